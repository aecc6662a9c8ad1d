"""The pipeline tasks by name (sent by producers, by completion callbacks and by the sweeper)."""

from __future__ import annotations

import uuid

from shared.state import Callback, TaskSpec
from shared.tasks import routed

__all__ = ["CHILD_CALLBACK", "TASK_PIPELINE_ADVANCE", "TASK_PIPELINE_CHILD", "advance_task"]

#: Moves a pipeline run on from a step that is done (or from its start) and starts the next one.
TASK_PIPELINE_ADVANCE = "wesichain.pipeline.advance"
#: A child run's completion callback: records how it ended, starts the next items or step.
TASK_PIPELINE_CHILD = "wesichain.pipeline.child"
#: The callback every child run of a pipeline carries.
CHILD_CALLBACK = Callback(task=TASK_PIPELINE_CHILD)


def advance_task(pipeline_id: str, from_seq: int, namespace: str | None = None) -> TaskSpec:
    """Move ``pipeline_id`` on from step ``from_seq``; any number may run (moving on is atomic).
    A pipeline run in a queue namespace has it sent to that namespace's model queue, so the
    workers serving the namespace drive it, as they run its children."""
    spec = TaskSpec(
        name=TASK_PIPELINE_ADVANCE,
        task_id=f"pipe:{pipeline_id}:advance:{from_seq}:{uuid.uuid4().hex[:8]}",
        arguments={"pipeline_id": pipeline_id, "from_seq": from_seq},
    )
    return routed(spec, namespace)
