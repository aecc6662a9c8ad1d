"""A tool that reported progress is SIGKILLed mid-call with its worker: the events its dead delivery
appended stay in the stream and are marked void, the delivery that runs the call again reports live
ones, and the call's result is that delivery's."""

from __future__ import annotations

import time

from producer.client import Client
from shared.custom_events import void_attempts
from shared.events import CustomEvent, CustomEventsVoided, ToolCompleted, ToolDispatched
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
    starts,
    wait_tool_started,
)
from tests.invariants import ONE_HOP


def test_a_killed_deliverys_custom_events_are_voided_and_the_rerun_reports_live_ones(
    cluster: Cluster, client: Client
) -> None:
    cluster.start(2)
    r = client.store.redis
    handle = client.submit("progress_held", "go")
    key = idem(handle.run_id)
    # The first attempt appended its three events, then holds: kill its whole worker there.
    pid = wait_tool_started(r, key)
    victim = cluster.owner(pid)
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "progress reported"
    assert kinds(events) == ONE_HOP  # the committed ones: custom events are live
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    assert starts(r, key) == 2 and effects(r, key) == 1

    (dispatched,) = [e for e in events if isinstance(e, ToolDispatched)]
    (completed,) = [e for e in events if isinstance(e, ToolCompleted)]
    call = [e for e in events if isinstance(e, CustomEvent | CustomEventsVoided)]
    # Exactly: the dead delivery's three, the takeover's mark, the rerun's three, then the result.
    assert [(e.kind, e.attempt) for e in call] == [
        ("CustomEvent", 1),
        ("CustomEvent", 1),
        ("CustomEvent", 1),
        ("CustomEventsVoided", 1),
        ("CustomEvent", 2),
        ("CustomEvent", 2),
        ("CustomEvent", 2),
    ]
    custom = [e for e in call if isinstance(e, CustomEvent)]
    (voided,) = [e for e in call if isinstance(e, CustomEventsVoided)]
    assert {e.call_id for e in call} == {dispatched.call_id, completed.call_id}
    assert voided.reason == "taken_over" and voided.worker.host != victim.name
    assert [e.data["done"] for e in custom] == [1, 2, 3, 1, 2, 3]
    assert {e.data["pid"] for e in custom[:3]} == {pid}
    assert pid not in {e.data["pid"] for e in custom[3:]}
    # The result is the live delivery's, and every custom event of the call precedes it.
    assert completed.attempt == 2 and completed.ok
    assert events.index(custom[-1]) < events.index(completed)
    # The reader's rule: void when a CustomEventsVoided of the call names its attempt or a later one.
    limit = void_attempts(events)[(1, dispatched.call_id)]
    assert [e.attempt <= limit for e in custom] == [True] * 3 + [False] * 3
    note_recovery("whole worker killed inside a tool that reported progress", completed.ts - killed_at)
