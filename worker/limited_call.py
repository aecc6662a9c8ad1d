"""A think's model call under the shared provider limits, measured; and the re-queue of a think
that got no capacity.

A think that cannot get capacity does not hold its worker thread: its claim is given back (the
attempt uncounted: waiting is not a crash, so it never counts towards the poison limit and never
looks like a lost phase to the sweeper), the run records why it waits, and the same think task is
published again with a countdown (``RunStore.throttle``).
"""

from __future__ import annotations

import json
import logging
import time

from shared.agents import Agent
from shared.errors import ModelTransport
from shared.limits import Throttled
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse
from shared.state import RunHead
from shared.store import ClaimRef
from shared.tasks import task_for
from worker.heartbeat import Held
from worker.metrics import model_error_kind, split_model
from worker.model_call import ModelCall
from worker.runtime import Runtime
from worker.throttle import DEFAULT_BACK_OFF_S, LimitedAdapter

__all__ = ["call_model", "requeue_throttled"]

log = logging.getLogger("wesichain.limits")


def call_model(
    rt: Runtime,
    head: RunHead,
    agent: Agent,
    adapter: LlmAdapter,
    request: ModelRequest,
    held: Held,
    stream: bool | None = None,
) -> ModelResponse:
    """Call the model for ``head``'s think, within its provider limit if one applies.

    Raises :class:`Throttled` when the limit has no capacity now, or when the provider answered
    429 (after making the whole pool back off); the call's capacity is given back when it ends.
    """
    gate = rt.gate
    limit = gate.limit_for(head, agent) if gate is not None else None
    if gate is not None and limit is not None:
        adapter = LimitedAdapter(adapter, gate, gate.admit(limit, request))
    call = ModelCall(
        rt.store,
        run_id=head.run_id,
        step=head.step,
        held=held,
        stream=agent.stream if stream is None else stream,
        max_delta_chars=rt.settings.limits.max_event_payload_chars,
        carry=lambda *deltas: rt.carry_events(head.run_id, *deltas),
    )
    provider, model = split_model(head.model)
    span_attributes = {"wesichain.step": head.step, "gen_ai.system": provider, "gen_ai.request.model": model}
    started = time.perf_counter()
    try:
        with rt.tracing.span("wesichain.model_call", head.run_id, **span_attributes) as span:
            response = call.run(adapter, request)
            if span is not None:
                span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    except ModelTransport as exc:
        rt.metrics.model_call(
            head.model, time.perf_counter() - started, error=model_error_kind(exc.status_code, exc.retryable)
        )
        if limit is not None and exc.status_code == 429:
            raise Throttled(limit.scope, "retry_after", exc.retry_after_s or DEFAULT_BACK_OFF_S) from exc
        raise
    usage = response.usage
    rt.metrics.model_call(
        head.model,
        time.perf_counter() - started,
        error=None,
        tokens_in=usage.input_tokens,
        tokens_out=usage.output_tokens,
    )
    return response


def requeue_throttled(rt: Runtime, head: RunHead, claim: ClaimRef, throttled: Throttled) -> None:
    """Give the think back and publish it again after its countdown (nothing if the claim was lost)."""
    wait = throttled.countdown()
    why = json.dumps(
        {"version": head.version, "step": head.step, "limit": throttled.scope, "reason": throttled.reason}
    )
    count = rt.store.throttle(head.run_id, head.version, claim.token, wait, why)
    if count == 0:
        return  # taken over meanwhile: the new holder goes on
    rt.metrics.model_throttled(head.model, throttled.reason)
    log.info(
        "run %s: think of step %d throttled (%s on %s); again in %.2fs (%d so far)",
        head.run_id,
        head.step,
        throttled.reason,
        throttled.scope,
        wait,
        count,
    )
    (spec,) = task_for(head)
    rt.publish([spec.model_copy(update={"countdown": wait})], head.epoch)
