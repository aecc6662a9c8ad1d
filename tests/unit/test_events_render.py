"""Events and messages survive their JSON form; the CLI renders every kind of event and head."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from producer.render import render_event, render_head
from shared import events as ev
from shared.errors import RunErrorInfo
from shared.llm.base import Usage
from shared.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    dump_message,
    load_message,
)
from shared.state import Phase, RunHead

ERR = RunErrorInfo(kind="ToolDispatch", message="it broke", step=2, tool="add", details={"x": 1})
W = ev.WorkerId(host="h1", pid=42)

EVENTS: list[ev.Event] = [
    ev.RunStarted(run_id="r", step=0, agent="a", agent_version="3", model="m:x", worker=W),
    ev.StepStarted(run_id="r", step=1, worker=W),
    ev.TokenDelta(run_id="r", step=1, text="Hel", worker=W),
    ev.ModelResponded(run_id="r", step=1, text="thinking\nhard", tool_calls=2, usage=Usage(input_tokens=3)),
    ev.ToolDispatched(run_id="r", step=1, call_id="c1", tool="add", arguments={"a": 1}, worker=W),
    ev.ToolCompleted(run_id="r", step=1, call_id="c1", tool="add", ok=True, output="3.0", duration_s=0.0123),
    ev.ToolCompleted(run_id="r", step=1, call_id="c2", tool="add", ok=False, output="Error: x", error=ERR),
    ev.StepFailed(run_id="r", step=1, error=ERR, decision="retry"),
    ev.AwaitingApproval(run_id="r", step=1, call_id="c1", tool="charge", reason="needs a human"),
    ev.Completed(run_id="r", step=2, answer="42", usage=Usage(input_tokens=10, output_tokens=5)),
    ev.Failed(run_id="r", step=2, error=ERR),
    ev.Interrupted(run_id="r", step=2, reason="cancelled"),
]


def test_every_event_kind_is_covered() -> None:
    assert {e.kind for e in EVENTS} == {
        "RunStarted",
        "StepStarted",
        "TokenDelta",
        "ModelResponded",
        "ToolDispatched",
        "ToolCompleted",
        "StepFailed",
        "AwaitingApproval",
        "Completed",
        "Failed",
        "Interrupted",
    }
    assert set(ev.END_EVENTS) == {"Completed", "Failed", "Interrupted"}


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind)
def test_event_round_trip(event: ev.Event) -> None:
    raw = ev.dump_event(event)
    assert json.loads(raw)["kind"] == event.kind
    back = ev.load_event(raw)
    assert type(back) is type(event)
    assert back == event
    assert ev.load_event(raw.encode()) == event


def test_unknown_or_malformed_events_are_rejected() -> None:
    with pytest.raises(ValidationError):
        ev.load_event('{"kind": "Exploded", "run_id": "r", "step": 1}')
    with pytest.raises(ValidationError):
        ev.load_event('{"kind": "StepStarted"}')


def test_events_record_the_worker() -> None:
    e = ev.StepStarted(run_id="r", step=1)
    assert e.worker == ev.this_worker()
    assert e.ts > 0


MESSAGES: list[Message] = [
    SystemMessage(content="sys"),
    UserMessage(content="ünïcode ✓"),
    AssistantMessage(
        content=None, tool_calls=[ToolCall(id="c", name="t", arguments={"k": [1, {"n": None}]})]
    ),
    AssistantMessage(content="plain"),
    ToolMessage(tool_call_id="c", name="t", content="out", is_error=True),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.role)
def test_message_round_trip(message: Message) -> None:
    assert load_message(dump_message(message)) == message


def test_tool_calls_are_immutable() -> None:
    call = ToolCall(id="c", name="t", arguments={})
    with pytest.raises(ValidationError):
        call.id = "other"  # type: ignore[misc]


# -- rendering ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "detail"),
    [
        (EVENTS[0], "agent=a v3 model=m:x"),
        (EVENTS[2], "'Hel'"),
        (EVENTS[3], "text=thinking hard tool_calls=2"),
        (EVENTS[4], "add({'a': 1}) id=c1"),
        (EVENTS[5], "add ok 3.0 (12.3 ms)"),
        (EVENTS[6], "add ERROR Error: x (0.0 ms)"),
        (EVENTS[7], "ToolDispatch: it broke -> retry"),
        (EVENTS[8], "charge id=c1: needs a human"),
        (EVENTS[9], "tokens in/out 10/5"),
        (EVENTS[10], "ToolDispatch: it broke"),
        (EVENTS[11], "cancelled"),
    ],
    ids=lambda v: str(getattr(v, "kind", "")),
)
def test_render_event(event: ev.Event, detail: str) -> None:
    line = render_event(event)
    assert line.startswith(f"[step {event.step}] {event.kind:<15} ")
    assert detail in line
    assert line.endswith(f"  <{event.worker.host}/{event.worker.pid}>")
    assert "\n" not in line


def test_render_shortens_long_text() -> None:
    line = render_event(ev.ModelResponded(run_id="r", step=1, text="z" * 500, worker=W))
    assert "z" * 77 + "..." in line and "z" * 78 not in line
    assert "text=-" in render_event(ev.ModelResponded(run_id="r", step=1, text=None, worker=W))


def test_render_head() -> None:
    head = RunHead.new_idle("r1", "agent", "q", model="m:x").model_copy(
        update={"phase": Phase.COMPLETED, "step": 2, "max_steps": 6, "version": 6, "answer": "42"}
    )
    lines = render_head(head).splitlines()
    assert lines[0] == "run      r1"
    assert lines[2] == "phase    completed  step 2/6  version 6"
    assert lines[-1] == "answer   42"
    failed = head.model_copy(update={"phase": Phase.FAILED, "answer": None, "error": ERR})
    assert render_head(failed).splitlines()[-1] == "error    ToolDispatch: it broke"
    assert "answer" not in render_head(failed)
