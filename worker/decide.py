"""The decide phase: a parked run (AWAITING_APPROVAL) goes on once a human's decision is stored."""

from __future__ import annotations

from shared import fsm
from shared.errors import BudgetExceeded, ToolOutcomeUnknown
from shared.state import Phase
from shared.tasks import TASK_DECIDE
from worker.runtime import Runtime, log


def run_decide(rt: Runtime, run_id: str, version: int, epoch: int = 0, takeover: bool = False) -> None:
    claim = rt.store.begin(run_id, version, Phase.AWAITING_APPROVAL, epoch, 0, "decide", takeover=takeover)
    claim = rt.ready(claim, TASK_DECIDE, run_id, version, "decide")
    if claim is None:
        return
    current = fsm.view(claim.head)
    assert isinstance(current, fsm.AwaitingApproval)
    decision = rt.store.load_decision(run_id)
    approval = current.head.approval
    if decision is None or approval is None:
        log.warning("run %s: decide without a stored decision; still waiting", run_id)
        rt.store.park(run_id, claim.claim_field, claim.token)
        return
    if approval.kind == "unknown_outcome":
        if decision.approve:
            rt.commit(current, current.resume(rt.store.load_results(run_id, current.head.step)))
        else:
            note = f": {decision.note}" if decision.note else ""
            error = ToolOutcomeUnknown(
                f"a human declined to continue after an unknown tool outcome{note}",
                step=current.head.step,
            ).info()
            rt.fail(current, error)
        return
    if decision.approve:
        rt.commit(current, current.approve())
    elif current.budget_left <= 0:
        rt.fail(
            current,
            BudgetExceeded(
                "step budget spent after the tool calls were denied", step=current.head.step
            ).info(),
        )
    else:
        rt.commit(current, current.deny(decision.note))
