"""The think phase: ask the model, validate what it wants, and commit the next move."""

from __future__ import annotations

import json
from collections.abc import Sequence

from shared import events as ev
from shared import fsm
from shared.actions import accept_tool_calls
from shared.agents import Agent
from shared.context import (
    SUMMARY_PROMPT,
    ContextBudget,
    TokenCounter,
    counter_for,
    fit,
    summary_due,
    summary_request_text,
    with_summary,
)
from shared.errors import ConfigError, InvalidModelAction, ModelTransport, RunConfigError, RunError
from shared.handoffs import choose_handoff, conversation_of, offered_tools
from shared.limits import Throttled
from shared.llm.base import LlmAdapter, ModelRequest, ModelResponse
from shared.llm.resolver import resolve_model
from shared.messages import Message, SystemMessage, UserMessage
from shared.middleware import Veto, after_model, before_model
from shared.output import instructions, parse_output
from shared.policy import Verdict, on_invalid_action, on_model_error, on_truncated
from shared.state import Phase, RunHead, Summary
from shared.store import Claim, ClaimRef, PhaseClaim
from shared.subagents import plan_children
from worker.handoffs import hand_off
from worker.heartbeat import Held
from worker.limited_call import call_model, requeue_throttled
from worker.model_call import ClaimLost
from worker.phase import run_phase
from worker.runtime import Delivery, Runtime, middleware_context
from worker.signals import NothingPending, absorb_pending, absorb_signals, wake_after_park

__all__ = ["TRUNCATION_CORRECTION", "build_request", "correction_for", "run_think"]

#: What the model is told after an answer the provider cut at its output limit
#: (``Policy.on_truncated="reprompt"``); also how the reprompts a run had for that are counted.
TRUNCATION_CORRECTION = (
    "Your previous answer was cut off at the output length limit. Answer again, completely and"
    " more briefly, so that the whole answer fits."
)


def run_think(rt: Runtime, delivery: Delivery, step: int) -> RunHead | None:
    want = PhaseClaim(
        delivery.run_id,
        delivery.version,
        Phase.THINKING,
        delivery.epoch,
        step,
        read_messages=True,
        read_inbox=True,
    )

    def body(current: fsm.Thinking, claim: Claim, held: Held) -> RunHead | None:
        return _think(rt, current, claim, held)

    return run_phase(rt, delivery, want, f"think of step {step}", fsm.Thinking, body)


def _think(rt: Runtime, current: fsm.Thinking, claim: Claim, held: Held) -> RunHead | None:
    head = current.head
    ref = claim.ref
    try:
        agent = rt.agent_of(head)
        # A model string named by the agent itself is trusted; one a producer set per run is not.
        adapter = resolve_model(
            head.model, rt.agents, trusted=head.model == agent.model, settings=rt.settings.llm
        )
    except ConfigError as exc:
        # This worker cannot build the run's model (unknown provider, missing API key): no
        # redelivery can change that, so the run fails now instead of crashing every attempt.
        return rt.fail(current, ref, RunConfigError(str(exc), step=head.step).info())
    absorbed = absorb_signals(rt, current, claim, agent)  # messages and updates sent in come first
    if not isinstance(absorbed, NothingPending):
        return absorbed
    # The conversation the current agent sees: after a handoff, the target's (``shared/handoffs.py``).
    conversation = conversation_of(head.handoffs, claim.messages)
    request = build_request(agent, adapter, head.model, conversation)
    if agent.context is not None:
        counter = counter_for(head.model, agent.context.chars_per_token)
        due = (
            summary_due(agent.context, conversation, head.summary, request.tools, counter)
            if agent.context.strategy == "summarise"
            else None
        )
        if due is not None:
            return _summarise(rt, current, ref, held, agent, adapter, agent.context, due, counter)
        fitted, _ = fit(
            with_summary(request.messages, head.summary), request.tools, agent.context.max_tokens, counter
        )
        request = request.model_copy(update={"messages": fitted})
    ctx = middleware_context(head, rt.phase_memory(head, "think"))
    request = before_model(agent.middleware, ctx, request)
    response = _ask(rt, current, ref, held, agent, adapter, request)
    if isinstance(response, _Handled):
        return response.head
    # Counted from the conversation itself, so no head field is needed to bound the reprompts.
    cut_before = sum(
        1 for m in conversation if isinstance(m, UserMessage) and m.content == TRUNCATION_CORRECTION
    )
    checked = after_model(agent.middleware, ctx, response)
    return _next_move(rt, current, ref, agent, checked, response, cut_before, conversation)


