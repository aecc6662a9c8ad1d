"""Agents and pipelines the pipeline tests run on real workers: fast scripted models that count
their calls in Redis (``test:pipe_calls``, ``<agent>|<input>`` -> calls), so a test can tell that
every child run asked its model exactly once.

* ``splitter`` turns ``"a,b,c"`` into ``Parts(items=["a", "b", "c"])``;
* ``worker`` answers ``"done <x>"``; ``slow <x>`` sleeps first (``PIPE_SLOW_S``), ``fail <x>`` fails
  (a non-retryable model error), ``flaky <x>`` fails on its first call and answers on the next;
* ``joiner`` answers with its input as it is (so a test sees what the reduce got);
* ``triage`` answers ``Route(route=...)``: ``math`` when the input has a digit, else ``words``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import cache
from typing import Literal

import redis
from pydantic import BaseModel

from shared.agents import Agent, AgentRegistry
from shared.errors import ModelTransport
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.pipeline.definition import Pipeline
from shared.tools import ToolContext, ToolSet, tool
from tests.broker import redis_from_env

CALLS_KEY = "test:pipe_calls"


class Parts(BaseModel):
    items: list[str]


class Route(BaseModel):
    route: Literal["math", "words"]


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


def _question(messages: Sequence[Message]) -> str:
    return next(m.content for m in reversed(messages) if isinstance(m, UserMessage))


def _counted(agent: str, messages: Sequence[Message]) -> tuple[str, int]:
    question = _question(messages)
    return question, int(_redis().hincrby(CALLS_KEY, f"{agent}|{question}", 1))


def _splitter(messages: Sequence[Message]) -> ModelResponse:
    question, _ = _counted("splitter", messages)
    items = [p.strip() for p in question.split(",") if p.strip()]
    return reply(Parts(items=items).model_dump_json())


def _worker(messages: Sequence[Message]) -> ModelResponse:
    question, calls = _counted("worker", messages)
    if question.startswith("slow "):
        time.sleep(float(os.environ.get("PIPE_SLOW_S", "0.3")))
    if question.startswith("fail ") or (question.startswith("flaky ") and calls == 1):
        raise ModelTransport(f"scripted failure for {question!r}", retryable=False)
    return reply(f"done {question}")


def _joiner(messages: Sequence[Message]) -> ModelResponse:
    question, _ = _counted("joiner", messages)
    if os.environ.get("PIPE_SLOW_REDUCE_S"):
        time.sleep(float(os.environ["PIPE_SLOW_REDUCE_S"]))
    return reply(question)


def _triage(messages: Sequence[Message]) -> ModelResponse:
    question, _ = _counted("triage", messages)
    route = "math" if any(c.isdigit() for c in question) else "words"
    return reply(Route(route=route).model_dump_json())


registry = AgentRegistry()
for _name, _fn in (("splitter", _splitter), ("worker", _worker), ("joiner", _joiner), ("triage", _triage)):
    registry.add_model(_name, ScriptedModel(_fn, chunk=64))
registry.add(Agent(name="splitter", model="scripted:splitter", system_prompt="Split.", output_type=Parts))
registry.add(Agent(name="worker", model="scripted:worker", system_prompt="Work."))
registry.add(Agent(name="joiner", model="scripted:joiner", system_prompt="Join."))
registry.add(Agent(name="triage", model="scripted:triage", system_prompt="Route.", output_type=Route))


def items_of(parts: Parts) -> list[str]:
    return parts.items


def numbered(answers: list[str]) -> str:
    return " | ".join(f"{i}:{a}" for i, a in enumerate(answers))


def cap_of() -> int:
    return int(os.environ.get("PIPE_CAP", "8"))


registry.add_pipeline(Pipeline("chain").then("worker").then("worker", input=lambda a: f"again {a}"))
registry.add_pipeline(
    Pipeline("fan")
    .then("splitter")
    .map("worker", over=items_of, concurrency=cap_of())
    .reduce("joiner", input=numbered)
)
registry.add_pipeline(
    Pipeline("fan-retry")
    .then("splitter")
    .map("worker", over=items_of, concurrency=4, retries=1)
    .reduce("joiner", input=numbered)
)
registry.add_pipeline(
    Pipeline("fan-skip")
    .then("splitter")
    .map("worker", over=items_of, concurrency=4, on_error="skip")
    .reduce("joiner", input=numbered)
)
registry.add_pipeline(
    Pipeline("math", input_type=Route).then("worker", input=lambda r: f"math for {r.route}")
)
registry.add_pipeline(
    Pipeline("words", input_type=Route).then("joiner", input=lambda r: f"words for {r.route}")
)


def route_of(route: Route) -> str:
    return route.route


registry.add_pipeline(Pipeline("routed").then("triage").branch(route_of, {"math": "math", "words": "words"}))


def broken_over(parts: Parts) -> list[str]:
    raise ValueError("no items today")


def odd_route(route: Route) -> str:
    return "elsewhere"


#: Pipelines whose mapping functions fail in the workers (a step error, not a child's).
registry.add_pipeline(Pipeline("broken-map").then("splitter").map("worker", over=broken_over))
registry.add_pipeline(Pipeline("broken-branch").then("triage").branch(odd_route, {"math": "math"}))


# -- custom run state handed along -----------------------------------------------------------------


class Tally(BaseModel):
    """The run state of ``tally``: every question its runs noted, in order."""

    noted: list[str] = []


class NoteArgs(BaseModel):
    text: str


@tool
def tally_note(args: NoteArgs, ctx: ToolContext) -> str:
    """Note the question in the run's state."""
    assert isinstance(ctx.state, Tally)
    ctx.update_state(noted=[*ctx.state.noted, args.text])
    return "noted"


def _tally(messages: Sequence[Message]) -> ModelResponse:
    if isinstance(messages[-1], ToolMessage):
        return reply(f"noted {_question(messages)}")
    return reply(None, ("tally_note", {"text": _question(messages)}))


registry.add_model("tally", ScriptedModel(_tally))
registry.add(
    Agent(
        name="tally",
        model="scripted:tally",
        system_prompt="Tally.",
        tools=ToolSet([tally_note]),
        state_type=Tally,
    )
)
registry.add_pipeline(
    Pipeline("tallied")
    .then("tally")
    .then("tally", input=lambda a: f"then {a}", state=True)
    .map("tally", over=lambda a: [f"x {a}", f"y {a}"], state=True)
)
