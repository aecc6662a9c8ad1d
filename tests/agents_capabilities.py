"""Agents of the capability tests (structured output, prompt templates, middleware, richer tools).

The scripted models here answer from the conversation they are given, so any worker that picks a
phase up answers the same; a few also record which process called them (``test:model_pids``,
keyed by the run's input) so a test can kill that process in the middle of the call.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from functools import cache

import redis
from pydantic import BaseModel, Field

from shared.agents import Agent, AgentRegistry
from shared.context import SUMMARY_PROMPT, ContextBudget, counter_for, message_tokens, tools_tokens
from shared.llm.base import ModelResponse
from shared.llm.scripted import ScriptedModel, ScriptFn, reply
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.middleware import (
    ArgumentRule,
    AuditLog,
    BlockArguments,
    Middleware,
    MiddlewareContext,
    RedactPII,
    Refuse,
    Veto,
)
from shared.policy import Policy, Reprompt, Retry
from shared.prompts import Prompt
from shared.subagents import AgentTool
from shared.tools import ToolContext, ToolSet, tool
from tests.agents_fixture import EFFECTS_KEY, TOOLS, add
from tests.broker import redis_from_env

#: input -> pid of the process that last called a model of this module.
MODEL_PIDS_KEY = "test:model_pids"
#: input:turn -> how many times the model was called for that turn.
MODEL_CALLS_KEY = "test:model_calls"
#: Inputs that start with this make a model's first call hang until its process is killed.
HANG_FIRST = "hang:"


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


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


# -- middleware -------------------------------------------------------------------------------------

#: Every audit entry, as JSON, in order.
AUDIT_KEY = "test:audit"
CUSTOMER_RECORD = "Customer 7: jane.doe@example.com, +33 6 12 34 56 78, card 4111 1111 1111 1111"


class CustomerArgs(BaseModel):
    id: int


@tool
def lookup_customer(args: CustomerArgs) -> str:
    """A customer record, full of personal data."""
    return CUSTOMER_RECORD.replace("7", str(args.id), 1)


class FetchArgs(BaseModel):
    url: str


@tool
def fetch(args: FetchArgs, ctx: ToolContext) -> str:
    """Fetch a URL (records one effect per call)."""
    _redis().hincrby(EFFECTS_KEY, ctx.idempotency_key, 1)
    return f"fetched {args.url}"


class NoShouting(Middleware):
    """Vetoes an answer written in capitals; refuses inputs that look like SQL injection."""

    def on_user_message(self, ctx: MiddlewareContext, text: str) -> str | Refuse:
        if "drop table" in text.lower():
            return Refuse("the input looks like SQL")
        return text.strip()

    def after_model(self, ctx: MiddlewareContext, response: ModelResponse) -> ModelResponse | Veto:
        if response.text and not response.tool_calls and response.text.isupper():
            return Veto("do not shout; answer in sentence case")
        return response


def _audit(entry: dict[str, object]) -> None:
    _redis().rpush(AUDIT_KEY, json.dumps(entry, sort_keys=True))


def _guarded(messages: Sequence[Message]) -> ModelResponse:
    """Three calls (a record, an internal and a public fetch); then a shouted answer; then a calm one."""
    _observe_call(messages)
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    if turn == 0:
        return reply(
            None,
            ("lookup_customer", {"id": 7}),
            ("fetch", {"url": "http://internal.example/admin"}),
            ("fetch", {"url": "https://example.org/"}),
        )
    if turn == 1:
        return reply("HERE IS EVERYTHING")
    results = [m for m in messages if isinstance(m, ToolMessage)]
    return reply(" | ".join(m.content for m in results))


GUARD = BlockArguments(
    [
        ArgumentRule(
            "fetch", "url", r"^https?://(localhost|127\.|internal\.)", "internal addresses are off limits"
        )
    ]
)
registry.add_model("guarded", ScriptedModel(_guarded))
registry.add(
    Agent(
        name="guarded",
        model="scripted:guarded",
        system_prompt="You look customers up.",
        tools=ToolSet([lookup_customer, fetch]),
        middleware=(AuditLog(sink=_audit), NoShouting(), RedactPII(), GUARD),
        policy=Policy(on_invalid_action=Reprompt(n=1)),
    )
)


# -- richer tools -----------------------------------------------------------------------------------


class FlakyArgs(BaseModel):
    failures: int = Field(ge=0, le=20)


@tool(retry=Retry(n=3, backoff_s=0.05))
def flaky(args: FlakyArgs, ctx: ToolContext) -> str:
    """Fails its first ``failures`` attempts, then succeeds."""
    attempt = int(_redis().hincrby("test:flaky", ctx.idempotency_key, 1))
    if attempt <= args.failures:
        raise ConnectionError(f"attempt {attempt} failed")
    return f"succeeded on attempt {attempt}"


class AnswerArgs(BaseModel):
    title: str
    score: int


@tool(ends_run=True)
def submit_verdict(args: AnswerArgs) -> Verdict:
    """Hand in the final verdict: the run ends with it."""
    return Verdict(title=args.title, score=args.score, tags=["by tool"])


class TransferArgs(BaseModel):
    cents: int = Field(ge=1)


@tool(retry_safe=False, approval=lambda args: args.cents > 10_000)
def transfer(args: TransferArgs, ctx: ToolContext) -> str:
    """Move money; a human approves large amounts."""
    _redis().hincrby(EFFECTS_KEY, ctx.idempotency_key, 1)
    return f"moved {args.cents}"


@tool(risk="high")
def wipe(args: FlakyArgs) -> str:
    """Something a human must always approve (high risk)."""
    return "wiped"


RICH_TOOLS = ToolSet([flaky, submit_verdict, transfer, wipe])


def _retrying(messages: Sequence[Message]) -> ModelResponse:
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        failures = int(_user(messages).split()[-1])
        return reply(None, ("flaky", {"failures": failures}))
    return reply(f"tool said: {results[-1].content}")


def _ending(messages: Sequence[Message]) -> ModelResponse:
    _observe_call(messages)
    if any(isinstance(m, ToolMessage) for m in messages):
        return reply("the model was asked again after the ending tool")
    return reply(None, ("submit_verdict", {"title": "done", "score": 9}))


def _transfers(messages: Sequence[Message]) -> ModelResponse:
    """Small transfer, large one (approved always), larger one (no second approval), then wipe."""
    turn = sum(1 for m in messages if isinstance(m, AssistantMessage))
    plan = [
        ("transfer", {"cents": 500}),
        ("transfer", {"cents": 50_000}),
        ("transfer", {"cents": 60_000}),
        ("wipe", {"failures": 0}),
    ]
    if turn < len(plan):
        return reply(None, plan[turn])
    results = [m.content for m in messages if isinstance(m, ToolMessage)]
    return reply(", ".join(results))


for _name, _script, _extra in (
    ("retrying", _retrying, {}),
    ("ending", _ending, {"output_type": Verdict}),
    ("transfers", _transfers, {"approval_risk": "high"}),
):
    registry.add_model(_name, ScriptedModel(_script))
    registry.add(
        Agent(
            name=_name,
            model=f"scripted:{_name}",
            system_prompt=_name,
            tools=RICH_TOOLS,
            **_extra,
        )
    )


# -- time travel ------------------------------------------------------------------------------------


def _since_last_user(messages: Sequence[Message]) -> tuple[str, list[str]]:
    last = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    return _user(messages[last:]), [m.content for m in messages[last:] if isinstance(m, ToolMessage)]


def _hops(messages: Sequence[Message]) -> ModelResponse:
    """Two adds, then an answer naming the question and every result it saw."""
    user, results = _since_last_user(messages)
    if len(results) < 2:
        return reply(None, ("add", {"a": len(results), "b": 1}))
    return reply(f"done: user={user!r} results={results}")


def _hops_alt(messages: Sequence[Message]) -> ModelResponse:
    user, results = _since_last_user(messages)
    return reply(f"alt: user={user!r} results={results}")


registry.add_model("hops", ScriptedModel(_hops))
registry.add_model("hops_alt", ScriptedModel(_hops_alt))
registry.add(Agent(name="hops", model="scripted:hops", system_prompt="hops", tools=TOOLS))


# -- subagents --------------------------------------------------------------------------------------


def _lead(messages: Sequence[Message]) -> ModelResponse:
    """Two researchers in parallel (tasks from the input, split on ';'), then both answers."""
    _observe_call(messages)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        text = _user(messages).removeprefix(HANG_FIRST)
        if text.startswith("grade "):
            return reply(None, ("grader", {"task": text.removeprefix("grade ")}))
        return reply(None, *[("researcher", {"task": t.strip()}) for t in text.split(";")])
    return reply(" + ".join(f"{'ok' if not m.is_error else 'err'}[{m.content}]" for m in results))


def _researcher(messages: Sequence[Message]) -> ModelResponse:
    """One add (an effect counted per call), then an answer naming its task."""
    _observe_call(messages)
    if not any(isinstance(m, ToolMessage) for m in messages):
        if "slowly" in _user(messages):
            return reply(None, ("slow", {"seconds": 30, "label": "child"}))
        return reply(None, ("add", {"a": 1, "b": 1}))
    return reply(f"found {_user(messages).removeprefix(HANG_FIRST)}")


def _grader(messages: Sequence[Message]) -> ModelResponse:
    return reply(json.dumps({"title": _user(messages), "score": 5}))


def _recursive(messages: Sequence[Message]) -> ModelResponse:
    """Delegates to itself until refused (the depth limit), then answers from what came back."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    corrections = [m for m in messages[2:] if isinstance(m, UserMessage)]
    if corrections:
        return reply("leaf")
    if not results:
        return reply(None, ("recursive", {"task": "go deeper"}))
    return reply(f"up({results[-1].content})")