class _Handled:
    """A model call that did not answer: what was committed about it (None: nothing, or fenced)."""

    def __init__(self, head: RunHead | None) -> None:
        self.head = head


def _ask(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    held: Held,
    agent: Agent,
    adapter: LlmAdapter,
    request: ModelRequest,
    stream: bool | None = None,
) -> ModelResponse | _Handled:
    """Call the model; a call that fails is handled here (by the policy, a countdown, or not at all)."""
    head = current.head
    try:
        return call_model(rt, head, agent, adapter, request, held, stream)
    except Throttled as throttled:
        requeue_throttled(rt, head, ref, throttled)  # no capacity: again after a countdown
        return _Handled(None)
    except ClaimLost:
        return _Handled(None)  # taken over: whatever this delivery commits now would be fenced off
    except ModelTransport as exc:
        return _Handled(_on_model_error(rt, current, ref, agent, exc))
    except RunError as exc:
        return _Handled(rt.fail(current, ref, exc.info()))


def _summarise(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    held: Held,
    agent: Agent,
    adapter: LlmAdapter,
    budget: ContextBudget,
    due: tuple[int, list[Message]],
    counter: TokenCounter,
) -> RunHead | None:
    """Ask the model for the summary of the oldest messages and commit it on the run (once: every
    later think uses it); the step is then thought again with it."""
    head = current.head
    upto, dropped = due
    text = summary_request_text(head.summary, dropped, budget, counter)
    request = ModelRequest(
        model=head.model.partition(":")[2],
        messages=[SystemMessage(content=SUMMARY_PROMPT), UserMessage(content=text)],
        max_tokens=budget.summary_tokens,
    )
    response = _ask(rt, current, ref, held, agent, adapter, request, stream=False)
    if isinstance(response, _Handled):
        return response.head
    summary = Summary(upto=upto, text=(response.text or "")[: rt.settings.limits.max_message_chars])
    return rt.commit(current, current.summarised(summary, response.usage), ref)


def _next_move(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    agent: Agent,
    checked: ModelResponse | Veto,
    original: ModelResponse,
    cut_before: int = 0,
    conversation: Sequence[Message] = (),
) -> RunHead | None:
    """Commit what the model's (checked) response asks for: tool calls, approval, or the answer.

    A final answer the provider cut at its output limit goes by ``Policy.on_truncated``
    (``cut_before``: the reprompts the run had for that already); accepted, it is marked so.
    """
    head = current.head
    try:
        if isinstance(checked, Veto):
            raise InvalidModelAction(f"the reply was vetoed by {checked.reason}", step=head.step)
        response = checked
        calls = accept_tool_calls(response, offered_tools(agent), head.step, rt.settings.limits)
        handoff = choose_handoff(agent, calls)
        children = plan_children(agent, head, calls) if handoff is None else []
        if not calls and response.truncated:
            verdict = on_truncated(agent.policy, cut_before, current.budget_left)
            if verdict.action != "accept":
                return _on_truncated(rt, current, ref, response, verdict)
        output = (
            parse_output(response.text, agent.output_type, head.step)
            if agent.output_type is not None and not calls
            else None
        )
    except InvalidModelAction as exc:
        return _on_invalid(rt, current, ref, agent, exc, original if isinstance(checked, Veto) else checked)
    if handoff is not None:
        # A handoff wins over the rest of its reply: none of the reply's other calls runs.
        return hand_off(rt, current, ref, agent, response, calls, handoff, conversation)
    if children:
        return rt.commit(current, current.delegate(response.text, calls, response.usage, children), ref)
    approved = set(head.approved_tools)
    needs_approval = sorted({c.name for c in calls if c.name not in approved and agent.needs_approval(c)})
    if needs_approval:
        parked = rt.commit(current, current.park(response.text, calls, response.usage, needs_approval), ref)
        wake_after_park(rt, parked, agent)
        return parked
    if calls:
        return rt.commit(
            current, current.act(response.text, calls, response.usage, agent.max_parallel_tools), ref
        )
    answer = (response.text or "")[: rt.settings.limits.max_message_chars]
    return rt.commit(
        current,
        current.complete(answer, response.usage, output, response.truncated),
        ref,
        signals_first=lambda: _signals_first(rt, current, ref, agent),
    )


