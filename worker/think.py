"""The think phase: ask the model, validate what it wants, and commit the next move."""

from __future__ import annotations

import time

from shared import events as ev
from shared import fsm
from shared.actions import accept_tool_calls
from shared.errors import ConfigError, InvalidModelAction, ModelTransport, RunConfigError, RunError
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse, TextDelta
from shared.llm.resolver import resolve_model
from shared.messages import Message
from shared.policy import Retry, decide_invalid_action, decide_model_error
from shared.state import Phase
from shared.store import Claim
from shared.tasks import TASK_THINK
from worker.heartbeat import Held
from worker.runtime import Runtime

#: Token deltas are flushed to the event stream at most this often (one round trip per batch).
DELTA_FLUSH_S = 0.05


def run_think(
    rt: Runtime, run_id: str, step: int, version: int, epoch: int = 0, takeover: bool = False
) -> None:
    claim = rt.store.begin(
        run_id, version, Phase.THINKING, epoch, step, f"{step}:think", with_messages=True, takeover=takeover
    )
    claim = rt.ready(claim, TASK_THINK, run_id, version, f"think of step {step}")
    if claim is None:
        return
    current = fsm.view(claim.head)
    assert isinstance(current, fsm.Thinking)
    with rt.heartbeat.hold(run_id, claim.claim_field, claim.token) as held:
        rt.paused(Phase.THINKING, run_id)
        _think(rt, current, claim, held)


def _think(rt: Runtime, current: fsm.Thinking, claim: Claim, held: Held) -> None:
    head = current.head
    agent = rt.agents.get(head.agent)
    step = head.step
    try:
        adapter = resolve_model(head.model, rt.agents)
        request = ModelRequest(
            model=head.model.partition(":")[2], messages=claim.messages, tools=agent.tools.specs()
        )
        response = _call_model(rt, adapter, request, head.run_id, step, stream=agent.stream, held=held)
    except Cancelled:
        rt.interrupt(current, "cancelled")
        return
    except ModelTransport as exc:
        exc.step = step
        decision, consume = decide_model_error(agent.policy, head.model_retries, exc.retryable)
        error = exc.info()
        if decision == "retry":
            policy = agent.policy.on_model_error
            delay = policy.delay_s(head.model_retries) if isinstance(policy, Retry) else 0.0
            rt.commit(current, current.retry(error, consume), countdown=delay)
        elif decision == "interrupt":
            rt.interrupt(current, "model error (halted by policy)", error)
        else:
            rt.fail(
                current, error, (ev.StepFailed(run_id=head.run_id, step=step, error=error, decision="fail"),)
            )
        return
    except RunError as exc:
        rt.fail(current, exc.info())
        return
    except ConfigError as exc:
        # This worker cannot build the run's model (unknown provider, missing API key): no
        # redelivery can change that, so the run fails now instead of crashing every attempt.
        rt.fail(current, RunConfigError(str(exc), step=step).info())
        return
    try:
        calls = accept_tool_calls(response, agent.tools, step, rt.settings.limits)
    except InvalidModelAction as exc:
        _on_invalid(rt, current, exc, response, claim.messages)
        return
    needs_approval = sorted({c.name for c in calls} & agent.approval_required)
    if needs_approval:
        rt.commit(current, current.park(response.text, calls, response.usage, needs_approval))
    elif calls:
        rt.commit(current, current.act(response.text, calls, response.usage))
    else:
        answer = (response.text or "")[: rt.settings.limits.max_message_chars]
        rt.commit(current, current.complete(answer, response.usage))


def _on_invalid(
    rt: Runtime,
    current: fsm.Thinking,
    exc: InvalidModelAction,
    response: ModelResponse,
    history: list[Message],
) -> None:
    head = current.head
    agent = rt.agents.get(head.agent)
    decision, consume = decide_invalid_action(agent.policy, head.reprompts)
    error = exc.info()
    if decision == "reprompt" and (not consume or current.budget_left > 0):
        correction = (
            f"Your previous reply could not be used: {exc.message}. "
            f"Available tools: {', '.join(agent.tools.names) or 'none'}. "
            "Reply again with valid tool calls (arguments as a JSON object) or with a final answer."
        )
        raw = response.raw or response.text or _describe_calls(response)
        rt.commit(current, current.reprompt(error, raw, correction, response.usage, consume))
    elif decision == "interrupt":
        rt.interrupt(current, "invalid model action (halted by policy)", error)
    else:
        step_failed = ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="fail")
        rt.fail(current, error, (step_failed,))


def _describe_calls(response: ModelResponse) -> str:
    return "; ".join(f"{c.name}({c.arguments!r})"[:500] for c in response.tool_calls)


class Cancelled(Exception):
    """The run was cancelled while the model was still streaming."""


def _call_model(
    rt: Runtime,
    adapter: LlmAdapter,
    request: ModelRequest,
    run_id: str,
    step: int,
    *,
    stream: bool,
    held: Held,
) -> ModelResponse:
    if not stream:
        return adapter.complete(request)
    pending: list[str] = []
    last_flush = time.monotonic()
    final: ModelResponse | None = None
    for part in adapter.stream(request):
        if held.cancelled.is_set():
            # Closing the generator closes the HTTP response: the provider stops generating.
            raise Cancelled()
        if isinstance(part, TextDelta):
            pending.append(part.text)
            if time.monotonic() - last_flush >= DELTA_FLUSH_S:
                _flush(rt, run_id, step, pending)
                last_flush = time.monotonic()
        else:
            final = part
    _flush(rt, run_id, step, pending)
    if final is None:
        raise ModelTransport("the model stream ended without a final response", retryable=True, step=step)
    return final


def _flush(rt: Runtime, run_id: str, step: int, pending: list[str]) -> None:
    if pending:
        text = "".join(pending)[: rt.settings.limits.max_event_payload_chars]
        rt.store.emit(run_id, [ev.TokenDelta(run_id=run_id, step=step, text=text)])
        pending.clear()
