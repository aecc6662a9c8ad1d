"""The phase tasks by name, and the outbox each committed head leads to.

Pure and shared: the worker publishes these after its commits, and a producer (which never imports
worker code) builds the tasks it sends itself from the same functions, so task names, arguments and
deterministic ids have one definition.
"""

from __future__ import annotations

import re

from shared.state import Phase, RunHead, TaskSpec

TASK_START = "wesichain.start"
TASK_THINK = "wesichain.think"
TASK_TOOL = "wesichain.tool"
TASK_OBSERVE = "wesichain.observe"
TASK_DECIDE = "wesichain.decide"
TASK_SWEEP = "wesichain.sweep"


def _task_id(run_id: str, version: int, what: str, epoch: int) -> str:
    # Deterministic: the same commit always publishes the same ids; a takeover adds its epoch.
    return f"{run_id}:v{version}:{what}" + (f":e{epoch}" if epoch else "")


def task_for(head: RunHead) -> list[TaskSpec]:
    """The outbox of a committed head: the tasks that carry the run to its next phase."""
    run_id, version, epoch = head.run_id, head.version, head.epoch
    base = {"run_id": run_id, "step": head.step, "version": version, "epoch": epoch}
    if head.phase is Phase.IDLE:
        return [start_task(run_id, version, epoch)]
    if head.phase is Phase.THINKING:
        return [TaskSpec(name=TASK_THINK, task_id=_task_id(run_id, version, "think", epoch), arguments=base)]
    if head.phase is Phase.ACTING:
        return [
            TaskSpec(
                name=TASK_TOOL,
                task_id=_task_id(run_id, version, f"tool:{c.id}", epoch),
                arguments={**base, "call_id": c.id},
            )
            for c in head.pending_calls
        ]
    if head.phase is Phase.AWAITING_APPROVAL:
        return []  # parked: the decide task is sent when a human decides
    if head.phase is Phase.OBSERVING:
        return [
            TaskSpec(name=TASK_OBSERVE, task_id=_task_id(run_id, version, "observe", epoch), arguments=base)
        ]
    return []


def start_task(run_id: str, version: int, epoch: int = 0) -> TaskSpec:
    return TaskSpec(
        name=TASK_START,
        task_id=_task_id(run_id, version, "start", epoch),
        arguments={"run_id": run_id, "version": version, "epoch": epoch},
    )


def observe_task(acting: RunHead) -> TaskSpec:
    """The observe task the fan-in will enqueue: it expects the version after the last result."""
    version = acting.version + 1
    return TaskSpec(
        name=TASK_OBSERVE,
        task_id=_task_id(acting.run_id, version, "observe", acting.epoch),
        arguments={"run_id": acting.run_id, "step": acting.step, "version": version, "epoch": acting.epoch},
    )


def decide_task(head: RunHead) -> TaskSpec:
    """The task that resumes a parked run once a human's decision is stored (or a cancel is)."""
    return TaskSpec(
        name=TASK_DECIDE,
        task_id=_task_id(head.run_id, head.version, "decide", head.epoch),
        arguments={"run_id": head.run_id, "version": head.version, "epoch": head.epoch},
    )


def with_epoch(spec: TaskSpec, epoch: int) -> TaskSpec:
    """The same task re-published by the sweeper under a new epoch."""
    base = re.sub(r":e\d+$", "", spec.task_id)
    return TaskSpec(name=spec.name, task_id=f"{base}:e{epoch}", arguments={**spec.arguments, "epoch": epoch})