def _signals_first(rt: Runtime, current: fsm.Thinking, ref: ClaimRef, agent: Agent) -> RunHead | None:
    """Signals came in while the model was answering: apply them (one commit of their own, which
    sends this think again) rather than end the run without them."""
    absorbed = absorb_pending(rt, current, ref, agent)
    return None if isinstance(absorbed, NothingPending) else absorbed


def _on_truncated(
    rt: Runtime, current: fsm.Thinking, ref: ClaimRef, response: ModelResponse, verdict: Verdict
) -> RunHead | None:
    """A cut final answer the policy does not accept: reprompt for a whole one, or fail."""
    head = current.head
    error = InvalidModelAction(
        f"the answer was cut off at the model's output token limit (stop reason {response.finish_reason!r})",
        step=head.step,
    ).info()
    if verdict.action == "reprompt":
        transition = current.reprompt(
            error, response.text, TRUNCATION_CORRECTION, response.usage, verdict.consume_budget
        )
        return rt.commit(current, transition, ref)
    failed = ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="fail")
    return rt.fail(current, ref, error, (failed,))


def build_request(agent: Agent, adapter: LlmAdapter, model: str, messages: list[Message]) -> ModelRequest:
    """The model request of a think: the conversation, the tools, and the answer's format.

    A provider that takes a JSON schema natively gets it on the request; any other is told the
    schema in the system prompt of this request (not stored: every think says it again).
    """
    fmt = agent.output
    native = bool(getattr(adapter, "native_output", False))
    if fmt is not None and not native:
        told = instructions(fmt)
        if messages and isinstance(messages[0], SystemMessage):
            messages = [SystemMessage(content=f"{messages[0].content}\n\n{told}"), *messages[1:]]
        else:
            messages = [SystemMessage(content=told), *messages]
    return ModelRequest(
        model=model.partition(":")[2],
        messages=messages,
        tools=offered_tools(agent).specs(),
        output=fmt if native else None,
    )


def _on_model_error(
    rt: Runtime, current: fsm.Thinking, ref: ClaimRef, agent: Agent, exc: ModelTransport
) -> RunHead | None:
    head = current.head
    exc.step = head.step
    error = exc.info()
    verdict = on_model_error(agent.policy, head.model_retries, exc.retryable)
    if verdict.action == "retry":
        return rt.commit(
            current, current.retry(error, verdict.consume_budget), ref, countdown=verdict.delay_s
        )
    if verdict.action == "interrupt":
        return rt.interrupt(current, ref, "model error (halted by policy)", error)
    failed = ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="fail")
    return rt.fail(current, ref, error, (failed,))


def _on_invalid(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    agent: Agent,
    exc: InvalidModelAction,
    response: ModelResponse,
) -> RunHead | None:
    head = current.head
    verdict = on_invalid_action(agent.policy, head.reprompts, current.budget_left)
    error = exc.info()
    if verdict.action == "reprompt":
        correction = correction_for(agent, exc)
        raw = response.raw or response.text or _describe_calls(response)
        return rt.commit(
            current, current.reprompt(error, raw, correction, response.usage, verdict.consume_budget), ref
        )
    if verdict.action == "interrupt":
        return rt.interrupt(current, ref, "invalid model action (halted by policy)", error)
    failed = ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="fail")
    return rt.fail(current, ref, error, (failed,))


def correction_for(agent: Agent, exc: InvalidModelAction) -> str:
    """What the model is told after a malformed reply: what was wrong, and the schema to follow."""
    told = f"Your previous reply could not be used: {exc.message}. "
    tool = agent.tools.get(exc.tool) if exc.tool else None
    if tool is not None:
        schema = json.dumps(tool.spec().parameters, sort_keys=True)
        told += f"The arguments of {tool.name!r} must match this JSON schema: {schema}. "
    told += f"Available tools: {', '.join(agent.tools.names) or 'none'}. "
    if agent.output is not None:
        return told + (
            "Reply again with valid tool calls (arguments as a JSON object) or with a final answer "
            f"that is one JSON object matching this JSON schema: {agent.output.schema_text()}"
        )
    return told + "Reply again with valid tool calls (arguments as a JSON object) or with a final answer."


def _describe_calls(response: ModelResponse) -> str:
    return "; ".join(f"{c.name}({c.arguments!r})"[:500] for c in response.tool_calls)
