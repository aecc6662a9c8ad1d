"""The flagship example: a research assistant with a calculator, the clock and a local corpus search.

It runs on any model; by default on a scripted model so that ``wesichain demo`` works offline.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.examples.research_eval import guess_script, plan_script
from shared.examples.research_pipeline import register_pipeline
from shared.examples.research_tour import holds as tour_holds
from shared.examples.research_tour import register_tour
from shared.handoffs import Handoff, remove_tool_calls
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, reply
from shared.messages import Message, ToolMessage, UserMessage
from shared.middleware import ArgumentRule, AuditLog, BlockArguments, RedactPII
from shared.tools import ToolContext, ToolSet, tool

__all__ = [
    "Brief",
    "CalculatorArgs",
    "CalculatorResult",
    "DEMO_QUESTION",
    "Hit",
    "MAX_EXPONENT",
    "MAX_MAGNITUDE",
    "SearchArgs",
    "SearchResult",
    "TimeArgs",
    "TimeResult",
    "calculator",
    "current_time",
    "kb_search",
    "registry",
    "search",
    "search_corpus",
    "snippet",
]

# -- calculator: arithmetic over a whitelisted AST, never eval ----------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., float]] = {"sqrt": math.sqrt, "abs": abs, "round": round, "log": math.log}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e300


class CalculatorArgs(BaseModel):
    """An arithmetic expression."""

    expression: str = Field(max_length=200, description="Arithmetic, e.g. '3.5 * 24 * 3600' or 'sqrt(2)'")


class CalculatorResult(BaseModel):
    """The expression and its value."""

    expression: str
    value: float


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError("exponent too large")
        value = float(_BINARY[type(node.op)](left, right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = float(_UNARY[type(node.op)](_eval(node.operand)))
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
        and len(node.args) <= 2
    ):
        operands = [_eval(a) for a in node.args]
        if node.func.id == "round" and len(operands) == 2:
            # round()'s digits must be an int; every operand here is a float.
            if not operands[1].is_integer():
                raise ValueError("round(x, n) needs a whole number of digits")
            value = float(round(operands[0], int(operands[1])))
        else:
            value = float(_FUNCS[node.func.id](*operands))
    else:
        raise ValueError(f"unsupported expression element: {type(node).__name__}")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError("result out of range")
    return value


@tool
def calculator(args: CalculatorArgs) -> CalculatorResult:
    """Evaluate an arithmetic expression (+ - * / // % **, parentheses, sqrt, abs, round, log, pi, e)."""
    try:
        tree = ast.parse(args.expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    try:
        value = _eval(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("result out of range") from None
    except TypeError:
        raise ValueError("the result is not a real number") from None
    return CalculatorResult(expression=args.expression, value=value)


# -- clock -------------------------------------------------------------------------------------


class TimeArgs(BaseModel):
    """An IANA time zone."""

    timezone: str = Field(default="UTC", max_length=64, description="IANA time zone, e.g. 'Europe/Paris'")


class TimeResult(BaseModel):
    """The time zone and the current time there."""

    timezone: str
    iso: str


@tool
def current_time(args: TimeArgs) -> TimeResult:
    """The current date and time in a time zone."""
    try:
        zone = ZoneInfo(args.timezone) if args.timezone != "UTC" else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {args.timezone!r}") from None
    return TimeResult(timezone=args.timezone, iso=datetime.now(zone).isoformat(timespec="seconds"))


# -- local corpus search -------------------------------------------------------------------------


class SearchArgs(BaseModel):
    """A search of the bundled knowledge base."""

    query: str = Field(min_length=1, max_length=500)
    limit: int = Field(default=3, ge=1, le=10)


class Hit(BaseModel):
    """One matching document."""

    id: str
    title: str
    snippet: str
    score: float


class SearchResult(BaseModel):
    """The best matches, best first."""

    hits: list[Hit]


@cache
def _corpus() -> list[dict[str, str]]:
    data = resources.files("shared.examples").joinpath("corpus.json").read_text()
    return list(json.loads(data))


_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from how in is it of on or the to what which with".split())


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def snippet(text: str, limit: int = 240) -> str:
    """The start of ``text`` up to ``limit`` chars, ended at a sentence or at least a word boundary."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    sentence = head.rfind(". ")
    if sentence >= limit // 4:
        return head[: sentence + 1]
    return head[: head.rfind(" ")].rstrip(",;:") + "…"


@tool
def search(args: SearchArgs) -> SearchResult:
    """Search the bundled knowledge base about durable agents, Celery and Redis."""
    return search_corpus(args)


def search_corpus(args: SearchArgs) -> SearchResult:
    """The knowledge base's best matches for ``args.query``, best first (what ``search`` returns)."""
    query = _terms(args.query)
    scored = []
    for doc in _corpus():
        words = _terms(doc["title"] + " " + doc["text"])
        overlap = len(query & words)
        if overlap:
            scored.append((overlap / (len(query) or 1), doc))
    scored.sort(key=lambda pair: -pair[0])
    hits = [
        Hit(id=d["id"], title=d["title"], snippet=snippet(d["text"]), score=round(s, 3))
        for s, d in scored[: args.limit]
    ]
    return SearchResult(hits=hits)


@tool
def kb_search(args: SearchArgs, ctx: ToolContext) -> SearchResult:
    """Search the bundled knowledge base, reporting each hit as it is found (a ``hit`` custom event)."""
    result = search_corpus(args)
    for hit in result.hits:
        ctx.emit("hit", {"id": hit.id, "title": hit.title, "score": hit.score})
    # ``wesichain demo --tour`` holds some runs' search here while it talks to them (in process).
    tour_holds.wait_if_held(ctx.run_id)
    return result


# -- the scripted model that drives the demo -----------------------------------------------------

DEMO_QUESTION = "What makes an agent run durable, and how many seconds are there in 3.5 days?"


def _demo_script(messages: Sequence[Message]) -> ModelResponse:
    """Plan: search + calculate + read the clock in parallel, then answer from what came back."""
    tool_results = [m for m in messages if isinstance(m, ToolMessage)]
    if not tool_results:
        question = next((m.content for m in reversed(messages) if isinstance(m, UserMessage)), DEMO_QUESTION)
        return reply(
            "Let me look this up and do the arithmetic.",
            ("search", {"query": question, "limit": 2}),
            ("calculator", {"expression": "3.5 * 24 * 60 * 60"}),
            ("current_time", {"timezone": "UTC"}),
        )
    by_name = {m.name: m for m in tool_results}
    parts = []
    if (found := by_name.get("search")) and not found.is_error:
        hits = json.loads(found.content)["hits"]
        if hits:
            parts.append(f"{hits[0]['title']}: {hits[0]['snippet']}")
    if (calc := by_name.get("calculator")) and not calc.is_error:
        value = json.loads(calc.content)["value"]
        parts.append(f"3.5 days is {value:,.0f} seconds.")
    if (clock := by_name.get("current_time")) and not clock.is_error:
        parts.append(f"(Answered at {json.loads(clock.content)['iso']}.)")
    return reply(" ".join(parts) or "I could not find an answer.")


def _desk_script(messages: Sequence[Message]) -> ModelResponse:
    """The front desk hands every question to the research assistant."""
    return reply("A research question: handing you to the research assistant.", ("transfer_to_research", {}))


# -- the structured-output variant: the same research, answered as a Brief ------------------------


class Brief(BaseModel):
    """What ``research-brief`` answers: a summary, the figure it computed, and its sources."""

    summary: str = Field(max_length=2000)
    seconds: float | None = Field(default=None, description="The computed figure, when one was asked for")
    sources: list[str] = Field(default_factory=list, description="Ids of the documents the summary uses")


def _brief_script(messages: Sequence[Message]) -> ModelResponse:
    """The demo's plan, then its findings as one JSON object in the shape of :class:`Brief`."""
    tool_results = [m for m in messages if isinstance(m, ToolMessage)]
    if not tool_results:
        return _demo_script(messages)
    by_name = {m.name: m for m in tool_results}
    brief: dict[str, Any] = {"summary": "I could not find an answer.", "sources": []}
    if (found := by_name.get("search")) and not found.is_error:
        hits = json.loads(found.content)["hits"]
        if hits:
            brief["summary"] = f"{hits[0]['title']}: {hits[0]['snippet']}"
            brief["sources"] = [h["id"] for h in hits]
    if (calc := by_name.get("calculator")) and not calc.is_error:
        brief["seconds"] = json.loads(calc.content)["value"]
    return reply(json.dumps(brief))


registry = AgentRegistry()
registry.add_model("research-demo", ScriptedModel(_demo_script, chunk=6))
registry.add_model("research-brief", ScriptedModel(_brief_script, chunk=6))
# The bundled eval's models (``wesichain eval run examples/research-eval.toml``).
registry.add_model("research-eval", ScriptedModel(plan_script, chunk=64))
registry.add_model("research-eval-guess", ScriptedModel(guess_script, chunk=64))
registry.add(
    Agent(
        name="research",
        model="scripted:research-demo",
        system_prompt=(
            "You are a careful research assistant. Use `search` for facts from the knowledge base, "
            "`calculator` for any arithmetic and `current_time` for dates. Cite what you found."
        ),
        tools=ToolSet([search, calculator, current_time]),
        max_steps=6,
    )
)
registry.add(
    Agent(
        name="research-brief",
        model="scripted:research-brief",
        system_prompt=(
            "You are a careful research assistant. Use `search` for facts from the knowledge base and "
            "`calculator` for any arithmetic; answer with a brief that names the documents you used."
        ),
        tools=ToolSet([search, calculator, current_time]),
        max_steps=6,
        output_type=Brief,
    )
)
#: The same assistant behind middleware: personal data redacted from what its tools return, no
#: search for secrets, and an audit line (logger ``wesichain.audit``) for every model and tool call.
registry.add(
    Agent(
        name="research-guarded",
        model="scripted:research-demo",
        system_prompt=(
            "You are a careful research assistant. Use `search` for facts from the knowledge base, "
            "`calculator` for any arithmetic and `current_time` for dates. Cite what you found."
        ),
        tools=ToolSet([search, calculator, current_time]),
        max_steps=6,
        middleware=(
            AuditLog(),
            RedactPII(),
            BlockArguments(
                [ArgumentRule("search", "query", r"(?i)password|api[ _-]?key", "no searching for secrets")]
            ),
        ),
    )
)
#: ``research-desk``: a front desk that hands the conversation to ``research`` (``wesichain demo
#: --agent research-desk``): the run goes on under ``research``, which sees the question without the
#: desk's transfer call.
registry.add_model("research-desk", ScriptedModel(_desk_script, chunk=6))
registry.add(
    Agent(
        name="research-desk",
        model="scripted:research-desk",
        system_prompt="You are the front desk. Hand research questions to the research assistant.",
        handoffs=(
            Handoff(
                "research",
                description="Hand over to the research assistant (questions needing sources or sums).",
                input_filter=remove_tool_calls,
            ),
        ),
        max_steps=2,
    )
)
#: ``research-split``: the question split, one research run per part across the pool, one answer.
register_pipeline(registry, search, calculator)
#: ``research-tour-desk`` and ``research-tour``: the agents of ``wesichain demo --tour`` (a handoff,
#: a message into a running run, and a thread's second and third questions under its policies).
register_tour(registry, kb_search)
