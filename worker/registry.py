"""The worker's side of the registry: a heartbeat thread that says what it serves and whether its
consumer really takes messages from the broker.

A worker can be up and still deaf: a consumer whose broker connection was reset under it may never
ask the broker for a message again. So the heartbeat does not only say "alive": it looks at the
consumer itself. With Celery's Redis transport a consuming worker has a BRPOP on the way at all
times, answered by the broker within ``brpop_timeout`` (a second) and sent again at once; a worker
that wants messages (a pool slot is free) and has not sent one for several seconds is deaf, and
its record says so, so ``wesichain health`` fails and a deployment restarts it. A worker whose
every slot is busy asks for nothing, and is healthy.

RabbitMQ pushes messages to a consumer instead, so a RabbitMQ consumer proves three things: its
channel is open, a consumer of it is registered on every queue it serves (one the broker cancelled
is gone from the channel), and the broker's frames reach it. A connection with heartbeats
(``WESICHAIN_BROKER_HEARTBEAT_S``) carries a frame from RabbitMQ at least every half heartbeat, so a
connection silent for a whole heartbeat has lost its way from the broker (a half-open TCP
connection, a stalled proxy or NAT): deaf, a heartbeat before Celery itself gives the connection
up (after two) and well before TCP would.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import amqp
import redis
from celery.bootsteps import CLOSE, TERMINATE
from celery.worker import state as worker_state

from shared.events import worker_identity
from shared.scripts import register_scripts
from shared.workers import WorkerRecord, describe_agents
from worker.runtime import Runtime
from worker.versions import Drain

__all__ = ["DEAF_AFTER_S", "RECHECK_S", "STOPPING", "ConsumerWatch", "RegistryBeat"]

log = logging.getLogger("wesichain.registry")

#: A consumer that has not asked the broker for a message for this long, while it could take one,
#: is deaf (kombu's BRPOP is answered within a second and sent again at once).
DEAF_AFTER_S = 10.0
#: Between beats, how often the registry thread checks that its record is still in Redis. A Redis
#: that restarted empty, or that was down for longer than a record lives, has lost it: producers
#: would take this worker for gone until its next beat, so it writes the record again at once.
RECHECK_S = 0.25


#: The consumer state of a worker shutting down as asked: not consuming, and nothing wrong.
STOPPING = "stopping: shutting down"


class ConsumerWatch:
    """Tells whether Celery's consumer takes messages, and what it is doing (see the module doc).

    Three ways of being deaf are told apart:

    * the worker's event loop, which both polls the broker and collects the pool's results, has
      not turned for :data:`DEAF_AFTER_S` (blocked on a dead connection) while no task runs in it;
    * it could take a message and has not asked the broker for one for as long;
    * it believes every slot is taken while no task runs at all, for as long;

    and on RabbitMQ, a closed consumer channel, a queue without a registered consumer, and a
    connection silent for a whole heartbeat (:meth:`_amqp`).
    """

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self._stuck_since: float | None = None
        self._last_tick: float | None = None
        #: The AMQP connection last looked at, its frame count then and when that count last moved.
        self._frames: tuple[int, int, float] | None = None
        hub = getattr(consumer, "hub", None)
        if hub is not None:
            hub.on_tick.add(self._tick)

    def _tick(self) -> None:
        self._last_tick = time.monotonic()

    def state(self) -> tuple[bool, str]:
        now = time.monotonic()
        if getattr(getattr(self.consumer, "blueprint", None), "state", None) in (CLOSE, TERMINATE):
            if worker_state.should_stop is not None or worker_state.should_terminate is not None:
                # Asked to shut down (SIGTERM, SIGQUIT, a drain): it stops consuming on purpose.
                return False, STOPPING
            # Its consumer stopped (an error Celery does not recover from) while the process lives on.
            return False, "deaf: its consumer stopped"
        if (
            self._last_tick is not None
            and now - self._last_tick > DEAF_AFTER_S
            and not _running_in_loop(self.consumer)
        ):
            return False, f"deaf: its event loop has not turned for {now - self._last_tick:.0f}s"
        connection = getattr(self.consumer, "connection", None)
        if connection is None or not getattr(connection, "connected", False):
            self._stuck_since = None
            return False, "not connected to the broker (reconnecting)"
        raw = getattr(connection, "_connection", None)
        if isinstance(raw, amqp.Connection):
            return self._amqp(raw, now)
        cycle = getattr(connection.transport, "cycle", None)
        channels = getattr(cycle, "_channels", None)
        if channels is None:
            return True, "consuming"  # a transport without a polling cycle to look at (in-memory)
        polling = [c for c in channels if getattr(c, "active_queues", None)]
        if not polling:
            return False, "not consuming any queue"
        for channel in polling:
            if not channel.qos.can_consume():
                return self._full(now)
            sent = getattr(channel, "_brpop_sent_at", None)
            timeout = float(getattr(channel, "brpop_timeout", 1) or 1)
            if sent is not None and now - sent > timeout + DEAF_AFTER_S:
                return False, f"deaf: it has not asked the broker for a message for {now - sent:.0f}s"
        self._stuck_since = None
        return True, "consuming"

    def _amqp(self, connection: amqp.Connection, now: float) -> tuple[bool, str]:
        """A RabbitMQ consumer: its channel open, its consumers registered, the broker heard from."""
        self._stuck_since = None
        tasks = getattr(self.consumer, "task_consumer", None)
        queues = [q.name for q in getattr(tasks, "queues", None) or []]
        if tasks is None or not queues:
            return False, "not consuming any queue"
        channel = getattr(tasks, "channel", None)
        if channel is None or not getattr(channel, "is_open", False):
            return False, "deaf: its consumer channel to the broker is closed"
        tags = dict(getattr(tasks, "_active_tags", {}))
        registered = set(getattr(channel, "callbacks", {}))
        cancelled = sorted(q for q in queues if tags.get(q) not in registered)
        if cancelled:
            return False, f"deaf: it has no consumer registered on {', '.join(cancelled)}"
        silent = self._silent_for(connection, now)
        if silent is not None:
            return (
                False,
                f"deaf: nothing from the broker for {silent:.0f}s (heartbeat {connection.heartbeat}s)",
            )
        return True, "consuming"

    def _silent_for(self, connection: amqp.Connection, now: float) -> float | None:
        """How long a connection with heartbeats has heard nothing from the broker, past one
        heartbeat (None: it heard from it within one, or it has no heartbeats to go by)."""
        frames = int(connection.bytes_recv)
        if self._frames is None or self._frames[0] != id(connection) or self._frames[1] != frames:
            self._frames = (id(connection), frames, now)
            return None
        silent = now - self._frames[2]
        heartbeat = float(connection.heartbeat or 0)
        return silent if heartbeat and silent > heartbeat else None

    def _full(self, now: float) -> tuple[bool, str]:
        """Every slot is taken: by running tasks (saturated), or by deliveries nothing runs (deaf)."""
        running = len(worker_state.active_requests) + len(worker_state.reserved_requests)
        if running:
            self._stuck_since = None
            return True, "saturated"
        if self._stuck_since is None:
            self._stuck_since = now
        stuck = now - self._stuck_since
        if stuck > DEAF_AFTER_S:
            return False, f"deaf: its prefetch is full of deliveries while no task has run for {stuck:.0f}s"
        return True, "saturated"


def _persistence(rt: Runtime) -> str:
    """Redis's persistence, said once at start: anything but fsync-always is worth a warning."""
    try:
        persistence = rt.store.persistence()
    except redis.RedisError as exc:
        log.warning("cannot tell how durably Redis keeps its writes: %s", exc)
        return "unknown"
    if persistence != "aof-always" and not rt.settings.embedded:
        log.warning(
            "Redis keeps the run state with persistence %r: a host crash or a Redis restart can lose"
            " acknowledged commits, and a non-retry-safe tool could then run twice. Run Redis with"
            " appendonly yes and appendfsync always (docs/guarantees.md, 'Durability of Redis').",
            persistence,
        )
    return persistence


