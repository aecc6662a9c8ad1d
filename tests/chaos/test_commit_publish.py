"""SIGKILL right after a commit, before the worker's own publish of the outbox.

With a Redis broker on the store's server the commit script already pushed the next phase's message
(``WESICHAIN_COMMIT_PUBLISH``, the default): the crash loses nothing, no hand-on is needed, and the
next phase runs at once on another worker.

Committing, then publishing (``WESICHAIN_COMMIT_PUBLISH=0``, and any broker the script cannot push
to) leaves the next phase committed but never sent. Two ways back, both tested: a prefork child
dies, Celery redelivers its task, the redelivery finds the run moved on with its outbox unsent and
publishes it; or the whole worker dies (solo pool: the task runs in the main process), nothing is
redelivered, and the sweeper re-publishes the outbox once the queued lease of the committed phase
expires. On RabbitMQ (``--broker rabbitmq``), where a commit never publishes in its script, a
worker that dies whole is redelivered too: RabbitMQ hands its unacked task back at once.
"""

from __future__ import annotations

import pytest

from producer.client import Client
from shared.state import Phase
from tests.broker import is_cluster, on_rabbitmq
from tests.chaos.faults import fired_key
from tests.chaos.support import (
    QUEUED_LEASE_S,
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    committed,
    effects,
    events_of,
    idem,
    is_running,
    kinds,
    note_recovery,
)
from tests.harness import wait_until
from tests.invariants import ONE_HOP

PHASES = [Phase.IDLE, Phase.THINKING, Phase.OBSERVING]
#: (index of the last event the crashed commit wrote, kind of the first event after recovery) in ONE_HOP.
CRASHED_COMMIT = {
    Phase.IDLE: (1, "ModelResponded"),  # RunStarted, StepStarted(1) | think of step 1
    Phase.THINKING: (3, "ToolCompleted"),  # ModelResponded, ToolDispatched | the tool
    Phase.OBSERVING: (5, "ModelResponded"),  # StepStarted(2) | think of step 2
}
#: Commit, then publish: the gap the outbox and the sweeper cover.
TWO_STEPS = {"WESICHAIN_COMMIT_PUBLISH": "0"}


def _check(client: Client, run_id: str, phase: Phase, case: str) -> tuple[int, int]:
    """Returns the run's final epoch and the pid the crash killed."""
    r = client.store.redis
    handle = client.handle(run_id)
    head = handle.wait(RUN_TIMEOUT_S)
    events = committed(events_of(handle))
    # The fault records its pid right after the commit; when that commit already queued the next
    # phase, another worker may end the run first.
    key = fired_key(f"crash_after_commit:{phase.value}", run_id)
    crashed = wait_until(lambda: r.get(key), 10, what="the crash to fire")
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    assert effects(r, idem(run_id)) == 1
    last, next_kind = CRASHED_COMMIT[phase]
    assert events[last + 1].kind == next_kind
    note_recovery(case, events[last + 1].ts - events[last].ts)
    return head.epoch, int(crashed)


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_child_killed_between_commit_and_publish(cluster: Cluster, client: Client, phase: Phase) -> None:
    # A queued lease far beyond the test: only the redelivery can bring the run back in time.
    (worker,) = cluster.start(
        1,
        env={
            "WESICHAIN_FAULT": f"crash_after_commit:{phase.value}",
            "WESICHAIN_QUEUED_LEASE_S": "30",
            **TWO_STEPS,
        },
    )
    handle = client.submit("one_hop", "go")
    epoch, crashed = _check(
        client, handle.run_id, phase, f"prefork child killed after the {phase.value} commit"
    )
    assert epoch == 0, "the redelivered task should have published the outbox, not the sweeper"
    assert worker.alive
    # The crash killed a pool child (the worker's main process lives on and redelivered its task).
    assert crashed != worker.pid and not is_running(crashed)


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_whole_worker_killed_between_commit_and_publish(
    cluster: Cluster, client: Client, phase: Phase
) -> None:
    workers = cluster.start(
        2, pool="solo", env={"WESICHAIN_FAULT": f"crash_after_commit:{phase.value}", **TWO_STEPS}
    )
    handle = client.submit("one_hop", "go")
    epoch, crashed = _check(
        client, handle.run_id, phase, f"whole worker killed after the {phase.value} commit"
    )
    # The solo pool commits in the worker's main process: the crash took that worker down.
    wait_until(lambda: sum(not w.alive for w in workers) == 1, 30, what="the committing worker to die")
    (dead,) = [w for w in workers if not w.alive]
    assert crashed == dead.pid
    if on_rabbitmq():
        # RabbitMQ hands the committing task back as soon as the dead worker's connection drops;
        # its redelivery finds the outbox unclaimed and publishes it: no hand-on.
        assert epoch == 0, "the redelivery should have published the outbox"
        return
    assert epoch >= 1, "only the sweeper can re-publish the outbox of a worker that died whole"
    # The sweeper waited for the committed phase's queued lease before re-publishing.
    last, _ = CRASHED_COMMIT[phase]
    events = committed(events_of(handle))
    assert events[last + 1].ts - events[last].ts >= QUEUED_LEASE_S - 0.5


@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_whole_worker_killed_after_a_commit_that_published(
    cluster: Cluster, client: Client, phase: Phase
) -> None:
    if is_cluster(cluster.server.url) and not on_rabbitmq():
        pytest.skip(
            "no commit publishes beside a cluster, and a standalone Redis broker gives nothing back early"
        )
    # A queued lease far beyond the test: the sweeper cannot be what brings the run back.
    workers = cluster.start(
        2,
        pool="solo",
        env={"WESICHAIN_FAULT": f"crash_after_commit:{phase.value}", "WESICHAIN_QUEUED_LEASE_S": "60"},
    )
    handle = client.submit("one_hop", "go")
    epoch, crashed = _check(
        client, handle.run_id, phase, f"worker killed after the {phase.value} commit+publish"
    )
    assert epoch == 0, "the commit itself queued the next phase: nothing is handed on"
    # It kills itself right after the commit: the run may end on the other worker before that.
    wait_until(lambda: sum(not w.alive for w in workers) == 1, 30, what="the committing worker to die")
    (dead,) = [w for w in workers if not w.alive]
    assert crashed == dead.pid
    # Every piece of work was claimed once: the crash came after the commit, and the next phase's
    # message, pushed by that commit, was taken by the other worker.
    attempts = client.store.attempts(handle.run_id)
    claims = {k: v for k, v in attempts.items() if k.startswith("v")}
    assert claims and set(claims.values()) == {"1"}, attempts
    if not on_rabbitmq():
        # That commit acknowledged its own message too: nothing of the dead worker's is left in the
        # broker's unacked hash for the visibility timeout to hand back (as a stale delivery).
        r = client.store.redis
        wait_until(lambda: r.hlen("unacked") == 0, 10, what="no message left unacked")
