"""Middleware: hooks an agent declares around its input, its model calls and its tool calls.

A middleware is a class whose methods have no-op defaults; an agent lists instances in order
(``Agent(middleware=(RedactPII(), BlockArguments(...), AuditLog()))``), and each hook sees what
the one before it returned::

    on_user_message(ctx, text)        -> text (rewritten) | Refuse(reason)     start phase
    before_model(ctx, request)        -> request (messages, tools, settings)   think phase
    after_model(ctx, response)        -> response (rewritten) | Veto(reason)   think phase
    before_tool(ctx, call)            -> call (arguments edited) | Refuse      act phase
    after_tool(ctx, call, result)     -> result (checked, redacted)            act phase

Their effects are committed with the phase that ran them: the rewritten input is the stored user
message, a rewritten or vetoed response is what the think commits, a refused call and a rewritten
result are the call's one recorded result. A phase redelivered after a crash runs its hooks again
on the same inputs, so hooks must be deterministic functions of them (no clocks, no randomness);
a hook that writes somewhere else (like :class:`AuditLog`) sees each attempt.

A refused input fails the run (``InvalidRequest``); a vetoed response is an invalid model action
whose reason the model is shown, handled by the policy's ``on_invalid_action`` (``Reprompt(n)``
lets the model try again, at most ``n`` times); a refused call is a failed tool result the model
reads. Hooks run on the phase's thread and must be quick; one that raises fails the phase as a bug.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.call_memory import PhaseMemory
from shared.errors import ConfigError
from shared.llm.base import ModelRequest, ModelResponse
from shared.messages import ToolCall
from shared.state import ToolResult

__all__ = [
    "ArgumentRule",
    "AuditLog",
    "AuditSink",
    "BlockArguments",
    "DEFAULT_PII",
    "Middleware",
    "MiddlewareContext",
    "RedactPII",
    "Refuse",
    "Veto",
    "after_model",
    "after_tool",
    "before_model",
    "before_tool",
    "on_user_message",
]

log = logging.getLogger("wesichain.audit")


@dataclass(frozen=True)
class MiddlewareContext:
    """The run a hook is called for."""

    run_id: str
    agent: str
    step: int
    tenant: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: The run's custom state as JSON (None for an agent without a ``state_type``).
    state: Mapping[str, Any] | None = None
    #: The run's tenant's long-term memory; a write is made at once, once per phase version and
    #: hook, so a hook that runs again after a crash writes nothing twice (None outside a worker).
    memory: PhaseMemory | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Refuse:
    """Refuse the input (the run fails) or a tool call (it is not run; the model reads why)."""

    reason: str


@dataclass(frozen=True)
class Veto:
    """Reject the model's response; the model is shown the reason (within the policy's bounds)."""

    reason: str


class Middleware:
    """No-op defaults; override the hooks you need. ``name`` appears in refusals and vetoes."""

    @property
    def name(self) -> str:
        return type(self).__name__

    def on_user_message(self, ctx: MiddlewareContext, text: str) -> str | Refuse:
        return text

    def before_model(self, ctx: MiddlewareContext, request: ModelRequest) -> ModelRequest:
        return request

    def after_model(self, ctx: MiddlewareContext, response: ModelResponse) -> ModelResponse | Veto:
        return response

    def before_tool(self, ctx: MiddlewareContext, call: ToolCall) -> ToolCall | Refuse:
        return call

    def after_tool(self, ctx: MiddlewareContext, call: ToolCall, result: ToolResult) -> ToolResult:
        return result


# -- running a chain -------------------------------------------------------------------------------
# Each hook gets what the one before it returned; the first refusal or veto ends the chain, named.


def on_user_message(chain: Sequence[Middleware], ctx: MiddlewareContext, text: str) -> str | Refuse:
    for m in chain:
        out = m.on_user_message(ctx, text)
        if isinstance(out, Refuse):
            return Refuse(f"{m.name}: {out.reason}")
        text = out
    return text


def before_model(chain: Sequence[Middleware], ctx: MiddlewareContext, request: ModelRequest) -> ModelRequest:
    for m in chain:
        request = m.before_model(ctx, request)
    return request


def after_model(
    chain: Sequence[Middleware], ctx: MiddlewareContext, response: ModelResponse
) -> ModelResponse | Veto:
    for m in chain:
        out = m.after_model(ctx, response)
        if isinstance(out, Veto):
            return Veto(f"{m.name}: {out.reason}")
        response = out
    return response


def before_tool(chain: Sequence[Middleware], ctx: MiddlewareContext, call: ToolCall) -> ToolCall | Refuse:
    for m in chain:
        out = m.before_tool(ctx, call)
        if isinstance(out, Refuse):
            return Refuse(f"{m.name}: {out.reason}")
        call = out
    return call


def after_tool(
    chain: Sequence[Middleware], ctx: MiddlewareContext, call: ToolCall, result: ToolResult
) -> ToolResult:
    for m in chain:
        result = m.after_tool(ctx, call, result)
    return result


# -- PII redaction of tool results -------------------------------------------------------------------

#: What :class:`RedactPII` removes by default: label -> pattern, applied in this order.
DEFAULT_PII: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    "iban": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b",
    "card": r"\b(?:\d[ -]?){13,19}\b",
    # Eight to fifteen digits, optionally after a +, with spaces, dots, dashes or parentheses
    # (an ISO date is not one).
    "phone": r"(?<![\w+])(?!\d{4}-\d{2}-\d{2}\b)\+?\(?\d(?:[ .()-]{0,2}\d){7,14}(?!\w)",
}


class RedactPII(Middleware):
    """Replace personal data in tool results (and their events) by ``[redacted LABEL]``.

    The model, the stored conversation and the run's events only ever see the redacted text.
    ``patterns`` maps a label to a regular expression (default :data:`DEFAULT_PII`).
    """

    def __init__(self, patterns: Mapping[str, str] | None = None, tools: Sequence[str] | None = None) -> None:
        chosen = DEFAULT_PII if patterns is None else dict(patterns)
        try:
            self._patterns = [(label, re.compile(p)) for label, p in chosen.items()]
        except re.error as exc:
            raise ConfigError(f"RedactPII: bad pattern: {exc}") from None
        self._tools = frozenset(tools) if tools is not None else None

    def redact(self, text: str) -> str:
        for label, pattern in self._patterns:
            text = pattern.sub(f"[redacted {label}]", text)
        return text

    def after_tool(self, ctx: MiddlewareContext, call: ToolCall, result: ToolResult) -> ToolResult:
        if self._tools is not None and call.name not in self._tools:
            return result
        redacted = self.redact(result.output)
        return result if redacted == result.output else result.model_copy(update={"output": redacted})


# -- a guardrail on tool arguments -------------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentRule:
    """Block calls of ``tool`` (``"*"``: any) whose ``argument`` (its text) matches ``pattern``."""

    tool: str
    argument: str
    pattern: str
    reason: str = "blocked by policy"

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"ArgumentRule for {self.tool}.{self.argument}: bad pattern: {exc}") from None


class BlockArguments(Middleware):
    """Refuse tool calls by argument pattern: the call is not run, and the model reads the reason."""

    def __init__(self, rules: Sequence[ArgumentRule]) -> None:
        if not rules:
            raise ConfigError("BlockArguments needs at least one rule")
        self.rules = tuple(rules)
        self._compiled = [(r, re.compile(r.pattern)) for r in self.rules]

    def before_tool(self, ctx: MiddlewareContext, call: ToolCall) -> ToolCall | Refuse:
        for rule, pattern in self._compiled:
            if rule.tool not in ("*", call.name) or rule.argument not in call.arguments:
                continue
            value = call.arguments[rule.argument]
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            if pattern.search(text):
                return Refuse(f"argument {rule.argument!r} of {call.name!r}: {rule.reason}")
        return call


# -- an audit log ------------------------------------------------------------------------------------

AuditSink = Callable[[dict[str, Any]], None]


def _log_sink(entry: dict[str, Any]) -> None:
    log.info("%s", json.dumps(entry, sort_keys=True, default=str))


class AuditLog(Middleware):
    """One entry per model call and per tool call, to ``sink`` (default: the ``wesichain.audit``
    logger, one JSON object per line).

    An entry is written when the call returns, for every attempt: a phase redelivered after a crash
    writes again. Tool entries carry the call's ``idempotency_key`` (``run:step:call``) and model
    entries ``run_id`` and ``step``, so a consumer can tell attempts of one call apart from calls.
    Arguments are recorded, results by size only (they may hold what :class:`RedactPII` removes
    later in the chain; put ``AuditLog`` after it to see redacted results' sizes).
    """

    def __init__(self, sink: AuditSink | None = None) -> None:
        self.sink = sink or _log_sink

    def after_model(self, ctx: MiddlewareContext, response: ModelResponse) -> ModelResponse | Veto:
        self.sink(
            {
                "kind": "model_call",
                "run_id": ctx.run_id,
                "agent": ctx.agent,
                "tenant": ctx.tenant,
                "step": ctx.step,
                "tool_calls": [c.name for c in response.tool_calls],
                "text_chars": len(response.text or ""),
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
            }
        )
        return response

    def after_tool(self, ctx: MiddlewareContext, call: ToolCall, result: ToolResult) -> ToolResult:
        self.sink(
            {
                "kind": "tool_call",
                "run_id": ctx.run_id,
                "agent": ctx.agent,
                "tenant": ctx.tenant,
                "step": ctx.step,
                "tool": call.name,
                "idempotency_key": f"{ctx.run_id}:{ctx.step}:{call.id}",
                "arguments": call.arguments,
                "ok": result.ok,
                "error": result.error.kind if result.error else None,
                "output_chars": len(result.output),
                "duration_s": result.duration_s,
            }
        )
        return result
