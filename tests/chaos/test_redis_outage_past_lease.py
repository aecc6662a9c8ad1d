"""Redis down (AOF, fsync always) for longer than every lease, while tools and a think run.

Claims and the workers' liveness records run out by Redis's clock, which goes on while Redis is
down: when it comes back, every one of them has expired, while the processes holding them are alive
and still inside their tool or model call. Nothing was dead; nobody could renew. The sweeper that
reaches Redis first (here a sweeper of the test's own, as a standalone ``wesichain sweeper``
would, looking at once) must not hand that work on: a retry-safe call would run a second time
beside the first, a think would call its model again, and a non-retry-safe call would be reported
``ToolOutcomeUnknown`` while it still runs. It finds that no sweeper reached Redis for a while and
judges nothing for a lease, in which every live holder renews (``sweep_watch.lua``).

The gated agents run until the test opens a gate (a file) and count their starts in files, so they
run through the outage and past Redis's return whatever the machine's speed. The 3 s tools beside
them write to Redis and may end while it is down: those end as ``test_redis_restart`` says. With
RabbitMQ as the broker (``--broker rabbitmq``) the workers stay connected to it all along.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from producer.client import Client, NoLiveWorker, RunHandle
from shared.events import ToolCompleted
from shared.settings import Settings as RuntimeSettings
from shared.state import Phase
from tests.agents_fixture import GATE_DIR_ENV, gated_count, gated_thinks
from tests.broker import Settings, on_rabbitmq
from tests.chaos.support import (
    LEASE_S,
    QUEUED_LEASE_S,
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    kinds,
    noticed,
    starts,
)
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.invariants import ONE_HOP
from worker.app import create_app
from worker.sweeper import Sweeper

pytestmark = pytest.mark.standalone_redis  # stops and restarts the one Redis

_DEFAULTS = RuntimeSettings()
#: Down for longer than a claim's lease, a worker's liveness record and its registry record
#: (live while three intervals old), and a lease more: everything has run out when Redis is back.
OUTAGE_S = max(LEASE_S, _DEFAULTS.worker_lease_s, 3 * _DEFAULTS.registry_interval_s) + LEASE_S
THINK_INPUT = "think through the outage"


@pytest.fixture
def first_sweeper(aof_server: RedisServer) -> Iterator[Sweeper]:
    """A sweeper of the test's own, with the workers' settings, publishing to their broker."""
    settings = Settings(
        redis_url=aof_server.url,
        agents_module="tests.agents_fixture",
        lease_s=LEASE_S,
        queued_lease_s=QUEUED_LEASE_S,
    )
    holder = create_app(settings).wesichain_runtime
    yield Sweeper(holder.get(), holder.probe())
    holder.get().store.redis.close()


def _down_past_every_lease(server: RedisServer, workers: list[WorkerProcess], first: Sweeper) -> None:
    """Stop Redis; start it again once every worker noticed and OUTAGE_S passed, and have ``first``
    look as soon as it answers, before the workers' clients are back from their reconnect backoff
    (a standalone sweeper asking every few milliseconds would)."""
    offsets = {w.name: len(w.log()) for w in workers}
    stopped = time.monotonic()
    server.stop()
    wait_until(
        lambda: (
            time.monotonic() - stopped > OUTAGE_S
            and all(noticed(w.log()[offsets[w.name] :]) for w in workers)
        ),
        OUTAGE_S + 90,
        what="every worker to notice the outage, and every lease to run out",
    )
    probe = server.client(retry=Retry(NoBackoff(), 0), socket_timeout=1)

    def answers() -> bool:
        try:
            return bool(probe.ping())
        except redis.ConnectionError:  # refused, or still loading its AOF
            return False

    def look_as_soon_as_it_answers() -> None:
        wait_until(answers, 60, interval=0.005, what="Redis to answer")
        first.tick()

    with ThreadPoolExecutor(1) as pool:
        looked = pool.submit(look_as_soon_as_it_answers)
        server.start()
        looked.result()
    probe.close()


def test_work_alive_through_an_outage_past_its_lease_is_not_handed_on(
    aof_cluster: Cluster,
    aof_server: RedisServer,
    aof_client: Client,
    first_sweeper: Sweeper,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    # A process more than the three gated tasks that hold theirs: a worker that reserved another
    # task always has a process to run it.
    workers = aof_cluster.start(2, concurrency=4, env={GATE_DIR_ENV: str(gate)})
    pids = {w.name: w.pid for w in workers}
    r = aof_client.store.redis
    retry_safe = aof_client.submit("slow_gated", "go")
    paying = aof_client.submit("charge_gated", "go")
    thinking = aof_client.submit("think_gated", THINK_INPUT)
    gated = {retry_safe.run_id: "slow_gated", paying.run_id: "charge_gated", thinking.run_id: "think_gated"}
    slow_step = aof_client.submit("slow_step", "go")
    charge_once = aof_client.submit("charge_once", "go")
    wait_until(
        lambda: (
            gated_count(gate, f"{idem(retry_safe.run_id)}.starts")
            and gated_count(gate, f"{idem(paying.run_id)}.starts")
            and gated_count(gate, gated_thinks(THINK_INPUT))
            and starts(r, idem(slow_step.run_id))
            and starts(r, idem(charge_once.run_id))
        ),
        30,
        what="every tool to start and the think to call its model",
    )

    # Redis's clock went on: when it is back, every claim and liveness record has run out, its
    # holder alive, and a sweeper looks at once.
    _down_past_every_lease(aof_server, workers, first_sweeper)
    quiet = aof_client.store.keys.sweeper_quiet()
    wait_until(lambda: not r.exists(quiet), 30, what="the sweepers' quiet time after the outage to end")
    first_sweeper.sweep()  # and a sweep past it, besides the workers' own

    heads = {agent: aof_client.store.load(run_id) for run_id, agent in gated.items()}
    seen = {
        "epochs": {agent: head.epoch if head else None for agent, head in heads.items()},
        "retry-safe call starts": gated_count(gate, f"{idem(retry_safe.run_id)}.starts"),
        "non-retry-safe call starts": gated_count(gate, f"{idem(paying.run_id)}.starts"),
        "model calls": gated_count(gate, gated_thinks(THINK_INPUT)),
    }
    # Nothing handed on (no new epoch), nothing run again beside the call or think still running.
    assert seen == {
        "epochs": {agent: 0 for agent in gated.values()},
        "retry-safe call starts": 1,
        "non-retry-safe call starts": 1,
        "model calls": 1,
    }

    (gate / "open").touch()
    for handle in (retry_safe, paying):
        head = handle.wait(RUN_TIMEOUT_S)
        events = events_of(handle)
        assert head.phase is Phase.COMPLETED, f"{gated[handle.run_id]}: {head.phase} {head.error}"
        assert kinds(events) == ONE_HOP
        assert_event_invariants(events)
        assert_terminal_matches_events(head, events)
        (done,) = [e for e in events if isinstance(e, ToolCompleted)]
        assert done.ok and done.attempt == 1, done
        key = idem(handle.run_id)
        assert (gated_count(gate, f"{key}.starts"), gated_count(gate, f"{key}.effects")) == (1, 1)
    head = thinking.wait(RUN_TIMEOUT_S)
    events = events_of(thinking)
    assert head.phase is Phase.COMPLETED and head.answer == "thought through the outage", head
    assert kinds(events) == ["RunStarted", "StepStarted", "ModelResponded", "Completed"]
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    assert gated_count(gate, gated_thinks(THINK_INPUT)) == 1

    _check_tool_ended_in_the_outage(aof_client, slow_step, retry_safe=True)
    _check_tool_ended_in_the_outage(aof_client, charge_once, retry_safe=False)

    # The workers lived through it and serve new runs.
    assert {w.name: w.pid for w in workers if w.alive} == pids
    for agent in ("one_hop", "slow_step"):
        handle = _submitted_once_served(aof_client, agent)
        assert handle.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
        assert_event_invariants(events_of(handle))
    if not on_rabbitmq():
        # Every delivery was acknowledged: none waits for Redis's visibility timeout (an hour).
        wait_until(lambda: not r.hlen("unacked"), 30, what="the broker's unacked deliveries to be acked")


def _check_tool_ended_in_the_outage(client: Client, handle: RunHandle, *, retry_safe: bool) -> None:
    """A 3 s tool that writes its effect to Redis: it may have ended while Redis was down (its write
    failed, recorded as such) and its delivery with it, its call then handed on once the quiet time
    was over. A retry-safe call is then run again and its run completes; a non-retry-safe one is
    never run again: its run completes, or fails with its outcome unknown."""
    r = client.store.redis
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    key = idem(handle.run_id)
    if retry_safe:
        assert head.phase is Phase.COMPLETED, f"{head.agent}: {head.phase} {head.error}"
        assert 1 <= starts(r, key) <= 2
    else:
        assert starts(r, key) == 1, f"the charge started {starts(r, key)} times"
    if head.phase is Phase.COMPLETED:
        assert kinds(events) == ONE_HOP
        (done,) = [e for e in events if isinstance(e, ToolCompleted)]
        assert effects(r, key) == (1 if done.ok else 0), done
    else:
        assert head.error is not None and head.error.kind == "ToolOutcomeUnknown", head.error


def _submitted_once_served(client: Client, agent: str) -> RunHandle:
    """A run of ``agent`` submitted once a worker is registered again (until then a submit is
    refused with NoLiveWorker, "retry shortly", and a caller retries, as here)."""

    def attempt() -> RunHandle | None:
        try:
            return client.submit(agent, "go")
        except NoLiveWorker:
            return None

    handle: RunHandle = wait_until(attempt, 60, what=f"a worker serving {agent!r} to be registered again")
    return handle
