"""The act phase: one task per tool call, fanned out over the pool, fanned in atomically in Redis."""

from __future__ import annotations

import time

from pydantic import ValidationError

from shared import events as ev
from shared import fsm
from shared.errors import RunErrorInfo, ToolDispatch, ToolOutcomeUnknown
from shared.messages import ToolCall
from shared.state import Phase, RunHead, ToolResult
from shared.store import Stale
from shared.tools import Tool, ToolContext, validation_summary
from worker.runtime import TASK_TOOL, Runtime, log, observe_task


def run_tool(rt: Runtime, run_id: str, step: int, version: int, call_id: str) -> None:
    claim = rt.store.begin(run_id, version, Phase.ACTING, f"{step}:tool:{call_id}")
    if claim is None:
        log.warning("tool call for unknown run %s dropped", run_id)
        return
    if isinstance(claim, Stale):
        rt.on_stale(claim, TASK_TOOL, version)
        return
    head = claim.head
    call = next((c for c in head.pending_calls if c.id == call_id), None)
    if call is None:
        log.error("run %s v%d has no pending call %r; dropped", run_id, version, call_id)
        return
    if rt.store.has_result(run_id, step, call_id):
        return  # a duplicate delivery of a call whose result is already recorded
    current = fsm.view(head)
    assert isinstance(current, fsm.Acting)
    if rt.check_poison(current, claim.attempts, f"tool call {call.name}:{call_id} of step {step}"):
        return
    agent = rt.agents.get(head.agent)
    tool = agent.tools.get(call.name)
    if claim.cancel_requested:
        result = _error_result(
            call, ToolDispatch("the run was cancelled before the tool started", step=step, tool=call.name)
        )
    elif tool is None:
        result = _error_result(
            call,
            ToolDispatch(f"tool {call.name!r} is not registered on this worker", step=step, tool=call.name),
        )
    elif claim.attempts > 1 and not tool.retry_safe:
        # An earlier delivery entered this tool and never recorded a result: its worker died mid-call.
        # Running it again could repeat a side effect that must happen once, so the policy decides.
        result = _error_result(
            call,
            ToolOutcomeUnknown(
                f"tool {call.name!r} is not retry-safe and its earlier attempt ended without an outcome",
                step=step,
                tool=call.name,
            ),
        )
    else:
        result = _invoke(rt, tool, call, head)
    completed = ev.ToolCompleted(
        run_id=run_id,
        step=step,
        call_id=call.id,
        tool=call.name,
        ok=result.ok,
        output=result.output[: rt.settings.limits.max_event_payload_chars],
        error=result.error,
        duration_s=result.duration_s,
    )
    status = rt.store.record_result(head, result, completed, observe_task(head))
    if status == "complete":
        rt.publish([observe_task(head)])


def _invoke(rt: Runtime, tool: Tool, call: ToolCall, head: RunHead) -> ToolResult:
    store = rt.store
    ctx = ToolContext(
        run_id=head.run_id,
        step=head.step,
        call_id=call.id,
        deadline=time.time() + tool.timeout_s,
        _cancel_check=lambda: store.cancel_requested(head.run_id),
    )
    started = time.perf_counter()
    try:
        args = tool.validate(call.arguments)
        output = tool.invoke(args, ctx)
    except ValidationError as exc:
        return _error_result(
            call,
            ToolDispatch(
                f"bad arguments for {call.name!r}: {validation_summary(exc)}", step=head.step, tool=call.name
            ),
        )
    except Exception as exc:  # a tool's failure is data for the policy, never a crashed worker
        log.info("run %s: tool %s raised %s", head.run_id, call.name, type(exc).__name__)
        message = f"{type(exc).__name__}: {exc}"[:2000]
        return _error_result(call, ToolDispatch(message, step=head.step, tool=call.name))
    limit = rt.settings.limits.max_tool_output_chars
    if len(output) > limit:
        output = output[:limit] + f"...[truncated {len(output) - limit} chars]"
    return ToolResult(
        call_id=call.id,
        name=call.name,
        ok=True,
        output=output,
        duration_s=round(time.perf_counter() - started, 6),
    )


def _error_result(call: ToolCall, error: ToolDispatch | ToolOutcomeUnknown) -> ToolResult:
    info: RunErrorInfo = error.info()
    return ToolResult(call_id=call.id, name=call.name, ok=False, output=f"Error: {error.message}", error=info)
