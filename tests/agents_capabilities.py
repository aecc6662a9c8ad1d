"""Agents of the capability tests (structured output, prompt templates, middleware, richer tools).

The scripted models here answer from the conversation they are given, so any worker that picks a
phase up answers the same; a few also record which process called them (``test:model_pids``,
keyed by the run's input) so a test can kill that process in the middle of the call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.policy import Policy, Reprompt
from shared.prompts import Prompt
from tests.agents_fixture import TOOLS

#: input -> pid of the process that last called a model of this module.
MODEL_PIDS_KEY = "test:model_pids"
#: input:turn -> how many times the model was called for that turn.
MODEL_CALLS_KEY = "test:model_calls"
#: Inputs that start with this make a model's first call hang until its process is killed.
HANG_FIRST = "hang:"


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["WESICHAIN_REDIS_URL"], decode_responses=True)


def _user(messages: Sequence[Message]) -> str:
    return next(m.content for m in messages if isinstance(m, UserMessage))


def _observe_call(messages: Sequence[Message]) -> None:
    """Count the call, note its process; a ``hang:`` run's first call of its first turn never returns."""
    user = _user(messages)
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    calls = int(_redis().hincrby(MODEL_CALLS_KEY, f"{user}:{turn}", 1))
    _redis().hset(MODEL_PIDS_KEY, user, os.getpid())
    if user.startswith(HANG_FIRST) and turn == 0 and calls == 1:
        time.sleep(3600)  # only a SIGKILL ends this


class Verdict(BaseModel):
    """What the structured agents answer."""

    title: str = Field(max_length=100)
    score: int = Field(ge=0, le=10)
    tags: list[str] = Field(default_factory=list)


def _schema_told(messages: Sequence[Message]) -> bool:
    system = messages[0]
    return isinstance(system, SystemMessage) and '"score"' in system.content and "schema" in system.content


def _structured(messages: Sequence[Message]) -> ModelResponse:
    """A tool hop, then a wrong answer, then (once told why) the answer in the right shape."""
    _observe_call(messages)
    if not _schema_told(messages):
        return reply("nobody told me the schema")
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    if turn == 0:
        return reply(None, ("add", {"a": 2, "b": 5}))
    if turn == 1:
        return reply('{"title": "sum", "score": 70}')  # score out of range
    last_correction = [m for m in messages if isinstance(m, UserMessage)][-1].content
    assert "score" in last_correction and "less than or equal to 10" in last_correction, last_correction
    total = next(m.content for m in messages if isinstance(m, ToolMessage))
    answer = {"title": "sum", "score": 7, "tags": [f"total={total}"]}
    return reply("```json\n" + json.dumps(answer) + "\n```")


def _never_valid(messages: Sequence[Message]) -> ModelResponse:
    return reply("I will not answer in JSON")


def _echo_prompts(messages: Sequence[Message]) -> ModelResponse:
    """Answers with the system prompt and the user message it was given."""
    system = messages[0].content if isinstance(messages[0], SystemMessage) else ""
    return reply(f"system={system!r} user={_user(messages)!r}")


registry = AgentRegistry()
registry.add_model("structured", ScriptedModel(_structured))
registry.add(
    Agent(
        name="structured",
        model="scripted:structured",
        system_prompt="You grade sums.",
        tools=TOOLS,
        output_type=Verdict,
        policy=Policy(on_invalid_action=Reprompt(n=2)),
    )
)
registry.add_model("never_valid", ScriptedModel(_never_valid))
registry.add(
    Agent(
        name="structured_strict",
        model="scripted:never_valid",
        system_prompt="You grade sums.",
        tools=TOOLS,
        output_type=Verdict,
    )
)
registry.add_model("echo_prompts", ScriptedModel(_echo_prompts))
registry.add(
    Agent(
        name="templated",
        model="scripted:echo_prompts",
        system_prompt=Prompt("You answer in {language}, for {audience}."),
        input_template=Prompt("Question ({audience}): {input}"),
        tools=TOOLS,
    )
)
