"""The bundled pipeline over the research assistant: split a question, research each part, merge.

``research-split``::

    research-splitter        -> SubQuestions (typed output)
    map research-sub         -> one research run per sub-question, at most 4 live at once
    reduce research-writer   -> one answer from every finding, in sub-question order

Its agents run on scripted models, so ``wesichain pipeline run research-split "..."`` works
offline right after install; give them real models (``model="openai:..."``) for real answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.pipeline.definition import Pipeline
from shared.tools import Tool, ToolSet

__all__ = ["MAX_SUBQUESTIONS", "SubQuestions", "findings", "questions", "register_pipeline"]

#: Sub-questions the splitter may give (the map's width).
MAX_SUBQUESTIONS = 8


class SubQuestions(BaseModel):
    """What ``research-splitter`` answers: the question in self-contained parts."""

    questions: list[str] = Field(min_length=1, max_length=MAX_SUBQUESTIONS)


def questions(split: SubQuestions) -> list[str]:
    """The map's items: one research run per sub-question."""
    return split.questions


def findings(answers: list[str]) -> str:
    """The writer's input: every finding, numbered in sub-question order."""
    return "\n".join(f"{i}. {answer}" for i, answer in enumerate(answers, 1))


# -- scripted models, so the example runs offline ---------------------------------------------------

_PARTS = re.compile(r",?\s+and\s+(?=how|what|which|why|when|who|where)|\?\s+|;\s*", re.IGNORECASE)
_DAYS = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s+days?", re.IGNORECASE)


def _question(messages: Sequence[Message]) -> str:
    return next((m.content for m in reversed(messages) if isinstance(m, UserMessage)), "")


def _split_script(messages: Sequence[Message]) -> ModelResponse:
    parts = [p.strip(" ?,.") for p in _PARTS.split(_question(messages))]
    asked = [p[0].upper() + p[1:] + "?" for p in parts if p][:MAX_SUBQUESTIONS]
    return reply(SubQuestions(questions=asked or ["?"]).model_dump_json())


def _sub_script(messages: Sequence[Message]) -> ModelResponse:
    """A figure of days: the calculator; anything else: the knowledge base; then answer."""
    question = _question(messages)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        days = _DAYS.search(question)
        if days:
            return reply(None, ("calculator", {"expression": f"{days.group(1)} * 24 * 60 * 60"}))
        return reply(None, ("search", {"query": question, "limit": 1}))
    result = results[-1]
    if result.is_error:
        return reply(f"{question} I could not find out: {result.content[:200]}")
    data = json.loads(result.content)
    if result.name == "calculator":
        return reply(f"{question} {data['value']:,.0f} seconds.")
    hits = data["hits"]
    return reply(
        f"{question} {hits[0]['title']}: {hits[0]['snippet']}" if hits else f"{question} Nothing found."
    )


def _write_script(messages: Sequence[Message]) -> ModelResponse:
    lines = [line.split(". ", 1)[-1] for line in _question(messages).splitlines() if line.strip()]
    return reply("In short: " + " ".join(lines))


def register_pipeline(registry: AgentRegistry, search: Tool, calculator: Tool) -> Pipeline:
    """Add the pipeline's agents, their scripted models and ``research-split`` to ``registry``."""
    registry.add_model("research-split", ScriptedModel(_split_script, chunk=16))
    registry.add_model("research-sub", ScriptedModel(_sub_script, chunk=16))
    registry.add_model("research-write", ScriptedModel(_write_script, chunk=16))
    registry.add(
        Agent(
            name="research-splitter",
            model="scripted:research-split",
            system_prompt=(
                "Split the user's question into at most 8 self-contained sub-questions, each answerable"
                " on its own. Do not answer them."
            ),
            output_type=SubQuestions,
            max_steps=3,
        )
    )
    registry.add(
        Agent(
            name="research-sub",
            model="scripted:research-sub",
            system_prompt=(
                "Answer one research question in two sentences at most. Use `search` for facts from the"
                " knowledge base and `calculator` for arithmetic."
            ),
            tools=ToolSet([search, calculator]),
            max_steps=4,
        )
    )
    registry.add(
        Agent(
            name="research-writer",
            model="scripted:research-write",
            system_prompt="Merge the numbered findings into one short answer to the original question.",
            max_steps=2,
        )
    )
    pipeline = (
        Pipeline(
            "research-split",
            description="Split a question, research each part on the pool, merge the findings.",
        )
        .then("research-splitter")
        .map("research-sub", over=questions, concurrency=4)
        .reduce("research-writer", input=findings)
    )
    return registry.add_pipeline(pipeline)
