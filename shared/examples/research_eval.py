"""The scripted models the research assistant's bundled eval runs on (no network, deterministic).

``research-eval`` plans from the question: arithmetic goes to the calculator, "what time is it in
ZONE" to the clock, anything else to the corpus search; it then answers from what came back.
``research-eval-guess`` never uses the calculator: it answers arithmetic from a rough guess, so the
two variants differ for ``wesichain eval compare`` to find.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from shared.llm.base import ModelResponse
from shared.llm.scripted import reply
from shared.messages import Message, ToolMessage, UserMessage

__all__ = ["guess_script", "plan_script"]

_ARITHMETIC = re.compile(
    r"^(?:what is|compute|calculate|evaluate)\s+(?P<expr>[-+*/%().\d\s a-z,]+?)\s*\??$", re.I
)
_EXPRESSION = re.compile(r"^[-+*/%().\d\s]+$|sqrt|round|abs|log|pi")
_TIME = re.compile(r"what time is it in (?P<zone>[A-Za-z_/+-]+)", re.I)


def _question(messages: Sequence[Message]) -> str:
    return next((m.content for m in reversed(messages) if isinstance(m, UserMessage)), "")


def _expression(question: str) -> str | None:
    match = _ARITHMETIC.match(question.strip())
    if match is None:
        return None
    expr = match.group("expr").strip()
    return expr if _EXPRESSION.search(expr) else None


def _answer(results: Sequence[ToolMessage]) -> ModelResponse:
    result = results[-1]
    if result.is_error:
        return reply(f"I could not answer: {result.content[:200]}")
    data = json.loads(result.content)
    if result.name == "calculator":
        return reply(f"The answer is {data['value']:g}.")
    if result.name == "current_time":
        return reply(f"In {data['timezone']} it is now {data['iso']}.")
    hits = data.get("hits") or []
    if not hits:
        return reply("I found nothing about that in the knowledge base.")
    return reply(f"{hits[0]['title']}: {hits[0]['snippet']}")


def plan_script(messages: Sequence[Message]) -> ModelResponse:
    """One tool call chosen from the question, then an answer from its result."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if results:
        return _answer(results)
    question = _question(messages)
    if (expr := _expression(question)) is not None:
        return reply("Let me calculate that.", ("calculator", {"expression": expr}))
    if (zone := _TIME.search(question)) is not None:
        return reply("Let me read the clock.", ("current_time", {"timezone": zone.group("zone")}))
    return reply("Let me search the knowledge base.", ("search", {"query": question[:500], "limit": 2}))


def guess_script(messages: Sequence[Message]) -> ModelResponse:
    """Like :func:`plan_script`, but arithmetic is guessed (the first number), never calculated."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if results:
        return _answer(results)
    question = _question(messages)
    if (expr := _expression(question)) is not None:
        first = re.search(r"\d+(?:\.\d+)?", expr)
        return reply(f"Roughly {first.group(0) if first else 'zero'}, I think.")
    return plan_script(messages)
