"""The observe phase: feed the step's tool results back and decide whether to think again."""

from __future__ import annotations

from shared import fsm
from shared.policy import after_tools
from shared.state import Phase, RunHead
from shared.store import Claim, PhaseClaim
from worker.heartbeat import Held
from worker.phase import run_phase
from worker.runtime import Delivery, Runtime

__all__ = ["run_observe"]


def run_observe(rt: Runtime, delivery: Delivery, step: int) -> RunHead | None:
    want = PhaseClaim(
        delivery.run_id, delivery.version, Phase.OBSERVING, delivery.epoch, step, read_results=True
    )

    def body(current: fsm.Observing, claim: Claim, held: Held) -> RunHead | None:
        head = current.head
        policy = rt.agents.get(head.agent).policy
        verdict = after_tools(
            policy, claim.results, budget_left=current.budget_left, max_steps=head.max_steps, step=head.step
        )
        if verdict.action == "fail" and verdict.error is not None:
            return rt.fail(current, claim.ref, verdict.error)
        if verdict.action == "park_unknown":
            return rt.commit(current, current.park_unknown(claim.results), claim.ref)
        return rt.commit(current, current.next_step(claim.results), claim.ref)

    return run_phase(rt, delivery, want, f"observe of step {step}", fsm.Observing, body)
