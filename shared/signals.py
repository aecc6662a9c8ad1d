"""Signals: user messages and state updates sent into a run that is running.

A producer sends a *signal* to a live run; the store takes it into the run's inbox at once
(``shared/lua/signal.lua``) under a sequence number the server assigns (1, 2, 3... per run), once
per client key. The run applies its pending signals, in sequence order, at its next think: before
the model is asked, the think commits one transition that appends every pending message to the
conversation as a user message, merges every valid state update into the run's state, and moves
the run's ``signals_applied`` cursor past them (:meth:`shared.fsm.Thinking.absorb`). The cursor is
part of the head, so it is written by the commit's compare-and-set with the checkpoint itself: a
worker killed before that commit leaves the signals pending, and the delivery that takes the think
over applies them; a commit cannot apply them twice.

What applying a signal gave (``accepted``, or ``rejected`` with the validation error of an update)
is a pure function of the head it was applied to and the signals before it, so every delivery of
the same think computes the same outcomes; they are written beside the inbox before the commit, and
a signal's status reads them only once the cursor covers it (:func:`signal_status`).

This module is the domain part: the shapes, the limits, and applying signals to a head (no I/O).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import InvalidRequest
from shared.messages import Message, UserMessage
from shared.request import check_json_depth
from shared.run_state import StateError, check_state
from shared.state import RunHead

__all__ = [
    "MAX_SIGNALS_PER_RUN",
    "MAX_SIGNAL_BYTES",
    "MAX_SIGNAL_KEY_CHARS",
    "MAX_INBOX_BYTES",
    "MAX_WAIT_S",
    "Absorbed",
    "Signal",
    "SignalKind",
    "SignalOutcome",
    "SignalStatus",
    "SignalView",
    "absorb",
    "body_digest",
    "body_json",
    "new_signal",
    "signal_status",
]

#: One signal's body (a message's text, an update's patch), as JSON.
MAX_SIGNAL_BYTES = 64 * 1024
#: Signals one run takes in its life (every one is kept, with its outcome, until the run expires).
MAX_SIGNALS_PER_RUN = 1000
#: The bodies of all the signals of one run, together.
MAX_INBOX_BYTES = 4 * 1024 * 1024
#: A client key (``Idempotency-Key``).
MAX_SIGNAL_KEY_CHARS = 200
#: The longest a reader may wait for a signal's outcome in one request.
MAX_WAIT_S = 30.0

SignalKind = Literal["message", "update"]
#: ``pending`` until the run's next think applies it; ``accepted`` or ``rejected`` (an update that
#: does not fit the run's state type) once applied; ``discarded`` when the run ended first.
SignalStatus = Literal["pending", "accepted", "rejected", "discarded"]


class Signal(BaseModel):
    """A signal as the inbox keeps it."""

    model_config = ConfigDict(extra="forbid")

    seq: int
    kind: SignalKind
    #: A message's text.
    text: str | None = None
    #: An update's fields, merged over the run's state.
    patch: dict[str, Any] | None = None
    key: str | None = None
    #: Who sent it (the API key's name, or what the caller said), for the timeline.
    by: str = ""
    at: float


class SignalOutcome(BaseModel):
    """What applying one signal gave."""

    status: Literal["accepted", "rejected"]
    error: str | None = None
    #: The version whose commit applied it.
    version: int


class SignalView(BaseModel):
    """A signal as producers see it: its id, and what became of it."""

    run_id: str
    id: int = Field(description="The signal's sequence number in its run (1, 2, 3, ...).")
    kind: SignalKind
    status: SignalStatus = Field(description="pending, accepted, rejected or discarded.")
    error: str | None = Field(default=None, description="Why an update was rejected.")
    version: int | None = Field(default=None, description="The run version that applied it.")
    key: str | None = None
    duplicate: bool = Field(default=False, description="The key was seen before: this is that signal.")
    at: float


def new_signal(
    kind: SignalKind,
    body: Any,
    *,
    key: str | None,
    by: str,
    at: float,
    max_message_chars: int,
) -> Signal:
    """A signal checked against its limits (``seq`` 0 until the inbox numbers it); raises
    :class:`InvalidRequest` naming what is wrong."""
    if key is not None and (not key or len(key) > MAX_SIGNAL_KEY_CHARS or not key.isprintable()):
        raise InvalidRequest(f"key: 1 to {MAX_SIGNAL_KEY_CHARS} printable characters")
    if kind == "message":
        if not isinstance(body, str) or not body.strip():
            raise InvalidRequest("text: a message is a non-blank string")
        if len(body) > max_message_chars:
            raise InvalidRequest(f"text: {len(body)} characters, over the limit of {max_message_chars}")
        signal = Signal(seq=0, kind=kind, text=body, key=key, by=by[:200], at=at)
    else:
        if not isinstance(body, dict) or not body or not all(isinstance(k, str) for k in body):
            raise InvalidRequest("patch: an update is a non-empty JSON object of state fields")
        check_json_depth("patch", body)
        signal = Signal(seq=0, kind=kind, patch=body, key=key, by=by[:200], at=at)
    if (size := len(body_json(signal))) > MAX_SIGNAL_BYTES:
        raise InvalidRequest(
            f"the signal's body is {size} bytes as JSON, over the limit of {MAX_SIGNAL_BYTES}"
        )
    return signal


def body_json(signal: Signal) -> str:
    """The signal's body as canonical JSON: what its size is counted on and its key compared by."""
    body = signal.text if signal.kind == "message" else signal.patch
    return json.dumps([signal.kind, body], sort_keys=True, separators=(",", ":"))


