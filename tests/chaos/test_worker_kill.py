"""SIGKILL a worker in the middle of every phase; the run still ends, correctly, effects guarded.

Whole-worker kills (the process group: main process and pool children) leave the task message
unacked in the broker for the visibility timeout, so recovery is the sweeper's: the phase's lease
expires, the epoch is bumped and the outbox re-published to the surviving worker. A killed prefork
child leaves its main process running, and Celery redelivers the task (retry on worker lost), which
takes the dead child's claim over without waiting for the lease.
"""

from __future__ import annotations

import time

import pytest

from producer.client import Client
from shared.state import Phase
from shared.timeline import TASK_OF_PHASE, Timeline
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    first_event_after,
    idem,
    kill_child,
    kinds,
    note_recovery,
    starts,
    wait_paused,
    wait_tool_started,
)
from tests.harness import wait_until
from tests.invariants import ONE_HOP

TOOL_FAILED = ["RunStarted", "StepStarted", "ModelResponded", "ToolDispatched", "ToolCompleted", "Failed"]
#: The first event the recovered phase commits.
NEXT_EVENT = {
    Phase.IDLE: "RunStarted",
    Phase.THINKING: "ModelResponded",
    Phase.ACTING: "ToolCompleted",
    Phase.OBSERVING: "StepStarted",
}
#: A lease far longer than Celery's redelivery of a dead child's task (1 s countdown): when a run
#: recovers well within it, with its epoch unchanged, the redelivery did it, not the sweeper.
CHILD_ENV = {"WESICHAIN_LEASE_S": "20", "WESICHAIN_QUEUED_LEASE_S": "30"}


@pytest.mark.parametrize("phase", [Phase.IDLE, Phase.THINKING, Phase.ACTING, Phase.OBSERVING], ids=str)
def test_whole_worker_killed_mid_phase(cluster: Cluster, client: Client, phase: Phase) -> None:
    cluster.start(2, env={"WESICHAIN_FAULT": f"pause:{phase.value}"})
    r = client.store.redis
    handle = client.submit("one_hop", "go")
    victim = cluster.owner(wait_paused(r, phase, handle.run_id))
    killed_at = time.time()
    victim.kill()
    held = handle.status()
    assert held.phase is phase and held.epoch == 0, "the kill did not land inside the paused phase"

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert head.epoch >= 1, "the sweeper should have taken the dead worker's phase over"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    assert effects(r, idem(handle.run_id)) == 1
    recovered = first_event_after(events, killed_at)
    assert recovered.kind == NEXT_EVENT[phase]
    assert recovered.worker.host != victim.name, "the killed worker cannot have committed after its death"
    note_recovery(f"whole worker killed in {phase.value}", recovered.ts - killed_at)
    if phase is not Phase.ACTING:  # a tool call's takeover shows as its claim, not a phase bar
        _assert_timeline_shows_takeover(handle.timeline(), TASK_OF_PHASE[phase], victim.name)


def _assert_timeline_shows_takeover(timeline: Timeline, task: str, victim: str) -> None:
    """The phase that was killed is drawn once, as its second claim, on a surviving worker."""
    (bar,) = [b for b in timeline.bars if b.kind == "phase" and b.name == task and b.step <= 1]
    assert bar.attempt == 2 and not bar.lane.startswith(f"{victim}:")
    (marker,) = [m for m in timeline.markers if m.kind == "takeover"]
    assert marker.lane == bar.lane and marker.at == bar.start


def test_whole_worker_killed_inside_retry_safe_tool(cluster: Cluster, client: Client) -> None:
    cluster.start(2)
    r = client.store.redis
    handle = client.submit("slow_step", "go")
    key = idem(handle.run_id)
    victim = cluster.owner(wait_tool_started(r, key))
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "slow step done"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    # The killed call is run again (it is retry-safe); its effect happens once.
    assert starts(r, key) == 2
    assert effects(r, key) == 1
    completed = next(e for e in events if e.kind == "ToolCompleted")
    assert completed.ok and completed.worker.host != victim.name
    # Recovery here includes running the 3 s tool again.
    note_recovery("whole worker killed inside a 3 s retry-safe tool", completed.ts - killed_at)


def test_whole_worker_killed_inside_non_retry_safe_tool(cluster: Cluster, client: Client) -> None:
    cluster.start(2)
    r = client.store.redis
    handle = client.submit("charge_once", "go")
    key = idem(handle.run_id)
    victim = cluster.owner(wait_tool_started(r, key))
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ToolOutcomeUnknown"
    assert head.error.tool == "charge" and head.error.step == 1
    assert kinds(events) == TOOL_FAILED
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    # Never started again: the payment happened at most once (here: not at all, it was killed).
    assert starts(r, key) == 1
    assert effects(r, key) == 0
    completed = next(e for e in events if e.kind == "ToolCompleted")
    assert not completed.ok and completed.error is not None
    assert completed.error.kind == "ToolOutcomeUnknown"
    note_recovery("whole worker killed inside a non-retry-safe tool", completed.ts - killed_at)


def test_non_retry_safe_tool_whose_claim_expired_is_not_run(cluster: Cluster, client: Client) -> None:
    """Killed after claiming the call but before the body ran: the runtime cannot tell the two apart,
    so the call is reported as outcome-unknown rather than risked twice."""
    cluster.start(2, env={"WESICHAIN_FAULT": "pause:acting"})
    r = client.store.redis
    handle = client.submit("charge_once", "go")
    cluster.owner(wait_paused(r, Phase.ACTING, handle.run_id)).kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ToolOutcomeUnknown"
    assert kinds(events) == TOOL_FAILED
    assert_event_invariants(events)
    assert starts(r, idem(handle.run_id)) == 0


