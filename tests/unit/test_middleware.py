"""Middleware chains, the shipped middleware, and the richer tool options, in process."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from shared.agents import Agent
from shared.errors import ConfigError
from shared.llm.base import ModelRequest, ModelResponse
from shared.messages import ToolCall
from shared.middleware import (
    ArgumentRule,
    AuditLog,
    BlockArguments,
    Middleware,
    MiddlewareContext,
    RedactPII,
    Refuse,
    Veto,
    after_model,
    after_tool,
    before_model,
    before_tool,
    on_user_message,
)
from shared.policy import Retry
from shared.state import ToolResult
from shared.tools import ToolSet, tool

CTX = MiddlewareContext(run_id="r1", agent="a", step=2)


class Args(BaseModel):
    cents: int = 0
    url: str = ""


@tool(approval=lambda a: a.cents > 100)
def pay(args: Args) -> str:
    """Pay."""
    return "paid"


@tool(risk="medium")
def browse(args: Args) -> str:
    """Browse."""
    return "page"


class Upper(Middleware):
    def on_user_message(self, ctx: MiddlewareContext, text: str) -> str | Refuse:
        return text.upper()

    def before_model(self, ctx: MiddlewareContext, request: ModelRequest) -> ModelRequest:
        return request.model_copy(update={"temperature": 0.0})


class Strict(Middleware):
    def on_user_message(self, ctx: MiddlewareContext, text: str) -> str | Refuse:
        return Refuse("too loud") if text.isupper() else text

    def after_model(self, ctx: MiddlewareContext, response: ModelResponse) -> ModelResponse | Veto:
        return Veto("no") if response.text == "bad" else response


def test_each_hook_sees_what_the_one_before_returned_and_the_first_refusal_is_named() -> None:
    assert on_user_message([Upper()], CTX, "hi") == "HI"
    assert on_user_message([Upper(), Strict()], CTX, "hi") == Refuse("Strict: too loud")
    assert on_user_message([Strict(), Upper()], CTX, "hi") == "HI"
    request = before_model([Middleware(), Upper()], CTX, ModelRequest(model="m", messages=[]))
    assert request.temperature == 0.0
    assert after_model([Strict()], CTX, ModelResponse(text="bad")) == Veto("Strict: no")
    assert after_model([Strict()], CTX, ModelResponse(text="ok")) == ModelResponse(text="ok")


def test_redaction_of_tool_results() -> None:
    call = ToolCall(id="c", name="t", arguments={})
    result = ToolResult(call_id="c", name="t", ok=True, output="mail a.b@c.io or +44 20 7946 0958")
    redacted = after_tool([RedactPII()], CTX, call, result)
    assert redacted.output == "mail [redacted email] or [redacted phone]"
    only_other = after_tool([RedactPII(tools=["other"])], CTX, call, result)
    assert only_other is result
    custom = RedactPII({"ticket": r"T-\d+"})
    assert custom.redact("see T-123, a.b@c.io") == "see [redacted ticket], a.b@c.io"
    with pytest.raises(ConfigError, match="bad pattern"):
        RedactPII({"x": "("})


def test_blocking_by_argument_pattern() -> None:
    guard = BlockArguments([ArgumentRule("*", "url", r"^file:", "no local files")])
    ok = ToolCall(id="c", name="browse", arguments={"url": "https://x"})
    bad = ToolCall(id="c", name="browse", arguments={"url": "file:///etc/passwd"})
    assert before_tool([guard], CTX, ok) == ok
    assert before_tool([guard], CTX, bad) == Refuse(
        "BlockArguments: argument 'url' of 'browse': no local files"
    )
    numbers = BlockArguments([ArgumentRule("pay", "cents", r"^\d{5,}$")])
    assert isinstance(
        numbers.before_tool(CTX, ToolCall(id="c", name="pay", arguments={"cents": 12345})), Refuse
    )
    with pytest.raises(ConfigError):
        ArgumentRule("t", "a", "[")
    with pytest.raises(ConfigError):
        BlockArguments([])


def test_audit_entries() -> None:
    entries: list[dict[str, object]] = []
    audit = AuditLog(sink=entries.append)
    call = ToolCall(id="c9", name="pay", arguments={"cents": 5})
    result = ToolResult(call_id="c9", name="pay", ok=True, output="paid", duration_s=0.5)
    assert audit.after_tool(CTX, call, result) is result
    assert audit.after_model(CTX, ModelResponse(text="hi")) == ModelResponse(text="hi")
    assert entries[0]["idempotency_key"] == "r1:2:c9" and entries[0]["arguments"] == {"cents": 5}
    assert entries[0]["output_chars"] == 4
    assert entries[1]["kind"] == "model_call" and entries[1]["text_chars"] == 2


def test_approval_by_list_risk_and_predicate() -> None:
    agent = Agent(
        name="a", model="scripted:x", system_prompt="p", tools=ToolSet([pay, browse]), approval_risk="medium"
    )
    assert agent.needs_approval(ToolCall(id="c", name="pay", arguments={"cents": 101}))
    assert not agent.needs_approval(ToolCall(id="c", name="pay", arguments={"cents": 100}))
    assert agent.needs_approval(ToolCall(id="c", name="browse", arguments={}))
    lenient = Agent(name="b", model="scripted:x", system_prompt="p", tools=ToolSet([pay, browse]))
    assert not lenient.needs_approval(ToolCall(id="c", name="browse", arguments={}))
    with pytest.raises(ConfigError, match="middleware"):
        Agent(name="c", model="scripted:x", system_prompt="p", middleware=[AuditLog()])  # type: ignore[arg-type]


def test_tool_retry_options() -> None:
    @tool(retry=Retry(n=2, backoff_s=1.0), timeout_s=5)
    def fetch(args: Args) -> str:
        """Fetch."""
        return "x"

    assert fetch.attempt_limit_s == 5 * 3 + 1.0 + 2.0
    assert pay.attempt_limit_s == pay.timeout_s
    with pytest.raises(ConfigError, match="not retry-safe"):
        tool(retry=Retry(n=1), retry_safe=False)
    with pytest.raises(ConfigError, match="risk"):
        tool(risk="extreme")  # type: ignore[call-overload]
