"""What a worker's main process does when one of its pool processes dies with a phase in hand.

Celery's main process sees a pool child die (``WorkerLostError``) or kills it at a task's hard
time limit (``TimeLimitExceeded``), and knows which task it ran. It is the one process that knows
for sure the claim's holder is dead, so it expires that claim at once: the next delivery (Celery's
worker-lost retry) takes the work over without waiting for the lease, and a message that only
*says* it is a redelivery can take nothing over while the holder lives. A tool killed at its hard
time limit gets its result here (timed out; outcome unknown if it is not retry-safe), so the run
goes on without re-running a tool that hangs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shared import events as ev
from shared import fsm, protocol
from shared.errors import ConfigError
from shared.events import worker_identity
from shared.state import Phase
from shared.store import ClaimRef
from shared.tasks import TASK_TOOL, task_for
from worker.act import tool_timeout_result
from worker.runtime import Runtime

__all__ = ["on_lost_process"]

log = logging.getLogger("wesichain.worker")


def on_lost_process(
    rt: Runtime, task: str, kwargs: Mapping[str, Any], pid: int, why: str, timed_out: bool
) -> None:
    run_id, version = kwargs.get("run_id"), kwargs.get("version")
    if not isinstance(run_id, str) or not isinstance(version, int):
        return
    step, call_id = kwargs.get("step"), kwargs.get("call_id")
    is_call = task == TASK_TOOL and isinstance(step, int) and isinstance(call_id, str)
    field = protocol.call_claim(step, call_id) if is_call else protocol.RUNNING  # type: ignore[arg-type]
    holder = f"{worker_identity()}:{pid}"
    reason = f"its process ({holder}) {why}"
    if rt.store.expire_dead_holder(run_id, version, field, holder, reason):
        log.warning("run %s: %s %s; its claim is released", run_id, task, reason)
    if timed_out and is_call:
        _record_timeout(rt, run_id, version, step, call_id, reason)  # type: ignore[arg-type]


def _record_timeout(rt: Runtime, run_id: str, version: int, step: int, call_id: str, reason: str) -> None:
    head = rt.store.load(run_id)
    if head is None or head.phase is not Phase.ACTING or head.version != version or head.step != step:
        return
    call = next((c for c in head.pending_calls if c.id == call_id), None)
    if call is None:
        return
    try:
        tool = rt.agent_of(head).tools.get(call.name)
    except ConfigError:
        tool = None
    timeout = f" of {tool.timeout_s:g}s" if tool is not None else ""
    why = f"it did not finish within its timeout{timeout} and was killed at its hard time limit ({reason})"
    result = tool_timeout_result(call, tool, step, why)
    completed = ev.ToolCompleted(
        run_id=run_id,
        step=step,
        call_id=call_id,
        tool=call.name,
        ok=False,
        output=result.output,
        error=result.error,
    )
    observing = fsm.view_as(head, fsm.Acting).observe().head
    (observe,) = task_for(observing)
    recorded = rt.store.record_result(
        head, ClaimRef(protocol.call_claim(step, call_id), ""), result, completed, observing, observe
    )
    if recorded.status == "complete":
        rt.publish([observe], recorded.epoch)
