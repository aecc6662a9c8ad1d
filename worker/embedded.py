"""The embedded mode: producer, broker, Redis stand-in and worker in one process.

Same tasks, same scripts, same state format as the distributed mode; only the transports differ
(Celery's in-memory broker and an in-process Redis). It exists so ``wesichain demo`` works right
after ``pip install``, and so agents can be tested without a server (see ``worker.pytest_plugin``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from producer.client import Client
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings

__all__ = ["embedded"]


@contextmanager
def embedded(agents_module: str | None = None, *, concurrency: int = 4, **settings: Any) -> Iterator[Client]:
    """Run an in-process worker and yield a client bound to it."""
    from celery.contrib.testing.worker import start_worker

    from worker.app import create_app

    base = Settings.from_env(redis_url="memory://", agents_module=agents_module, **settings)
    app = create_app(base)
    # start_worker's readiness ping needs the built-in ping task registered.
    app.loader.import_module("celery.contrib.testing.tasks")
    holder = app.wesichain_runtime
    runtime = holder.get()
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel=base.loglevel,
        shutdown_timeout=10.0,
        queues=[QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS],
    ) as worker:
        # The test worker sends no worker_ready: join the registry here, so producers see its agents.
        holder.start_registry(worker.consumer)
        try:
            yield Client(base, app=app, store=runtime.store)
        finally:
            holder.stop_registry()
            _wake_for_shutdown(app)


def _wake_for_shutdown(app: Any) -> None:
    """Ask the in-process worker to stop, and wake its consumer right away.

    The consumer of the in-memory broker only notices a stop request between two polls of up to
    2 s each; one message per queue ends that poll at once.
    """
    from celery.worker import state

    state.should_terminate = 0
    for queue in (QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS):
        app.send_task("celery.ping", queue=queue)
