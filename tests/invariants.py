"""Event-stream invariants every run must keep, crash or no crash.

The checker is the one shipped to users in the pytest plugin (``worker.pytest_plugin``): the suite
holds every run to the same rules a user's own tests do.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.events import LIVE_EVENTS, Event
from worker.pytest_plugin import assert_event_invariants

__all__ = ["ONE_HOP", "assert_event_invariants", "committed", "kinds"]

#: The committed events of a run with one tool hop, in order.
ONE_HOP = [
    "RunStarted",
    "StepStarted",
    "ModelResponded",
    "ToolDispatched",
    "ToolCompleted",
    "StepStarted",
    "ModelResponded",
    "Completed",
]


def kinds(events: Iterable[Event]) -> list[str]:
    return [e.kind for e in events if e.kind not in LIVE_EVENTS]


def committed(events: Iterable[Event]) -> list[Event]:
    """The events written by commits (token deltas and tools' custom events are appended outside
    them, and may repeat)."""
    return [e for e in events if e.kind not in LIVE_EVENTS]
