"""A worker's main process vouching for its pool, and the sweeper acting on it (``shared/liveness.py``).

:class:`PoolBeat` runs in the worker's main process. On the prefork pool that process runs no task
code, so nothing a tool does (holding the GIL, spinning in C) can starve it; it knows from Celery
which pool process runs which task (``request.worker_pid``), and Celery's own bookkeeping drops a
task from that set as soon as its process is seen dead (``WorkerLostError``, the hard time limit).
On the threads and solo pools the tasks run in the main process itself, so its word is worth no
more than the claims' own heartbeat: its records then live as long as a claim's lease.

The beat also lists the pool's processes, and does not beat again for each task received: a claim
taken since the last beat is found under its process's last-claim key, which the claim script
itself writes (``shared/liveness.py``), so the process that consumes and dispatches makes no Redis
round trip per transition.

:class:`SweepLives` is what the sweeper does with those records, each sweep.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis
from celery.signals import worker_ready, worker_shutdown
from celery.worker import state as worker_state

from shared import protocol
from shared.events import worker_identity
from shared.liveness import DeadStart, HeldClaim, Lives
from shared.pool_records import Obituaries
from shared.store import Due, new_token
from shared.tasks import TASK_TOOL
from worker.runtime import Runtime

__all__ = [
    "PoolBeat",
    "SweepLives",
    "held_by_pool",
    "BEATS_PER_TTL",
    "REWRITE_EVERY",
]

log = logging.getLogger("wesichain.liveness")

#: Beats per ttl: a record outlives three lost beats.
BEATS_PER_TTL = 4
#: Beats between two writes of an unchanged list of held claims (written at once when it changes).
REWRITE_EVERY = 20


def held_by_pool(pool_pids: Sequence[int] = (), requests: Iterable[Any] | None = None) -> list[HeldClaim]:
    """The claims the pool processes of this worker may hold, from the tasks Celery gave them.

    A task a pool process accepted names that process (``request.worker_pid``). One received but
    not yet known to be accepted may already be claimed by any of them (the pool reports the
    acceptance asynchronously): it is listed with every process of the pool as a possible holder,
    so that a worker killed right after a claim still has it handed on at once.
    """
    identity = worker_identity()
    anyone = ",".join(f"{identity}:{pid}" for pid in pool_pids) or f"{identity}:{os.getpid()}"
    for _ in range(3):
        try:
            if requests is None:
                active = {*worker_state.reserved_requests, *worker_state.active_requests}
            else:
                active = set(requests)
            break
        except RuntimeError:  # a set changed while it was copied: copy again
            continue
    else:
        return []
    found: dict[tuple[str, str], HeldClaim] = {}
    for request in active:
        kwargs = getattr(request, "kwargs", None) or {}
        run_id, version = kwargs.get("run_id"), kwargs.get("version")
        if not isinstance(run_id, str) or not isinstance(version, int):
            continue
        step, call_id = kwargs.get("step"), kwargs.get("call_id")
        is_call = getattr(request, "task_name", "") == TASK_TOOL
        if is_call and isinstance(step, int) and isinstance(call_id, str):
            field = protocol.call_claim(step, call_id)
        else:
            field = protocol.RUNNING
        pid = getattr(request, "worker_pid", None)
        claim = HeldClaim(run_id, field, f"{identity}:{pid}" if pid else anyone, version)
        # Two deliveries of one piece of work: the one a process runs is the one that may hold it.
        if (run_id, field) not in found or pid:
            found[(run_id, field)] = claim
    return sorted(found.values(), key=HeldClaim.dump)


def _pool_pids(consumer: Any) -> list[int]:
    """The pids of a prefork pool's processes (none for the threads and solo pools)."""
    pool = getattr(getattr(getattr(consumer, "controller", None), "pool", None), "_pool", None)
    try:
        return [int(p.pid) for p in getattr(pool, "_pool", None) or [] if p.pid]
    except (AttributeError, TypeError, ValueError):
        return []


