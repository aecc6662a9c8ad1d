"""Subagents: an agent as a tool of another (``AgentTool(agent="researcher")``).

A call of an agent tool is not run in a tool task: it starts a *child run* of that agent on the
pool, with its own state, events and step budget. The parent's think commits the step's subagent
calls as a park (``Approval(kind="children")``), so it holds no worker while they run; the park's
outbox has one ``wesichain.spawn`` task per call, which creates the child (its id derived from the
parent's, the step and the call: a redelivered spawn finds it already there) and sends its start.
A child ends like any run, and its completion callback (the durable ``wesichain.child_done``
task, delivered at least once) records its answer, its structured output or its error as the
parent's tool result; the last one in wakes the parent, which goes on with the results.

Cancelling the parent cancels its children (and theirs). Limits: ``Agent.max_subagent_depth``
(how deep children may nest) and ``Agent.max_children`` (children per run, in total).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field, TypeAdapter

from shared.agents import Agent
from shared.errors import ConfigError, InvalidModelAction
from shared.messages import ToolCall
from shared.state import ChildRun, RunHead
from shared.tools import Tool

__all__ = ["AgentTool", "SubagentTask", "child_run_id", "plan_children"]


class SubagentTask(BaseModel):
    """What the model gives a subagent: the task, as the child run's input."""

    task: str = Field(
        min_length=1, max_length=20_000, description="The task for the subagent, self-contained"
    )


_STR: TypeAdapter[str] = TypeAdapter(str)


def _not_called(args: SubagentTask) -> str:
    raise RuntimeError("a subagent call runs as a child run, never as a function")


@dataclass(frozen=True, init=False)
class AgentTool(Tool):
    """The agent named ``agent`` (registered in the same agents module) as a tool."""

    def __init__(
        self, agent: str, *, name: str | None = None, description: str | None = None, timeout_s: float = 60.0
    ) -> None:
        if not agent:
            raise ConfigError("AgentTool needs the name of the agent it runs")
        values = {
            "name": name or agent.replace("-", "_").replace(".", "_"),
            "description": description
            or f"Delegate a self-contained task to the {agent} agent; it answers with its final result.",
            "args_model": SubagentTask,
            "result_adapter": _STR,
            "fn": _not_called,
            "takes_context": False,
            "retry_safe": False,
            "timeout_s": timeout_s,
            "subagent": agent,
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)
        for key, fld in Tool.__dataclass_fields__.items():
            if key not in values:
                object.__setattr__(self, key, fld.default)


def plan_children(agent: Agent, head: RunHead, calls: Sequence[ToolCall]) -> list[ChildRun]:
    """The child runs of a step's subagent calls (none: no call is one), or InvalidModelAction
    when they cannot be started: mixed with other calls, nested too deep, or too many."""
    subagents = {c.id: t.subagent for c in calls if (t := agent.tools.get(c.name)) and t.subagent}
    if not subagents:
        return []
    step = head.step
    if len(subagents) != len(calls):
        others = sorted({c.name for c in calls if c.id not in subagents})
        raise InvalidModelAction(
            f"subagent calls cannot share a step with other tool calls ({', '.join(others)});"
            " call the subagents in a step of their own",
            step=step,
        )
    depth = head.parent.depth if head.parent is not None else 0
    if depth + 1 > agent.max_subagent_depth:
        raise InvalidModelAction(
            f"subagents may nest {agent.max_subagent_depth} deep and this run is at depth {depth}:"
            " answer without them",
            step=step,
        )
    if head.children + len(calls) > agent.max_children:
        raise InvalidModelAction(
            f"this run has started {head.children} of its {agent.max_children} subagent runs;"
            f" {len(calls)} more would pass the limit",
            step=step,
        )
    return [
        ChildRun(
            call_id=c.id,
            run_id=child_run_id(head.run_id, step, c.id),
            agent=subagents[c.id],
            input=str(c.arguments["task"]),
        )
        for c in calls
    ]


def child_run_id(parent_run_id: str, step: int, call_id: str) -> str:
    """The child run of a subagent call: the same call always names the same child."""
    return f"{parent_run_id}.s{step}.{call_id}"
