"""Handoffs, pure parts: the agent's declaration, the transfer tools, the choice in a reply, the
conversation each agent sees, the input filters, and the state machine's two moves."""

from __future__ import annotations

import pytest

from shared import events as ev
from shared import fsm
from shared.agents import Agent
from shared.errors import ConfigError, InternalInvariant, RunErrorInfo
from shared.handoffs import (
    Handoff,
    answers,
    choose_handoff,
    conversation_of,
    keep_last_messages,
    offered_tools,
    paired,
    remove_tool_calls,
)
from shared.llm.base import Usage
from shared.messages import AssistantMessage, Message, SystemMessage, ToolCall, ToolMessage, UserMessage
from shared.state import HandoffRecord, Phase, RunHead
from shared.tools import ToolSet, tool
from tests.agents_fixture import AddArgs


@tool
def add(args: AddArgs) -> float:
    """Add."""
    return args.a + args.b


def _agent(**kw: object) -> Agent:
    return Agent(name="desk", model="scripted:x", system_prompt="s", **kw)  # type: ignore[arg-type]


def test_declared_handoffs_become_transfer_tools() -> None:
    agent = _agent(
        tools=ToolSet([add]), handoffs=("billing", Handoff("tech.support", description="For the hard ones."))
    )
    assert [h.agent for h in agent.handoff_targets] == ["billing", "tech.support"]
    specs = {s.name: s for s in offered_tools(agent).specs()}
    assert list(specs) == ["add", "transfer_to_billing", "transfer_to_tech_support"]
    assert specs["transfer_to_tech_support"].description == "For the hard ones."
    assert offered_tools(agent).get("transfer_to_billing") is not None
    assert agent.tools.names == ["add"]  # the transfer tools never reach the act phase


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"handoffs": ("b", "b")}, "declared twice"),
        ({"handoffs": (Handoff("b", tool_name="add"),), "tools": ToolSet([add])}, "clash"),
        ({"max_handoffs": 21}, "max_handoffs"),
        ({"max_handoffs": -1}, "max_handoffs"),
    ],
)
def test_bad_declarations_are_config_errors(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _agent(**kw)


def test_a_filter_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="callable"):
        Handoff("b", input_filter="nope")  # type: ignore[arg-type]


def test_the_first_transfer_call_of_a_reply_wins() -> None:
    agent = _agent(tools=ToolSet([add]), handoffs=("billing", "tech"))
    calls = [
        ToolCall(id="c0", name="add", arguments={"a": 1, "b": 2}),
        ToolCall(id="c1", name="transfer_to_tech", arguments={}),
        ToolCall(id="c2", name="transfer_to_billing", arguments={}),
    ]
    choice = choose_handoff(agent, calls)
    assert choice is not None and choice.handoff.agent == "tech" and choice.call.id == "c1"
    assert choose_handoff(agent, calls[:1]) is None
    replies = answers(calls, choice.call, "moved", error=False)
    assert [(m.tool_call_id, m.is_error) for m in replies] == [("c0", True), ("c1", False), ("c2", True)]
    assert replies[1].content == "moved" and replies[0].content.startswith("Not run")


def _head(**kw: object) -> RunHead:
    head = RunHead.new_idle("r1", "desk", "q")
    return head.model_copy(
        update={"phase": Phase.THINKING, "step": 2, "steps_used": 2, "max_steps": 3, "message_count": 4, **kw}
    )


CALL = ToolCall(id="t1", name="transfer_to_billing", arguments={})


def test_hand_off_commits_the_target_and_the_event() -> None:
    head = _head(reprompts=1, model_retries=1)
    record = HandoffRecord(from_agent="desk", to_agent="billing", to_version="7", step=2, call_id="t1", at=6)
    told = [ToolMessage(tool_call_id="t1", name=CALL.name, content="moved")]
    moved = fsm.Thinking(head).hand_off(
        "bye", [CALL], Usage(), told, record, [SystemMessage(content="billing")], model="m:b", max_steps=5
    )
    new = moved.head
    assert new.phase is Phase.THINKING and new.active_agent == "billing" and new.agent == "desk"
    assert (new.step, new.steps_used, new.max_steps) == (3, 3, 7)  # the target's 5 steps from here
    assert (new.agent_version, new.model, new.reprompts, new.model_retries) == ("7", "m:b", 0, 0)
    assert new.message_count == 4 + 3 and new.handoffs == [record]
    assert [type(m) for m in moved.messages] == [AssistantMessage, ToolMessage, SystemMessage]
    assert [e.kind for e in moved.events] == ["ModelResponded", "HandedOff", "StepStarted"]
    handed = moved.events[1]
    assert isinstance(handed, ev.HandedOff) and (handed.step, handed.to_agent, handed.call_id) == (
        2,
        "billing",
        "t1",
    )
    with pytest.raises(InternalInvariant):  # the system prompt must sit where the record says
        fsm.Thinking(head).hand_off(
            None,
            [CALL],
            Usage(),
            told,
            record.model_copy(update={"at": 5}),
            [SystemMessage(content="b")],
            model="m:b",
            max_steps=5,
        )