def _greedy(messages: Sequence[Message]) -> ModelResponse:
    return reply(None, *[("researcher", {"task": f"t{i}"}) for i in range(3)])


for _name, _fn in (
    ("lead", _lead),
    ("researcher", _researcher),
    ("grader", _grader),
    ("recursive", _recursive),
    ("greedy", _greedy),
):
    registry.add_model(_name, ScriptedModel(_fn))
registry.add(
    Agent(
        name="lead",
        model="scripted:lead",
        system_prompt="lead",
        tools=ToolSet([AgentTool("researcher"), AgentTool("grader"), add]),
    )
)
registry.add(Agent(name="researcher", model="scripted:researcher", system_prompt="researcher", tools=TOOLS))
registry.add(
    Agent(name="grader", model="scripted:grader", system_prompt="grader", tools=TOOLS, output_type=Verdict)
)
registry.add(
    Agent(
        name="recursive",
        model="scripted:recursive",
        system_prompt="recursive",
        tools=ToolSet([AgentTool("recursive")]),
        max_subagent_depth=2,
        policy=Policy(on_invalid_action=Reprompt(n=1)),
    )
)
registry.add(
    Agent(
        name="greedy",
        model="scripted:greedy",
        system_prompt="greedy",
        tools=ToolSet([AgentTool("researcher")]),
        max_children=2,
    )
)


