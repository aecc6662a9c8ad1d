"""Scripts that add data refuse at a full Redis before they change anything, whatever they write first.

Redis at ``maxmemory`` (``noeviction``) refuses a script's command that may add data only until
the script's first write. Each script here used to begin with a purge, a trim or a removal, and so
added its data past ``maxmemory``; each must now be refused with nothing of it written (not even
its purge), and be served once memory is freed. The workers' memory writes wait for room instead
of failing (``worker.full.until_room``), and apply each write once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
import redis.asyncio as aioredis

from producer.admission import Admissions, reservations_key
from shared.assistant_store import AssistantStore
from shared.assistants import AssistantConfig, UnknownAssistant
from shared.call_memory import PhaseMemory
from shared.keys import Keys
from shared.memory import Memory, memory_of
from shared.protocol import SCHED_AFTER, SCHED_NEXT, SCHED_PAUSED, SCHED_SPEC, SCHED_YES
from shared.scripts import LoopConnections, register_script
from shared.settings import Settings
from shared.state import MemoryWrite, RunHead
from shared.store import RunStore
from shared.store.runs import NewRun, creation_of
from shared.tasks import start_task
from shared.tenants import TenantLimits
from tests.chaos.support import fill_redis, free_redis, refuses_writes
from tests.harness import RedisServer, wait_until
from worker.full import until_room

pytestmark = pytest.mark.standalone_redis  # sets the one Redis's maxmemory

NS = ["user", "notes"]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    own = RedisServer().start()
    yield own
    own.cleanup()


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.config_set("maxmemory", 0)
    client.close()


@contextmanager
def full(r: redis.Redis) -> Iterator[None]:
    """Redis held above its maxmemory inside the block; freed after it, whatever happens."""
    ballast = fill_redis(r)
    try:
        assert refuses_writes(r)
        yield
    finally:
        free_redis(r, ballast)


def _memory(r: redis.Redis) -> tuple[Memory, str]:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    return memory_of(r, Keys(), tenant), tenant


def _expired_item(r: redis.Redis, memory: Memory, tenant: str) -> str:
    """An item whose TTL has passed but which no write has purged yet: its expiry set's key."""
    memory.put(NS, "old", {"n": 0}, ttl_s=3600)
    expiry = Keys().memory(tenant, "expiry")
    (member,) = [str(m) for m in r.zrange(expiry, 0, -1)]
    r.zadd(expiry, {member: 1})
    return expiry


def test_a_memory_put_is_refused_before_its_purges_and_a_delete_goes_through(r: redis.Redis) -> None:
    memory, tenant = _memory(r)
    memory.put(NS, "kept", {"n": 1})
    expiry = _expired_item(r, memory, tenant)
    applied = Keys().memory(tenant, "applied")
    r.zadd(applied, {"an-old-write": 1})  # an applied id long past its keeping time
    with full(r):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            memory.put(NS, "new", {"n": 2})
        # Nothing of it was written: not the item, nor the purges it makes first.
        assert memory.get(NS, "new") is None
        assert r.zcard(expiry) == 1 and r.zscore(applied, "an-old-write") == 1
        # A delete adds nothing: a full Redis takes it (and the purges with it).
        assert memory.delete(NS, "kept")
        assert memory.get(NS, "kept") is None
    assert memory.put(NS, "new", {"n": 2}).version == 1
    assert memory.get(NS, "new") is not None and r.zcard(expiry) == 0


def _refused_then_served(r: redis.Redis, write: threading.Thread, caplog: pytest.LogCaptureFixture) -> None:
    """``write`` (not started) is refused while Redis is full and waits; it ends once memory is
    freed."""
    with full(r):
        with caplog.at_level(logging.WARNING, logger="wesichain.worker"):
            write.start()
            wait_until(
                lambda: "waits for memory" in caplog.text or not write.is_alive(),
                30,
                what="the write to be refused",
            )
        assert write.is_alive(), "the write went through a full Redis"
    write.join(30)
    assert not write.is_alive()


