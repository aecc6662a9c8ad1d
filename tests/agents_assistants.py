"""Agents of the assistants tests: ``concierge`` lets assistants configure everything it can, and
its two scripted models record what each call received (``SEEN_KEY``, a list per run input: the
model, the system prompt, the tools offered), so a test asserts on what a run really ran with.

Inputs steer the model: ``forge ...`` calls ``book`` whatever is offered; ``hold ...`` calls
``hold``, a tool that records its process (``HOLD_PIDS_KEY``) and waits for ``RELEASE_KEY``; any
other input calls ``lookup``. After a tool result the model answers ``done by <model>``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.configurable import Configurable
from shared.llm.base import ModelRequest, ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, SystemMessage, ToolMessage, UserMessage
from shared.prompts import Prompt
from shared.tools import ToolContext, ToolSet, tool
from tests.broker import redis_from_env

SEEN_KEY = "test:asst:seen:{}"
EFFECTS_KEY = "test:asst:effects"
HOLD_PIDS_KEY = "test:asst:hold-pids"
RELEASE_KEY = "test:asst:release:{}"
#: The default system prompt (a template: an assistant's template value fills ``{hotel}``).
PROMPT = "You help the guests of {hotel}."


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


class Empty(BaseModel):
    pass


@tool(retry_safe=True)
def lookup(args: Empty, ctx: ToolContext) -> str:
    """Look something up."""
    return "found"


@tool(retry_safe=False)
def book(args: Empty, ctx: ToolContext) -> str:
    """Book something (an effect, recorded)."""
    _redis().hincrby(EFFECTS_KEY, ctx.run_id, 1)
    return "booked"


@tool(retry_safe=True, timeout_s=120)
def hold(args: Empty, ctx: ToolContext) -> str:
    """Wait until the test lets the call finish."""
    r = _redis()
    r.hset(HOLD_PIDS_KEY, ctx.run_id, os.getpid())
    deadline = time.monotonic() + 110
    while time.monotonic() < deadline and not r.exists(RELEASE_KEY.format(ctx.run_id)):
        time.sleep(0.05)
    return "held"


def _input(messages: Sequence[Message]) -> str:
    return next((m.content for m in messages if isinstance(m, UserMessage)), "")


def _script(messages: Sequence[Message], model: str) -> ModelResponse:
    if any(isinstance(m, ToolMessage) for m in messages):
        return reply(f"done by {model}")
    text = _input(messages)
    name = "book" if text.startswith("forge") else "hold" if text.startswith("hold") else "lookup"
    return reply(None, (name, {}))


class Recording(ScriptedModel):
    """A scripted model that records every request it gets."""

    def __init__(self, name: str) -> None:
        super().__init__(lambda messages: _script(messages, name))
        self.name = name

    def complete(self, request: ModelRequest) -> ModelResponse:
        system = next((m.content for m in request.messages if isinstance(m, SystemMessage)), "")
        seen = {
            "model": self.name,
            "system": system,
            "tools": [t.name for t in request.tools],
            "pid": os.getpid(),
        }
        _redis().rpush(SEEN_KEY.format(_input(request.messages)), json.dumps(seen))
        return super().complete(request)


registry = AgentRegistry()
registry.add_model("concierge-a", Recording("concierge-a"))
registry.add_model("concierge-b", Recording("concierge-b"))
registry.add(
    Agent(
        name="concierge",
        model="scripted:concierge-a",
        system_prompt=Prompt(PROMPT),
        tools=ToolSet([lookup, book, hold]),
        configurable=Configurable(
            model=True,
            system_prompt=True,
            template_values=("hotel",),
            tools=True,
            max_steps=(1, 20),
            policy=("on_tool_error",),
        ),
    )
)
registry.add(
    Agent(name="plain", model="scripted:concierge-a", system_prompt="Plain.", tools=ToolSet([lookup]))
)
