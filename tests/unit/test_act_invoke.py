"""How the act phase turns one tool call into a recorded result (``worker.act.invoke``)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

from shared.messages import ToolCall
from shared.settings import Limits, Settings
from shared.state import Phase, RunHead, ToolResult
from shared.tools import Tool, ToolContext, tool
from worker.act import invoke as act_invoke
from worker.heartbeat import Held
from worker.tracing import Tracing

HEAD = RunHead.new_idle("run9", "agent", "q").model_copy(update={"phase": Phase.ACTING, "step": 4})


class Args(BaseModel):
    n: int


def invoke(
    t: Tool, arguments: dict[str, Any], *, held: Held | None = None, limit: int = 32_000
) -> ToolResult:
    rt = SimpleNamespace(settings=Settings(limits=Limits(max_tool_output_chars=limit)), tracing=Tracing())
    call = ToolCall(id="c7", name=t.name, arguments=arguments)
    return act_invoke(rt, t, call, HEAD, held or Held("run9", "call:4:c7", "tok"))  # type: ignore[arg-type]


def test_ok_result() -> None:
    seen: list[ToolContext] = []

    @tool
    def double(args: Args, ctx: ToolContext) -> int:
        """Double."""
        seen.append(ctx)
        return args.n * 2

    result = invoke(double, {"n": 21})
    assert (result.call_id, result.name, result.ok, result.output, result.error) == (
        "c7",
        "double",
        True,
        "42",
        None,
    )
    assert result.duration_s >= 0
    (ctx,) = seen
    assert ctx.idempotency_key == "run9:4:c7"
    assert 59 < ctx.remaining_s() <= 60


def test_cancel_is_visible_to_the_tool() -> None:
    @tool
    def check(args: Args, ctx: ToolContext) -> bool:
        """Report the cancel flag."""
        return ctx.cancelled()

    held = Held("run9", "claim:c7", "tok")
    assert invoke(check, {"n": 1}, held=held).output == "false"
    held.cancelled.set()
    assert invoke(check, {"n": 1}, held=held).output == "true"


def test_bad_arguments_do_not_run_the_tool() -> None:
    calls: list[Args] = []

    @tool
    def record(args: Args) -> int:
        """Record."""
        calls.append(args)
        return 0

    result = invoke(record, {"n": "many"})
    assert calls == []
    assert not result.ok
    assert result.output.startswith("Error: bad arguments for 'record': n: Input should be a valid integer")
    assert result.error is not None
    assert (result.error.kind, result.error.tool, result.error.step) == ("ToolDispatch", "record", 4)


def test_a_raising_tool_becomes_an_error_result() -> None:
    @tool
    def boom(args: Args) -> int:
        """Fail."""
        raise RuntimeError("kaput " + "x" * 5000)

    result = invoke(boom, {"n": 1})
    assert not result.ok
    assert result.output.startswith("Error: RuntimeError: kaput x")
    assert result.error is not None and result.error.kind == "ToolDispatch"
    assert len(result.error.message) == 2000


def test_long_output_is_truncated() -> None:
    @tool
    def big(args: Args) -> str:
        """Big."""
        return "y" * args.n

    result = invoke(big, {"n": 150}, limit=100)
    assert result.ok
    assert result.output == "y" * 100 + "...[truncated 50 chars]"
    assert invoke(big, {"n": 100}, limit=100).output == "y" * 100


def test_a_wrong_result_type_is_not_blamed_on_the_arguments() -> None:
    @tool
    def liar(args: Args) -> int:
        """Claims an int."""
        return "not a number"  # type: ignore[return-value]

    result = invoke(liar, {"n": 1})
    assert not result.ok
    assert "bad arguments" not in result.output


def test_a_tool_over_its_timeout_fails() -> None:
    @tool(timeout_s=0.05)
    def slow(args: Args) -> int:
        """Sleep past the timeout."""
        time.sleep(0.3)
        return 1

    result = invoke(slow, {"n": 1})
    assert not result.ok
    assert result.error is not None and result.error.kind == "ToolDispatch"


def test_a_tool_over_its_timeout_fails_on_a_thread_pool_too() -> None:
    """Off the main thread (a threads-pool worker) the timeout is enforced by waiting, not a signal."""

    @tool(timeout_s=0.05)
    def stuck(args: Args) -> int:
        """Sleep past the timeout."""
        time.sleep(0.3)
        return 1

    box: dict[str, object] = {}
    worker = threading.Thread(target=lambda: box.update(result=invoke(stuck, {"n": 1})))
    worker.start()
    worker.join(5)
    result = box["result"]
    assert isinstance(result, ToolResult)
    assert not result.ok and "timeout" in result.output


def test_a_tool_that_catches_every_exception_is_still_stopped_at_its_timeout() -> None:
    """The soft limit is a BaseException: a blanket ``except Exception`` cannot swallow it."""

    @tool(timeout_s=0.05)
    def stubborn(args: Args) -> int:
        """Ignore every exception until done."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                time.sleep(0.01)
            except Exception:
                pass
        return 1

    started = time.monotonic()
    result = invoke(stubborn, {"n": 1})
    assert time.monotonic() - started < 25, "the tool ran to its own end"
    assert not result.ok and result.error is not None and result.error.kind == "ToolDispatch"
    assert "timeout" in result.error.message


def test_a_non_retry_safe_tool_past_its_timeout_has_an_unknown_outcome() -> None:
    @tool(timeout_s=0.05, retry_safe=False)
    def pay(args: Args) -> int:
        """Pay, slowly."""
        time.sleep(5)
        return 1

    result = invoke(pay, {"n": 1})
    assert not result.ok and result.error is not None and result.error.kind == "ToolOutcomeUnknown"