def body_digest(signal: Signal) -> str:
    """The digest a client key remembers: the same key with another body is a conflict."""
    return hashlib.sha256(body_json(signal).encode()).hexdigest()


@dataclass(frozen=True)
class Absorbed:
    """The pending signals applied to a head: what the absorbing commit writes."""

    messages: tuple[Message, ...]
    state: dict[str, Any] | None
    outcomes: dict[int, SignalOutcome]
    upto: int


def absorb(
    head: RunHead, signals: Sequence[Signal], state_type: type[BaseModel] | None, version: int
) -> Absorbed:
    """Apply ``signals`` (in sequence order) to ``head``: messages become user messages; an
    update is merged over the state and the whole state validated, or rejected with the error.

    Deterministic: the same head and signals give the same result on every delivery.
    """
    messages: list[Message] = []
    state = head.state
    outcomes: dict[int, SignalOutcome] = {}
    upto = head.signals_applied
    for signal in sorted(signals, key=lambda s: s.seq):
        if signal.seq <= upto:
            continue  # applied already (a stale read)
        upto = signal.seq
        if signal.kind == "message":
            messages.append(UserMessage(content=signal.text or ""))
            outcomes[signal.seq] = SignalOutcome(status="accepted", version=version)
            continue
        error: str | None = None
        if state_type is None or state is None:
            error = "the run's agent declares no state_type, so its runs take no state updates"
        else:
            try:
                state = check_state(state_type, {**state, **(signal.patch or {})})
            except StateError as exc:
                error = str(exc)
        outcomes[signal.seq] = SignalOutcome(
            status="rejected" if error else "accepted", error=error, version=version
        )
    return Absorbed(tuple(messages), state, outcomes, upto)


def signal_status(signal: Signal, head: RunHead, outcome: SignalOutcome | None) -> SignalView:
    """What became of ``signal`` as of ``head`` (the run's current head)."""
    view = SignalView(
        run_id=head.run_id, id=signal.seq, kind=signal.kind, status="pending", key=signal.key, at=signal.at
    )
    if signal.seq <= head.signals_applied and outcome is not None:
        return view.model_copy(
            update={"status": outcome.status, "error": outcome.error, "version": outcome.version}
        )
    if head.terminal:
        return view.model_copy(update={"status": "discarded", "error": "the run ended before it was applied"})
    return view
