"""A stalled delivery of a call that reported progress: its whole worker is stopped (SIGSTOP) mid-call
past its lease, so the sweeper hands the call on and another delivery records the call's result.
Resumed (SIGCONT), the stalled delivery finishes its tool; its result is refused, as the call has
one, and it marks its own custom events void (``result_refused``) while the run is still going."""

from __future__ import annotations

import os
import signal
import uuid

from producer.client import Client
from shared.custom_events import void_attempts
from shared.events import CustomEvent, CustomEventsVoided, ToolCompleted
from shared.messages import ToolMessage
from shared.state import Phase
from tests.agents_reliability import ANSWER_RELEASE_KEY, CALL_PIDS_KEY, TOOL_RELEASE_KEY
from tests.chaos.support import Cluster, assert_event_invariants, events_of, wait_terminal
from tests.harness import wait_until

AGENTS = "tests.agents_reliability"


def test_a_stalled_deliverys_late_result_is_refused_and_its_events_voided(
    cluster: Cluster, client: Client
) -> None:
    cluster.start(2, agents=AGENTS)
    r = client.store.redis
    token = uuid.uuid4().hex
    handle = client.submit("progress_stalled", token, check_agent=False)
    pids = CALL_PIDS_KEY + handle.run_id
    wait_until(lambda: r.llen(pids) == 1, 60, what="the call's first delivery to start")
    wait_until(
        lambda: sum(isinstance(e, CustomEvent) for e in events_of(handle)) == 3, 30, what="its 3 events"
    )
    stalled_pid = int(r.lindex(pids, 0) or 0)
    victim = cluster.owner(stalled_pid)
    os.killpg(victim.pid, signal.SIGSTOP)
    try:
        # Taken over: the second delivery ran on the other worker, and its result is the call's.
        wait_until(lambda: r.llen(pids) == 2, 60, what="the call to be handed on")
        wait_until(lambda: handle.status().phase is Phase.THINKING, 60, what="the taken-over result")
    finally:
        os.killpg(victim.pid, signal.SIGCONT)
    # The stalled delivery returns now; the run is still thinking (its answer waits for the test).
    r.set(TOOL_RELEASE_KEY + handle.run_id, "1", ex=3600)
    wait_until(
        lambda: any(
            isinstance(e, CustomEventsVoided) and e.reason == "result_refused" for e in events_of(handle)
        ),
        60,
        what="the stalled delivery's events to be voided",
    )
    r.set(ANSWER_RELEASE_KEY + token, "1", ex=3600)
    head = wait_terminal(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "progress reported", head.error

    events = events_of(handle)
    assert_event_invariants(events)
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    assert completed.attempt == 2 and completed.output == f"reported by {int(r.lindex(pids, 1) or 0)}"
    marks = [(e.attempt, e.reason) for e in events if isinstance(e, CustomEventsVoided)]
    # The takeover voided attempt 1 first; the refused result names the same attempt again.
    assert marks == [(1, "taken_over"), (1, "result_refused")]
    custom = [e for e in events if isinstance(e, CustomEvent)]
    assert [(e.attempt, e.data["done"]) for e in custom] == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    assert {e.data["pid"] for e in custom if e.attempt == 1} == {stalled_pid}
    # The reader's rule: the stalled delivery's events are void, the live one's are not.
    limit = void_attempts(events)[(1, completed.call_id)]
    assert [e.attempt <= limit for e in custom] == [True] * 3 + [False] * 3
    # Its result was refused: the run's one tool result is the takeover's.
    tool_messages = [m for m in client.store.load_messages(handle.run_id) if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages] == [completed.output]
