"""The eval tasks by name (sent by producers and by the pool alike)."""

from __future__ import annotations

import uuid

from shared.state import TaskSpec

__all__ = ["TASK_EVAL_PUMP", "TASK_EVAL_SCORE", "pump_task"]

#: Starts an eval's case runs while its cap has room.
TASK_EVAL_PUMP = "wesichain.eval.pump"
#: A case run's completion callback: scores it and records the result.
TASK_EVAL_SCORE = "wesichain.eval.score"


def pump_task(eval_id: str, queue: str | None) -> TaskSpec:
    """A pump of ``eval_id``; any number may run at once (taking slots is atomic)."""
    return TaskSpec(
        name=TASK_EVAL_PUMP,
        task_id=f"eval:{eval_id}:pump:{uuid.uuid4().hex[:12]}",
        arguments={"eval_id": eval_id},
        queue=queue,
    )
