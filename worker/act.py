"""The act phase: one task per tool call, fanned out over the pool, fanned in atomically in Redis.

A call's delivery claims the call (the claim names the run, the step and the call), runs the tool
under a heartbeat and records its result once; the delivery whose result is the step's last
computes the OBSERVING head with the state machine, and the same script commits it. Whatever
happens, the call gets exactly one recorded result, so its ``ToolDispatched`` gets exactly one
``ToolCompleted``: a call past the attempt limit, cancelled, naming an unknown tool, or hit by a
bug is recorded as failed, and observe decides.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import redis
from pydantic import BaseModel, ValidationError

from shared import events as ev
from shared import fsm
from shared.call_memory import CallMemory
from shared.custom_events import CustomEmitter
from shared.errors import ConfigError, RunErrorInfo, ToolDispatch, ToolOutcomeUnknown
from shared.messages import ToolCall
from shared.middleware import Middleware, Refuse, after_tool, before_tool
from shared.state import Phase, RunHead, ToolResult
from shared.store import CallClaim, Claim
from shared.tasks import task_for
from shared.tools import Tool, ToolContext, validation_summary
from worker.full import until_room
from worker.heartbeat import Held
from worker.logs import annotate
from worker.runtime import Delivery, Runtime, internal_error, middleware_context, poison_error
from worker.timeouts import ToolTimeout, call_with_timeout, hard_limit_s

__all__ = ["invoke", "run_tool", "tool_timeout_result"]

log = logging.getLogger("wesichain.worker")


def run_tool(rt: Runtime, delivery: Delivery, step: int, call_id: str) -> None:
    want = CallClaim(delivery.run_id, delivery.version, delivery.epoch, step, call_id)
    outcome = until_room(lambda: rt.store.claim_call(want, rt.holder()), f"the claim of {want.run_id}")
    if not isinstance(outcome, Claim):
        rt.on_unclaimed(outcome, delivery)
        return
    head = outcome.head
    current = fsm.view_as(head, fsm.Acting)
    call = next((c for c in head.pending_calls if c.id == call_id), None)
    if call is None:  # the claim script checked the call id against the step: state that cannot be
        raise RuntimeError(f"run {head.run_id} v{head.version} has no pending call {call_id!r}")
    what = f"tool call {call.name}:{call_id} of step {step}"
    if outcome.attempts == 1 and outcome.prior == "none":
        rt.metrics.waited(delivery.task, time.time() - head.updated_at, head.namespace)
    annotate(tenant=head.tenant, step=step, phase=Phase.ACTING.value)
    if outcome.prior == "expired" and outcome.attempts > 1:
        _void_custom_events(rt, head, call, outcome.attempts - 1, "taken_over")
    emitter = _emitter(rt, head, call, outcome)
    started = time.perf_counter()
    attributes = {"wesichain.step": step, "wesichain.phase": "acting", "wesichain.call_id": call_id}
    with rt.tracing.span("wesichain.acting", head.run_id, **attributes):
        try:
            result = _outcome(rt, outcome, call, what, emitter)
            emitter.finish()
            hooks = middleware_context(head, rt.phase_memory(head, f"after_tool:{call_id}"))
            result = after_tool(_middleware(rt, head), hooks, call, result)
        except redis.RedisError:
            raise  # Redis trouble: the lease hands the call on
        except Exception as exc:
            log.exception("run %s: %s failed with an unexpected error", head.run_id, what)
            result = _error_result(call, internal_error(exc, what, Phase.ACTING, step))
    elapsed = time.perf_counter() - started
    rt.metrics.phase_done(Phase.ACTING, elapsed)
    rt.metrics.tool_call(
        call.name, elapsed, result.error.kind if result.error else None, known=_known(rt, head, call.name)
    )
    completed = ev.ToolCompleted(
        run_id=head.run_id,
        step=step,
        call_id=call.id,
        tool=call.name,
        ok=result.ok,
        output=result.output[: rt.settings.limits.max_event_payload_chars],
        error=result.error,
        duration_s=result.duration_s,
        attempt=outcome.attempts,
    )
    observing = current.observe().head
    (observe,) = task_for(observing)
    push = rt.push_for(head.run_id, [observe], head.epoch)
    # Under the claim: while a full Redis refuses the result, the heartbeat keeps the call held, so
    # nothing hands it on and the result is recorded once memory is freed.
    with rt.heartbeat.hold(head.run_id, outcome.field, outcome.token):
        recorded = until_room(
            lambda: rt.store.record_result(head, outcome.ref, result, completed, observing, observe, push),
            f"the result of {what} of run {head.run_id}",
        )
    if recorded.status in ("recorded", "complete"):
        # The call's memory writes are recorded with its result: apply them now (observe applies
        # them again before it commits, a no-op unless this process dies first).
        rt.apply_memory(head, [result])
    if recorded.status == "complete":
        rt.pushed(head.run_id, recorded.pushed)
        if not recorded.pushed:
            rt.publish([observe], recorded.epoch, acking=head.run_id)
    elif recorded.status in ("duplicate", "stale") and emitter.emitted:
        # Another delivery's result is the call's: what this one reported is void. A run that
        # ended (or is gone) meanwhile gets nothing after its end.
        now = rt.store.load(head.run_id) if recorded.status == "stale" else head
        if now is not None and not now.terminal:
            _void_custom_events(rt, head, call, outcome.attempts, "result_refused")


def _emitter(rt: Runtime, head: RunHead, call: ToolCall, claim: Claim) -> CustomEmitter:
    """This delivery's custom events: appended only while it holds the call (``emit_custom.lua``)."""
    step, token = head.step, claim.token

    def write(event: ev.Event) -> bool:
        return rt.store.emit_custom(head.run_id, step, call.id, token, event)

    return CustomEmitter(
        write,
        run_id=head.run_id,
        step=step,
        call_id=call.id,
        tool=call.name,
        attempt=claim.attempts,
        limits=rt.settings.limits,
    )


