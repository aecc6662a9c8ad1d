"""Agents of the reliability tests (imported by path by real workers, like any agents module; the
embedded one runs in process).

* ``progress_stalled``: one retry-safe call that reports three progress events, then (its first
  delivery only) waits until the test releases it; the think after the call waits too, so the run
  is still going when a stalled delivery's late result comes in. Keys are named by the run id
  (the tool) and the run's input (the model).
* ``answer_held``: answers with every user message it was told; its first think (told only the
  input) waits until the test releases it, so a message can be sent while the run's last think
  asks the model. ``ANSWER_HOLDING_KEY`` names the process that holds.
* ``progress_embedded``: one call that reports three progress events and returns: nothing outside
  the run, so it runs in the embedded mode.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.tools import ToolContext, ToolSet, tool
from tests.broker import redis_from_env

__all__ = ["ANSWER_HOLDING_KEY", "ANSWER_RELEASE_KEY", "CALL_PIDS_KEY", "TOOL_RELEASE_KEY", "registry"]

#: List per run: the pid of each delivery of the stalled call, in the order they started.
CALL_PIDS_KEY = "test:stalled:pids:"
#: String per run: set by the test to let the stalled call's first delivery return.
TOOL_RELEASE_KEY = "test:stalled:release:"
#: String per run input: set by the test to let the think after the call answer.
ANSWER_RELEASE_KEY = "test:stalled:answer:"
#: String per run input: the pid of the process whose think of ``answer_held`` holds.
ANSWER_HOLDING_KEY = "test:answer:holding:"
#: How long anything here waits for the test at most.
WAIT_S = 120


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


def _wait_for(key: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not _redis().exists(key):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released it")
        time.sleep(0.02)


class StepsArgs(BaseModel):
    steps: int = Field(default=3, ge=1, le=10)


@tool
def progress_until_released(args: StepsArgs, ctx: ToolContext) -> str:
    """Report progress; the first delivery then waits for the test (retry-safe)."""
    first = _redis().rpush(CALL_PIDS_KEY + ctx.run_id, os.getpid()) == 1
    for done in range(1, args.steps + 1):
        ctx.emit("progress", {"done": done, "pid": os.getpid()})
    if first:
        _wait_for(TOOL_RELEASE_KEY + ctx.run_id)
    return f"reported by {os.getpid()}"


@tool
def report_progress(args: StepsArgs, ctx: ToolContext) -> str:
    """Report progress, then return."""
    for done in range(1, args.steps + 1):
        ctx.emit("progress", {"done": done, "of": args.steps})
    return f"{args.steps} steps reported"


def _stalled(messages: Sequence[Message]) -> ModelResponse:
    if not any(isinstance(m, ToolMessage) for m in messages):
        return reply(None, ("progress_until_released", {"steps": 3}))
    token = next(m.content for m in messages if isinstance(m, UserMessage))
    _wait_for(ANSWER_RELEASE_KEY + token)
    return reply("progress reported")


def _answer_held(messages: Sequence[Message]) -> ModelResponse:
    said = [m.content for m in messages if isinstance(m, UserMessage)]
    if len(said) == 1:
        _redis().set(ANSWER_HOLDING_KEY + said[0], os.getpid(), ex=3600)
        _wait_for(ANSWER_RELEASE_KEY + said[0])
    return reply("heard: " + " | ".join(said))


registry = AgentRegistry()
registry.add_model("answer_held", ScriptedModel(_answer_held))
registry.add(Agent(name="answer_held", model="scripted:answer_held", system_prompt="listens"))
registry.add_model("progress_stalled", ScriptedModel(_stalled))
registry.add(
    Agent(
        name="progress_stalled",
        model="scripted:progress_stalled",
        system_prompt="reports progress",
        tools=ToolSet([progress_until_released]),
    )
)
registry.add_model(
    "progress_embedded",
    ScriptedModel([reply(None, ("report_progress", {"steps": 3})), reply("progress reported")]),
)
registry.add(
    Agent(
        name="progress_embedded",
        model="scripted:progress_embedded",
        system_prompt="reports progress",
        tools=ToolSet([report_progress]),
    )
)
