"""A task of the worker's app names its phase for the lines its thread logs while it runs, and
no phase once it returned."""

from __future__ import annotations

from typing import Any

from celery import Celery

from shared import events as ev
from worker import logs
from worker.app import PHASE_OF_TASK, LoggedTask


def test_the_log_context_holds_while_the_task_runs_and_is_cleared_after() -> None:
    app = Celery("logged-task-test", set_as_current=False, task_cls=LoggedTask)
    seen: list[dict[str, Any] | None] = []

    @app.task(name="wesichain.think", shared=False)
    def think(run_id: str, step: int) -> None:
        current = logs._context.get()
        seen.append(dict(current) if current is not None else None)

    think.apply(kwargs={"run_id": "r1", "step": 3}, task_id="t1", throw=True)
    assert seen == [
        {
            "run_id": "r1",
            "step": 3,
            "phase": PHASE_OF_TASK["wesichain.think"],
            "task_id": "t1",
            "worker": ev.worker_identity(),
        }
    ]
    assert logs._context.get() is None
