"""The run state machine's transitions: phase, version, messages and events of every legal move."""

from __future__ import annotations

from typing import Any

import pytest

from shared import events as ev
from shared import fsm
from shared.errors import InternalInvariant, RunErrorInfo
from shared.llm.base import Usage
from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import Approval, Phase, RunHead, ToolResult

ERROR = RunErrorInfo(kind="ModelTransport", message="provider down", step=1)
CALLS = [
    ToolCall(id="b", name="search", arguments={"query": "x"}),
    ToolCall(id="a", name="calculator", arguments={"expression": "1+1"}),
]


def head(phase: Phase, **changes: Any) -> RunHead:
    base = RunHead.new_idle("r1", "agent", "question")
    values: dict[str, Any] = {
        "phase": phase,
        "version": 7,
        "step": 2,
        "steps_used": 2,
        "max_steps": 5,
        "message_count": 4,
        "usage": Usage(input_tokens=100, output_tokens=50),
        "created_at": 1000.0,
        "updated_at": 1000.0,
    }
    if phase in (Phase.ACTING, Phase.OBSERVING):
        values["pending_calls"] = list(CALLS)
    values.update(changes)
    return base.model_copy(update=values)


def kinds(transition: fsm.Transition[Any]) -> list[str]:
    return [e.kind for e in transition.events]


def assert_moved(
    before: RunHead, transition: fsm.Transition[Any], phase: Phase, cls: type[fsm.PhaseView]
) -> RunHead:
    after = transition.head
    assert isinstance(transition.to, cls)
    assert transition.to.phase is phase
    assert after.phase is phase
    assert after.version == before.version + 1
    assert after.updated_at > before.updated_at
    assert after.created_at == before.created_at
    assert after.run_id == before.run_id
    assert all(e.run_id == before.run_id for e in transition.events)
    return after


# -- start ----------------------------------------------------------------------------------------


def test_idle_start() -> None:
    before = RunHead.new_idle("r1", "agent", "hello").model_copy(
        update={"created_at": 1000.0, "updated_at": 1000.0}
    )
    initial: list[Message] = [SystemMessage(content="sys"), UserMessage(content="hello")]
    t = fsm.Idle(before).start(initial, agent_version="3", model="scripted:x", max_steps=4)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert after.version == 2
    assert (after.step, after.steps_used, after.max_steps) == (1, 1, 4)
    assert after.message_count == 2
    assert (after.agent_version, after.model) == ("3", "scripted:x")
    assert t.messages == tuple(initial)
    assert kinds(t) == ["RunStarted", "StepStarted"]
    started, step = t.events
    assert isinstance(started, ev.RunStarted) and isinstance(step, ev.StepStarted)
    assert (started.step, started.agent, started.agent_version, started.model) == (
        0,
        "agent",
        "3",
        "scripted:x",
    )
    assert step.step == 1


# -- think ----------------------------------------------------------------------------------------


def test_thinking_complete() -> None:
    before = head(Phase.THINKING, model_retries=2)
    usage = Usage(input_tokens=10, output_tokens=5)
    t = fsm.Thinking(before).complete("the answer", usage)
    after = assert_moved(before, t, Phase.COMPLETED, fsm.CompletedRun)
    assert after.answer == "the answer"
    assert after.usage == Usage(input_tokens=110, output_tokens=55)
    assert after.message_count == 5
    assert after.model_retries == 0
    assert after.step == 2
    assert t.messages == (AssistantMessage(content="the answer"),)
    assert kinds(t) == ["ModelResponded", "Completed"]
    responded, completed = t.events
    assert isinstance(responded, ev.ModelResponded) and isinstance(completed, ev.Completed)
    assert (responded.step, responded.text, responded.tool_calls, responded.usage) == (
        2,
        "the answer",
        0,
        usage,
    )
    assert (completed.answer, completed.usage) == ("the answer", after.usage)
    assert after.terminal


def test_thinking_act_emits_one_dispatch_per_call() -> None:
    before = head(Phase.THINKING, model_retries=1)
    usage = Usage(input_tokens=3, output_tokens=4)
    t = fsm.Thinking(before).act("let me check", CALLS, usage)
    after = assert_moved(before, t, Phase.ACTING, fsm.Acting)
    assert after.pending_calls == CALLS
    assert after.message_count == 5
    assert after.model_retries == 0
    assert after.usage == Usage(input_tokens=103, output_tokens=54)
    assert after.step == 2 and after.steps_used == 2
    assert t.messages == (AssistantMessage(content="let me check", tool_calls=CALLS),)
    assert kinds(t) == ["ModelResponded", "ToolDispatched", "ToolDispatched"]
    responded = t.events[0]
    assert isinstance(responded, ev.ModelResponded)
    assert (responded.text, responded.tool_calls, responded.usage) == ("let me check", 2, usage)
    dispatched = [e for e in t.events if isinstance(e, ev.ToolDispatched)]
    assert [(d.call_id, d.tool, d.arguments, d.step) for d in dispatched] == [
        ("b", "search", {"query": "x"}, 2),
        ("a", "calculator", {"expression": "1+1"}, 2),
    ]


