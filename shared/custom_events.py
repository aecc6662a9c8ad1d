"""Custom events from tools: what ``ctx.emit(name, data)`` checks, bounds and appends.

A tool reports progress or partial results while it runs. Progress is only useful live, so each
event is appended to the run's stream at once (one round trip), not held until the call's result
is recorded. What keeps it consistent with the call's one recorded result:

* the append is fenced in Redis (``emit_custom.lua``): it is made only while the emitting delivery
  still holds the call's claim (its token, not handed on) and the call has no result yet. So a
  delivery that was fenced off appends nothing more, and no custom event of a call follows its
  ``ToolCompleted``;
* what such a delivery appended before it was fenced off is marked void by a
  ``CustomEventsVoided`` event, written by the runtime when it learns of the fence: by the
  delivery that takes the call over, before the tool runs again, and by a delivery whose result
  was refused because the call already had one.

Bounds, per delivery of a call (``Limits``): the data is JSON of at most
``max_custom_event_bytes``; at most ``max_custom_events_per_call`` events, at
``custom_events_per_s`` (a token bucket, bursts of twice the rate). An event over the count or the
rate is dropped, never failing the tool, and the delivery writes one ``CustomEventsDropped`` with
their number when the tool returns. A name or data that breaks the rules is the tool's bug: a
``ValueError`` in the tool. Redis trouble is logged (never the event's content) and the event
dropped: an emit never raises it into the tool.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from shared.events import EVENT_KINDS, CustomEvent, CustomEventsDropped, Event
from shared.settings import Limits

__all__ = [
    "CustomEmitter",
    "NAME_PATTERN",
    "RESERVED_NAMES",
    "TokenBucket",
    "Writer",
    "check_custom",
    "void_attempts",
]

log = logging.getLogger("wesichain.custom_events")

#: A custom event's name: a short identifier, as a stream mode or a metric label would be.
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
#: Names a tool may not use: the runtime's own event kinds (and their lower-case spellings), so a
#: reader that filters on names never mistakes a tool's event for the runtime's.
RESERVED_NAMES = frozenset(kind.lower() for kind in EVENT_KINDS)

#: Appends one event if its delivery still holds the call (``RunStore.emit_custom`` bound to the
#: delivery's claim): True when appended, False when fenced off.
Writer = Callable[[Event], bool]


def check_custom(name: object, data: object, max_bytes: int) -> Any:
    """``data`` as the JSON value it will be stored as; ``ValueError`` for a name that is not a
    short identifier or a reserved one, data that is not JSON, or data over ``max_bytes``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            "a custom event's name must be a short identifier (a letter, then up to 63 letters,"
            f" digits or _.:-), got {str(name)[:70]!r}"
        )
    if name.lower() in RESERVED_NAMES:
        raise ValueError(f"{name!r} is the name of a runtime event: pick another for a custom event")
    try:
        text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        # The message names the type, never the value: the data is tenant content.
        raise ValueError(f"custom event {name!r}: data must be JSON ({exc.__class__.__name__})") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"custom event {name!r}: data holds text that is not valid Unicode") from None
    if size > max_bytes:
        raise ValueError(f"custom event {name!r}: data is {size} bytes of JSON, over the {max_bytes} allowed")
    return json.loads(text)


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` kept; :meth:`take` spends one if there is one."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class CustomEmitter:
    """The custom events of one delivery of one tool call: checked, bounded, appended fenced.

    Safe to call from the tool's threads. ``emitted`` counts the events appended, ``dropped`` those
    the bounds, a fence or Redis refused (reported once by :meth:`finish`).
    """

    def __init__(
        self,
        write: Writer,
        *,
        run_id: str,
        step: int,
        call_id: str,
        tool: str,
        attempt: int,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self.run_id, self.step, self.call_id, self.tool, self.attempt = run_id, step, call_id, tool, attempt
        self.limits = limits
        self._bucket = TokenBucket(limits.custom_events_per_s, 2 * limits.custom_events_per_s, clock)
        self._lock = threading.Lock()
        self.emitted = 0
        self.dropped = 0
        #: Once an append was refused by the fence, every later one would be too: skip the trip.
        self.fenced = False

    def emit(self, name: str, data: Any) -> bool:
        """Append one custom event; True if it was appended (see the module's rules)."""
        value = check_custom(name, data, self.limits.max_custom_event_bytes)
        with self._lock:
            if (
                self.fenced
                or self.emitted >= self.limits.max_custom_events_per_call
                or not self._bucket.take()
            ):
                self.dropped += 1
                return False
            # Counted before the append (which runs outside the lock, so one slow round trip does
            # not hold the tool's other threads), given back if it is not made.
            self.emitted += 1
        event = CustomEvent(
            run_id=self.run_id,
            step=self.step,
            call_id=self.call_id,
            tool=self.tool,
            attempt=self.attempt,
            name=name,
            data=value,
        )
        appended = self._append(event)
        if not appended:
            with self._lock:
                self.emitted -= 1
                self.dropped += 1
        return appended

    def finish(self) -> None:
        """Once the tool returned: say how many events were dropped, if any (fenced like the rest)."""
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        if dropped and not self.fenced:
            self._append(
                CustomEventsDropped(
                    run_id=self.run_id,
                    step=self.step,
                    call_id=self.call_id,
                    tool=self.tool,
                    attempt=self.attempt,
                    dropped=dropped,
                )
            )

    def _append(self, event: Event) -> bool:
        try:
            appended = self._write(event)
        except redis.RedisError as exc:
            # Progress is not worth failing or slowing the tool for; the content is never logged.
            log.warning(
                "run %s: a custom event of call %s was dropped: %s",
                self.run_id,
                self.call_id,
                exc.__class__.__name__,
            )
            return False
        if not appended:
            self.fenced = True
        return appended


def void_attempts(events: list[Event]) -> dict[tuple[int, str], int]:
    """For each ``(step, call_id)``, the highest attempt whose custom events are void (a reader's
    rule: a ``CustomEvent`` is void when its attempt is at or below this)."""
    voided: dict[tuple[int, str], int] = {}
    for event in events:
        if event.kind == "CustomEventsVoided":
            key = (event.step, event.call_id)
            voided[key] = max(voided.get(key, 0), event.attempt)
    return voided