class PoolBeat:
    """Says, every quarter of its ttl, that this worker start is alive and what its pool holds."""

    def __init__(self, rt: Runtime, consumer: Any) -> None:
        self.rt = rt
        self.consumer = consumer
        settings = rt.settings
        pool = type(getattr(getattr(consumer, "controller", None), "pool", None)).__module__
        #: Only a prefork main process is out of reach of its tasks (see the module doc).
        self.prefork = pool.endswith("prefork")
        lease_s = max(settings.lease_s, settings.worker_lease_s)
        self.ttl_s = settings.worker_lease_s if self.prefork else lease_s
        self.interval_s = self.ttl_s / BEATS_PER_TTL
        self.life = f"{worker_identity()}:{os.getpid()}:{new_token()[:8]}"
        self.lives = Lives(rt.store.redis, rt.store.keys, settings.lease_s)
        self._sent: tuple[list[HeldClaim], list[str]] | None = None
        self._beats = 0
        self._stop = False
        #: Set to beat at once (to stop).
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def beat(self) -> None:
        pids = _pool_pids(self.consumer) if self.prefork else []
        held = held_by_pool(pids)
        identity = worker_identity()
        pool = [f"{identity}:{pid}" for pid in pids or [os.getpid()]]
        listed = (held, pool)
        rewrite = self._sent is None or listed != self._sent or self._beats % REWRITE_EVERY == 0
        self._beats += 1
        try:
            there = self.lives.beat(self.life, self.ttl_s, held if rewrite else None, pool)
        except redis.RedisError:
            self._sent = None  # unknown whether the list was written: write it next time
            raise
        self._sent = listed if there else None

    def run_forever(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop:
                return
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("liveness beat failed (will retry): %s", exc)
            except Exception:  # the beat must outlive anything one beat runs into
                log.exception("liveness beat failed (will retry)")

    def start(self) -> None:
        try:
            self.beat()
        except redis.RedisError as exc:
            log.warning("liveness beat failed (will retry): %s", exc)
        self._thread = threading.Thread(target=self.run_forever, name="wesichain-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.lives.leave(self.life)
        except redis.RedisError as exc:
            log.warning("could not leave the liveness records: %s", exc)


class SweepLives:
    """The sweeper's side: hand on a dead worker's claims, keep a starved live process's."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.lives = Lives(rt.store.redis, rt.store.keys, rt.settings.lease_s)
        self.obituaries = Obituaries(rt.store.redis, rt.store.keys)
        self._alive: dict[tuple[str, str], tuple[HeldClaim, int]] | None = None
        self._now_ms = 0

    def begin(self) -> None:
        """A new sweep: what live starts list is read again when first needed."""
        self._alive = None

    def hand_on_dead(self, hand_on: Callable[[Due, str], int]) -> int:
        """Expire the claims of every dead worker start and hand their work on; returns hand-ons."""
        handed = 0
        now_ms = self.lives.now_ms()
        for dead in self.lives.dead(now_ms):
            handed += self._bury(dead, hand_on)
        return handed

    def _bury(self, dead: DeadStart, hand_on: Callable[[Due, str], int]) -> int:
        reason = (
            f"its worker ({dead.life}) stopped saying it is alive: the worker died or stalled"
            f" (its claim was held by %s)"
        )
        runs: dict[str, str] = {}
        listed = {(c.run_id, c.field) for c in dead.held}
        # Claims taken after the start's last beat: its processes' last claims (held_claim.lua
        # expires one only if that process still holds it and nothing renewed it since the death).
        latest = [c for c in self.lives.last_claims(dead.pool) if (c.run_id, c.field) not in listed]
        for claim in [*dead.held, *latest]:
            why = reason % claim.holder
            if self.lives.expire(claim, dead.until_ms, why):
                runs[claim.run_id] = why
        handed = 0
        for run_id, why in runs.items():
            seen = self.rt.store.inspect(run_id)
            if isinstance(seen, Due) and seen.expired:
                handed += hand_on(seen, why)
        if runs:
            log.warning("worker start %s is dead: %d claim(s) handed on", dead.life, len(runs))
        # Before it is forgotten: the operator view lists it, and the timelines of the runs it held
        # mark its death (a claim taken after its last beat is known from its process's last claim).
        self.obituaries.record(dead, [*dead.held, *latest])
        self.lives.forget(dead)
        return handed

    def keep_alive(self, seen: Due) -> bool:
        """``seen`` has expired claims: are all of them held by pool processes a live main process
        says still run them? Then extend them (True) rather than hand the work on again."""
        if self._alive is None:
            self._now_ms = self.lives.now_ms()
            self._alive = self.lives.alive(self._now_ms)
        expired = [key for key, state in seen.states.items() if state == "expired"]
        if not expired:
            return False
        kept = 0
        for key in expired:
            field = protocol.RUNNING if key == "" else protocol.call_claim(seen.step, key)
            found = self._alive.get((seen.run_id, field))
            if found is not None and self.lives.extend(*found):
                kept += 1
        if kept:
            log.info(
                "run %s: %d expired claim(s) kept: their pool processes still run them (starved heartbeat)",
                seen.run_id,
                kept,
            )
        return kept == len(expired)


#: The beat of this process's worker, once it is ready.
_beat: PoolBeat | None = None


@worker_ready.connect  # type: ignore[untyped-decorator]
def _start_beat(sender: Any = None, **_: Any) -> None:
    """The consumer is ready (``sender``): vouch for its pool from now on."""
    global _beat
    holder = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
    if holder is None or _beat is not None:
        return
    _beat = PoolBeat(holder.get(), sender)
    _beat.start()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop_beat(**_: Any) -> None:
    global _beat
    if _beat is not None:
        _beat.stop()
        _beat = None
