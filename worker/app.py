"""The Celery app: thin tasks that hand each phase to the runtime.

Start a worker with ``wesichain worker`` (or ``celery -A worker.app worker``). Settings come from
the environment (``WESICHAIN_REDIS_URL``, ``WESICHAIN_AGENTS``, ...), read once per process.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery

from shared.agents import load_registry
from shared.settings import Settings, celery_config
from shared.store import RunStore
from worker.act import run_tool
from worker.observe import run_observe
from worker.runtime import TASK_OBSERVE, TASK_START, TASK_THINK, TASK_TOOL, Runtime
from worker.start import run_start
from worker.think import run_think


class RuntimeHolder:
    """Builds the runtime lazily, once per process: Redis connections must not cross a fork."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._runtime: Runtime | None = None

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

        def send(name: str, kwargs: dict[str, Any], task_id: str) -> None:
            app.send_task(name, kwargs=kwargs, task_id=task_id)

        return Runtime(
            store=store, agents=load_registry(self.settings.agents_module), send=send, settings=self.settings
        )


def create_app(settings: Settings) -> Celery:
    app = Celery("wesichain", set_as_current=False)
    app.conf.update(celery_config(settings))
    holder = RuntimeHolder(app, settings)
    app.wesichain_runtime = holder  # the embedded mode and tests reach the runtime through the app

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_START, ignore_result=True, shared=False
    )
    def start(run_id: str, version: int = 1, create: dict[str, Any] | None = None) -> None:
        run_start(holder.get(), run_id, version, create)

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_THINK, ignore_result=True, shared=False
    )
    def think(run_id: str, step: int, version: int) -> None:
        run_think(holder.get(), run_id, step, version)

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_TOOL, ignore_result=True, shared=False
    )
    def tool(run_id: str, step: int, version: int, call_id: str) -> None:
        run_tool(holder.get(), run_id, step, version, call_id)

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_OBSERVE, ignore_result=True, shared=False
    )
    def observe(run_id: str, step: int, version: int) -> None:
        run_observe(holder.get(), run_id, step, version)

    return app


def _default_app() -> Celery:
    return create_app(Settings.from_env())


#: The app ``celery -A worker.app`` finds.
app = _default_app()
