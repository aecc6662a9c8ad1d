"""Agents of the run page's browser tests (imported by path by real workers, like any agents
module): a parked call whose arguments and answer carry markup and script, a run with two subagent
runs, a run that fails in its tool, a call that reports progress and holds on its first attempt
(a test kills its worker there), a front desk that hands its conversation to refunds, and a tool
whose custom events carry markup."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage
from shared.policy import Policy
from shared.subagents import AgentTool
from shared.tools import ToolContext, ToolSet, tool
from tests.agents_fixture import TOOLS

__all__ = ["HOSTILE", "registry"]

#: Markup and script a page must show as text: run as markup, it would set ``window.__pwned``.
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script><b>bold</b>'

registry = AgentRegistry()


def _hostile_charge(messages: Sequence[Message]) -> ModelResponse:
    """Ask for a charge labelled with markup; then answer with the reviewer's outcome and markup."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return reply(None, ("charge", {"seconds": 0, "label": HOSTILE}))
    return reply(f"{'denied' if results[-1].is_error else 'charged'} {HOSTILE}")


registry.add_model("hostile_charge", ScriptedModel(_hostile_charge))
registry.add(
    Agent(
        name="hostile_charge",
        model="scripted:hostile_charge",
        system_prompt="a charge a human approves",
        tools=TOOLS,
        approval_required=frozenset({"charge"}),
    )
)


def _delegator(messages: Sequence[Message]) -> ModelResponse:
    if not any(isinstance(m, ToolMessage) for m in messages):
        return reply(
            None, ("helper", {"task": "find the first fact"}), ("helper", {"task": "find the second"})
        )
    return reply("both helpers answered")


registry.add_model("delegator", ScriptedModel(_delegator))
registry.add_model("helper", ScriptedModel([reply("helped")]))
registry.add(
    Agent(
        name="delegator",
        model="scripted:delegator",
        system_prompt="delegates",
        tools=ToolSet([AgentTool("helper")]),
    )
)
registry.add(Agent(name="helper", model="scripted:helper", system_prompt="helps", tools=TOOLS))

registry.add_model("tool_fails", ScriptedModel([reply(None, ("boom", {}))]))
registry.add(
    Agent(
        name="tool_fails",
        model="scripted:tool_fails",
        system_prompt="its tool fails",
        tools=TOOLS,
        policy=Policy(on_tool_error="fail_fast"),
    )
)

#: Its call's first attempt reports three progress events, then holds for 30 s (to be killed).
registry.add_model(
    "progress_held",
    ScriptedModel([reply(None, ("progress", {"steps": 3, "hold_s": 30})), reply("progress reported")]),
)
registry.add(
    Agent(name="progress_held", model="scripted:progress_held", system_prompt="progress", tools=TOOLS)
)


# -- a handoff, and custom events with markup in them ----------------------------------------------


def _desk(messages: Sequence[Message]) -> ModelResponse:
    """The front desk hands every conversation to refunds, saying so with markup."""
    return reply(f"Passing you to refunds {HOSTILE}", ("transfer_to_refunds", {}))


registry.add_model("desk", ScriptedModel(_desk))


def _refunds(messages: Sequence[Message]) -> ModelResponse:
    return reply(f"refunds took it {HOSTILE}")


registry.add_model("refunds", ScriptedModel(_refunds))
registry.add(
    Agent(
        name="desk",
        model="scripted:desk",
        system_prompt="the front desk",
        handoffs=("refunds",),
        max_handoffs=1,
    )
)
registry.add(Agent(name="refunds", model="scripted:refunds", system_prompt="refunds", version="3"))


class ShoutArgs(BaseModel):
    times: int = Field(ge=1, le=5)


@tool
def shout(args: ShoutArgs, ctx: ToolContext) -> str:
    """Report ``times`` custom events whose data holds markup, then answer."""
    for n in range(1, args.times + 1):
        ctx.emit("note", {"n": n, "text": HOSTILE})
    return f"shouted {args.times} times"


registry.add_model("shouter", ScriptedModel([reply(None, ("shout", {"times": 2})), reply("shouting done")]))
registry.add(Agent(name="shouter", model="scripted:shouter", system_prompt="shouts", tools=ToolSet([shout])))
