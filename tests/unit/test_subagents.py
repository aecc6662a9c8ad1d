"""Planning a step's subagent calls: their child runs, and the limits."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from shared.agents import Agent
from shared.errors import InvalidModelAction
from shared.fsm import Thinking
from shared.llm.base import Usage
from shared.messages import ToolCall
from shared.state import ChildRun, ParentLink, RunHead
from shared.subagents import AgentTool, child_run_id, plan_children
from shared.tasks import TASK_SPAWN, task_for
from shared.tools import ToolSet, tool


class NoArgs(BaseModel):
    pass


@tool
def clock(args: NoArgs) -> str:
    """The time."""
    return "now"


AGENT = Agent(
    name="lead",
    model="scripted:x",
    system_prompt="p",
    tools=ToolSet([AgentTool("researcher"), AgentTool("writer", name="write"), clock]),
    max_children=3,
    max_subagent_depth=2,
)


def _head(**changes: object) -> RunHead:
    return RunHead.new_idle("p1", "lead", "q").model_copy(update={"step": 2, **changes})


def _call(i: int, name: str = "researcher") -> ToolCall:
    return ToolCall(id=f"call_{i}", name=name, arguments={"task": f"t{i}"} if name != "clock" else {})


def test_each_subagent_call_gets_its_child_run() -> None:
    children = plan_children(AGENT, _head(), [_call(0), _call(1, "write")])
    assert children == [
        ChildRun(call_id="call_0", run_id="p1.s2.call_0", agent="researcher", input="t0"),
        ChildRun(call_id="call_1", run_id="p1.s2.call_1", agent="writer", input="t1"),
    ]
    assert child_run_id("p1", 2, "call_0") == "p1.s2.call_0"
    assert plan_children(AGENT, _head(), [_call(0, "clock")]) == []
    # The park's outbox starts each child.
    parked = (
        Thinking(_head(max_steps=5)).delegate(None, [_call(0), _call(1, "write")], Usage(), children).head
    )
    assert [t.name for t in task_for(parked)] == [TASK_SPAWN, TASK_SPAWN]
    assert [t.arguments["call_id"] for t in task_for(parked)] == ["call_0", "call_1"]
    assert parked.children == 2 and parked.approval is not None and parked.approval.kind == "children"


@pytest.mark.parametrize(
    ("head", "calls", "problem"),
    [
        (_head(), [_call(0), _call(1, "clock")], "cannot share a step with other tool calls \\(clock\\)"),
        (_head(parent=ParentLink(run_id="x", step=1, call_id="c", depth=2)), [_call(0)], "nest 2 deep"),
        (_head(children=2), [_call(0), _call(1)], "started 2 of its 3 subagent runs; 2 more"),
    ],
)
def test_limits_are_invalid_actions(head: RunHead, calls: list[ToolCall], problem: str) -> None:
    with pytest.raises(InvalidModelAction, match=problem):
        plan_children(AGENT, head, calls)


def test_a_subagent_call_needs_no_approval_of_its_own() -> None:
    agent = Agent(
        name="a", model="scripted:x", system_prompt="p", tools=ToolSet([AgentTool("r")]), approval_risk="low"
    )
    assert not agent.needs_approval(_call(0, "r"))
