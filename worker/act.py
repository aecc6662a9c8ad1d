"""The act phase: one task per tool call, fanned out over the pool, fanned in atomically in Redis."""

from __future__ import annotations

import time

from pydantic import ValidationError

from shared import events as ev
from shared import fsm
from shared.errors import PoisonPhase, RunError, RunErrorInfo, ToolDispatch, ToolOutcomeUnknown
from shared.messages import ToolCall
from shared.state import Phase, RunHead, ToolResult
from shared.store import Claim
from shared.tasks import TASK_TOOL, observe_task, with_epoch
from shared.tools import Tool, ToolContext, validation_summary
from worker.heartbeat import Held
from worker.runtime import Runtime, log
from worker.timeouts import call_with_timeout


def run_tool(
    rt: Runtime, run_id: str, step: int, version: int, call_id: str, epoch: int = 0, takeover: bool = False
) -> None:
    claim = rt.store.begin(
        run_id,
        version,
        Phase.ACTING,
        epoch,
        step,
        f"{step}:tool:{call_id}",
        call_id=call_id,
        takeover=takeover,
    )
    if rt.unclaimed(claim, TASK_TOOL, run_id, version):
        return
    assert isinstance(claim, Claim)
    head = claim.head
    call = next((c for c in head.pending_calls if c.id == call_id), None)
    if call is None:
        log.error("run %s v%d has no pending call %r; dropped", run_id, version, call_id)
        return
    current = fsm.view(head)
    assert isinstance(current, fsm.Acting)
    agent = rt.agents.get(head.agent)
    tool = agent.tools.get(call.name)
    if claim.attempts > rt.settings.max_phase_attempts:
        # Past the limit: record the call as failed, like any result (one ToolCompleted, the fan-in
        # intact), instead of running it again; observe then fails the run with PoisonPhase.
        result = _error_result(
            call,
            PoisonPhase(
                f"tool call {call.name}:{call_id} of step {step} was started {claim.attempts} times"
                f" without finishing (limit {rt.settings.max_phase_attempts})",
                step=step,
                tool=call.name,
            ),
        )
    elif claim.cancel_requested:
        result = _error_result(
            call, ToolDispatch("the run was cancelled before the tool started", step=step, tool=call.name)
        )
    elif tool is None:
        result = _error_result(
            call,
            ToolDispatch(f"tool {call.name!r} is not registered on this worker", step=step, tool=call.name),
        )
    elif claim.prior != "none" and not tool.retry_safe:
        # An earlier delivery claimed this call and never recorded a result: its worker died mid-call.
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
        with rt.heartbeat.hold(run_id, claim.claim_field, claim.token) as held:
            rt.paused(Phase.ACTING, run_id)
            result = _invoke(rt, tool, call, head, held)
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
    status, epoch = rt.store.record_result(head, result, completed, observe_task(head))
    if status == "complete":
        rt.publish([with_epoch(observe_task(head), epoch) if epoch != head.epoch else observe_task(head)])


def _invoke(rt: Runtime, tool: Tool, call: ToolCall, head: RunHead, held: Held) -> ToolResult:
    ctx = ToolContext(
        run_id=head.run_id,
        step=head.step,
        call_id=call.id,
        deadline=time.time() + tool.timeout_s,
        _cancel_check=held.cancelled.is_set,
    )
    started = time.perf_counter()
    try:
        args = tool.validate(call.arguments)
    except ValidationError as exc:
        return _error_result(
            call,
            ToolDispatch(
                f"bad arguments for {call.name!r}: {validation_summary(exc)}", step=head.step, tool=call.name
            ),
        )
    try:
        output = call_with_timeout(lambda: tool.invoke(args, ctx), tool.timeout_s)
    except ValidationError as exc:
        # Raised by the result check: the tool broke its own contract, not the model.
        message = f"tool {call.name!r} returned a result that does not match its declared type: "
        return _error_result(
            call, ToolDispatch(message + validation_summary(exc), step=head.step, tool=call.name)
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


def _error_result(call: ToolCall, error: RunError) -> ToolResult:
    info: RunErrorInfo = error.info()
    return ToolResult(call_id=call.id, name=call.name, ok=False, output=f"Error: {error.message}", error=info)
