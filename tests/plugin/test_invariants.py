"""The plugin's event checker (the suite's own too): what it rejects, and how it says so."""

from __future__ import annotations

import pytest

from shared.errors import RunErrorInfo
from shared.events import (
    Completed,
    Event,
    Failed,
    ModelResponded,
    RunStarted,
    StepStarted,
    TokenDelta,
    ToolCompleted,
    ToolDispatched,
)
from tests import invariants
from worker.pytest_plugin import assert_event_invariants, event_kinds, tool_calls

RUN = "r1"


def started() -> list[Event]:
    return [RunStarted(run_id=RUN, step=0, agent="a", agent_version="1", model="scripted:x")]


def step(n: int) -> list[Event]:
    return [StepStarted(run_id=RUN, step=n), ModelResponded(run_id=RUN, step=n, tool_calls=1)]


def dispatched(n: int, call_id: str) -> ToolDispatched:
    return ToolDispatched(run_id=RUN, step=n, call_id=call_id, tool="add", arguments={"a": 1, "b": 2})


def completed(n: int, call_id: str) -> ToolCompleted:
    return ToolCompleted(run_id=RUN, step=n, call_id=call_id, tool="add", ok=True, output="3.0")


def done(n: int) -> Completed:
    return Completed(run_id=RUN, step=n, answer="3")


def failed(n: int) -> Failed:
    return Failed(run_id=RUN, step=n, error=RunErrorInfo(kind="InternalInvariant", message="x"))


ONE_HOP = [*started(), *step(1), dispatched(1, "c0"), completed(1, "c0"), *step(2), done(2)]

CASES: dict[str, tuple[list[Event], str | None]] = {
    "one tool hop": (ONE_HOP, None),
    "token deltas may trail the end": ([*ONE_HOP, TokenDelta(run_id=RUN, step=2, text="3")], None),
    "a failed run": ([*started(), *step(1), failed(1)], None),
    "a call never completed": (
        [
            *started(),
            *step(1),
            dispatched(1, "c0"),
            dispatched(1, "c1"),
            completed(1, "c1"),
            *step(2),
            done(2),
        ],
        "every ToolDispatched needs exactly one ToolCompleted: never completed: add (c0, step 1);"
        " completed but never dispatched: none",
    ),
    "a call completed twice": (
        [*started(), *step(1), dispatched(1, "c0"), completed(1, "c0"), completed(1, "c0"), done(1)],
        "tool calls completed more than once: add (c0, step 1)",
    ),
    "a step started twice": (
        [*started(), *step(1), *step(1), done(1)],
        "step 1 started twice:"
        " RunStarted, StepStarted, ModelResponded, StepStarted, ModelResponded, Completed",
    ),
    "an event before its step": (
        [*started(), ModelResponded(run_id=RUN, step=1), done(1)],
        "ModelResponded of step 1 before its StepStarted: RunStarted, ModelResponded, Completed",
    ),
    "no end event": (
        [*started(), *step(1)],
        "expected exactly one end event, got 0: RunStarted, StepStarted, ModelResponded",
    ),
    "two end events": (
        [*started(), *step(1), done(1), failed(1)],
        "expected exactly one end event, got 2: RunStarted, StepStarted, ModelResponded, Completed, Failed",
    ),
    "events after the end": (
        [*started(), *step(1), done(1), StepStarted(run_id=RUN, step=2)],
        "events go on after the Completed event:"
        " RunStarted, StepStarted, ModelResponded, Completed, StepStarted",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checker_verdict_and_message(case: str) -> None:
    events, message = CASES[case]
    if message is None:
        assert_event_invariants(events)
        return
    with pytest.raises(AssertionError) as failure:
        assert_event_invariants(events)
    assert str(failure.value) == message


def test_kinds_and_tool_calls_of_an_event_list() -> None:
    events = [*ONE_HOP[:3], TokenDelta(run_id=RUN, step=1, text="x"), *ONE_HOP[3:]]
    assert event_kinds(events) == invariants.ONE_HOP
    assert tool_calls(events) == [("add", {"a": 1, "b": 2})]
