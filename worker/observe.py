"""The observe phase: feed the step's tool results back and decide whether to think again."""

from __future__ import annotations

from collections.abc import Sequence

from shared import fsm
from shared.agents import Agent
from shared.errors import InvalidModelAction, ToolDispatch
from shared.messages import ToolCall
from shared.output import parse_output
from shared.policy import after_tools
from shared.run_state import StateError, apply_updates
from shared.state import Phase, RunHead, ToolResult
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
        # Before the commit: a call's memory writes are applied once its result is recorded, even
        # when the delivery that recorded it died before it could apply them (each write id once).
        rt.apply_memory(head, claim.results)
        agent = rt.agent_of(head)
        try:
            state = apply_updates(agent.state_type, head.state, head.pending_calls, claim.results)
        except StateError as exc:
            # Each call's changes were valid on their own; together they are not (a model validator).
            return rt.fail(current, claim.ref, ToolDispatch(str(exc), step=head.step).info())
        if state != head.state:
            # The step's changes go into the next commit, whichever move the policy makes.
            current = fsm.view_as(head.model_copy(update={"state": state}), fsm.Observing)
            head = current.head
        verdict = after_tools(
            agent.policy,
            claim.results,
            budget_left=current.budget_left,
            max_steps=head.max_steps,
            step=head.step,
        )
        spent = verdict.error is not None and verdict.error.kind == "BudgetExceeded"
        if head.waiting_calls and (verdict.action != "fail" or spent):
            # Calls of this step wait for a wave (a cap on parallel calls): send the next one. Only
            # a failing result stops them; an unknown outcome is decided once all are in.
            return rt.commit(current, current.next_wave(agent.max_parallel_tools), claim.ref)
        if verdict.action == "next_step" or spent:
            ending = _ending_result(agent, [*head.done_calls, *head.pending_calls], claim.results)
            if ending is not None:
                return _finish(rt, current, claim, agent, ending)
        if verdict.action == "fail" and verdict.error is not None:
            return rt.fail(current, claim.ref, verdict.error)
        if verdict.action == "park_unknown":
            return rt.commit(current, current.park_unknown(claim.results), claim.ref)
        return rt.commit(current, current.next_step(claim.results), claim.ref)

    return run_phase(rt, delivery, want, f"observe of step {step}", fsm.Observing, body)


def _ending_result(
    agent: Agent, calls: Sequence[ToolCall], results: Sequence[ToolResult]
) -> ToolResult | None:
    """The first successful result (in call order) of a tool that ends the run, if any."""
    by_id = {r.call_id: r for r in results}
    for call in calls:
        tool = agent.tools.get(call.name)
        result = by_id.get(call.id)
        if tool is not None and tool.ends_run and result is not None and result.ok:
            return result
    return None


def _finish(
    rt: Runtime, current: fsm.Observing, claim: Claim, agent: Agent, ending: ToolResult
) -> RunHead | None:
    """Complete the run with the ending tool's result (validated against the output type, if any)."""
    output = None
    if agent.output_type is not None:
        try:
            output = parse_output(ending.output, agent.output_type, current.head.step)
        except InvalidModelAction as exc:
            message = f"tool {ending.name!r} ended the run with a result that does not fit: {exc.message}"
            error = ToolDispatch(message, step=current.head.step, tool=ending.name)
            return rt.fail(current, claim.ref, error.info())
    answer = ending.output[: rt.settings.limits.max_message_chars]
    return rt.commit(current, current.finish(claim.results, answer, output), claim.ref)
