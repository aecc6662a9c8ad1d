"""A worker SIGKILLed in the middle of resuming a parked run: the resume is a claimed phase like any
other, so the sweeper hands it on once the claim's lease runs out, and another worker finishes the
run (the broker's visibility timeout, an hour by default, plays no part).

Three ways a parked run is resumed, each killed right after the resume (the ``decide`` task)
claimed the run: a human's approval, a message that wakes it (``wake_on_message``), and the last
result of its subagents. The approved non-retry-safe tool runs exactly once. And a decision stored
by a producer that died before it sent the resume: the sweeper sends it.
"""

from __future__ import annotations

import time

from producer.client import Client, RunHandle
from shared.state import Decision, Phase
from tests.broker import Settings
from tests.chaos.support import (
    QUEUED_LEASE_S,
    Cluster,
    effects,
    events_of,
    idem,
    note_recovery,
    starts,
    wait_paused,
    wait_terminal,
)
from tests.harness import wait_until

PAUSE_THE_RESUME = {"WESICHAIN_FAULT": "pause:awaiting_approval", "WESICHAIN_FAULT_PAUSE_S": "600"}


def _parked(client: Client, handle: RunHandle) -> None:
    wait_until(
        lambda: handle.status().phase is Phase.AWAITING_APPROVAL, 60, what="the run to park for approval"
    )


def _kill_the_resume(cluster: Cluster, client: Client, handle: RunHandle) -> float:
    """SIGKILL the whole worker whose resume of the run paused right after its claim; returns when."""
    victim = cluster.owner(wait_paused(client.store.redis, Phase.AWAITING_APPROVAL, handle.run_id))
    victim.kill()
    assert victim.alive is False
    return time.monotonic()


def test_worker_killed_while_resuming_an_approved_run(cluster: Cluster, client: Client) -> None:
    cluster.start(2, env=PAUSE_THE_RESUME)
    handle = client.submit("needs_approval", "refund the order")
    _parked(client, handle)
    handle.approve(note="go ahead", by="reviewer")
    killed = _kill_the_resume(cluster, client, handle)
    head = wait_terminal(handle)
    note_recovery("resume of an approved run, worker SIGKILLed", time.monotonic() - killed)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer is not None and head.answer.startswith("charged: ")
    # The approved charge is not retry-safe: it ran once, by the worker that took the resume over.
    key = idem(handle.run_id)
    assert (starts(client.store.redis, key), effects(client.store.redis, key)) == (1, 1)
    decided = [e for e in events_of(handle) if e.kind == "ApprovalDecided"]
    assert [(e.approve, e.by) for e in decided] == [(True, "reviewer")]


def test_worker_killed_while_resuming_a_run_woken_by_a_message(cluster: Cluster, client: Client) -> None:
    cluster.start(2, env=PAUSE_THE_RESUME)
    handle = client.submit("wakes_on_message", "refund the order")
    _parked(client, handle)
    handle.send_message("never mind, cancel it")
    _kill_the_resume(cluster, client, handle)
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "woken by never mind, cancel it; denied"
    # The parked charge was denied by the wake: it never ran.
    assert starts(client.store.redis, idem(handle.run_id)) == 0


def test_worker_killed_while_resuming_a_parent_after_its_subagents(cluster: Cluster, client: Client) -> None:
    cluster.start(2, env=PAUSE_THE_RESUME, agents="tests.agents_capabilities")
    handle = client.submit("lead", "alpha; beta", check_agent=False)
    _kill_the_resume(cluster, client, handle)
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "ok[found alpha] + ok[found beta]"


def test_a_stored_decision_whose_resume_was_never_sent(cluster: Cluster, client: Client) -> None:
    # The producer stored the decision and died before it sent the decide task: the sweeper finds
    # the message missing from the broker once its queued time is over, and sends it.
    cluster.start(2)
    handle = client.submit("needs_approval", "refund the order")
    _parked(client, handle)
    producer = Client(
        Settings(
            redis_url=cluster.server.url, agents_module="tests.agents_fixture", queued_lease_s=QUEUED_LEASE_S
        )
    )
    try:
        assert producer.store.submit_decision(handle.run_id, handle.status().version, Decision(approve=True))
    finally:
        producer.close()
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED, head.error
    key = idem(handle.run_id)
    assert (starts(client.store.redis, key), effects(client.store.redis, key)) == (1, 1)
