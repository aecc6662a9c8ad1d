"""The phase tasks by name, and the outbox each committed head leads to.

Pure and shared: the worker publishes these after its commits, and a producer (which never imports
worker code) builds the tasks it sends itself from the same functions, so task names, arguments and
deterministic ids have one definition.

A task names the run, version, epoch (and step, and call) it was published for; its id is
deterministic: the same commit always publishes the same ids, and a hand-on by the sweeper adds
the new epoch. Every publish stamps the run's current epoch (:func:`with_epoch`), so an outbox
stored before the epoch changed is sent under the right one. A run with a queue namespace
(``shared/queues.py``) has each task name its queue in that namespace; the others name none, and
the routes (``wesichain.model``, ``wesichain.tools``, ``wesichain.callbacks``) apply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from shared.queues import queue_in
from shared.state import Phase, RunHead, TaskSpec
from shared.versions import version_queue

__all__ = [
    "PHASE_TASKS",
    "TASK_ARCHIVE",
    "TASK_BULK",
    "TASK_CALLBACK",
    "TASK_CHILD_DONE",
    "TASK_DECIDE",
    "TASK_OBSERVE",
    "TASK_SPAWN",
    "TASK_START",
    "TASK_SWEEP",
    "TASK_THINK",
    "TASK_TOOL",
    "VERSIONED_TASKS",
    "decide_task",
    "kind_of",
    "routed",
    "start_task",
    "task_for",
    "with_epoch",
]

TASK_START = "wesichain.start"
TASK_THINK = "wesichain.think"
TASK_TOOL = "wesichain.tool"
TASK_OBSERVE = "wesichain.observe"
TASK_DECIDE = "wesichain.decide"
TASK_SWEEP = "wesichain.sweep"
#: One pass of the archiver (beat-scheduled when an archive is configured).
TASK_ARCHIVE = "wesichain.archive"
TASK_CALLBACK = "wesichain.callback"
#: Creates and starts one subagent call's child run (``shared/subagents.py``).
TASK_SPAWN = "wesichain.spawn"
#: A child run's completion callback: records its outcome as its parent's tool result.
TASK_CHILD_DONE = "wesichain.child_done"
#: Works a bulk job a chunk at a time (``shared/bulk.py``; never nameable by a producer). Named
#: here, not beside the jobs, so a worker registers the task without loading bulk jobs and search.
TASK_BULK = "wesichain.bulk.run"

#: Every phase task, by name (the sweep is not a phase).
PHASE_TASKS = (TASK_START, TASK_THINK, TASK_TOOL, TASK_OBSERVE, TASK_DECIDE)
#: The tasks of a run that run its agent's code: sent to the queue of the version the run is
#: pinned to (``shared/versions.py``) once it has started.
VERSIONED_TASKS = frozenset({TASK_THINK, TASK_TOOL, TASK_OBSERVE, TASK_DECIDE, TASK_SPAWN})


def _task_id(run_id: str, version: int, what: str, epoch: int) -> str:
    return f"{run_id}:v{version}:{what}" + (f":e{epoch}" if epoch else "")


def kind_of(task: str) -> str:
    """The queue kind a task goes to: its tool calls to tools, callbacks to callbacks, the rest model."""
    return "tools" if task == TASK_TOOL else "callbacks" if task == TASK_CALLBACK else "model"


def routed(spec: TaskSpec, namespace: str | None) -> TaskSpec:
    """``spec`` sent to its kind's queue in ``namespace`` (unchanged for the default namespace)."""
    if namespace is None:
        return spec
    return spec.model_copy(update={"queue": queue_in(namespace, kind_of(spec.name))})


def _route(spec: TaskSpec, head: RunHead) -> TaskSpec:
    """``spec`` of the run of ``head`` on its queue: its agent version's once the run is pinned to
    one and the task runs agent code, else its namespace's."""
    if head.agent_version and spec.name in VERSIONED_TASKS:
        queue = version_queue(head.namespace, kind_of(spec.name), head.active_agent, head.agent_version)
        return spec.model_copy(update={"queue": queue})
    return routed(spec, head.namespace)


def task_for(head: RunHead, time_limits: Mapping[str, float] | None = None) -> list[TaskSpec]:
    """The outbox of a committed head: the tasks that carry the run to its next phase, each on
    its queue in the run's namespace.

    ``time_limits`` maps a tool name to the hard time limit of its calls.
    """
    return [_route(spec, head) for spec in _next_tasks(head, time_limits or {})]


def _next_tasks(head: RunHead, limits: Mapping[str, float]) -> list[TaskSpec]:
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
                time_limit_s=limits.get(c.name),
            )
            for c in head.pending_calls
        ]
    if head.phase is Phase.OBSERVING:
        return [
            TaskSpec(name=TASK_OBSERVE, task_id=_task_id(run_id, version, "observe", epoch), arguments=base)
        ]
    if head.terminal and head.callback is not None:
        # Ended, with a service to tell: delivering the callback is the run's last task.
        what = "callback"
        return [
            TaskSpec(
                name=TASK_CALLBACK,
                task_id=_task_id(run_id, version, what, epoch),
                arguments={**base, "phase": head.phase.value},
            )
        ]
    if (
        head.phase is Phase.AWAITING_APPROVAL
        and head.approval is not None
        and head.approval.kind == "children"
    ):
        # Waiting for subagents: start each child run (the last to end wakes this one).
        return [
            TaskSpec(
                name=TASK_SPAWN,
                task_id=_task_id(run_id, version, f"spawn:{child.call_id}", epoch),
                arguments={**base, "call_id": child.call_id},
            )
            for child in head.approval.children
        ]
    return []  # parked (the decide task is sent when a human decides) or ended


def start_task(run_id: str, version: int = 1, epoch: int = 0, namespace: str | None = None) -> TaskSpec:
    spec = TaskSpec(
        name=TASK_START,
        task_id=_task_id(run_id, version, "start", epoch),
        arguments={"run_id": run_id, "version": version, "epoch": epoch},
    )
    return routed(spec, namespace)


def decide_task(head: RunHead) -> TaskSpec:
    """The task that resumes a parked run once a human's decision is stored (or a cancel is)."""
    spec = TaskSpec(
        name=TASK_DECIDE,
        task_id=_task_id(head.run_id, head.version, "decide", head.epoch),
        arguments={"run_id": head.run_id, "version": head.version, "epoch": head.epoch, "step": head.step},
    )
    return _route(spec, head)


def with_epoch(spec: TaskSpec, epoch: int) -> TaskSpec:
    """The same task under ``epoch`` (its id and arguments say so); unchanged if already there."""
    if spec.arguments.get("epoch") == epoch:
        return spec
    base = re.sub(r":e\d+$", "", spec.task_id)
    return spec.model_copy(
        update={
            "task_id": base + (f":e{epoch}" if epoch else ""),
            "arguments": {**spec.arguments, "epoch": epoch},
        }
    )