def test_a_tools_memory_writes_wait_for_room_and_apply_once(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    memory, tenant = _memory(r)
    _expired_item(r, memory, tenant)
    writes = [
        MemoryWrite(op="put", namespace=NS, key="k", value={"n": 1}, write_id="run:1:call:0"),
        MemoryWrite(op="delete", namespace=NS, key="gone", write_id="run:1:call:1"),
    ]
    statuses: list[list[str]] = []
    applying = threading.Thread(target=lambda: statuses.append(memory.apply(writes, until_room)), daemon=True)
    _refused_then_served(r, applying, caplog)
    assert statuses == [["put", "absent"]]
    item = memory.get(NS, "k")
    assert item is not None and item.version == 1
    # Applied again (observe re-applies a step's writes): each id once.
    assert memory.apply(writes, until_room) == ["duplicate", "duplicate"]
    item = memory.get(NS, "k")
    assert item is not None and item.version == 1


def test_a_hooks_memory_put_waits_for_room(r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    memory, tenant = _memory(r)
    _expired_item(r, memory, tenant)
    hook = PhaseMemory(lambda: memory, "run:v3:before_model", until_room)
    putting = threading.Thread(target=lambda: hook.put(NS, "seen", {"yes": True}), daemon=True)
    _refused_then_served(r, putting, caplog)
    item = memory.get(NS, "seen")
    assert item is not None and item.value == {"yes": True} and item.version == 1


def test_an_assistant_create_is_refused_before_its_purge(r: redis.Redis) -> None:
    store, tenant = AssistantStore(r, Keys()), f"t-{uuid.uuid4().hex[:8]}"
    store.create(tenant, "first", "concierge", AssistantConfig())
    with full(r):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            store.create(tenant, "second", "concierge", AssistantConfig())
        with pytest.raises(UnknownAssistant):
            store.get(tenant, "second")
        assert r.zrange(Keys().assistants(tenant), 0, -1) == ["first"]
    assert store.create(tenant, "second", "concierge", AssistantConfig()).version == 1


def test_a_submit_is_refused_before_its_window_is_trimmed(r: redis.Redis) -> None:
    window_script = register_script(r, "submit_window")
    window = f"test:window:{uuid.uuid4().hex[:8]}"
    r.zadd(window, {"long-ago": 1})
    with full(r):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            window_script([window], [10, 60_000, "now"])
        assert r.zrange(window, 0, -1) == ["long-ago"]
    assert [int(x) for x in window_script([window], [10, 60_000, "now"])] == [1, 0]
    assert r.zrange(window, 0, -1) == ["now"]


def test_a_submit_admitted_with_its_create_is_refused_before_it_writes(
    server: RedisServer, r: redis.Redis
) -> None:
    """The API's common submit (``Admissions.create_on_loop``): its window's trim, its purge of
    expired reservations and its run, none written at a full Redis; served once memory is freed."""
    store = RunStore(r, Settings(prefix=f"full-{uuid.uuid4().hex[:8]}:"))
    admissions = Admissions(store)
    window = store.keys.submits("t")
    r.zadd(window, {"long-ago": 1})
    r.zadd(reservations_key(window), {"expired": 1})
    head = RunHead.new_idle(uuid.uuid4().hex, "a", "q", tenant="t")
    keys, args = store.create_call(NewRun(head, [start_task(head.run_id)]))

    async def submit() -> object:
        client = aioredis.from_url(server.url, decode_responses=True)
        admissions.loop = LoopConnections(client)
        try:
            return await admissions.create_on_loop("t", TenantLimits(), keys, args)
        finally:
            await admissions.loop.close()
            await client.aclose()

    with full(r):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            asyncio.run(submit())
        assert r.zrange(window, 0, -1) == ["long-ago"]
        assert r.zrange(reservations_key(window), 0, -1) == ["expired"]
        assert store.load(head.run_id) is None and store.inflight("t") == 0
    assert creation_of(asyncio.run(submit())) in ("created", "pushed")
    assert store.load(head.run_id) is not None and store.inflight("t") == 1
    assert r.zcard(window) == 1 and r.zcard(reservations_key(window)) == 0


def test_a_schedule_resume_and_an_advance_are_refused_before_they_write(r: redis.Redis) -> None:
    state, advance = register_script(r, "schedule_state"), register_script(r, "schedule_advance")
    tag = uuid.uuid4().hex[:8]
    paused, moving = f"test:sched:{tag}:paused", f"test:sched:{tag}:moving"
    history, due = f"test:sched:{tag}:history", f"test:sched:{tag}:due"
    r.hset(paused, mapping={SCHED_SPEC: "{}", SCHED_NEXT: "100", SCHED_PAUSED: SCHED_YES})
    # A timing changed while tick 100 was fired: its advance moves on to the tick left in AFTER.
    r.hset(moving, mapping={SCHED_SPEC: "{}", SCHED_NEXT: "100", SCHED_AFTER: "300"})
    before = {key: r.hgetall(key) for key in (paused, moving)}
    advance_args = ["100", "200", '{"tick": 100}', "n_started", 1, "", "moving", 10, ""]
    with full(r):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            state([paused, due], ["resume", "paused", "500"])
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            advance([moving, history, due], advance_args)
        assert {key: r.hgetall(key) for key in (paused, moving)} == before
        assert r.llen(history) == 0 and r.zcard(due) == 0
    assert state([paused, due], ["resume", "paused", "500"]) == "ok"
    assert int(advance([moving, history, due], advance_args)) == 1
    assert r.hget(paused, SCHED_PAUSED) is None and r.hget(moving, SCHED_NEXT) == "300"
    assert r.llen(history) == 1 and r.zrange(due, 0, -1, withscores=True) == [
        ("moving", 300),
        ("paused", 500),
    ]
