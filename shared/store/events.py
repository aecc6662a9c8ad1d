"""A run's event stream outside commits: live events appended, read and waited for.

Events that are part of a state change are written by the commit's own script (``claims``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from shared.events import Event, dump_event, load_event, stream_after
from shared.store.base import StoreCore, _s

__all__ = [
    "EventsMixin",
]


class EventsMixin(StoreCore):
    """Appending, reading and waiting for a run's events."""

    # -- events ----------------------------------------------------------------------------

    def emit(
        self, run_id: str, events: Sequence[Event], step: int | None = None, claim_token: str | None = None
    ) -> int:
        """Append events that are not part of a commit (live token deltas, custom events voided)
        while the run has not ended, is at ``step`` if one is given, and its phase claim is the one
        ``claim_token`` names if one is given (``emit_live.lua``): a delivery that lost its claim
        (handed on, or its phase committed by another) appends nothing.
        Returns how many were appended: all, or none (the run ended or moved on)."""
        if not events:
            return 0
        k = self.keys
        appended = self._run(
            "emit_live",
            [k.run(run_id), k.events(run_id)],
            [
                "" if step is None else step,
                self.settings.limits.events_maxlen,
                claim_token or "",
                *map(dump_event, events),
            ],
        )
        return int(appended)

    def emit_custom(self, run_id: str, step: int, call_id: str, claim_token: str, event: Event) -> bool:
        """Append a tool's custom event if the delivery holding ``claim_token`` still holds the call
        and the call has no result yet (``emit_custom.lua``); False: fenced off, nothing appended."""
        k = self.keys
        appended = self._run(
            "emit_custom",
            [k.run(run_id), k.results(run_id, step), k.events(run_id)],
            [step, call_id, claim_token, dump_event(event), self.settings.limits.events_maxlen],
        )
        return int(appended) == 1

    def read_events(self, run_id: str, after: str = "0-0", count: int = 1000) -> list[tuple[str, Event]]:
        raw = self.redis.xrange(self.keys.events(run_id), min=stream_after(after), count=count)
        if not raw and (archive := self._archived(run_id)) is not None:
            return archive.events(run_id, after, count)
        return _entries(raw)

    def wait_events(self, run_id: str, after: str, timeout_s: float) -> list[tuple[str, Event]]:
        """Block up to ``timeout_s`` for events after ``after`` (XREAD BLOCK; polled when embedded)."""
        key = self.keys.events(run_id)
        if self.settings.embedded:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if batch := self.read_events(run_id, after):
                    return batch
                time.sleep(0.01)
            return []
        reply: Any = self.redis.xread({key: after}, count=500, block=max(1, int(timeout_s * 1000)))
        return _entries(reply[0][1] if reply else [])


def _entries(raw: Any) -> list[tuple[str, Event]]:
    entries = []
    for eid, fields in raw:
        event = load_event(fields["e"])
        event.stream_id = _s(eid)
        entries.append((event.stream_id, event))
    return entries
