"""The Celery app: thin tasks that hand each phase to the runtime.

Start a worker with ``wesichain worker`` (or ``celery -A worker.app worker``). Settings come from
the environment (``WESICHAIN_REDIS_URL``, ``WESICHAIN_AGENTS``, ...), read once per process.
Every worker's main process also runs the sweeper (one active at a time across the cluster)
unless ``WESICHAIN_SWEEPER=0``. With a ``rediss://`` URL whose server fails TLS verification, the
worker exits (status 2) before it consumes anything.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from celery import Celery, Task
from celery.signals import celeryd_init, worker_ready, worker_shutdown
from celery.worker.consumer import Consumer as CeleryConsumer

from shared.agents import load_registry
from shared.settings import Settings, celery_config
from shared.state import TaskSpec
from shared.store import RunStore
from shared.tasks import TASK_DECIDE, TASK_OBSERVE, TASK_START, TASK_SWEEP, TASK_THINK, TASK_TOOL
from shared.tls import RedisTlsError
from worker.act import run_tool
from worker.decide import run_decide
from worker.heartbeat import Heartbeat
from worker.observe import run_observe
from worker.runtime import Runtime
from worker.start import run_start
from worker.sweeper import Sweeper, sweep_once
from worker.think import run_think


class RuntimeHolder:
    """Builds the runtime lazily, once per process: Redis connections must not cross a fork."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._runtime: Runtime | None = None
        self.sweeper: Sweeper | None = None

    def get(self) -> Runtime:
        if self._runtime is None or self._pid != os.getpid():
            with self._lock:
                if self._runtime is None or self._pid != os.getpid():
                    self._runtime = self._build()
                    self._pid = os.getpid()
        return self._runtime

    def _build(self) -> Runtime:
        from shared.redis_client import connect

        store = RunStore(connect(self.settings), self.settings)
        app = self.app

        def send(spec: TaskSpec) -> None:
            app.send_task(
                spec.name, kwargs=spec.arguments, task_id=spec.task_id, countdown=spec.countdown or None
            )

        return Runtime(
            store=store,
            agents=load_registry(self.settings.agents_module),
            send=send,
            settings=self.settings,
            heartbeat=Heartbeat(store, interval_s=min(self.settings.lease_s / 3, 1.0)),
        )

    def start_sweeper(self) -> None:
        if self.sweeper is None:
            self.sweeper = Sweeper(self.get())
            self.sweeper.start()

    def stop_sweeper(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, surviving a broker outage while tasks are in flight.

    Celery 5.7.0 cleans a lost connection up with ``collect()`` and then ``close()``. With Redis
    still down, closing the channel inside ``collect()`` fails half-way (the channel stays open) and
    ``collect()`` drops the transport anyway; ``close()`` then closes that channel again, which
    restores its unacked messages through the dropped transport's client (None): AttributeError,
    not a connection error, so the worker exits ("Unrecoverable error"). Forget the half-closed
    channel once ``collect()`` ran: its messages stay in the broker's unacked hash and the sweeper
    hands their phases on when their leases expire.
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            collect = connection.collect

            def collect_then_forget(*args: Any, **kwargs: Any) -> None:
                try:
                    collect(*args, **kwargs)
                finally:
                    connection._default_channel = None

            connection.collect = collect_then_forget
        super().on_connection_error_after_connected(exc)


def _lost_worker(task: Task) -> bool:
    """True when the broker handed this task over because the process running it died."""
    request = task.request
    return bool(request.retries) or bool((request.delivery_info or {}).get("redelivered"))


def create_app(settings: Settings) -> Celery:
    app = Celery("wesichain", set_as_current=False)
    app.conf.update(celery_config(settings))
    app.conf.worker_consumer = "worker.app:Consumer"
    app.conf.beat_schedule = {
        "wesichain-sweep": {"task": TASK_SWEEP, "schedule": settings.sweep_interval_s},
    }
    holder = RuntimeHolder(app, settings)
    app.wesichain_runtime = holder  # the embedded mode and tests reach the runtime through the app

    @app.task(name=TASK_START, bind=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def start(
        self: Task, run_id: str, version: int = 1, epoch: int = 0, create: dict[str, Any] | None = None
    ) -> None:
        run_start(holder.get(), run_id, version, epoch, create, takeover=_lost_worker(self))

    @app.task(name=TASK_THINK, bind=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def think(self: Task, run_id: str, step: int, version: int, epoch: int = 0) -> None:
        run_think(holder.get(), run_id, step, version, epoch, takeover=_lost_worker(self))

    @app.task(name=TASK_TOOL, bind=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def tool(self: Task, run_id: str, step: int, version: int, call_id: str, epoch: int = 0) -> None:
        run_tool(holder.get(), run_id, step, version, call_id, epoch, takeover=_lost_worker(self))

    @app.task(name=TASK_OBSERVE, bind=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def observe(self: Task, run_id: str, step: int, version: int, epoch: int = 0) -> None:
        run_observe(holder.get(), run_id, step, version, epoch, takeover=_lost_worker(self))

    @app.task(name=TASK_DECIDE, bind=True, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def decide(self: Task, run_id: str, version: int, epoch: int = 0) -> None:
        run_decide(holder.get(), run_id, version, epoch, takeover=_lost_worker(self))

    @app.task(name=TASK_SWEEP, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def sweep() -> int:
        return sweep_once(holder.get())

    return app


def _default_app() -> Celery:
    return create_app(Settings.from_env())


#: The app ``celery -A worker.app`` finds.
app = _default_app()


#: The CLI's exit status for a configuration error.
EXIT_CONFIG = 2


@celeryd_init.connect  # type: ignore[untyped-decorator]
def _refuse_unverified_redis(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Exit before consuming anything if the Redis server fails TLS verification.

    Celery would retry the broker connection forever (broker_connection_retry_on_startup); the
    store connects with the same TLS parameters, so one PING of the store tells first.
    """
    holder: RuntimeHolder | None = getattr(getattr(instance, "app", None), "wesichain_runtime", None)
    if holder is None:
        return
    from shared.redis_client import check_tls

    try:
        check_tls(holder.settings)
    except RedisTlsError as exc:
        print(f"wesichain: refusing to start the worker: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None


@worker_ready.connect  # type: ignore[untyped-decorator]
def _start_sweeper(sender: Any = None, **_: Any) -> None:
    if os.environ.get("WESICHAIN_SWEEPER", "1") != "0":
        holder: RuntimeHolder | None = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
        if holder is not None:
            holder.start_sweeper()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _stop_sweeper(sender: Any = None, **_: Any) -> None:
    holder: RuntimeHolder | None = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
    if holder is not None:
        holder.stop_sweeper()