def _running_in_loop(consumer: Any) -> bool:
    """A solo pool runs its task inside the event loop, which then does not turn until it ends."""
    pool = getattr(getattr(consumer, "controller", None), "pool", None)
    return type(pool).__module__.endswith(".solo") and bool(worker_state.active_requests)


def _busy() -> int:
    """Tasks this worker's pool runs now (Celery's own bookkeeping, kept in the main process)."""
    for _ in range(3):
        try:
            return len(set(worker_state.active_requests))
        except RuntimeError:  # the set changed while it was copied: copy again
            continue
    return 0


class RegistryBeat:
    """Writes this worker's record every ``interval_s`` while the worker runs."""

    def __init__(self, rt: Runtime, consumer: Any, interval_s: float) -> None:
        self.rt = rt
        self.consumer = consumer
        self.interval_s = interval_s
        self.started_at = time.time()
        self._beat = register_scripts(rt.store.redis)["worker_beat"]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        controller = getattr(consumer, "controller", None)
        self.worker_id = str(getattr(controller, "hostname", None) or f"{worker_identity()}@{os.getpid()}")
        self._agents = describe_agents(rt.agents)
        self.watch = ConsumerWatch(consumer)
        self.persistence = _persistence(rt)
        self.drain = Drain(rt, consumer, self.worker_id)

    def record(self) -> WorkerRecord:
        consuming, state = self.watch.state()
        controller = getattr(self.consumer, "controller", None)
        queues = sorted(
            q.name for q in getattr(getattr(self.consumer, "task_consumer", None), "queues", []) or []
        )
        pool = type(getattr(controller, "pool", None)).__module__.rsplit(".", 1)[-1]
        return WorkerRecord(
            id=self.worker_id,
            host=worker_identity(),
            pid=os.getpid(),
            queues=queues,
            pool=pool,
            concurrency=int(getattr(controller, "concurrency", 0) or 0),
            agents=self._agents,
            started_at=self.started_at,
            consuming=consuming,
            consumer_state=state,
            redis_persistence=self.persistence,
            draining=self.drain.draining,
            busy=_busy(),
        )

    def beat(self) -> None:
        self.drain.check()
        record = self.record()
        keys = self.rt.store.keys
        self._beat(
            keys=[keys.worker(self.worker_id), keys.workers()],
            args=[self.worker_id, record.model_dump_json(), int(self.interval_s * 3000)],
        )
        if not record.consuming and record.consumer_state != STOPPING:
            log.error("worker %s cannot consume: %s", self.worker_id, record.consumer_state)

    def run_forever(self) -> None:
        last_beat = time.monotonic()
        failing = False
        while not self._stop.wait(min(RECHECK_S, self.interval_s)):
            try:
                # A beat is due every interval, and at once when Redis is back after an outage
                # (the last beat failed) or lost the record (restarted empty, or the record expired
                # while Redis was down): the worker is listed again the moment Redis answers.
                due = (
                    failing
                    or time.monotonic() - last_beat >= self.interval_s
                    or not self.rt.store.redis.exists(self.rt.store.keys.worker(self.worker_id))
                )
                if due:
                    self.beat()
                    last_beat = time.monotonic()
                    if failing:
                        log.info(
                            "registry heartbeat: Redis answers again, worker %s re-registered", self.worker_id
                        )
                    failing = False
            except redis.RedisError as exc:
                if not failing:  # said once per outage, not at every recheck
                    log.warning("registry heartbeat failed (will retry): %s", exc)
                failing = True
            except Exception:  # the heartbeat must outlive anything one beat runs into
                log.exception("registry heartbeat failed (will retry)")

    def start(self) -> None:
        try:
            self.beat()  # at once: the worker is listed as soon as it is ready
        except redis.RedisError as exc:
            log.warning("registry heartbeat failed (will retry): %s", exc)
        self._thread = threading.Thread(target=self.run_forever, name="wesichain-registry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and leave the registry (a stopped worker serves nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        keys = self.rt.store.keys
        try:
            self.rt.store.redis.delete(keys.worker(self.worker_id))
            self.rt.store.redis.zrem(keys.workers(), self.worker_id)
        except redis.RedisError as exc:
            log.warning("could not leave the registry: %s", exc)
