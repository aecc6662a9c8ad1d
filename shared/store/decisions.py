"""What reaches a run from outside its own work: human decisions, cancels, callback deliveries
and waits for provider capacity.
"""

from __future__ import annotations

import json
from typing import Any

from shared import protocol
from shared.state import Decision, Phase
from shared.store.base import StoreCore, _s

__all__ = [
    "DecisionsMixin",
]


class DecisionsMixin(StoreCore):
    """Decisions, cancels, completion callbacks and throttling."""

    # -- human decisions and cancels -------------------------------------------------------

    def submit_decision(self, run_id: str, version: int, decision: Decision) -> bool:
        """Store a human's decision on a run parked at ``version``; False if it is not parked there."""
        k = self.keys
        reply = self._run(
            "decide",
            [k.run(run_id), k.leases_of(run_id)],
            [run_id, version, decision.model_dump_json(), self._queued_ms],
        )
        return int(reply) == 1

    def load_decision(self, run_id: str) -> Decision | None:
        raw = self.redis.hget(self.keys.run(run_id), protocol.DECISION)
        return Decision.model_validate_json(raw) if raw else None

    def finish_callback(self, run_id: str, token: str, outcome: str, state: str, wait_s: float = 0) -> bool:
        """End one callback delivery attempt as the claim's holder (see ``finish_callback.lua``)."""
        reply = self._run(
            "finish_callback",
            [self.keys.run(run_id), self.keys.leases_of(run_id)],
            [run_id, token, outcome, state, int(wait_s * 1000), self._queued_ms],
        )
        return int(reply) == 1

    def callback_state(self, run_id: str) -> str | None:
        """The JSON of a run's callback delivery (attempts, last error), if it has a callback."""
        raw = self.redis.hget(self.keys.run(run_id), protocol.CALLBACK_STATE)
        if raw is None and (archive := self._archived(run_id)) is not None:
            return archive.callback_state(run_id)
        return _s(raw) if raw is not None else None

    def throttle(self, run_id: str, version: int, token: str, wait_s: float, why: str) -> int:
        """Give a think claimed by ``token`` back for ``wait_s``: no provider capacity (see
        ``throttle.lua``). Returns the run's throttle count, 0 if the claim is no longer held."""
        k = self.keys
        reply = self._run(
            "throttle",
            [k.run(run_id), k.attempts(run_id), k.leases_of(run_id)],
            [run_id, version, token, int(wait_s * 1000), self._queued_ms, why],
        )
        return int(reply)

    def throttled(self, run_id: str) -> tuple[dict[str, Any], int] | None:
        """Why the run's think last waited for provider capacity, and how often it did (None: never)."""
        raw, count = self.redis.hmget(self.keys.run(run_id), protocol.THROTTLED, protocol.THROTTLES)
        if raw is None:
            return None
        return json.loads(_s(raw)), int(count or 0)

    def request_cancel(self, run_id: str) -> Phase | None:
        phase = _s(self._run("cancel", [self.keys.run(run_id)], []))
        if not phase and (archive := self.archive) is not None:
            archived = archive.load(run_id)  # ended long ago: nothing to cancel
            return archived.phase if archived is not None else None
        return Phase(phase) if phase else None
