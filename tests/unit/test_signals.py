"""Signals applied to a head (``shared/signals.py``): pure, ordered, deterministic."""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel, Field

from shared.errors import InvalidRequest
from shared.messages import UserMessage
from shared.signals import Signal, SignalOutcome, absorb, body_digest, new_signal, signal_status
from shared.state import Phase, RunHead


class Ticket(BaseModel):
    priority: int = Field(default=0, ge=0, le=5)
    tags: list[str] = []


def _head(**changes: object) -> RunHead:
    head = RunHead.new_idle("r1", "a", "go")
    return head.model_copy(
        update={"phase": Phase.THINKING, "version": 4, "state": {"priority": 0, "tags": []}, **changes}
    )


def _signal(seq: int, kind: str, body: object) -> Signal:
    made = new_signal(kind, body, key=None, by="", at=1.0, max_message_chars=100)  # type: ignore[arg-type]
    return made.model_copy(update={"seq": seq})


def test_signals_apply_in_sequence_order_and_a_bad_update_changes_nothing() -> None:
    signals = [
        _signal(3, "update", {"priority": 9}),  # out of range: rejected
        _signal(1, "message", "first"),
        _signal(2, "update", {"priority": 2}),
        _signal(4, "message", "second"),
        _signal(5, "update", {"tags": ["x"]}),
    ]
    applied = absorb(_head(), signals, Ticket, 5)
    assert applied.messages == (UserMessage(content="first"), UserMessage(content="second"))
    assert applied.state == {"priority": 2, "tags": ["x"]}
    assert applied.upto == 5
    assert [(s, o.status) for s, o in applied.outcomes.items()] == [
        (1, "accepted"), (2, "accepted"), (3, "rejected"), (4, "accepted"), (5, "accepted"),
    ]  # fmt: skip
    error = applied.outcomes[3].error
    assert error is not None and "does not fit Ticket" in error and "priority" in error
    assert absorb(_head(), list(reversed(signals)), Ticket, 5) == applied  # deterministic


def test_signals_the_cursor_covers_are_skipped_and_stateless_agents_reject_updates() -> None:
    head = _head(signals_applied=1, state=None)
    applied = absorb(head, [_signal(1, "message", "old"), _signal(2, "update", {"a": 1})], None, 5)
    assert applied.messages == () and applied.upto == 2
    assert applied.outcomes[2].status == "rejected" and "declares no state_type" in (
        applied.outcomes[2].error or ""
    )


def test_status_reads_the_outcome_only_once_the_cursor_covers_it() -> None:
    signal = _signal(2, "update", {"priority": 1})
    outcome = SignalOutcome(status="accepted", version=5)
    assert signal_status(signal, _head(signals_applied=1), outcome).status == "pending"
    assert signal_status(signal, _head(signals_applied=2), outcome).status == "accepted"
    ended = _head(signals_applied=1, phase=Phase.COMPLETED)
    assert signal_status(signal, ended, outcome).status == "discarded"


@pytest.mark.parametrize(
    ("kind", "body", "key", "problem"),
    [
        ("message", "", None, "non-blank"),
        ("message", " \n", None, "non-blank"),
        ("message", 3, None, "non-blank"),
        ("message", "x" * 101, None, "over the limit"),
        ("update", {}, None, "non-empty JSON object"),
        ("update", ["a"], None, "non-empty JSON object"),
        ("update", {"a": "y" * 70_000}, None, "bytes as JSON"),
        ("message", "hi", "", "key"),
        ("message", "hi", "k" * 201, "key"),
        ("message", "hi", "bad\nkey", "key"),
    ],
)
def test_bad_signals_are_refused(kind: str, body: object, key: str | None, problem: str) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        new_signal(kind, body, key=key, by="", at=time.time(), max_message_chars=100)  # type: ignore[arg-type]


def test_the_digest_tells_bodies_apart_not_keys_or_times() -> None:
    a = new_signal("message", "hi", key="k", by="x", at=1.0, max_message_chars=100)
    b = new_signal("message", "hi", key="k2", by="y", at=2.0, max_message_chars=100)
    c = new_signal("update", {"hi": 1}, key="k", by="x", at=1.0, max_message_chars=100)
    assert body_digest(a) == body_digest(b) != body_digest(c)