def test_a_refused_handoff_stays_with_the_agent() -> None:
    error = RunErrorInfo(kind="InvalidModelAction", message="not handed off")
    told = [ToolMessage(tool_call_id="t1", name=CALL.name, content="Error: not handed off", is_error=True)]
    moved = fsm.Thinking(_head()).refuse_handoff(None, [CALL], Usage(), told, error)
    assert moved.head.active_agent == "desk" and moved.head.handoffs == []
    assert (moved.head.step, moved.head.steps_used, moved.head.message_count) == (3, 3, 6)
    assert [e.kind for e in moved.events] == ["ModelResponded", "StepFailed", "StepStarted"]


S0, S1, S2 = SystemMessage(content="a"), SystemMessage(content="b"), SystemMessage(content="c")
U = UserMessage(content="q")
A1 = AssistantMessage(tool_calls=[CALL])
T1 = ToolMessage(tool_call_id="t1", name=CALL.name, content="moved")


def test_the_conversation_each_agent_sees() -> None:
    stored: list[Message] = [S0, U, A1, T1, S1, AssistantMessage(content="b says")]
    kept = HandoffRecord(from_agent="a", to_agent="b", to_version="1", step=1, call_id="t1", at=4)
    assert conversation_of([], stored) == stored
    assert conversation_of([kept], stored) == [S1, U, A1, T1, AssistantMessage(content="b says")]
    # A second handoff, filtered: its copy stands in for everything before it.
    call2 = ToolCall(id="t2", name="transfer_to_c", arguments={})
    a2, t2 = (
        AssistantMessage(tool_calls=[call2]),
        ToolMessage(tool_call_id="t2", name=call2.name, content="moved"),
    )
    stored += [a2, t2, S2, U, AssistantMessage(content="c says")]
    filtered = HandoffRecord(
        from_agent="b", to_agent="c", to_version="1", step=2, call_id="t2", at=8, history="filtered"
    )
    assert conversation_of([kept, filtered], stored) == [S2, U, AssistantMessage(content="c says")]
    # Kept again after it: the filtered conversation, then what followed.
    stored += [
        AssistantMessage(tool_calls=[CALL.model_copy(update={"id": "t3"})]),
        T1.model_copy(update={"tool_call_id": "t3"}),
        S0,
    ]
    back = HandoffRecord(from_agent="c", to_agent="a", to_version="1", step=3, call_id="t3", at=13)
    seen = conversation_of([kept, filtered, back], stored)
    assert seen[0] == S0 and seen[1:4] == [U, AssistantMessage(content="c says"), stored[11]]
    assert sum(isinstance(m, SystemMessage) for m in seen) == 1


def test_filters_and_pairing() -> None:
    history: list[Message] = [
        U,
        AssistantMessage(content="let me", tool_calls=[CALL]),
        T1,
        AssistantMessage(content="done"),
    ]
    assert remove_tool_calls(history) == [
        U,
        AssistantMessage(content="let me"),
        AssistantMessage(content="done"),
    ]
    assert keep_last_messages(1)(history) == [U, AssistantMessage(content="done")]
    assert keep_last_messages(4)(history) == history
    with pytest.raises(ConfigError):
        keep_last_messages(0)
    # A result without its call goes; a call without its result loses the call (its text stays).
    assert paired([U, T1]) == [U]
    assert paired([U, AssistantMessage(content="x", tool_calls=[CALL])]) == [U, AssistantMessage(content="x")]
    assert paired([AssistantMessage(tool_calls=[CALL])]) == []
    assert paired(history) == history