def _void_custom_events(
    rt: Runtime, head: RunHead, call: ToolCall, attempt: int, reason: Literal["taken_over", "result_refused"]
) -> None:
    """Mark the custom events of this call's deliveries up to ``attempt`` void (they were fenced off)."""
    voided = ev.CustomEventsVoided(
        run_id=head.run_id, step=head.step, call_id=call.id, tool=call.name, attempt=attempt, reason=reason
    )
    until_room(
        lambda: rt.store.emit(head.run_id, [voided]), f"the voided events of {call.id} of run {head.run_id}"
    )


def _middleware(rt: Runtime, head: RunHead) -> tuple[Middleware, ...]:
    try:
        return rt.agent_of(head).middleware
    except ConfigError:
        return ()


def _known(rt: Runtime, head: RunHead, name: str) -> bool:
    """Whether the run's agent has this tool (a name the model made up is not a metric label)."""
    try:
        return rt.agent_of(head).tools.get(name) is not None
    except ConfigError:
        return False


def _outcome(rt: Runtime, claim: Claim, call: ToolCall, what: str, emitter: CustomEmitter) -> ToolResult:
    """Run the call, or say why it is not run."""
    head, step = claim.head, claim.head.step
    limit = rt.settings.max_phase_attempts
    if claim.attempts > limit:
        # Past the limit: record the call as failed, like any result (one ToolCompleted, the fan-in
        # intact), instead of running it again; observe then fails the run with PoisonPhase.
        return _error_result(
            call, poison_error(what, Phase.ACTING, step, claim.attempts, limit, claim.last_error)
        )
    if claim.cancel_requested:
        return _error_result(
            call,
            ToolDispatch("the run was cancelled before the tool started", step=step, tool=call.name).info(),
        )
    try:
        agent = rt.agent_of(head)
        tool = agent.tools.get(call.name)
    except ConfigError as exc:
        return _error_result(call, ToolDispatch(str(exc), step=step, tool=call.name).info())
    if tool is None:
        message = f"tool {call.name!r} is not registered on this worker"
        return _error_result(call, ToolDispatch(message, step=step, tool=call.name).info())
    if claim.prior != "none" and not tool.retry_safe:
        # An earlier delivery claimed this call and never recorded a result: its worker died (or
        # stalled past its lease) mid-call. Running it again could repeat a side effect that must
        # happen once, so the policy decides.
        error = ToolOutcomeUnknown(
            f"tool {call.name!r} is not retry-safe and its earlier attempt ended without an outcome",
            step=step,
            tool=call.name,
            last_error=claim.last_error or None,
        )
        return _error_result(call, error.info())
    hooks = middleware_context(head, rt.phase_memory(head, f"before_tool:{call.id}"))
    checked = before_tool(_middleware(rt, head), hooks, call)
    if isinstance(checked, Refuse):
        message = f"the call was refused by {checked.reason}"
        return _error_result(call, ToolDispatch(message, step=step, tool=call.name).info())
    if not tool.retry_safe:
        _replicate_claim(rt, head.run_id, what)
    renew_until = time.monotonic() + hard_limit_s(tool.attempt_limit_s)
    with rt.heartbeat.hold(head.run_id, claim.field, claim.token, renew_until) as held:
        rt.hooks.on_claimed(Phase.ACTING, head.run_id, rt.store)
        return invoke(rt, tool, checked, head, held, agent.state_type, emitter)


def _replicate_claim(rt: Runtime, run_id: str, what: str) -> None:
    """On a cluster, have a replica acknowledge the claim of a non-retry-safe call before it runs,
    so that a failover cannot lose the claim and let the call run a second time.

    No replica in time (none configured, or one far behind) does not stop the call: the primary
    then stands alone, as a standalone Redis does, and the log says so.
    """
    wait_ms = rt.settings.claim_wait_ms
    if not rt.settings.redis_cluster or wait_ms <= 0:
        return
    if rt.store.replicate(run_id, wait_ms) == 0:
        log.warning(
            "run %s: no replica acknowledged the claim of %s within %d ms; a failover now could"
            " lose it and run the call again",
            run_id,
            what,
            wait_ms,
        )


