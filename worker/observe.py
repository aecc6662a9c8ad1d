"""The observe phase: feed the step's tool results back and decide whether to think again."""

from __future__ import annotations

from shared import fsm
from shared.errors import BudgetExceeded, RunErrorInfo
from shared.state import Phase, ToolResult
from shared.tasks import TASK_OBSERVE
from worker.runtime import Runtime


def run_observe(
    rt: Runtime, run_id: str, step: int, version: int, epoch: int = 0, takeover: bool = False
) -> None:
    claim = rt.store.begin(
        run_id, version, Phase.OBSERVING, epoch, step, f"{step}:observe", with_results=True, takeover=takeover
    )
    claim = rt.ready(claim, TASK_OBSERVE, run_id, version, f"observe of step {step}")
    if claim is None:
        return
    current = fsm.view(claim.head)
    assert isinstance(current, fsm.Observing)
    head = current.head
    with rt.heartbeat.hold(run_id, claim.claim_field, claim.token):
        rt.paused(Phase.OBSERVING, run_id)
    agent = rt.agents.get(head.agent)
    results = claim.results
    failures = [r for r in results if not r.ok]
    poisoned = [r for r in failures if r.error is not None and r.error.kind == "PoisonPhase"]
    if poisoned:
        rt.fail(current, _first_error(poisoned))
        return
    unknown = [r for r in failures if r.error is not None and r.error.kind == "ToolOutcomeUnknown"]
    if unknown and agent.policy.on_unknown_outcome == "fail":
        rt.fail(current, _first_error(unknown))
        return
    if unknown:
        rt.commit(current, current.park_unknown(results))
        return
    if failures and agent.policy.on_tool_error == "fail_fast":
        rt.fail(current, _first_error(failures))
        return
    if current.budget_left <= 0:
        error = BudgetExceeded(
            f"step budget of {head.max_steps} spent before the model gave a final answer", step=step
        ).info()
        rt.fail(current, error)
        return
    rt.commit(current, current.next_step(results))


def _first_error(results: list[ToolResult]) -> RunErrorInfo:
    error = results[0].error
    assert error is not None
    return error
