"""Agents the benchmarks run on real workers (``wesichain worker --agents benchmarks.agents``).

Every model here is scripted, so a run's shape is exact and repeatable. Each scripted model is
registered twice: ``scripted:NAME`` answers at once, ``scripted:NAME-200ms`` sleeps 200 ms per
call like a fast hosted model; the benchmark picks one with the ``model=`` override at submit.

The parametrised agents read their size from the run's input, so one agent serves every length
(the scripted model is a pure function of the conversation, as a worker in any process needs):

* ``long``: input ``"steps=50"``: 50 steps each calling the trivial ``noop`` tool, then an answer;
* ``fanout``: input ``"calls=8 seconds=0.5"``: one step with 8 parallel ``pause`` calls, then an answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse, RawToolCall, Usage
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import AssistantMessage, Message, UserMessage
from shared.pipeline.definition import Pipeline
from shared.policy import Policy, Reprompt
from shared.tools import ToolSet, tool

#: Model latency of the ``-200ms`` variants.
SLOW_LATENCY_S = 0.2
SLOW_SUFFIX = "-200ms"


class AddArgs(BaseModel):
    a: float
    b: float


@tool
def add(args: AddArgs) -> float:
    """Add two numbers."""
    return args.a + args.b


class NoArgs(BaseModel):
    pass


@tool
def noop(args: NoArgs) -> str:
    """Do nothing and say so (the cheapest possible tool)."""
    return "ok"


class PauseArgs(BaseModel):
    seconds: float = Field(ge=0, le=10)
    label: str = ""


@tool
def pause(args: PauseArgs) -> str:
    """Wait, like an I/O-bound tool (a web request, a database query)."""
    time.sleep(args.seconds)
    return args.label or "done"


TOOLS = ToolSet([add, noop, pause])

registry = AgentRegistry()


def _param(messages: Sequence[Message], name: str, default: float) -> float:
    user = next((m for m in messages if isinstance(m, UserMessage)), None)
    found = re.search(rf"\b{name}=([0-9.]+)", user.content) if user else None
    return float(found.group(1)) if found else default


def _turn(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if isinstance(m, AssistantMessage))


def _long_script(messages: Sequence[Message]) -> ModelResponse:
    steps = int(_param(messages, "steps", 50))
    if _turn(messages) < steps:
        return reply(None, ("noop", {}))
    return reply(f"done after {steps} steps")


def _fanout_script(messages: Sequence[Message]) -> ModelResponse:
    if _turn(messages) == 0:
        calls = int(_param(messages, "calls", 8))
        seconds = _param(messages, "seconds", 0.5)
        return reply(None, *[("pause", {"seconds": seconds, "label": f"p{i}"}) for i in range(calls)])
    return reply("all calls done")


def _malformed() -> ModelResponse:
    """A tool call whose arguments fail validation (``a`` is not a number, ``b`` is missing)."""
    return ModelResponse(
        tool_calls=[RawToolCall(id="c1", name="add", arguments={"a": "one"})],
        usage=Usage(input_tokens=10, output_tokens=5),
    )


Script = Sequence[ModelResponse] | Callable[[Sequence[Message]], ModelResponse]

SCRIPTS: dict[str, Script] = {
    # The four user-facing scenarios.
    "direct": [reply("The answer is 42.")],
    "one_hop": [reply(None, ("add", {"a": 1, "b": 2})), reply("1 + 2 = 3")],
    "chain": [
        reply(None, ("add", {"a": 1, "b": 2})),
        reply(None, ("add", {"a": 3, "b": 4})),
        reply(None, ("add", {"a": 5, "b": 6})),
        reply("done after three hops"),
    ],
    "recover": [_malformed(), reply(None, ("add", {"a": 1, "b": 1})), reply("fixed it: 2")],
    # Parametrised by the input.
    "long": _long_script,
    "fanout": _fanout_script,
}

POLICIES: dict[str, Policy] = {"recover": Policy(on_invalid_action=Reprompt(n=1))}
MAX_STEPS: dict[str, int] = {"long": 1000}

for _name, _script in SCRIPTS.items():
    registry.add_model(_name, ScriptedModel(_script))
    registry.add_model(_name + SLOW_SUFFIX, ScriptedModel(_script, latency_s=SLOW_LATENCY_S))
    registry.add(
        Agent(
            name=_name,
            model=f"scripted:{_name}",
            system_prompt=f"benchmark agent {_name}",
            tools=TOOLS,
            policy=POLICIES.get(_name, Policy()),
            max_steps=MAX_STEPS.get(_name, 10),
        )
    )


def _lines(text: str) -> list[str]:
    return text.splitlines()


#: The pipeline benchmark's maps (``benchmarks/pipelines.py``): one ``direct`` run per line of the
#: input, with a cap that never throttles, and with a cap of 8.
registry.add_pipeline(Pipeline("bench-map").map("direct", over=_lines, concurrency=1000))
registry.add_pipeline(Pipeline("bench-map-8").map("direct", over=_lines, concurrency=8))
