"""One heartbeat thread per worker process renews the claims of every task it is running.

While a renewal succeeds, the sweeper leaves the run alone; a renewal also reads the run's cancel
flag, so a long model call or tool learns about a cancel within one interval without a Redis round
trip of its own. All claims of the process are renewed in one pipelined round trip.

A claim may carry a renewal deadline (a tool's timeout plus grace): past it the claim is no longer
extended, so work that hangs beyond its limit is handed on by the sweeper when the claim expires.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

from shared.store import RunStore

__all__ = ["Flag", "Heartbeat", "Held"]

log = logging.getLogger("wesichain.heartbeat")


#: Guards the creation of a :class:`Flag`'s event against a concurrent ``set``.
_flags_lock = threading.Lock()


class Flag:
    """A :class:`threading.Event` whose event is made only when something waits on it.

    Every phase holds two of these, almost never set and rarely waited on; an Event (a Condition
    and its lock) costs more to make than the rest of the claim's bookkeeping in this process.
    """

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _flags_lock:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` seconds passed; returns whether it is set."""
        with _flags_lock:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


@dataclass
class Held:
    """A claim this process holds while its task runs."""

    run_id: str
    claim_field: str
    token: str
    #: ``time.monotonic()`` past which the claim is no longer extended (None: while the task runs).
    renew_until: float | None = None
    cancelled: Flag = field(default_factory=Flag)
    #: Set when the claim was lost (expired and taken over): this delivery's commit will be fenced.
    lost: Flag = field(default_factory=Flag)


class Heartbeat:
    """Renews the claims this process holds, and passes cancels to them."""

    def __init__(self, store: RunStore, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = -1

    @contextmanager
    def hold(
        self, run_id: str, claim_field: str, token: str, renew_until: float | None = None
    ) -> Iterator[Held]:
        held = Held(run_id, claim_field, token, renew_until)
        with self._lock:
            self._held[id(held)] = held
            self._ensure_thread()
        try:
            yield held
        finally:
            with self._lock:
                self._held.pop(id(held), None)

    def _ensure_thread(self) -> None:
        # A prefork child inherits the parent's object but not its threads: start one per process.
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="wesichain-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self._lock:
                held = list(self._held.values())
            if held:
                self.beat(held)

    def beat(self, held: list[Held]) -> None:
        now = time.monotonic()
        claims = [
            (h.run_id, h.claim_field, h.token, h.renew_until is None or now < h.renew_until) for h in held
        ]
        try:
            replies = self.store.renew(claims)
        except redis.RedisError as exc:
            log.warning("heartbeat of %d claim(s) failed: %s", len(held), exc)
            return
        for h, (still_held, cancel) in zip(held, replies, strict=True):
            if cancel:
                h.cancelled.set()
            if not still_held:
                h.lost.set()