def invoke(
    rt: Runtime,
    tool: Tool,
    call: ToolCall,
    head: RunHead,
    held: Held,
    state_type: type[BaseModel] | None = None,
    emitter: CustomEmitter | None = None,
) -> ToolResult:
    """Validate the arguments and run the tool, retrying it as its ``retry`` says; its failures
    become data.

    A retry's wait is spent in this task, under the call's claim (bounded: ``Retry`` caps each wait
    at ``MAX_BACKOFF_S``); a cancel seen meanwhile ends the waiting with the last failure.
    """
    started = time.perf_counter()
    try:
        args = tool.validate(call.arguments)
    except ValidationError as exc:
        message = f"bad arguments for {call.name!r}: {validation_summary(exc)}"
        return _error_result(call, ToolDispatch(message, step=head.step, tool=call.name).info())
    retries = tool.retry.n if tool.retry is not None else 0
    # Each attempt sees the state as the step began: a failed attempt's changes are dropped.
    state = head.state_as(state_type) if state_type is not None else None
    attempt = 0
    while True:
        result = _attempt(rt, tool, call, head, held, args, started, state, emitter)
        retryable = result.error is not None and result.error.kind == "ToolDispatch"
        if result.ok or not retryable or attempt >= retries or tool.retry is None:
            if attempt and result.error is not None:
                result.error.details["attempts"] = attempt + 1
            return result
        log.info("run %s: tool %s failed (attempt %d); retrying", head.run_id, call.name, attempt + 1)
        if held.cancelled.wait(tool.retry.delay_s(attempt)):
            return result
        attempt += 1


def _attempt(
    rt: Runtime,
    tool: Tool,
    call: ToolCall,
    head: RunHead,
    held: Held,
    args: BaseModel,
    started: float,
    state: BaseModel | None,
    emitter: CustomEmitter | None = None,
) -> ToolResult:
    """One run of the tool within its timeout (``state``: the run's state as the tool sees it;
    ``emitter``: where its custom events go)."""
    ctx = ToolContext(
        run_id=head.run_id,
        step=head.step,
        call_id=call.id,
        deadline=time.time() + tool.timeout_s,
        _cancel_check=held.cancelled.is_set,
        state=state,
        _emitter=emitter,
        _memory=CallMemory(lambda: rt.memory(head), f"{head.run_id}:{head.step}:{call.id}"),
    )
    try:
        with rt.tracing.span("wesichain.tool", head.run_id, **{"wesichain.tool": call.name}) as span:
            output = call_with_timeout(lambda: tool.invoke(args, ctx), tool.timeout_s)
            if span is not None:
                span.set_attribute("wesichain.output_chars", len(output))
    except ToolTimeout as exc:
        if not tool.retry_safe:
            # It may have had its effect before the limit stopped it.
            message = (
                f"tool {call.name!r} is not retry-safe and {exc}: its effect may or may not have happened"
            )
            return _error_result(call, ToolOutcomeUnknown(message, step=head.step, tool=call.name).info())
        return _error_result(call, ToolDispatch(str(exc), step=head.step, tool=call.name).info())
    except ValidationError as exc:
        # Raised by the result check: the tool broke its own contract, not the model.
        message = f"tool {call.name!r} returned a result that does not match its declared type: "
        return _error_result(
            call, ToolDispatch(message + validation_summary(exc), step=head.step, tool=call.name).info()
        )
    except Exception as exc:  # a tool's failure is data for the policy, never a crashed worker
        log.info("run %s: tool %s raised %s", head.run_id, call.name, type(exc).__name__)
        message = f"{type(exc).__name__}: {exc}"[:2000]
        return _error_result(call, ToolDispatch(message, step=head.step, tool=call.name).info())
    limit = rt.settings.limits.max_tool_output_chars
    if len(output) > limit:
        output = output[:limit] + f"...[truncated {len(output) - limit} chars]"
    return ToolResult(
        call_id=call.id,
        name=call.name,
        ok=True,
        output=_printable(output),
        duration_s=round(time.perf_counter() - started, 6),
        state_update=ctx.state_update or None,
        memory_writes=ctx.memory.pending or None,
    )


def tool_timeout_result(call: ToolCall, tool: Tool | None, step: int, reason: str) -> ToolResult:
    """The result of a call whose process was killed at its hard time limit."""
    if tool is not None and not tool.retry_safe:
        message = (
            f"tool {call.name!r} is not retry-safe and {reason}: its effect may or may not have happened"
        )
        return _error_result(call, ToolOutcomeUnknown(message, step=step, tool=call.name).info())
    return _error_result(call, ToolDispatch(reason, step=step, tool=call.name).info())


def _error_result(call: ToolCall, error: RunErrorInfo) -> ToolResult:
    return ToolResult(
        call_id=call.id, name=call.name, ok=False, output=f"Error: {error.message}", error=error
    )


def _printable(text: str) -> str:
    # Lone surrogates (text decoded without care) cannot be written as JSON; replace them.
    return text.encode("utf-8", "replace").decode("utf-8")
