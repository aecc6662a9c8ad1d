"""A run's inbox: signals (messages and state updates) sent into a running run.

Taking a signal is one script (``signal.lua``): numbered, deduplicated by its client key, bounded,
its ``SignalReceived`` event appended with it. Applying signals is a commit of the run (its cursor,
``RunHead.signals_applied``, is part of the head); what applying each gave is written here first
(:meth:`SignalsMixin.record_outcomes`) and read once the cursor covers it (``shared/signals.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from shared import protocol
from shared.events import SignalReceived, dump_event
from shared.signals import (
    MAX_INBOX_BYTES,
    MAX_SIGNALS_PER_RUN,
    Signal,
    SignalOutcome,
    body_digest,
    body_json,
)
from shared.state import Phase
from shared.store.base import StoreCore, _s

__all__ = ["SignalTaken", "SignalsMixin"]


@dataclass(frozen=True)
class SignalTaken:
    """What sending a signal did.

    ``stored``: taken under ``seq``; ``duplicate``: its key named signal ``seq`` already (with the
    same body); ``conflict``: its key named signal ``seq`` with another body; ``ended``: the run
    ended (in ``phase``); ``full``: the run took as many signals (or bytes) as it may (``limit``);
    ``missing``: no such run in Redis.
    """

    status: Literal["stored", "duplicate", "conflict", "ended", "full", "missing"]
    seq: int = 0
    phase: Phase | None = None
    limit: int = 0


def _cut(json_text: str) -> tuple[str, str]:
    """A JSON object without ``seq`` as the head and tail the script puts the number between."""
    return '{"seq":', "," + json_text[1:]


class SignalsMixin(StoreCore):
    """Taking signals into a run's inbox, reading them and their outcomes."""

    def send_signal(self, run_id: str, signal: Signal) -> SignalTaken:
        """Take ``signal`` (its ``seq`` is assigned here) into the inbox of ``run_id``."""
        k = self.keys
        record_head, record_tail = _cut(signal.model_dump_json(exclude={"seq"}))
        event = SignalReceived(run_id=run_id, step=0, seq=0, signal=signal.kind, by=signal.by)
        event_head, event_tail = _cut(dump_event(event).replace('"seq":0,', "", 1))
        reply = self._run(
            "signal",
            [k.run(run_id), k.inbox(run_id), k.events(run_id)],
            [
                signal.key or "",
                body_digest(signal),
                record_head,
                record_tail,
                event_head,
                event_tail,
                len(body_json(signal)),
                MAX_SIGNALS_PER_RUN,
                MAX_INBOX_BYTES,
                self.settings.limits.events_maxlen,
            ],
        )
        status = _s(reply[0])
        if status in ("stored", "duplicate"):
            return SignalTaken(status, int(_s(reply[1])), Phase(_s(reply[2])))  # type: ignore[arg-type]
        if status == "conflict":
            return SignalTaken("conflict", int(_s(reply[1])))
        if status == "ended":
            return SignalTaken("ended", phase=Phase(_s(reply[1])))
        if status == "full":
            return SignalTaken("full", limit=int(_s(reply[1])))
        return SignalTaken("missing")

    def pending_signals(self, run_id: str, applied: int) -> list[Signal]:
        """The signals after sequence number ``applied``, in order (one round trip when none)."""
        inbox = self.keys.inbox(run_id)
        last = int(self.redis.hget(inbox, protocol.INBOX_NEXT) or 0)
        if last <= applied:
            return []
        fields = [f"{protocol.INBOX_SIGNAL_PREFIX}{seq}" for seq in range(applied + 1, last + 1)]
        return [Signal.model_validate_json(raw) for raw in self.redis.hmget(inbox, fields) if raw is not None]

    def load_signal(self, run_id: str, seq: int) -> tuple[Signal, SignalOutcome | None] | None:
        """One signal of the run and what applying it gave (None: not applied by any delivery yet)."""
        raw, outcome = self.redis.hmget(
            self.keys.inbox(run_id),
            f"{protocol.INBOX_SIGNAL_PREFIX}{seq}",
            f"{protocol.INBOX_OUTCOME_PREFIX}{seq}",
        )
        if raw is None:
            return None
        return Signal.model_validate_json(raw), (
            SignalOutcome.model_validate_json(outcome) if outcome is not None else None
        )

    def record_outcomes(self, run_id: str, outcomes: Mapping[int, SignalOutcome]) -> None:
        """Write what applying signals gave, before the commit that applies them (every delivery of
        that commit computes the same outcomes; readers trust one only once the cursor covers it)."""
        if outcomes:
            self.redis.hset(
                self.keys.inbox(run_id),
                mapping={
                    f"{protocol.INBOX_OUTCOME_PREFIX}{seq}": o.model_dump_json()
                    for seq, o in outcomes.items()
                },
            )
