"""The observe phase: feed the step's tool results back and decide whether to think again."""

from __future__ import annotations

from shared import fsm
from shared.errors import BudgetExceeded, RunErrorInfo
from shared.state import Phase, ToolResult
from shared.store import Stale
from worker.runtime import TASK_OBSERVE, Runtime, log


def run_observe(rt: Runtime, run_id: str, step: int, version: int) -> None:
    claim = rt.store.begin(run_id, version, Phase.OBSERVING, f"{step}:observe")
    if claim is None:
        log.warning("observe for unknown run %s dropped", run_id)
        return
    if isinstance(claim, Stale):
        rt.on_stale(claim, TASK_OBSERVE, version)
        return
    current = fsm.view(claim.head)
    assert isinstance(current, fsm.Observing)
    if rt.check_poison(current, claim.attempts, f"observe of step {step}"):
        return
    if claim.cancel_requested:
        rt.interrupt(current, "cancelled")
        return
    head = current.head
    agent = rt.agents.get(head.agent)
    results = rt.store.load_results(run_id, step)
    failures = [r for r in results if not r.ok]
    unknown = [r for r in failures if r.error is not None and r.error.kind == "ToolOutcomeUnknown"]
    if unknown and agent.policy.on_unknown_outcome == "fail":
        rt.fail(current, _first_error(unknown))
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
