"""Agents the eval tests run on real workers: fast scripted models that count their calls.

``evals-a`` answers ``"<n>"`` to ``"double <m>"`` with n = 2m; ``evals-b`` gets multiples of 3 wrong.
Every model call adds one to ``test:eval_calls`` under ``<model>|<input>``, so a test can tell
that each case run asked its model exactly once per repeat. ``slow <m>`` sleeps first (to keep runs
in flight while a test samples the cap or kills workers).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from functools import cache

import redis

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, UserMessage
from shared.tools import ToolSet
from tests.broker import redis_from_env

CALLS_KEY = "test:eval_calls"


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


def _model(name: str, wrong_multiples_of: int | None) -> ScriptedModel:
    def script(messages: Sequence[Message]) -> ModelResponse:
        question = next(m.content for m in reversed(messages) if isinstance(m, UserMessage))
        _redis().hincrby(CALLS_KEY, f"{name}|{question}", 1)
        match = re.search(r"(slow )?double (\d+)", question)
        if match is None:
            return reply("I do not understand.")
        if match.group(1):
            time.sleep(float(os.environ.get("EVAL_SLOW_S", "0.3")))
        m = int(match.group(2))
        wrong = wrong_multiples_of is not None and m % wrong_multiples_of == 0
        return reply(str(2 * m + (1 if wrong else 0)))

    return ScriptedModel(script, chunk=64)


def _echo(messages: Sequence[Message]) -> ModelResponse:
    """Answers with the question itself: an answer holding whatever markup the case's input holds."""
    return reply(next(m.content for m in reversed(messages) if isinstance(m, UserMessage)))


registry = AgentRegistry()
registry.add_model("evals-echo", ScriptedModel(_echo, chunk=64))
registry.add_model("evals-a", _model("evals-a", None))
registry.add_model("evals-b", _model("evals-b", 3))
registry.add(Agent(name="doubler", model="scripted:evals-a", system_prompt="Double it.", tools=ToolSet([])))


def _judge_strict(messages: Sequence[Message]) -> ModelResponse:
    """Score 1 when the graded answer equals the expected one, else 0: a well-behaved judge."""
    prompt = next(m.content for m in reversed(messages) if isinstance(m, UserMessage))
    expected = re.search(r"Expected answer:\n(.*?)\n\n", prompt, re.S)
    answer = prompt.rsplit("Answer to grade:\n", 1)[-1].strip()
    right = expected is not None and expected.group(1).strip().strip('"') == answer
    return reply(f'{{"score": {1 if right else 0}, "reason": "{"matches" if right else "differs"}"}}')


registry.add_model("judge-strict", ScriptedModel(_judge_strict))
registry.add_model("judge-garbage", ScriptedModel([reply("Looks good to me!")] * 1000))
