"""One heartbeat thread per worker process renews the claims of every task it is running.

While a renewal succeeds, the sweeper leaves the run alone; a renewal also reads the run's cancel
flag, so a long model stream or tool learns about a cancel within one interval without a Redis
round trip of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

from shared.store import RunStore

log = logging.getLogger("wesichain.heartbeat")


@dataclass
class Held:
    run_id: str
    claim_field: str
    token: str
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Set when the claim was lost (expired and taken over): this delivery's commit will be fenced.
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeat:
    def __init__(self, store: RunStore, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = -1

    @contextmanager
    def hold(self, run_id: str, claim_field: str, token: str) -> Iterator[Held]:
        held = Held(run_id, claim_field, token)
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
        while not self._wake.wait(self.interval_s):
            with self._lock:
                held = list(self._held.values())
            for h in held:
                try:
                    still_held, cancel = self.store.renew(h.run_id, h.claim_field, h.token)
                except redis.RedisError as exc:
                    log.warning("heartbeat for run %s failed: %s", h.run_id, exc)
                    continue
                if cancel:
                    h.cancelled.set()
                if not still_held:
                    h.lost.set()
