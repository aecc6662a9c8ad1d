"""Event-stream invariants every run must keep, crash or no crash."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shared.events import END_EVENTS, Event

#: The committed events of a run with one tool hop, in order.
ONE_HOP = [
    "RunStarted",
    "StepStarted",
    "ModelResponded",
    "ToolDispatched",
    "ToolCompleted",
    "StepStarted",
    "ModelResponded",
    "Completed",
]


def kinds(events: Iterable[Event]) -> list[str]:
    return [e.kind for e in events if e.kind != "TokenDelta"]


def committed(events: Iterable[Event]) -> list[Event]:
    """The events written by commits (token deltas are streamed outside them, and may repeat)."""
    return [e for e in events if e.kind != "TokenDelta"]


def assert_event_invariants(events: Sequence[Event]) -> None:
    """Every step's StepStarted precedes its end; every ToolDispatched has exactly one completion;
    a terminal run has exactly one end event and it is the last."""
    started: set[int] = set()
    for e in events:
        if e.kind == "StepStarted":
            assert e.step not in started, f"step {e.step} started twice"
            started.add(e.step)
        elif e.kind in (
            "ModelResponded",
            "ToolDispatched",
            "ToolCompleted",
            "StepFailed",
            "Completed",
            "Failed",
        ) and (e.step > 0):
            assert e.step in started, f"{e.kind} of step {e.step} before its StepStarted"
    dispatched = [(e.step, e.call_id) for e in events if e.kind == "ToolDispatched"]
    completed = [(e.step, e.call_id) for e in events if e.kind == "ToolCompleted"]
    assert len(set(dispatched)) == len(dispatched), f"a tool call was dispatched twice: {dispatched}"
    assert len(set(completed)) == len(completed), f"a tool call completed twice: {completed}"
    assert sorted(dispatched) == sorted(completed), (
        f"dispatched calls without exactly one completion: dispatched={dispatched} completed={completed}"
    )
    ends = [e for e in events if e.kind in END_EVENTS]
    assert len(ends) == 1, f"expected one end event, got {kinds(ends)}"
    assert committed(events)[-1].kind in END_EVENTS, f"events go on after the end: {kinds(events)}"
