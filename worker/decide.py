"""The decide phase: a parked run (AWAITING_APPROVAL) goes on once a human's decision is stored, or
(parked for subagents) once every child run of its step has ended; an agent with
``wake_on_message`` is also woken from an approval by a message sent into the run."""

from __future__ import annotations

import logging

from shared import events as ev
from shared import fsm
from shared.errors import BudgetExceeded, ToolOutcomeUnknown
from shared.policy import after_tools
from shared.state import Phase, RunHead
from shared.store import Claim, PhaseClaim
from worker.heartbeat import Held
from worker.phase import run_phase
from worker.runtime import Delivery, Runtime
from worker.signals import wake_for_message

__all__ = ["run_decide"]

log = logging.getLogger("wesichain.worker")


def run_decide(rt: Runtime, delivery: Delivery, step: int | None = None) -> RunHead | None:
    def body(current: fsm.Parked, claim: Claim, held: Held) -> RunHead | None:
        head = current.head
        if head.approval is not None and head.approval.kind == "children":
            return _children_ended(rt, current, claim)
        decision = rt.store.load_decision(head.run_id) or wake_for_message(rt, head)
        approval = head.approval
        if decision is None or approval is None:
            log.warning("run %s: decide without a stored decision; still waiting", head.run_id)
            rt.store.release(head.run_id, claim.field, claim.token, head.version)
            return None
        if approval.kind == "unknown_outcome":
            # Who decided, and why, is recorded as for approved or denied calls.
            decided = ev.ApprovalDecided(
                run_id=head.run_id,
                step=head.step,
                approve=decision.approve,
                note=decision.note,
                by=decision.by,
            )
            if decision.approve:
                resumed = current.resume(rt.store.load_results(head.run_id, head.step))
                return rt.commit(current, resumed, claim.ref, (decided,))
            note = f": {decision.note}" if decision.note else ""
            error = ToolOutcomeUnknown(
                f"a human declined to continue after an unknown tool outcome{note}", step=head.step
            )
            return rt.fail(current, claim.ref, error.info(), (decided,))
        if decision.approve:
            cap = rt.agent_of(head).max_parallel_tools
            moved = current.approve(decision.always, cap, note=decision.note, by=decision.by)
            return rt.commit(current, moved, claim.ref)
        if current.budget_left <= 0:
            spent = BudgetExceeded("step budget spent after the tool calls were denied", step=head.step)
            return rt.fail(current, claim.ref, spent.info())
        return rt.commit(current, current.deny(decision.note, by=decision.by), claim.ref)

    if step is None:  # sent by an older producer, without the step: claim at the run's own
        head = rt.store.load(delivery.run_id)
        step = head.step if head is not None else 0
    want = PhaseClaim(delivery.run_id, delivery.version, Phase.AWAITING_APPROVAL, delivery.epoch, step)
    return run_phase(rt, delivery, want, "decide", fsm.Parked, body)


def _children_ended(rt: Runtime, current: fsm.Parked, claim: Claim) -> RunHead | None:
    """Go on once every child run of the step has its result; until then, keep waiting."""
    head = current.head
    waited = head.approval.call_ids if head.approval is not None else []
    results = rt.store.load_results(head.run_id, head.step)
    missing = set(waited) - {r.call_id for r in results}
    if missing:
        rt.store.release(head.run_id, claim.field, claim.token, head.version)
        return None
    policy = rt.agent_of(head).policy
    verdict = after_tools(
        policy, results, budget_left=current.budget_left, max_steps=head.max_steps, step=head.step
    )
    if verdict.action == "fail" and verdict.error is not None:
        return rt.fail(current, claim.ref, verdict.error)
    return rt.commit(current, current.resume(results), claim.ref)