def test_thinking_act_without_calls_is_an_invariant_violation() -> None:
    with pytest.raises(InternalInvariant, match="at least one tool call") as info:
        fsm.Thinking(head(Phase.THINKING)).act(None, [], Usage())
    assert info.value.step == 2


def test_reprompt_consuming_budget_starts_a_new_step() -> None:
    before = head(Phase.THINKING, reprompts=1)
    usage = Usage(input_tokens=1, output_tokens=2)
    t = fsm.Thinking(before).reprompt(ERROR, "garbage", "fix it", usage, consume_budget=True)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert (after.step, after.steps_used, after.reprompts) == (3, 3, 2)
    assert after.message_count == 6
    assert after.usage == Usage(input_tokens=101, output_tokens=52)
    assert t.messages == (AssistantMessage(content="garbage"), UserMessage(content="fix it"))
    assert kinds(t) == ["StepFailed", "StepStarted"]
    failed, started = t.events
    assert isinstance(failed, ev.StepFailed) and isinstance(started, ev.StepStarted)
    assert (failed.step, failed.decision, failed.error) == (2, "reprompt", ERROR)
    assert started.step == 3


def test_reprompt_without_budget_stays_on_the_step() -> None:
    before = head(Phase.THINKING)
    t = fsm.Thinking(before).reprompt(ERROR, None, "fix it", Usage(), consume_budget=False)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert (after.step, after.steps_used, after.reprompts) == (2, 2, 1)
    assert after.message_count == 6
    assert t.messages == (AssistantMessage(content=""), UserMessage(content="fix it"))
    assert kinds(t) == ["StepFailed"]
    assert t.events[0].step == 2


@pytest.mark.parametrize("consume", [True, False])
def test_retry(consume: bool) -> None:
    before = head(Phase.THINKING, model_retries=1)
    t = fsm.Thinking(before).retry(ERROR, consume_budget=consume)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert after.model_retries == 2
    assert after.steps_used == (3 if consume else 2)
    assert after.step == 2
    assert after.message_count == before.message_count
    assert t.messages == ()
    assert kinds(t) == ["StepFailed"]
    failed = t.events[0]
    assert isinstance(failed, ev.StepFailed)
    assert (failed.step, failed.decision, failed.error) == (2, "retry", ERROR)


# -- act / observe ---------------------------------------------------------------------------------


def test_acting_observe() -> None:
    before = head(Phase.ACTING)
    t = fsm.Acting(before).observe()
    after = assert_moved(before, t, Phase.OBSERVING, fsm.Observing)
    assert after.pending_calls == CALLS
    assert after.step == before.step
    assert t.messages == () and t.events == ()


def result(call_id: str, name: str, output: str, ok: bool = True) -> ToolResult:
    return ToolResult(call_id=call_id, name=name, ok=ok, output=output)


def test_observing_next_step_appends_results_in_call_order() -> None:
    before = head(Phase.OBSERVING)
    # Results arrive in any order (and extra ones are ignored); messages follow the calls' order.
    results = [
        result("a", "calculator", "2.0"),
        result("zzz", "other", "ignored"),
        result("b", "search", "boom", ok=False),
    ]
    t = fsm.Observing(before).next_step(results)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert t.messages == (
        ToolMessage(tool_call_id="b", name="search", content="boom", is_error=True),
        ToolMessage(tool_call_id="a", name="calculator", content="2.0", is_error=False),
    )
    assert (after.step, after.steps_used) == (3, 3)
    assert after.pending_calls == []
    assert after.message_count == 6
    assert kinds(t) == ["StepStarted"]
    assert t.events[0].step == 3


def test_observing_next_step_missing_result_raises() -> None:
    with pytest.raises(InternalInvariant, match=r"\['a'\]") as info:
        fsm.Observing(head(Phase.OBSERVING)).next_step([result("b", "search", "x")])
    assert info.value.step == 2
    with pytest.raises(InternalInvariant, match=r"\['b', 'a'\]"):
        fsm.Observing(head(Phase.OBSERVING)).next_step([])


# -- approvals ----------------------------------------------------------------------------------------