# -- context management -----------------------------------------------------------------------------

#: Problems a model saw in a request of a budgeted agent: "input: what".
CONTEXT_PROBLEMS_KEY = "test:context_problems"
#: input -> the most tokens a request of that run carried.
CONTEXT_MAX_KEY = "test:context_max"
#: input -> how many summary requests the model got.
SUMMARY_CALLS_KEY = "test:summary_calls"
BUDGET = ContextBudget(max_tokens=1500)
SUMMARISED = ContextBudget(max_tokens=1500, strategy="summarise", summary_tokens=64)


class TickArgs(BaseModel):
    note: str = ""


@tool
def tick(args: TickArgs, ctx: ToolContext) -> str:
    """Report the step (with a long payload, so conversations outgrow their budget)."""
    return f"tick {ctx.step} " + "x" * 300


def _check_request(user: str, messages: Sequence[Message], budget: ContextBudget) -> None:
    """Record what a budgeted request breaks: its size, its system prompt, its call/result pairs."""
    count = counter_for("scripted:x", budget.chars_per_token)
    used = tools_tokens(RICH_CONTEXT_TOOLS.specs(), count) + sum(message_tokens(m, count) for m in messages)
    _redis().hset(CONTEXT_MAX_KEY, user, max(used, int(_redis().hget(CONTEXT_MAX_KEY, user) or 0)))
    problems = []
    if used > budget.max_tokens:
        problems.append(f"{used} tokens over {budget.max_tokens}")
    if not isinstance(messages[0], SystemMessage):
        problems.append("no system prompt first")
    for i, m in enumerate(messages):
        if isinstance(m, AssistantMessage) and m.tool_calls:
            ids = [
                r.tool_call_id
                for r in messages[i + 1 : i + 1 + len(m.tool_calls)]
                if isinstance(r, ToolMessage)
            ]
            if ids != [c.id for c in m.tool_calls]:
                problems.append(f"calls at {i} without their results")
        if isinstance(m, ToolMessage):
            before = messages[:i]
            owner = next((b for b in reversed(before) if isinstance(b, AssistantMessage)), None)
            if owner is None or m.tool_call_id not in {c.id for c in owner.tool_calls}:
                problems.append(f"result at {i} without its call")
    for p in problems:
        _redis().rpush(CONTEXT_PROBLEMS_KEY, f"{user}: {p}")


