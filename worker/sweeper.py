"""The sweeper: hands on every phase whose lease expired without progress.

It runs as a thread in every worker's main process (one at a time cluster-wide, by a Redis lock),
as a celery beat schedule (``wesichain.sweep``), or standalone (``wesichain sweeper``). Recovery
time after a whole-worker SIGKILL is then the lease plus one sweep interval, not the broker's
visibility timeout.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import redis

from shared import fsm
from shared.errors import PoisonPhase
from shared.state import Phase
from shared.store import Recovery
from shared.tasks import with_epoch
from worker.runtime import Runtime

log = logging.getLogger("wesichain.sweeper")


def sweep_once(rt: Runtime, limit: int = 200) -> int:
    """Recover every run whose lease expired; returns how many were re-published."""
    # The run index outlives no run: trim entries older than the retention.
    rt.store.redis.zremrangebyscore(rt.store.keys.runs_index(), "-inf", time.time() - rt.settings.retention_s)
    recovered = 0
    for run_id in rt.store.expired_leases(limit):
        recovery = rt.store.recover(run_id)
        if recovery is None:
            continue
        if recovery.takeovers > rt.settings.max_phase_attempts:
            _fail_as_poison(rt, run_id, recovery)
            continue
        outbox = recovery.outbox
        if recovery.phase is Phase.ACTING:
            # Only the calls still without a result; their old claims (if any) have expired, so a
            # non-retry-safe call that was mid-flight is reported as outcome-unknown, not re-run.
            outbox = [
                s
                for s in outbox
                if not rt.store.has_result(run_id, recovery.step, str(s.arguments["call_id"]))
            ]
        log.warning(
            "run %s: lease expired in %s v%d; re-publishing %d task(s) under epoch %d",
            run_id,
            recovery.phase.value,
            recovery.version,
            len(outbox),
            recovery.epoch,
        )
        rt.publish([with_epoch(s, recovery.epoch) for s in outbox])
        recovered += 1
    return recovered


def _fail_as_poison(rt: Runtime, run_id: str, recovery: Recovery) -> None:
    """A phase re-published this often never even claimed the run (it fails before it can)."""
    head = rt.store.load(run_id)
    if head is None or head.terminal or head.version != recovery.version:
        return
    current = fsm.view(head)
    if isinstance(current, fsm.Completed | fsm.Failed | fsm.Interrupted):
        return
    error = PoisonPhase(
        f"{recovery.phase.value} of step {recovery.step} was handed on {recovery.takeovers} times"
        f" without progress (limit {rt.settings.max_phase_attempts})",
        step=recovery.step,
    ).info()
    log.error("run %s: %s", run_id, error.message)
    rt.fail(current, error)


class Sweeper:
    """Runs :func:`sweep_once` every interval while it holds the cluster-wide sweeper lock."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.interval_s = rt.settings.sweep_interval_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        r = self.rt.store.redis
        lock_key = self.rt.store.keys.sweeper_lock()
        ttl_ms = int(self.interval_s * 3000)
        # Take the lock, or keep it if it is ours; another sweeper sweeps meanwhile.
        if not r.set(lock_key, self.token, nx=True, px=ttl_ms):
            if r.get(lock_key) != self.token:
                return 0
            r.pexpire(lock_key, ttl_ms)
        return sweep_once(self.rt)

    def run_forever(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("sweep failed (will retry): %s", exc)
            except Exception:  # the sweeper must outlive any one bad run
                log.exception("sweep failed (will retry)")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run_forever, name="wesichain-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
