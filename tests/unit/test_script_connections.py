"""The store's scripts on a thread's own connection (``shared.scripts.ScriptConnections``), against a
real standalone redis-server: one connection per thread, kept across calls; a script Redis lost,
a dropped connection and a fork each handled as redis-py's own call handles them."""

from __future__ import annotations

import gc
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.store import Claim, RunStore
from tests.harness import RedisServer
from tests.store_support import make_store
from worker.testing.runs import claim, started


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    # The kept connections are for a standalone Redis only (a cluster client keeps its own per node).
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture
def rds(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def store(rds: redis.Redis) -> RunStore:
    return make_store(rds)


def _count_checkouts(monkeypatch: pytest.MonkeyPatch, pool: Any) -> list[int]:
    taken = [0]
    get_connection = pool.get_connection

    def counted(*args: Any, **kwargs: Any) -> Any:
        taken[0] += 1
        return get_connection(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted)
    return taken


def test_a_thread_keeps_one_connection_for_its_scripts(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    thinking = started(store)  # this thread's connection is taken here
    taken = _count_checkouts(monkeypatch, store.redis.connection_pool)

    for _ in range(3):
        thinking = started(store)
        assert isinstance(claim(store, thinking.head), Claim)

    assert taken[0] == 0, "the scripts went through the pool again instead of the thread's connection"


def test_each_thread_has_a_connection_of_its_own_which_goes_back_when_it_ends(store: RunStore) -> None:
    started(store)
    pool = store.redis.connection_pool
    in_use = len(pool._in_use_connections)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            assert isinstance(claim(store, started(store).head), Claim)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(pool._in_use_connections) == in_use, "an ended thread's connection is back in the pool"


def test_a_script_redis_lost_is_loaded_again(store: RunStore, rds: redis.Redis) -> None:
    started(store)
    rds.script_flush()

    thinking = started(store)
    assert isinstance(claim(store, thinking.head), Claim)
    assert store.load(thinking.head.run_id) is not None


def test_a_dropped_connection_is_replaced_and_the_call_answered(store: RunStore, server: RedisServer) -> None:
    started(store)
    killer = server.client()
    try:
        assert int(killer.client_kill_filter(_type="normal", skipme=True)) >= 1
    finally:
        killer.close()

    thinking = started(store)
    assert isinstance(claim(store, thinking.head), Claim)


def _claim_in_child(store: RunStore, run_id: str, version: int, answers: Any) -> None:
    head = store.load(run_id)
    assert head is not None and head.version == version
    answers.put(isinstance(claim(store, head), Claim))


def test_a_forked_process_takes_a_connection_of_its_own(store: RunStore) -> None:
    parent_run = started(store)  # the parent thread's connection exists before the fork
    child_run = started(store)
    answers: Any = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(
        target=_claim_in_child, args=(store, child_run.head.run_id, child_run.head.version, answers)
    )
    child.start()
    child.join(timeout=60)

    assert child.exitcode == 0
    assert answers.get(timeout=10) is True
    # The parent's connection is still its own: the child neither used nor closed it.
    assert isinstance(claim(store, parent_run.head), Claim)


def test_a_thread_that_cannot_connect_raises_as_redis_py_does_and_connects_once_redis_is_back() -> None:
    own = RedisServer().start()
    try:
        rds = own.client(retry=Retry(NoBackoff(), 0), socket_connect_timeout=2)
        store = make_store(rds)
        started(store)
        own.stop()
        errors: list[BaseException] = []

        def work() -> None:  # a thread of its own: its connection is taken while Redis is down
            try:
                started(store)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=work)
        t.start()
        t.join(timeout=60)
        assert len(errors) == 1 and isinstance(errors[0], redis.ConnectionError), errors
        gc.collect()  # the failed attempt left nothing behind that raises when collected

        own.start()
        assert isinstance(claim(store, started(store).head), Claim)
        rds.close()
    finally:
        own.cleanup()


def test_a_kept_connection_packs_a_script_call_as_redis_py_does(rds: redis.Redis) -> None:
    from shared.scripts import _HeldConnection

    held = _HeldConnection(rds.connection_pool)
    assert held.hiredis  # the test suite's redis-py packs with hiredis
    connection = held.connection
    for command in (
        ("EVALSHA", "a" * 40, 2, "run:{r1}", "claims:{r1}", "7", 3, 1.5, "é", b"\x00bytes"),
        # Types only redis-py's own pack converts: handed to it, the same bytes come out.
        ("EVALSHA", "a" * 40, 1, "k", bytearray(b"ba"), memoryview(b"mv")),
    ):
        assert b"".join(held.pack(command)) == b"".join(connection.pack_command(*command))
    # A type nothing packs fails as redis-py's own call fails.
    with pytest.raises(redis.DataError):
        held.pack(("EVALSHA", "a" * 40, 1, "k", object()))
