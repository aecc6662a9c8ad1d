"""The worker's side of handoffs: commit the move a reply with a transfer call asks for.

See ``shared/handoffs.py`` for the semantics. Everything here runs inside the think that got the
reply, before its one commit: the target's system prompt is rendered and the input filter applied
then, so a worker killed before the commit leaves nothing behind (the think is handed on and the
model asked again), and the committed handoff is the only one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import ValidationError

from shared import events as ev
from shared import fsm
from shared.agents import Agent
from shared.errors import BudgetExceeded, ConfigError, InternalInvariant, InvalidModelAction
from shared.handoffs import HandoffChoice, answers, history_for_target, paired
from shared.llm.base import ModelResponse
from shared.messages import MESSAGE_ADAPTER, AssistantMessage, Message, SystemMessage, ToolCall
from shared.state import HandoffRecord, RunHead
from shared.store import ClaimRef
from worker.runtime import Runtime
from worker.start import render_prompts
from worker.versions import pin

__all__ = ["hand_off"]

log = logging.getLogger("wesichain.worker")


def hand_off(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    agent: Agent,
    response: ModelResponse,
    calls: Sequence[ToolCall],
    choice: HandoffChoice,
    conversation: Sequence[Message],
) -> RunHead | None:
    """Commit the handoff ``choice`` asks for, or its refusal (the model reads why)."""
    head = current.head
    target_name = choice.handoff.agent
    refusal: str | None = None
    target: Agent | None = None
    if len(head.handoffs) >= agent.max_handoffs:
        refusal = (
            f"not handed off to {target_name}: this run has been handed off {len(head.handoffs)} times,"
            f" the most {agent.name} allows; carry on without a handoff"
        )
    else:
        try:
            target = rt.agents.get(target_name)
        except ConfigError:
            refusal = f"not handed off: no agent {target_name!r} is available; carry on without a handoff"
    if target is None:
        return _refuse(rt, current, ref, response, calls, choice, refusal or "not handed off")
    told = f"Transferred to {target.name}, which takes the conversation over from here."
    replies = answers(calls, choice.call, told, error=False)
    system, _ = render_prompts(target, head)
    history = history_for_target(
        [*conversation, AssistantMessage(content=response.text, tool_calls=list(calls)), *replies]
    )
    kind: str = "kept"
    taken_over: list[Message] = [SystemMessage(content=system)]
    if choice.handoff.input_filter is not None:
        kind = "filtered"
        taken_over += _filtered(rt, choice, history, head.step)
    record = HandoffRecord(
        from_agent=agent.name,
        to_agent=target.name,
        to_version=pin(rt, head, target),
        step=head.step,
        call_id=choice.call.id,
        at=head.message_count + 1 + len(replies),
        history="filtered" if kind == "filtered" else "kept",
    )
    log.info("run %s: step %d hands off from %s to %s", head.run_id, head.step, agent.name, target.name)
    transition = current.hand_off(
        response.text,
        calls,
        response.usage,
        replies,
        record,
        taken_over,
        model=target.model,
        max_steps=target.max_steps,
    )
    return rt.commit(current, transition, ref)


def _refuse(
    rt: Runtime,
    current: fsm.Thinking,
    ref: ClaimRef,
    response: ModelResponse,
    calls: Sequence[ToolCall],
    choice: HandoffChoice,
    refusal: str,
) -> RunHead | None:
    head = current.head
    error = InvalidModelAction(refusal, step=head.step, tool=choice.call.name).info()
    if current.budget_left <= 0:
        spent = BudgetExceeded(
            f"step budget spent ({head.max_steps} steps) after a refused handoff", step=head.step
        )
        failed = ev.StepFailed(run_id=head.run_id, step=head.step, error=error, decision="fail")
        return rt.fail(current, ref, spent.info(), (failed,))
    replies = answers(calls, choice.call, f"Error: {refusal}", error=True)
    return rt.commit(
        current, current.refuse_handoff(response.text, calls, response.usage, replies, error), ref
    )


def _filtered(rt: Runtime, choice: HandoffChoice, history: list[Message], step: int) -> list[Message]:
    """The handoff's input filter applied to ``history`` (a copy: the filter cannot change the
    stored conversation), checked: messages only, no more than it was given and one more, each
    within the message size limit; then every tool call paired with its result. A filter that
    raises, or returns anything else, is a bug in the agents module: the run fails with it."""
    assert choice.handoff.input_filter is not None
    given = [m.model_copy(deep=True) for m in history]
    result = choice.handoff.input_filter(given)
    target = choice.handoff.agent
    if not isinstance(result, list):
        raise InternalInvariant(
            f"the input_filter of the handoff to {target!r} returned {type(result).__name__}, not a list",
            step=step,
        )
    if len(result) > len(history) + 1:
        raise InternalInvariant(
            f"the input_filter of the handoff to {target!r} returned {len(result)} messages"
            f" for {len(history)}: a filter may add at most one",
            step=step,
        )
    checked: list[Message] = []
    limit = rt.settings.limits.max_message_chars
    for index, message in enumerate(result):
        try:
            # Re-validated from JSON: only real messages go on, whatever the filter built.
            parsed = MESSAGE_ADAPTER.validate_python(
                message.model_dump(mode="json") if hasattr(message, "model_dump") else message
            )
        except ValidationError:
            raise InternalInvariant(
                f"the input_filter of the handoff to {target!r} returned a non-message at {index}", step=step
            ) from None
        content = getattr(parsed, "content", None)
        if isinstance(content, str) and len(content) > limit:
            raise InternalInvariant(
                f"the input_filter of the handoff to {target!r} returned a message over {limit} characters",
                step=step,
            )
        if not isinstance(parsed, SystemMessage):  # the target's own system prompt comes first
            checked.append(parsed)
    return paired(checked)
