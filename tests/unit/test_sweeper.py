"""The sweeper against a real redis-server: what it re-publishes, under which epoch, and its bound."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared import fsm
from shared.agents import load_registry
from shared.messages import SystemMessage, UserMessage
from shared.settings import Settings
from shared.state import Phase, RunHead, TaskSpec
from shared.store import RunStore
from shared.tasks import task_for
from tests.harness import RedisServer, wait_until
from worker.heartbeat import Heartbeat
from worker.runtime import Runtime
from worker.sweeper import Sweeper, sweep_once


@pytest.fixture
def runtime(redis_server: RedisServer) -> Iterator[tuple[Runtime, list[TaskSpec]]]:
    client = redis_server.client()
    settings = Settings(prefix=f"sw-{uuid.uuid4().hex[:8]}:", max_phase_attempts=3)
    store = RunStore(client, settings)
    sent: list[TaskSpec] = []
    rt = Runtime(
        store=store,
        agents=load_registry("tests.agents_fixture"),
        send=sent.append,
        settings=settings,
        heartbeat=Heartbeat(store, interval_s=1.0),
    )
    yield rt, sent
    client.close()


def thinking_run(rt: Runtime) -> RunHead:
    idle = RunHead.new_idle(uuid.uuid4().hex, "direct", "hi")
    assert rt.store.commit(None, idle) == "committed"
    start = fsm.Idle(idle).start(
        [SystemMessage(content="s"), UserMessage(content="hi")],
        agent_version="1",
        model="scripted:direct",
        max_steps=3,
    )
    assert (
        rt.store.commit(idle.version, start.head, start.messages, start.events, task_for(start.head))
        == "committed"
    )
    return start.head


def expire(rt: Runtime, run_id: str) -> None:
    rt.store.redis.zadd(rt.store.keys.leases(), {run_id: 0})


def test_expired_lease_is_republished_under_a_new_epoch(runtime: tuple[Runtime, list[TaskSpec]]) -> None:
    rt, sent = runtime
    head = thinking_run(rt)
    assert sweep_once(rt) == 0  # the queued lease has not expired yet
    expire(rt, head.run_id)
    assert sweep_once(rt) == 1
    assert [(s.name, s.arguments["epoch"], s.task_id) for s in sent] == [
        ("wesichain.think", 1, f"{head.run_id}:v{head.version}:think:e1")
    ]
    assert rt.store.load(head.run_id).epoch == 1  # type: ignore[union-attr]
    # A delivery of the old epoch is now stale.
    assert (
        rt.store.begin(head.run_id, head.version, Phase.THINKING, 0, 1, "1:think").__class__.__name__
        == "Stale"
    )


def test_a_phase_that_never_claims_is_failed_as_poison(runtime: tuple[Runtime, list[TaskSpec]]) -> None:
    rt, sent = runtime
    head = thinking_run(rt)
    for _ in range(rt.settings.max_phase_attempts):
        expire(rt, head.run_id)
        assert sweep_once(rt) == 1
    assert len(sent) == rt.settings.max_phase_attempts
    expire(rt, head.run_id)
    sweep_once(rt)
    final = rt.store.load(head.run_id)
    assert final is not None and final.phase is Phase.FAILED
    assert final.error is not None and final.error.kind == "PoisonPhase"
    assert len(sent) == rt.settings.max_phase_attempts  # nothing more was published


def test_only_one_sweeper_sweeps_at_a_time(runtime: tuple[Runtime, list[TaskSpec]]) -> None:
    rt, sent = runtime
    head = thinking_run(rt)
    expire(rt, head.run_id)
    first, second = Sweeper(rt), Sweeper(rt)
    assert first.tick() == 1
    expire(rt, head.run_id)
    assert second.tick() == 0  # the lock is the first sweeper's
    assert first.tick() == 1


def test_parked_and_finished_runs_leave_the_watch_list(runtime: tuple[Runtime, list[TaskSpec]]) -> None:
    rt, sent = runtime
    head = thinking_run(rt)
    done = fsm.Thinking(head).complete("ok", head.usage)
    assert rt.store.commit(head.version, done.head, done.messages, done.events) == "committed"
    rt.store.redis.zadd(rt.store.keys.leases(), {head.run_id: 0})
    assert sweep_once(rt) == 0
    assert rt.store.redis.zscore(rt.store.keys.leases(), head.run_id) is None
    assert sent == []


def test_redis_unavailable_does_not_kill_the_sweeper(runtime: tuple[Runtime, list[TaskSpec]]) -> None:
    rt, _ = runtime
    broken = Runtime(
        store=RunStore(
            redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)), rt.settings
        ),
        agents=rt.agents,
        send=lambda spec: None,
        settings=rt.settings,
        heartbeat=rt.heartbeat,
    )
    failures: list[Exception] = []

    class Counting(Sweeper):
        def tick(self) -> int:
            try:
                return super().tick()
            except Exception as exc:
                failures.append(exc)
                raise

    sweeper = Counting(broken)
    sweeper.interval_s = 0.05
    sweeper.start()
    try:
        wait_until(lambda: len(failures) >= 3, 10, what="three failed sweeps")
        assert all(isinstance(e, redis.ConnectionError) for e in failures)
        assert sweeper._thread is not None and sweeper._thread.is_alive()
    finally:
        sweeper.stop()