def test_thinking_park_waits_for_approval_without_dispatching() -> None:
    before = head(Phase.THINKING, model_retries=2)
    usage = Usage(input_tokens=1, output_tokens=1)
    t = fsm.Thinking(before).park("may I?", CALLS, usage, needs_approval=["search"])
    after = assert_moved(before, t, Phase.AWAITING_APPROVAL, fsm.Parked)
    assert after.pending_calls == CALLS
    assert after.approval == Approval(
        kind="tool_calls", call_ids=["b", "a"], reason="tool calls need approval: search"
    )
    assert (after.step, after.steps_used, after.model_retries, after.message_count) == (2, 2, 0, 5)
    assert after.usage == Usage(input_tokens=101, output_tokens=51)
    assert t.messages == (AssistantMessage(content="may I?", tool_calls=CALLS),)
    # Nothing is dispatched until a human approves.
    assert kinds(t) == ["ModelResponded", "AwaitingApproval", "AwaitingApproval"]
    waiting = [e for e in t.events if isinstance(e, ev.AwaitingApproval)]
    assert [(w.call_id, w.tool, w.reason) for w in waiting] == [
        ("b", "search", "tool calls need approval: search"),
        ("a", "calculator", "tool calls need approval: search"),
    ]


def parked(**changes: Any) -> RunHead:
    values: dict[str, Any] = {
        "pending_calls": list(CALLS),
        "approval": Approval(kind="tool_calls", call_ids=["b", "a"], reason="r"),
        **changes,
    }
    return head(Phase.AWAITING_APPROVAL, **values)


def test_approve_dispatches_every_pending_call() -> None:
    before = parked()
    t = fsm.Parked(before).approve()
    after = assert_moved(before, t, Phase.ACTING, fsm.Acting)
    assert after.approval is None
    assert after.pending_calls == CALLS
    assert (after.step, after.steps_used, after.message_count) == (2, 2, 4)
    assert t.messages == ()
    assert [(e.kind, getattr(e, "call_id", None)) for e in t.events] == [
        ("ApprovalDecided", None),
        ("ToolDispatched", "b"),
        ("ToolDispatched", "a"),
    ]


@pytest.mark.parametrize(
    ("note", "content"),
    [
        ("", "Denied by a human reviewer. The tool call was not executed."),
        ("too risky", "Denied by a human reviewer: too risky. The tool call was not executed."),
    ],
)
def test_deny_tells_the_model_and_starts_a_new_step(note: str, content: str) -> None:
    before = parked()
    t = fsm.Parked(before).deny(note)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert t.messages == (
        ToolMessage(tool_call_id="b", name="search", content=content, is_error=True),
        ToolMessage(tool_call_id="a", name="calculator", content=content, is_error=True),
    )
    assert (after.step, after.steps_used, after.message_count) == (3, 3, 6)
    assert after.pending_calls == [] and after.approval is None
    assert kinds(t) == ["ApprovalDecided", "StepStarted"] and t.events[1].step == 3
    decided = t.events[0]
    assert decided.kind == "ApprovalDecided" and (decided.approve, decided.note, decided.step) == (
        False,
        note,
        2,
    )


def test_park_unknown_outcome() -> None:
    before = head(Phase.OBSERVING)
    unknown = RunErrorInfo(kind="ToolOutcomeUnknown", message="worker died")
    other = RunErrorInfo(kind="ToolDispatch", message="raised")
    results = [
        ToolResult(call_id="a", name="calculator", ok=False, output="?", error=unknown),
        ToolResult(call_id="b", name="search", ok=False, output="boom", error=other),
    ]
    t = fsm.Observing(before).park_unknown(results)
    after = assert_moved(before, t, Phase.AWAITING_APPROVAL, fsm.Parked)
    reason = "outcome unknown (worker died mid-call) for: calculator"
    assert after.approval == Approval(kind="unknown_outcome", call_ids=["a"], reason=reason)
    assert after.pending_calls == CALLS
    assert after.step == 2 and after.message_count == 4
    assert t.messages == ()
    assert [(e.kind, getattr(e, "call_id", None)) for e in t.events] == [("AwaitingApproval", "a")]


def test_resume_feeds_every_result_back_in_call_order() -> None:
    before = parked(approval=Approval(kind="unknown_outcome", call_ids=["a"], reason="r"))
    unknown = RunErrorInfo(kind="ToolOutcomeUnknown", message="worker died")
    results = [
        ToolResult(call_id="a", name="calculator", ok=False, output="Error: unknown", error=unknown),
        ToolResult(call_id="b", name="search", ok=True, output="hits"),
    ]
    t = fsm.Parked(before).resume(results)
    after = assert_moved(before, t, Phase.THINKING, fsm.Thinking)
    assert t.messages == (
        ToolMessage(tool_call_id="b", name="search", content="hits", is_error=False),
        ToolMessage(tool_call_id="a", name="calculator", content="Error: unknown", is_error=True),
    )
    assert (after.step, after.steps_used, after.message_count) == (3, 3, 6)
    assert after.pending_calls == [] and after.approval is None
    assert kinds(t) == ["StepStarted"]


