"""The worker's side of subagents: starting child runs, recording their ends, cancelling them.

See ``shared/subagents.py`` for the protocol (cancelling a parent's children is
``Runtime.cancel_children``, part of every interruption). Both tasks here are idempotent: a spawn delivered
twice finds its child created (and only sends its start again while it has not started), and a
child's end recorded twice keeps the first record (``record_child``), so each child runs once and
gives its parent exactly one result.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from shared import events as ev
from shared.errors import ToolDispatch
from shared.state import Callback, ChildRun, ParentLink, Phase, RunHead, ToolResult
from shared.tasks import TASK_CHILD_DONE, decide_task, start_task
from worker.runtime import Runtime

__all__ = ["child_result", "run_child_done", "run_spawn"]

log = logging.getLogger("wesichain.worker")


def run_spawn(rt: Runtime, run_id: str, version: int, call_id: str) -> None:
    """Create and start the child run of ``call_id`` of the parent parked at ``version``."""
    parent = rt.store.load(run_id)
    if parent is None or parent.version != version or parent.approval is None:
        return  # moved on (cancelled, or every child already ended): nothing to start
    child = next((c for c in parent.approval.children if c.call_id == call_id), None)
    if child is None:
        return
    if rt.store.cancel_requested(run_id):
        return  # the cancel's decide cancels the children that did start
    existing = rt.store.load(child.run_id)
    if existing is None:
        start = start_task(child.run_id, namespace=parent.namespace)
        if not rt.store.create(_child_head(parent, child), [start]):
            existing = rt.store.load(child.run_id)
    if existing is not None and existing.phase is not Phase.IDLE:
        return  # started already: this is a duplicate delivery
    log.info("run %s: starting subagent %s as run %s", run_id, child.agent, child.run_id)
    rt.publish([start_task(child.run_id, namespace=parent.namespace)], 0)


def _child_head(parent: RunHead, child: ChildRun) -> RunHead:
    depth = parent.parent.depth + 1 if parent.parent is not None else 1
    return RunHead.new_idle(
        child.run_id,
        child.agent,
        child.input,
        metadata=parent.metadata,
        tenant=parent.tenant,
        # A subagent's run goes to its parent's queues.
        namespace=parent.namespace,
        callback=Callback(task=TASK_CHILD_DONE),
        parent=ParentLink(run_id=parent.run_id, step=parent.step, call_id=child.call_id, depth=depth),
    )


def run_child_done(rt: Runtime, outcome: dict[str, Any]) -> None:
    """A child run ended (its completion callback): record it as its parent's tool result, and
    wake the parent when it was the step's last."""
    child = rt.store.load(str(outcome.get("run_id", "")))
    if child is None or child.parent is None or not child.terminal:
        log.warning("child_done for %r, which is not an ended child run; ignored", outcome.get("run_id"))
        return
    link = child.parent
    parent = rt.store.load(link.run_id)
    approval = parent.approval if parent is not None else None
    if parent is None or approval is None or approval.kind != "children" or parent.step != link.step:
        log.info("run %s: its parent %s no longer waits for it", child.run_id, link.run_id)
        return
    call = next((c for c in parent.pending_calls if c.id == link.call_id), None)
    if call is None or not any(
        c.call_id == link.call_id and c.run_id == child.run_id for c in approval.children
    ):
        return  # not the child run this call started
    result = child_result(rt, call.name, link.call_id, child)
    completed = ev.ToolCompleted(
        run_id=parent.run_id,
        step=parent.step,
        call_id=call.id,
        tool=call.name,
        ok=result.ok,
        output=result.output[: rt.settings.limits.max_event_payload_chars],
        error=result.error,
        duration_s=result.duration_s,
        child_run_id=child.run_id,
    )
    count = rt.store.record_child(parent, result, completed)
    if count is not None and count >= len(approval.call_ids):
        rt.publish([decide_task(parent)], parent.epoch)


def child_result(rt: Runtime, tool: str, call_id: str, child: RunHead) -> ToolResult:
    """A child run's end as its parent's tool result: its output or answer, or why it did not end well."""
    duration = round(max(0.0, child.updated_at - child.created_at), 6)
    if child.phase is Phase.COMPLETED:
        output = json.dumps(child.output) if child.output is not None else (child.answer or "")
        limit = rt.settings.limits.max_tool_output_chars
        if len(output) > limit:
            output = output[:limit] + f"...[truncated {len(output) - limit} chars]"
        return ToolResult(call_id=call_id, name=tool, ok=True, output=output, duration_s=duration)
    why = child.error.message if child.error is not None else "no reason recorded"
    error = ToolDispatch(
        f"subagent {child.agent} ended {child.phase.value}: {why}"[:2000],
        step=child.parent.step if child.parent else None,
        tool=tool,
        child_run_id=child.run_id,
        child_error=child.error.kind if child.error is not None else None,
    ).info()
    return ToolResult(
        call_id=call_id,
        name=tool,
        ok=False,
        output=f"Error: {error.message}",
        error=error,
        duration_s=duration,
    )
