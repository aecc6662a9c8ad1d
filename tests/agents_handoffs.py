"""Agents of the handoff tests: a triage desk that hands the conversation to billing (imported by
path by real workers, like any agents module).

Each agent's scripted model answers from the conversation it is given, so any worker that picks a
phase up answers the same. What the run's input starts with decides what triage asks for:

* ``refund ORDER``: a handoff to ``billing``, whose ``issue_refund`` tool (not retry-safe, its effect
  counted under ``EFFECTS_KEY`` by idempotency key) runs, and whose answer ends the run;
* ``mixed ORDER``: the handoff and an ``issue_refund`` call in one reply (the call must not run);
* ``ghost``: a handoff to an agent no worker has (refused; triage answers itself);
* ``pingpong``: triage and billing hand the conversation back and forth until the limit refuses;
* ``slow ORDER``: a handoff to ``billing`` through the filtered handoff whose input filter hangs
  on its first call for that input (``FILTER_PIDS_KEY`` names the process), until killed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.handoffs import Handoff, remove_tool_calls
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, SystemMessage, ToolMessage, UserMessage
from shared.tools import ToolContext, ToolSet, tool
from tests.broker import redis_from_env

__all__ = ["EFFECTS_KEY", "FILTER_CALLS_KEY", "FILTER_PIDS_KEY", "registry"]

#: idempotency key -> how many times ``issue_refund`` ran for it.
EFFECTS_KEY = "test:handoff:effects"
#: input -> pid of the process whose input filter is hanging.
FILTER_PIDS_KEY = "test:handoff:filter_pids"
#: input -> how many times the input filter was called for it.
FILTER_CALLS_KEY = "test:handoff:filter_calls"

BILLING_PROMPT = "You are billing. Refund orders with issue_refund."
TRIAGE_PROMPT = "You are the triage desk. Hand billing questions to billing."


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


class RefundArgs(BaseModel):
    order: str = Field(min_length=1, max_length=50)


@tool(retry_safe=False)
def issue_refund(args: RefundArgs, ctx: ToolContext) -> str:
    """Refund an order (once: it is not retry-safe)."""
    _redis().hincrby(EFFECTS_KEY, ctx.idempotency_key, 1)
    return f"refunded {args.order}"


def _user(messages: Sequence[Message]) -> str:
    return next((m.content for m in messages if isinstance(m, UserMessage)), "")


def _results(messages: Sequence[Message], name: str) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage) and m.name == name]


def _since_system(messages: Sequence[Message]) -> list[Message]:
    """What was said since the last system prompt (a scripted model sees one, first)."""
    return list(messages[1:])


def _triage(messages: Sequence[Message]) -> ModelResponse:
    assert isinstance(messages[0], SystemMessage) and messages[0].content == TRIAGE_PROMPT, messages[0]
    text = _user(messages)
    order = text.partition(" ")[2]
    refused = [
        m for m in messages if isinstance(m, ToolMessage) and m.is_error and m.name.startswith("transfer_to_")
    ]
    if refused:
        return reply(f"triage carries on: {refused[-1].content}")
    if text.startswith("refund"):
        return reply("Passing you to billing.", ("transfer_to_billing", {}))
    if text.startswith("mixed"):
        return reply(None, ("issue_refund", {"order": order}), ("transfer_to_billing", {}))
    if text.startswith("slow"):
        return reply(None, ("transfer_to_billing_filtered", {}))
    if text.startswith("ghost"):
        return reply(None, ("transfer_to_ghost", {}))
    if text.startswith("pingpong"):
        return reply(None, ("transfer_to_billing", {}))
    return reply("triage has nothing to do")


def _billing(messages: Sequence[Message]) -> ModelResponse:
    assert isinstance(messages[0], SystemMessage) and messages[0].content == BILLING_PROMPT, messages[0]
    text = _user(messages)
    if text.startswith("pingpong"):
        return reply(None, ("transfer_to_triage", {}))
    done = _results(messages, "issue_refund")
    ran = [m for m in done if not m.content.startswith("Not run")]
    if not ran:
        return reply(None, ("issue_refund", {"order": text.partition(" ")[2]}))
    return reply(f"billing: {ran[-1].content}")


def _slow_filter(messages: list[Message]) -> list[Message]:
    """Drops the tool calls; its first call for an input hangs until its process is killed."""
    text = _user(messages)
    r = _redis()
    if int(r.hincrby(FILTER_CALLS_KEY, text, 1)) == 1:
        r.hset(FILTER_PIDS_KEY, text, os.getpid())
        time.sleep(3600)  # only a SIGKILL ends this
    return remove_tool_calls(messages)


registry = AgentRegistry()
registry.add_model("triage", ScriptedModel(_triage))
registry.add_model("billing", ScriptedModel(_billing))
registry.add(
    Agent(
        name="triage",
        model="scripted:triage",
        system_prompt=TRIAGE_PROMPT,
        tools=ToolSet([issue_refund]),
        handoffs=(
            "billing",
            "ghost",
            Handoff(
                "billing",
                tool_name="transfer_to_billing_filtered",
                description="Hand over to billing, without the tool calls so far.",
                input_filter=_slow_filter,
            ),
        ),
        max_handoffs=2,
        max_steps=4,
    )
)
registry.add(
    Agent(
        name="billing",
        model="scripted:billing",
        system_prompt=BILLING_PROMPT,
        tools=ToolSet([issue_refund]),
        handoffs=("triage",),
        max_handoffs=2,
        max_steps=3,
        version="7",
    )
)
