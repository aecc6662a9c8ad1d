"""The embedded mode: producer, broker, Redis stand-in and worker in one process.

Same tasks, same scripts, same state format as the distributed mode; only the transports differ
(Celery's in-memory broker and an in-process Redis). It exists so ``wesichain demo`` works right
after ``pip install``, and so agents can be tested without a server (see ``worker.pytest_plugin``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from producer.client import Client
from shared.errors import ArchiveUnavailable
from shared.settings import ENV_ARCHIVE_URL, QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings
from shared.store import RunStore

__all__ = ["ENV_HOME", "default_archive_url", "embedded"]

#: Where the embedded mode keeps what outlives its process (its archive).
ENV_HOME = "WESICHAIN_HOME"

log = logging.getLogger("wesichain.embedded")


def default_archive_url() -> str:
    """The embedded mode's archive: a SQLite file under ``$WESICHAIN_HOME`` (``~/.wesichain``)."""
    home = Path(os.environ.get(ENV_HOME) or Path.home() / ".wesichain").expanduser().resolve()
    return f"sqlite:///{home / 'archive.db'}"


@contextmanager
def embedded(
    agents_module: str | None = None, *, concurrency: int = 4, archive: bool = False, **settings: Any
) -> Iterator[Client]:
    """Run an in-process worker and yield a client bound to it.

    With ``archive``, the runs that ended are moved to the archive when the block ends (its
    in-process Redis goes with the process): ``WESICHAIN_ARCHIVE_URL``, by default a SQLite file
    (:func:`default_archive_url`), where ``wesichain export`` and ``status`` find them later.
    """
    from celery.contrib.testing.worker import start_worker

    from worker.app import create_app

    if archive and not (settings.get("archive_url") or os.environ.get(ENV_ARCHIVE_URL)):
        settings["archive_url"] = default_archive_url()
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
            if archive:
                _archive_ended(runtime.store)


def _archive_ended(store: RunStore) -> None:
    """Move every ended run to the archive before the in-process Redis is gone."""
    from shared.archiver import Archiver

    try:
        report = Archiver(store).run_once(after_s=0)
    except ArchiveUnavailable as exc:
        log.warning("the runs were not archived: %s", exc)
        return
    finally:
        store.close_archive()
    if report.error:
        log.warning("the runs were not all archived: %s", report.error)


def _wake_for_shutdown(app: Any) -> None:
    """Ask the in-process worker to stop, and wake its consumer right away.

    The consumer of the in-memory broker only notices a stop request between two polls of up to
    2 s each; one message per queue ends that poll at once.
    """
    from celery.worker import state

    state.should_terminate = 0
    for queue in (QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS):
        app.send_task("celery.ping", queue=queue)
