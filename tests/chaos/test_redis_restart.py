"""Redis restarted (AOF, fsync always) while tools run: the runs continue and complete afterwards.

The server is stopped, kept down until every worker has noticed, and started again on the same port
with its AOF. Losing the broker connection makes Celery cancel the tasks it is running (they are
late-acked) and the connection that delivered them is gone, so their messages stay unacked; the
sweeper hands those phases on once their leases expire. Retry-safe tools may run again; their effect
still happens once. With RabbitMQ as the broker (``--broker rabbitmq``) the outage is the run
state's alone: the workers stay connected to RabbitMQ, and what they must survive is every commit,
claim renewal and heartbeat failing until Redis is back.
"""

from __future__ import annotations

import signal

import pytest

from producer.client import Client, NoLiveWorker
from shared.events import ToolCompleted
from shared.state import Phase
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    kinds,
    note_recovery,
    noticed,
    outage,
    starts,
    wait_tool_started,
)
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.invariants import ONE_HOP

pytestmark = pytest.mark.standalone_redis  # stops and restarts the one Redis


def _submit_slow_runs_and_wait_for_their_tools(client: Client, n: int) -> list[str]:
    handles = [client.submit("slow_step", "go") for _ in range(n)]
    for h in handles:
        wait_tool_started(client.store.redis, idem(h.run_id))
    return [h.run_id for h in handles]


def _check_completed(client: Client, run_id: str) -> None:
    r = client.store.redis
    handle = client.handle(run_id)
    agent = handle.status().agent
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED, f"{run_id}: {head.phase} {head.error}"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    key = idem(run_id)
    # A test tool writes its effect to this same Redis: one that finished while Redis was down
    # (on RabbitMQ the workers run on through the outage) failed on that write, recorded as such.
    (done,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert effects(r, key) == (1 if done.ok else 0), done
    if agent == "slow_step":
        assert 1 <= starts(r, key) <= 2


def test_runs_complete_across_a_redis_restart(
    aof_cluster: Cluster, aof_server: RedisServer, aof_client: Client
) -> None:
    """The durable state survives the restart and every run ends correctly.

    A worker that exits on the connection loss is started again here, as a process supervisor would
    (``test_workers_reconnect_after_a_redis_restart`` is the check that they should not exit at all).
    """
    workers = aof_cluster.start(2, concurrency=2)
    before = _submit_slow_runs_and_wait_for_their_tools(aof_client, 3)
    stopped_at = outage(aof_server, workers)
    aof_cluster.revive(wait=True)
    after = [aof_client.submit(agent, "go").run_id for agent in ("one_hop", "slow_step", "one_hop")]

    for run_id in before + after:
        _check_completed(aof_client, run_id)
    for run_id in before:
        done = next(e for e in events_of(aof_client.handle(run_id)) if e.kind == "ToolCompleted")
        note_recovery("redis stopped under a running 3 s tool, then restarted", done.ts - stopped_at)


def test_workers_reconnect_after_a_redis_restart(
    aof_cluster: Cluster, aof_server: RedisServer, aof_client: Client
) -> None:
    """Workers busy with tasks when Redis goes away must reconnect, not exit."""
    workers = aof_cluster.start(2, concurrency=2)
    before = _submit_slow_runs_and_wait_for_their_tools(aof_client, 3)
    outage(aof_server, workers)
    dead = [w.name for w in workers if not w.alive]
    assert not dead, (
        f"workers {dead} exited on the broker connection loss instead of reconnecting:\n"
        + "\n".join(_crash_lines(w) for w in workers if not w.alive)
    )
    after = [_submitted_once_served(aof_client, "one_hop") for _ in range(3)]
    for run_id in before + after:
        _check_completed(aof_client, run_id)
    assert all(w.alive for w in workers)


def _submitted_once_served(client: Client, agent: str) -> str:
    """A run of ``agent``, submitted once a worker consumes it again after the outage: until the
    workers have reconnected to the broker the client refuses with NoLiveWorker ("retry
    shortly"), and a caller retries, as here."""

    def attempt() -> str | None:
        try:
            return client.submit(agent, "go").run_id
        except NoLiveWorker:
            return None

    run_id: str = wait_until(attempt, 60, what=f"a worker serving {agent!r} to consume again")
    return run_id


def _crash_lines(w: WorkerProcess) -> str:
    lines = w.log().splitlines()
    keep = [i for i, line in enumerate(lines) if "CRITICAL" in line or "Unrecoverable" in line]
    if not keep:
        return f"{w.name}: exited with {w.proc.returncode if w.proc else '?'}"
    tail = lines[keep[0] :][-12:]
    return f"{w.name}: " + "\n".join([lines[keep[0]], *tail])


def test_redis_killed_mid_workload_loses_nothing_acknowledged(
    aof_cluster: Cluster, aof_server: RedisServer, aof_client: Client
) -> None:
    """SIGKILL, not a clean stop: Redis has no chance to flush anything. With appendfsync always
    every write it acknowledged is already on disk, so after the restart every run goes on from
    its last commit, and a non-retry-safe call that was in flight is never run a second time."""
    workers = aof_cluster.start(2, concurrency=2)
    r = aof_client.store.redis
    paying = [aof_client.submit("charge_once", "go") for _ in range(2)]
    others = [aof_client.submit(agent, "go") for agent in ("slow_step", "chain", "parallel", "one_hop")]
    for handle in paying:
        wait_tool_started(r, idem(handle.run_id))
    offsets = {w.name: len(w.log()) for w in workers}
    aof_server.stop(signal.SIGKILL)
    wait_until(
        lambda: all(noticed(w.log()[offsets[w.name] :]) or not w.alive for w in workers),
        30,
        what="every worker to notice Redis is gone",
    )
    aof_server.start()
    aof_cluster.revive(wait=True)
    for handle in paying:
        head = handle.wait(RUN_TIMEOUT_S)
        events = events_of(handle)
        assert_event_invariants(events)
        assert_terminal_matches_events(head, events)
        key = idem(handle.run_id)
        # Never twice: it completed once, or its outcome is unknown and it never ran again.
        assert starts(r, key) == 1, f"{handle.run_id}: the charge started {starts(r, key)} times"
        if head.phase is Phase.COMPLETED:
            # The charge writes its effect to this same Redis after its 3 s: one that got there
            # while Redis was still down failed on that write, and the run recorded that failure.
            # Either way the effect is there exactly when the run recorded the charge as done.
            (done,) = [e for e in events if isinstance(e, ToolCompleted)]
            assert effects(r, key) == (1 if done.ok else 0), done
        else:
            assert head.error is not None and head.error.kind == "ToolOutcomeUnknown", head.error
    for handle in others:
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED, f"{head.agent}: {head.phase} {head.error}"
        assert_event_invariants(events_of(handle))