def _ticker(budget: ContextBudget) -> ScriptFn:
    def script(messages: Sequence[Message]) -> ModelResponse:
        system = messages[0]
        if isinstance(system, SystemMessage) and system.content == SUMMARY_PROMPT:
            text = _user(messages)
            calls = _redis().hincrby(SUMMARY_CALLS_KEY, hashlib.sha1(text.encode()).hexdigest(), 1)
            if HANG_FIRST in text and calls == 1:
                _redis().hset(MODEL_PIDS_KEY, "summary", os.getpid())
                time.sleep(3600)  # only a SIGKILL ends this
            return reply(f"summary of {text.count('tick ')} ticks")
        # The system prompt (always kept) says "run TAG ticks GOAL times".
        words = system.content.split() if isinstance(system, SystemMessage) else ["run", "?", "ticks", "0"]
        tag, goal = words[1], int(words[3])
        _check_request(tag, messages, budget)
        last = [m.content for m in messages if isinstance(m, ToolMessage)]
        done = int(last[-1].split()[1]) if last else 0
        if done >= goal:
            return reply(f"ticked {done} times")
        return reply(None, ("tick", {"note": "n" * 100}))

    return script


def _chatter(messages: Sequence[Message]) -> ModelResponse:
    """One answer per run of a thread, each long enough that the thread outgrows the budget."""
    user = _user(messages[-1:])
    _check_request(user, messages, BUDGET)
    return reply(f"answer to {user}: " + "y" * 200)


RICH_CONTEXT_TOOLS = ToolSet([tick])
registry.add_model("ticker", ScriptedModel(_ticker(BUDGET)))
registry.add_model("ticker_summarised", ScriptedModel(_ticker(SUMMARISED)))
registry.add_model("chatter", ScriptedModel(_chatter))
for _name, _model, _budget in (
    ("long_run", "ticker", BUDGET),
    ("summarised", "ticker_summarised", SUMMARISED),
    ("chatty", "chatter", BUDGET),
):
    registry.add(
        Agent(
            name=_name,
            model=f"scripted:{_model}",
            system_prompt=Prompt("run {tag} ticks {goal} times") if _name != "chatty" else "You chat.",
            tools=RICH_CONTEXT_TOOLS,
            max_steps=250,
            context=_budget,
        )
    )


# -- a cap on parallel tool calls -------------------------------------------------------------------

#: run id -> how many of its calls run right now; "peak:" + run id -> the most seen at once.
RUNNING_KEY = "test:running"


class GaugeArgs(BaseModel):
    label: str
    seconds: float = Field(ge=0, le=10)


@tool
def gauge(args: GaugeArgs, ctx: ToolContext) -> str:
    """Run for a while, recording how many calls of the run run at the same time."""
    r = _redis()
    now = int(r.hincrby(RUNNING_KEY, ctx.run_id, 1))
    r.sadd(f"{RUNNING_KEY}:peaks:{ctx.run_id}", now)
    r.hincrby(EFFECTS_KEY, ctx.idempotency_key, 1)
    time.sleep(args.seconds)
    r.hincrby(RUNNING_KEY, ctx.run_id, -1)
    return args.label


def _fan_out(messages: Sequence[Message]) -> ModelResponse:
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return reply(None, *[("gauge", {"label": f"g{i}", "seconds": 0.6}) for i in range(5)])
    return reply(",".join(m.content for m in results))


registry.add_model("fan_out", ScriptedModel(_fan_out))
for _name, _cap in (("capped", 2), ("sequential", 1), ("uncapped", None)):
    registry.add(
        Agent(
            name=_name,
            model="scripted:fan_out",
            system_prompt=_name,
            tools=ToolSet([gauge]),
            max_parallel_tools=_cap,
        )
    )
