"""The sweeper: hands on every phase whose claim expired, or whose message left the broker unclaimed.

It runs as a thread in every worker's main process, as a celery beat schedule (``wesichain.sweep``)
or standalone (``wesichain sweeper``); all of them take the same lock, so one sweeps at a time.
Each run whose lease time came (by Redis's clock) is inspected:

* a claim expired: its holder stopped renewing it (the process died, or stalled past its lease),
  so the phase is handed on under a new epoch; recovery after a whole-worker SIGKILL is then the
  lease plus one sweep interval, not the broker's visibility timeout;
* unclaimed tasks waited past their queued time: if the broker still holds their messages they
  are only waiting behind a backlog, and the sweeper looks again later (the wait doubles, up to
  ``max_queued_check_s``); only a message gone from the broker is published again, and a run
  whose messages keep vanishing is failed as poison.

Claims and workers' liveness records run out by Redis's clock, which goes on while Redis is down
or out of reach, when no holder can renew anything. So every sweeper notes each time it reaches
Redis (``sweep_watch.lua``); after a gap in those notes, or a look that failed to reach Redis,
sweepers judge nothing expired or dead for a lease, while the live holders renew.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import redis

from producer.publishing import PUBLISH_ERRORS
from shared import fsm
from shared.errors import PoisonPhase
from shared.protocol import QUEUED_UNSENT
from shared.scripts import register_scripts
from shared.store import Due, HandedOn
from shared.tasks import with_epoch
from shared.versions import is_version_queue
from shared.workers import WorkerDirectory
from worker.broker_probe import BrokerProbe, Located
from worker.liveness import SweepLives
from worker.runtime import Runtime
from worker.threads import repair_threads

__all__ = ["BATCH", "QUIET_AFTER_SWEEPS", "Repairs", "Sweeper", "TRIM_EVERY"]

log = logging.getLogger("wesichain.sweeper")

#: Runs looked at per shard and sweep.
BATCH = 200
#: Sweeps between two trims of the listing indexes (they only lose entries past the retention).
TRIM_EVERY = 60
#: Sweep intervals without any sweeper reaching Redis after which it counts as having been out of
#: reach (down, or cut off from every worker): what ran out meanwhile is given a lease to renew.
QUIET_AFTER_SWEEPS = 2


class Repairs(Protocol):
    """What the pool repairs each sweep besides runs (``EvalPool``, ``PipelinePool``)."""

    def tick(self) -> int: ...


class Sweeper:
    """Sweeps while it holds the cluster-wide sweeper lock (see :meth:`sweep`).

    ``evals`` and ``pipelines`` give the pool's eval and pipeline repairs when asked: they are
    asked only once Redis holds an eval or a pipeline run of this prefix, so a worker whose pool
    runs neither never imports their code (nor the client and model providers it brings).
    """

    def __init__(
        self,
        rt: Runtime,
        probe: BrokerProbe,
        evals: Callable[[], Repairs] | None = None,
        pipelines: Callable[[], Repairs] | None = None,
        bulk: Callable[[], Repairs] | None = None,
    ) -> None:
        self.rt = rt
        self.probe = probe
        #: Evals whose case runs or scoring a dead process left behind are repaired each sweep.
        self.evals = evals
        #: Pipeline runs whose child runs, callbacks or steps a dead process left are repaired too.
        self.pipelines = pipelines
        #: Running bulk jobs nobody works on (their worker died) are handed on too.
        self.bulk = bulk
        self.interval_s = rt.settings.sweep_interval_s
        self.token = uuid.uuid4().hex
        scripts = register_scripts(rt.store.redis)
        self._lock = scripts["lock"]
        self._watch_script = scripts["sweep_watch"]
        #: This sweeper failed to reach Redis since its last look (its next look says so).
        self._unreachable = False
        self._quiet_logged = False
        #: Worker starts' liveness: a dead worker's claims handed on at once, a starved one's kept.
        self.lives = SweepLives(rt)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeps = 0

    # -- the lock ------------------------------------------------------------------------------

    def _hold_lock(self) -> bool:
        key = self.rt.store.keys.sweeper_lock()
        return int(self._lock(keys=[key], args=[self.token, int(self.interval_s * 3000), "hold"])) == 1

    def _release_lock(self) -> None:
        self._lock(keys=[self.rt.store.keys.sweeper_lock()], args=[self.token, 0, "release"])

    def tick(self) -> int:
        """Sweep once if this sweeper holds (or takes) the lock; returns the runs handed on."""
        quiet_s = self._watch()
        if not self._hold_lock():
            return 0
        return self.sweep(quiet_s)

    def sweep_once_and_release(self) -> int:
        """One sweep under the lock, then let it go (celery beat's ``wesichain.sweep``)."""
        quiet_s = self._watch()
        if not self._hold_lock():
            return 0
        try:
            return self.sweep(quiet_s)
        finally:
            self._release_lock()

    def _watch(self) -> float:
        """Note that this sweeper reached Redis; returns the seconds left in which nothing may be
        judged expired or dead, because Redis was out of reach before (``sweep_watch.lua``)."""
        settings = self.rt.settings
        keys = self.rt.store.keys
        quiet_ms = int(
            self._watch_script(
                keys=[keys.sweeper_seen(), keys.sweeper_quiet()],
                args=[
                    int(settings.sweep_interval_s * QUIET_AFTER_SWEEPS * 1000),
                    # A lease for every holder to renew: its claims' and its worker's record's.
                    int(max(settings.lease_s, settings.worker_lease_s) * 1000),
                    "1" if self._unreachable else "0",
                ],
            )
        )
        self._unreachable = False
        return max(0.0, quiet_ms / 1000)

    # -- one sweep -----------------------------------------------------------------------------

    def sweep(self, quiet_s: float = 0.0) -> int:
        """One sweep. While ``quiet_s`` is left after Redis was out of reach, no claim is handed on
        for having expired and no worker for having stopped saying it is alive: their holders could
        not renew while Redis was away, and are given the time to do it now."""
        store = self.rt.store
        handed = 0
        if self._sweeps % TRIM_EVERY == 0:
            # The indexes outlive no run: trim entries older than the retention (each sweep
            # would only find the few runs created in the last second past it).
            cutoff_ms = (time.time() - self.rt.settings.retention_s) * 1000
            for shard in range(store.keys.shards):
                store.redis.zremrangebyscore(store.keys.runs_index(shard), "-inf", cutoff_ms)
                store.trim_indexes(shard, cutoff_ms)
        self._sweeps += 1
        self.lives.begin()
        quiet = quiet_s > 0
        if quiet and not self._quiet_logged:
            log.warning(
                "Redis was out of reach: no claim is handed on as expired, nor any worker's as dead,"
                " for %.1f s while the live holders renew them",
                quiet_s,
            )
        self._quiet_logged = quiet
        # A dead worker's claims first: its main process stopped saying it is alive long before
        # its claims' leases run out.
        if not quiet:
            handed += self.lives.hand_on_dead(lambda seen, why: self._hand_on(seen, [], why))
        # Every shard's due runs in one round trip: most sweeps find none anywhere.
        for due in store.due_everywhere(BATCH):
            waiting: list[Due] = []
            for run_id in due:
                seen = store.inspect(run_id)
                if not isinstance(seen, Due):
                    continue
                if seen.expired:
                    if quiet:
                        continue  # looked at again next sweep, once its holder had time to renew
                    if self.lives.keep_alive(seen):
                        continue  # a starved but live pool process: looked at again next sweep
                    handed += self._hand_on(
                        seen, [], "its lease expired: the holder stopped renewing its claim"
                    )
                else:
                    waiting.append(seen)
            handed += self._check_queued(waiting)
        # Threads whose hand-on to their next run was lost (a kill right after a terminal commit).
        handed += repair_threads(self.rt)
        self._repair()
        return handed

    def _repair(self) -> None:
        """Repair evals and pipeline runs, if Redis holds any.

        A repair's tick trims its index and reads its active set: with neither key there, it has
        nothing to do, and its code need not be loaded.
        """
        self._repair_bulk()
        if self.evals is None and self.pipelines is None:
            return
        keys = self.rt.store.keys
        with self.rt.store.redis.pipeline(transaction=False) as pipe:
            # One key per command: the keys may live on different nodes of a Redis Cluster.
            for key in (keys.evals_index(), keys.evals_active(), keys.pipes_index(), keys.pipes_active()):
                pipe.exists(key)
            found = pipe.execute()
        evals_there, pipelines_there = any(found[:2]), any(found[2:])
        if self.evals is not None and evals_there:
            self.evals().tick()
        if self.pipelines is not None and pipelines_there:
            self.pipelines().tick()

    def _repair_bulk(self) -> None:
        """Hand on running bulk jobs nobody works on, if Redis holds any."""
        if self.bulk is not None and self.rt.store.redis.exists(self.rt.store.keys.bulk_active()):
            self.bulk().tick()

    def _check_queued(self, waiting: Sequence[Due]) -> int:
        """Unclaimed tasks past their queued time: waiting in the broker, or lost?

        A message waiting in a queue is waited for as long as the backlog lasts. One the broker
        handed to a worker that has not claimed the run by the next check is lost with that worker
        (the broker would give it back only after its visibility timeout).
        """
        if not waiting:
            return 0
        specs = [
            spec for seen in waiting for key in seen.unclaimed if (spec := seen.task_of(key)) is not None
        ]
        # A run in a queue namespace waits in that namespace's queues (its tasks name them).
        queues = {spec.queue for spec in specs if spec.queue is not None}
        located = self.probe.locate(
            {self._task_id(seen, key) for seen in waiting for key in seen.unclaimed}, queues
        )
        handed = 0
        settings = self.rt.settings
        # A broker that cannot be asked (RabbitMQ) would have such a task published again and again.
        unserved = self._unserved_version_queues(queues) if located is None else set()
        for seen in waiting:
            missing = [
                key
                for key in seen.unclaimed
                if not self._waiting(located, seen, key) and not self._parked_on(unserved, seen, key)
            ]
            if missing:
                handed += self._hand_on(seen, missing, "its message was missing from the broker")
            else:
                wait_s = min(
                    settings.queued_lease_s * 2 ** (seen.queued_checks + 1), settings.max_queued_check_s
                )
                self.rt.store.wait_in_queue(seen, wait_s)
        return handed

    def _waiting(self, located: Located | None, seen: Due, key: str) -> bool:
        """Is the unclaimed task ``key`` of ``seen`` on its way to a worker?"""
        if seen.queued_checks == QUEUED_UNSENT:
            return False  # its publish failed: it never reached the broker
        if located is None:
            # The broker cannot be asked: after a generous total wait, assume the worst.
            return seen.queued_checks < 6
        task_id = self._task_id(seen, key)
        if task_id in located.queued:
            return True
        return task_id in located.delivered and seen.queued_checks == 0

    def _unserved_version_queues(self, queues: set[str]) -> set[str]:
        """The version queues among ``queues`` that no live worker consumes (``shared/versions.py``)."""
        versioned = {q for q in queues if is_version_queue(q)}
        if not versioned:
            return set()
        settings = self.rt.settings
        directory = WorkerDirectory(self.rt.store.redis, self.rt.store.keys, settings.registry_interval_s)
        consumed = {q for w in directory.live() for q in w.record.queues}
        return versioned - consumed

    @staticmethod
    def _parked_on(unserved: set[str], seen: Due, key: str) -> bool:
        """A task sent to a version queue no live worker consumes waits there for one, on a broker
        that cannot be asked: handing it on would only pile copies on the queue (and count them
        towards poison) until one comes. A task whose publish failed is sent again all the same."""
        spec = seen.task_of(key)
        return spec is not None and spec.queue in unserved and seen.queued_checks != QUEUED_UNSENT

    @staticmethod
    def _task_id(seen: Due, key: str) -> str:
        spec = seen.task_of(key)
        return with_epoch(spec, seen.epoch).task_id if spec is not None else ""

    def _hand_on(self, seen: Due, missing: Sequence[str], reason: str) -> int:
        rt = self.rt
        result = rt.store.hand_on(seen, missing, reason)
        if result is None:
            return 0  # the run moved since it was inspected: nothing to do
        rt.metrics.takeover("message_lost" if missing else "lease_expired")
        if result.lost > rt.settings.max_phase_attempts:
            self._fail_as_poison(seen, result)
            return 1
        outbox = [spec for key in result.tasks if (spec := seen.task_of(key)) is not None]
        log.warning(
            "run %s: %s in %s v%d; publishing %d task(s) again under epoch %d",
            seen.run_id,
            reason,
            seen.phase.value,
            seen.version,
            len(outbox),
            result.epoch,
        )
        rt.publish(outbox, result.epoch)
        return 1

    def _fail_as_poison(self, seen: Due, result: HandedOn) -> None:
        """A phase whose messages keep vanishing unclaimed: its task fails before it can claim."""
        rt = self.rt
        head = rt.store.load(seen.run_id)
        if head is None or head.terminal or head.version != seen.version:
            return
        current = fsm.view(head)
        if isinstance(current, fsm.CompletedRun | fsm.FailedRun | fsm.InterruptedRun):
            return
        error = PoisonPhase(
            f"{seen.phase.value} of step {seen.step} was published {result.lost} times and never claimed"
            f" (limit {rt.settings.max_phase_attempts})",
            step=seen.step,
            phase=seen.phase.value,
            attempts=result.lost,
            last_error="its task message kept vanishing from the broker before any worker claimed it",
        ).info()
        log.error("run %s: %s", seen.run_id, error.message)
        rt.fail(current, None, error)

    # -- the thread ----------------------------------------------------------------------------

    def run_forever(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except redis.RedisError as exc:
                if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
                    self._unreachable = True
                log.warning("sweep failed (will retry): %s", exc)
            except PUBLISH_ERRORS as exc:
                # The broker is away: the run being handed on was marked unsent, and the others
                # wait for the next sweep rather than each failing its own publish now.
                log.warning("sweep stopped: the broker refused a publish (will retry): %s", exc)
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