def test_resume_with_a_missing_result_is_an_invariant_violation() -> None:
    results = [ToolResult(call_id="a", name="calculator", ok=True, output="2")]
    with pytest.raises(InternalInvariant):
        fsm.Parked(parked()).resume(results)


# -- fail / interrupt from every live phase ------------------------------------------------------

LIVE = [
    (Phase.IDLE, fsm.Idle),
    (Phase.THINKING, fsm.Thinking),
    (Phase.ACTING, fsm.Acting),
    (Phase.OBSERVING, fsm.Observing),
    (Phase.AWAITING_APPROVAL, fsm.Parked),
]


@pytest.mark.parametrize(("phase", "cls"), LIVE)
def test_fail_from_live_phase(phase: Phase, cls: type[fsm._Live]) -> None:
    before = head(phase, pending_calls=list(CALLS))
    t = cls(before).fail(ERROR)
    after = assert_moved(before, t, Phase.FAILED, fsm.FailedRun)
    assert after.error == ERROR
    assert after.pending_calls == []
    assert after.step == before.step and after.message_count == before.message_count
    assert t.messages == ()
    assert kinds(t) == ["Failed"]
    failed = t.events[0]
    assert isinstance(failed, ev.Failed)
    assert (failed.error, failed.step) == (ERROR, 2)
    assert after.terminal


@pytest.mark.parametrize(("phase", "cls"), LIVE)
@pytest.mark.parametrize("error", [None, ERROR])
def test_interrupt_from_live_phase(phase: Phase, cls: type[fsm._Live], error: RunErrorInfo | None) -> None:
    before = head(phase, pending_calls=list(CALLS))
    t = cls(before).interrupt("cancelled", error)
    after = assert_moved(before, t, Phase.INTERRUPTED, fsm.InterruptedRun)
    assert after.error == error
    assert after.pending_calls == []
    assert t.messages == ()
    assert kinds(t) == ["Interrupted"]
    interrupted = t.events[0]
    assert isinstance(interrupted, ev.Interrupted)
    assert (interrupted.reason, interrupted.step) == ("cancelled", 2)


def test_budget_left() -> None:
    assert fsm.Thinking(head(Phase.THINKING, max_steps=5, steps_used=2)).budget_left == 3
    assert fsm.Thinking(head(Phase.THINKING, max_steps=5, steps_used=5)).budget_left == 0


def test_transitions_do_not_mutate_the_input() -> None:
    before = head(Phase.THINKING)
    snapshot = before.model_dump()
    fsm.Thinking(before).act("x", CALLS, Usage(input_tokens=1))
    fsm.Thinking(before).complete("x", Usage(input_tokens=1))
    fsm.Thinking(before).fail(ERROR)
    assert before.model_dump() == snapshot


# -- view -----------------------------------------------------------------------------------------

VIEWS = [
    *LIVE,
    (Phase.COMPLETED, fsm.CompletedRun),
    (Phase.FAILED, fsm.FailedRun),
    (Phase.INTERRUPTED, fsm.InterruptedRun),
]


def test_view_covers_every_phase() -> None:
    assert {p for p, _ in VIEWS} == set(Phase)


@pytest.mark.parametrize(("phase", "cls"), VIEWS)
def test_view_dispatch(phase: Phase, cls: type[fsm.PhaseView]) -> None:
    h = head(phase)
    v = fsm.view(h)
    assert type(v) is cls
    assert v.phase is phase
    assert v.head is h
    assert isinstance(v, fsm._Live) is (not phase.terminal)


def test_full_cycle_versions() -> None:
    t1 = fsm.Idle(RunHead.new_idle("r", "a", "q")).start(
        [UserMessage(content="q")], agent_version="1", model="m:x", max_steps=3
    )
    t2 = t1.to.act(None, CALLS, Usage())
    t3 = t2.to.observe()
    t4 = t3.to.next_step([result("a", "calculator", "1"), result("b", "search", "2")])
    t5 = t4.to.complete("done", Usage())
    assert [t.head.version for t in (t1, t2, t3, t4, t5)] == [2, 3, 4, 5, 6]
    assert [t.head.phase for t in (t1, t2, t3, t4, t5)] == [
        Phase.THINKING,
        Phase.ACTING,
        Phase.OBSERVING,
        Phase.THINKING,
        Phase.COMPLETED,
    ]
    assert t5.head.message_count == 1 + 1 + 2 + 1
    assert t5.head.step == 2
