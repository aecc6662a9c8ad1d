"""``/v1/runs/{id}/messages``, ``/updates`` and ``/signals``: messages and state updates sent into a
tenant's running run, and what became of them (``shared/signals.py``).

As everywhere under ``/v1/runs``, another tenant's run is a 404, exactly as a run that does not
exist.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from producer.api.auth import Caller
from producer.api.errors import ApiError
from producer.api.limits import StreamSlot
from producer.api.runs import ERRORS, Svc, Who, owned_run
from producer.api.services import Services
from producer.client import RequestConflict, RunHandle, RunNotFound, SignalRefused, signal_view
from shared.errors import InvalidRequest
from shared.signals import MAX_SIGNAL_KEY_CHARS, MAX_WAIT_S, SignalKind, SignalView

__all__ = ["MessageBody", "UpdateBody", "get_signal", "router", "send_message", "send_update"]

router = APIRouter(prefix="/v1", responses=ERRORS)

_KEY = Field(
    default=None,
    min_length=1,
    max_length=MAX_SIGNAL_KEY_CHARS,
    description="A client key: the same signal sent again under it is answered with the first one"
    " (the same key with another body is a 409). The ``Idempotency-Key`` header does the same.",
)


class MessageBody(BaseModel):
    """``POST /v1/runs/{id}/messages``: a user message for the run's next think."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=1_000_000, description="The message, as the user says it.")
    key: str | None = _KEY


class UpdateBody(BaseModel):
    """``POST /v1/runs/{id}/updates``: fields to merge over the run's state at its next think."""

    model_config = ConfigDict(extra="forbid")

    patch: dict[str, Any] = Field(
        description="State fields and their new values; the whole state is validated against the"
        " agent's state type before it is committed."
    )
    key: str | None = _KEY


def _send(
    services: Services, who: Caller, run_id: str, kind: SignalKind, body: Any, key: str | None
) -> SignalView:
    owned_run(services, who, run_id)
    by = "api (no auth)" if who.key_id is None else f"tenant {who.tenant} key {who.key_id}"
    try:
        handle = RunHandle(services.client, run_id)
        if kind == "message":
            return handle.send_message(body, key=key, by=by)
        return handle.update(body, key=key, wait=None, by=by)
    except InvalidRequest as exc:
        raise ApiError(422, "invalid_request", exc.message) from None
    except RequestConflict as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except SignalRefused as exc:
        raise ApiError(409, exc.code, str(exc)) from None
    except RunNotFound:
        raise ApiError(404, "not_found", f"no run {run_id!r}") from None


def _key(header: str | None, body_key: str | None) -> str | None:
    if header is not None and body_key is not None and header != body_key:
        raise ApiError(422, "invalid_request", "the Idempotency-Key header and the body's key differ")
    return header if header is not None else body_key


_IdempotencyKey = Annotated[str | None, Header(min_length=1, max_length=MAX_SIGNAL_KEY_CHARS)]

_SENT = (
    " Answers 202 with the signal's id and status (``pending`` until the run's next think applies"
    " it). 409 ``run_ended`` when the run has ended, 409 ``inbox_full`` when it took as many"
    " signals as a run may, 409 ``conflict`` for a key reused with another body."
)


@router.post(
    "/runs/{run_id}/messages",
    status_code=202,
    response_model=SignalView,
    summary="Send a user message into a running run",
    description="Stored at once; the run's next think appends it to the conversation as a user"
    " message, in the order sent, before the model is asked. A run parked for approval of tool calls"
    " whose agent has ``wake_on_message`` is woken by it (the calls are denied, not run)." + _SENT,
)
def send_message(
    run_id: str, body: MessageBody, services: Svc, who: Who, idempotency_key: _IdempotencyKey = None
) -> SignalView:
    return _send(services, who, run_id, "message", body.text, _key(idempotency_key, body.key))


@router.post(
    "/runs/{run_id}/updates",
    status_code=202,
    response_model=SignalView,
    summary="Send a state update into a running run",
    description="Stored at once; the run's next think merges the fields over the run's state,"
    " validates the whole state against its agent's state type and commits it, or rejects the"
    " update with the validation error (nothing applied). Read the outcome with"
    " ``GET /v1/runs/{id}/signals/{signal_id}?wait=SECONDS``." + _SENT,
)
def send_update(
    run_id: str, body: UpdateBody, services: Svc, who: Who, idempotency_key: _IdempotencyKey = None
) -> SignalView:
    return _send(services, who, run_id, "update", body.patch, _key(idempotency_key, body.key))


@router.get(
    "/runs/{run_id}/signals/{signal_id}",
    response_model=SignalView,
    summary="What became of a message or update sent into a run",
    description="``pending``, ``accepted``, ``rejected`` (with the error) or ``discarded`` (the run"
    f" ended first). With ``wait``, answers once it is no longer pending or after that many seconds"
    f" (at most {MAX_WAIT_S:g}).",
)
async def get_signal(
    run_id: str,
    signal_id: Annotated[int, Path(ge=1, le=2**31)],
    services: Svc,
    who: Who,
    request: Request,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> SignalView:
    await asyncio.to_thread(owned_run, services, who, run_id)
    deadline = time.monotonic() + wait
    delay = 0.02
    slot: StreamSlot | None = None
    try:
        while True:
            view = await asyncio.to_thread(signal_view, services.store, run_id, signal_id)
            if view is None:
                raise ApiError(404, "not_found", f"no signal {signal_id} in run {run_id!r}")
            if view.status != "pending" or time.monotonic() >= deadline:
                return view
            if slot is None:
                # A wait holds a connection and polls Redis, as an event stream does: it takes one
                # of the tenant's stream places for as long (429 ``too_many_streams`` past them).
                slot = services.streams.take(who.tenant)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.25)
            if await request.is_disconnected():
                # Nobody reads the answer: give the place back now, not when the wait runs out.
                return view
    finally:
        if slot is not None:
            slot.release()
