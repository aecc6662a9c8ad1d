"""Agents of the long-term memory tests (imported by path by real workers, like any agents module).

One agent, ``keeper``, whose scripted model reads the run's input and calls one tool:

* ``remember NS KEY TEXT``: ``remember`` puts ``{"text": TEXT}`` under ``(user, NS)`` / ``KEY``;
* ``recall NS QUERY``: ``recall`` searches ``(user, NS)`` for ``QUERY`` and answers the texts found;
* ``held NS KEY TEXT``: ``remember`` with a first attempt that, after its put, holds until its
  process is killed (``HELD_PIDS_KEY`` names the process; ``PUTS_KEY`` counts the puts made);
* ``middleware NS KEY``: no tool; the ``Remembering`` middleware puts ``{"seen": KEY}`` before the
  model is asked.

``remember`` records the process that ran it under ``TOOL_PIDS_KEY``. ``gated_letters`` is an
embedding (``WESICHAIN_MEMORY_EMBEDDING``) that holds every put it embeds until the test opens its
gate: a worker applies a recorded call's writes after the result, so it holds them there.

Then it answers with the tool's result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelRequest, ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.middleware import Middleware, MiddlewareContext
from shared.tools import ToolContext, ToolSet, tool
from tests.agents_fixture import GATE_DIR_ENV
from tests.broker import redis_from_env
from tests.toy_embedding import letters

__all__ = [
    "EMBED_CALLS",
    "EMBED_OPEN",
    "HELD_PIDS_KEY",
    "PUTS_KEY",
    "TOOL_PIDS_KEY",
    "gated_letters",
    "registry",
]

#: idempotency key -> pid of the process whose ``remember`` call holds after its put.
HELD_PIDS_KEY = "test:memory:held_pids"
#: idempotency key -> how many times ``remember`` called ``ctx.memory.put`` for it.
PUTS_KEY = "test:memory:puts"
#: idempotency key -> pid of the process that ran ``remember`` last.
TOOL_PIDS_KEY = "test:memory:tool_pids"
#: Files under the gate directory (``GATE_DIR_ENV``): a line per embedding made (its pid), and the
#: gate that lets them go on. Files, not Redis: the test fills Redis while they wait.
EMBED_CALLS = "embedding.calls"
EMBED_OPEN = "embedding.open"
#: How long an embedding waits for its gate at most.
EMBED_HOLD_S = 120.0


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


class RememberArgs(BaseModel):
    namespace: str = Field(min_length=1, max_length=60)
    key: str = Field(min_length=1, max_length=60)
    text: str = Field(max_length=500)
    hold: bool = False


@tool
def remember(args: RememberArgs, ctx: ToolContext) -> str:
    """Remember a text (retry-safe); with ``hold``, its first attempt then waits to be killed."""
    ctx.memory.put(["user", args.namespace], args.key, {"text": args.text, "pid": os.getpid()})
    r = _redis()
    r.hincrby(PUTS_KEY, ctx.idempotency_key, 1)
    r.hset(TOOL_PIDS_KEY, ctx.idempotency_key, os.getpid())
    if args.hold and r.hsetnx(HELD_PIDS_KEY, ctx.idempotency_key, os.getpid()):
        time.sleep(3600)  # only a SIGKILL ends this
    return f"remembered {args.key}"


def gated_letters(text: str) -> Sequence[float]:
    """The toy letter-count embedding, made only once the gate file exists (each call noted first)."""
    gate = os.environ[GATE_DIR_ENV]
    with open(os.path.join(gate, EMBED_CALLS), "a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + EMBED_HOLD_S
    while not os.path.exists(os.path.join(gate, EMBED_OPEN)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return letters(text)


class RecallArgs(BaseModel):
    namespace: str = Field(min_length=1, max_length=60)
    query: str = Field(max_length=200)


@tool
def recall(args: RecallArgs, ctx: ToolContext) -> str:
    """Search memory for texts holding the query."""
    found = ctx.memory.search(["user", args.namespace], query=args.query, limit=10)
    return "; ".join(str(item.value["text"]) for item in found.items) or "nothing"


class Remembering(Middleware):
    """Before the model is asked for a ``middleware NS KEY`` input: remember that it was seen."""

    def before_model(self, ctx: MiddlewareContext, request: ModelRequest) -> ModelRequest:
        words = _user(request.messages).split()
        if ctx.memory is not None and words[:1] == ["middleware"] and ctx.step == 1:
            ctx.memory.put(["user", words[1]], words[2], {"seen": words[2]})
        return request


def _user(messages: Sequence[Message]) -> str:
    return next((m.content for m in messages if isinstance(m, UserMessage)), "")


def _keeper(messages: Sequence[Message]) -> ModelResponse:
    done = [m for m in messages if isinstance(m, ToolMessage)]
    if done:
        return reply(done[-1].content)
    verb, _, rest = _user(messages).partition(" ")
    if verb in ("remember", "held"):
        namespace, key, text = (rest.split(" ", 2) + ["", ""])[:3]
        return reply(
            None, ("remember", {"namespace": namespace, "key": key, "text": text, "hold": verb == "held"})
        )
    if verb == "recall":
        namespace, _, query = rest.partition(" ")
        return reply(None, ("recall", {"namespace": namespace, "query": query}))
    return reply("nothing to do")


registry = AgentRegistry()
registry.add_model("keeper", ScriptedModel(_keeper))
registry.add(
    Agent(
        name="keeper",
        model="scripted:keeper",
        system_prompt="You keep memories.",
        tools=ToolSet([remember, recall]),
        middleware=(Remembering(),),
    )
)