@pytest.mark.parametrize("approve", [True, False], ids=["accepted", "declined"])
def test_an_unknown_outcome_parked_for_a_human_records_who_decided(
    cluster: Cluster, client: Client, approve: bool
) -> None:
    """A policy that parks an unknown outcome for a human: the decision, its note and who made it
    are an ApprovalDecided event, whether the human goes on or declines."""
    cluster.start(2, env={"WESICHAIN_FAULT": "pause:acting"})
    r = client.store.redis
    handle = client.submit("charge_park_unknown", "go")
    cluster.owner(wait_paused(r, Phase.ACTING, handle.run_id)).kill()
    parked = wait_until(
        lambda: (h := handle.status()).phase is Phase.AWAITING_APPROVAL and h,
        RUN_TIMEOUT_S,
        what="the unknown outcome to park the run",
    )
    assert parked.approval is not None and parked.approval.kind == "unknown_outcome"
    if approve:
        handle.approve("checked the ledger: not charged", by="ops@example")
    else:
        handle.deny("cannot tell", by="ops@example")
    head = handle.wait(RUN_TIMEOUT_S)
    decided = [e for e in events_of(handle) if e.kind == "ApprovalDecided"]
    assert [(e.approve, e.note, e.by) for e in decided] == [
        (True, "checked the ledger: not charged", "ops@example")
        if approve
        else (False, "cannot tell", "ops@example")
    ]
    assert starts(r, idem(handle.run_id)) == 0  # never run again after the unknown outcome
    if not approve:
        assert head.phase is Phase.FAILED and head.error is not None
        assert head.error.kind == "ToolOutcomeUnknown" and "cannot tell" in head.error.message


@pytest.mark.parametrize("agent", ["slow_step", "charge_once"])
def test_prefork_child_killed_inside_tool(cluster: Cluster, client: Client, agent: str) -> None:
    (worker,) = cluster.start(1, env=CHILD_ENV)
    r = client.store.redis
    handle = client.submit(agent, "go")
    key = idem(handle.run_id)
    pid = wait_tool_started(r, key)
    killed_at = time.time()
    kill_child(pid, worker)

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert worker.alive, "only the child was killed; the worker's main process must survive"
    assert head.epoch == 0, "Celery's redelivery should have recovered the call, not the sweeper"
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    completed = next(e for e in events if e.kind == "ToolCompleted")
    assert completed.worker.pid != pid
    if agent == "slow_step":
        assert head.phase is Phase.COMPLETED and head.answer == "slow step done"
        assert kinds(events) == ONE_HOP
        assert starts(r, key) == 2
        assert effects(r, key) == 1
    else:
        assert head.phase is Phase.FAILED
        assert head.error is not None and head.error.kind == "ToolOutcomeUnknown"
        assert kinds(events) == TOOL_FAILED
        assert starts(r, key) == 1
        assert effects(r, key) == 0
    note_recovery(f"prefork child killed inside tool ({agent})", completed.ts - killed_at)


def test_prefork_child_killed_mid_think(cluster: Cluster, client: Client) -> None:
    (worker,) = cluster.start(1, env={**CHILD_ENV, "WESICHAIN_FAULT": "pause:thinking"})
    r = client.store.redis
    handle = client.submit("one_hop", "go")
    pid = wait_paused(r, Phase.THINKING, handle.run_id)
    killed_at = time.time()
    kill_child(pid, worker)

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert worker.alive
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert head.epoch == 0, "Celery's redelivery should have recovered the think, not the sweeper"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert effects(r, idem(handle.run_id)) == 1
    recovered = first_event_after(events, killed_at)
    assert recovered.kind == "ModelResponded" and recovered.worker.pid != pid
    note_recovery("prefork child killed in thinking", recovered.ts - killed_at)


def test_whole_worker_killed_during_a_parallel_fan_out(cluster: Cluster, client: Client) -> None:
    """Only the killed worker's calls run again; the calls whose results are in are not."""
    cluster.start(2, concurrency=2)
    r = client.store.redis
    handle = client.submit("parallel", "go")
    keys = [idem(handle.run_id, 1, f"call_{i}") for i in range(4)]
    pids = {key: wait_tool_started(r, key) for key in keys}
    victim = cluster.owner(pids[keys[0]])
    doomed = {key for key, pid in pids.items() if pid in victim.pids()}
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "all four done"
    assert kinds(events) == [
        "RunStarted",
        "StepStarted",
        "ModelResponded",
        *["ToolDispatched"] * 4,
        *["ToolCompleted"] * 4,
        "StepStarted",
        "ModelResponded",
        "Completed",
    ]
    assert_event_invariants(events)
    finished_by = {
        idem(handle.run_id, 1, e.call_id): e.worker.host for e in events if e.kind == "ToolCompleted"
    }
    for key in keys:
        assert effects(r, key) == 1, key
        # A call the victim had started and not finished ran again elsewhere; no other call did.
        rerun = key in doomed and finished_by[key] != victim.name
        assert starts(r, key) == (2 if rerun else 1), key
    assert any(finished_by[key] != victim.name for key in doomed), "the kill interrupted no call"
    last = max(e.ts for e in events if e.kind == "ToolCompleted")
    note_recovery("whole worker killed during a 4 x 1 s fan-out (its calls re-run)", last - killed_at)
