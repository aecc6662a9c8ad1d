"""The start phase: fill a new run in from its agent spec and begin thinking.

A producer creates the run IDLE (or sends ``wesichain.start`` with a ``create`` request and no
run at all, from any language); this task adds the agent's version, model and budget, the system
prompt and the thread's earlier conversation, and commits IDLE → THINKING. A ``create`` request
is checked against the same limits as the client's (``shared/request.py``): a bad one still
becomes a run, failed with ``InvalidRequest``, so its sender can read why.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from shared import fsm
from shared.agents import Agent
from shared.assistant_store import AssistantStore
from shared.assistants import check_config, schema_of
from shared.errors import ConfigError, InvalidRequest, RunConfigError, excerpt
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.middleware import Refuse, on_user_message
from shared.prompts import Prompt
from shared.request import check_run_id, new_run, validate_request
from shared.run_state import StateError, initial_state
from shared.state import ForkOrigin, Phase, RunHead
from shared.store import Claim, ClaimRef, PhaseClaim
from shared.tasks import start_task, task_for
from shared.timetravel import checkpoint_of, fork_conversation
from worker.heartbeat import Held
from worker.phase import run_phase
from worker.runtime import Delivery, Runtime, middleware_context
from worker.versions import pin

__all__ = [
    "HISTORY_WINDOW",
    "render_prompts",
    "run_start",
    "THREAD_WAIT_MAX_S",
    "THREAD_WAIT_S",
]

log = logging.getLogger("wesichain.worker")

#: Messages of earlier runs in the same thread carried into a new run (an agent with a context
#: budget sets its own, its requests trimmed by tokens).
HISTORY_WINDOW = 40
#: A run whose thread's previous run has not ended waits for it (it must not see a step in the
#: middle): its start is given back and published again after this, doubling up to the most.
THREAD_WAIT_S = 0.25
THREAD_WAIT_MAX_S = 5.0


def run_start(rt: Runtime, delivery: Delivery, create: dict[str, Any] | None = None) -> RunHead | None:
    rejected = _create(rt, delivery.run_id, create) if create is not None else None

    def body(current: fsm.Idle, claim: Claim, held: Held) -> RunHead | None:
        if rejected is not None:
            return rt.fail(current, claim.ref, rejected.info())
        head = current.head
        previous = _unended_predecessor(rt, head)
        if previous is not None:
            _wait_for(rt, head, claim.ref, previous)
            return None
        try:
            agent = rt.agents.get(head.agent)
            config = rt.assistant_config(head)
        except ConfigError as exc:
            return rt.fail(current, claim.ref, RunConfigError(str(exc), step=0).info())
        if config is not None:
            try:
                # Checked when it was saved against what the workers then advertised; again here,
                # against this worker's agent, which a deploy may have changed since.
                check_config(agent.name, config, schema_of(agent))
            except InvalidRequest as exc:
                why = f"assistant {head.assistant} v{head.assistant_version}: {exc.message}"
                return rt.fail(current, claim.ref, InvalidRequest(why, step=0).info())
            agent = rt.agent_of(head)
        try:
            state = initial_state(agent.state_type, head.state)
        except StateError as exc:
            return rt.fail(current, claim.ref, InvalidRequest(str(exc), step=0).info())
        try:
            messages = _initial_conversation(rt, agent, head)
        except InvalidRequest as exc:
            # Sent without the client's check (a bare start message, or check_agent=False), or
            # refused by the agent's middleware, or forked from a run that is gone.
            return rt.fail(current, claim.ref, InvalidRequest(exc.message, step=0).info())
        transition = current.start(
            messages,
            agent_version=pin(rt, head, agent),
            # The run's own model wins over its assistant's, which wins over the agent's.
            model=head.model or (config.model if config is not None else None) or agent.model,
            max_steps=agent.max_steps,
            state=state,
        )
        return rt.commit(current, transition, claim.ref)

    want = PhaseClaim(delivery.run_id, delivery.version, Phase.IDLE, delivery.epoch, 0)
    return run_phase(rt, delivery, want, "start", fsm.Idle, body)


def _initial_conversation(rt: Runtime, agent: Agent, head: RunHead) -> list[Message]:
    """The conversation a run starts thinking from: a fork's replayed one, or a fresh one."""
    ctx = middleware_context(head)
    if head.fork is not None:
        replayed = _forked_conversation(rt, head.fork)
        if replayed:
            if head.fork.edited_input:
                checked = on_user_message(agent.middleware, ctx, head.input)
                if isinstance(checked, Refuse):
                    raise InvalidRequest(f"the input was refused by {checked.reason}")
                replayed = fork_conversation(replayed, checked)
            return replayed
    system, user = render_prompts(agent, head)
    checked = on_user_message(agent.middleware, ctx, user)
    if isinstance(checked, Refuse):
        raise InvalidRequest(f"the input was refused by {checked.reason}")
    window = agent.context.thread_messages if agent.context is not None else HISTORY_WINDOW
    history = _thread_history(rt, head, window) if head.thread_id else []
    return [SystemMessage(content=system), *history, UserMessage(content=checked)]


def _forked_conversation(rt: Runtime, fork: ForkOrigin) -> list[Message]:
    """The original's conversation at the fork's checkpoint, up to where the model is asked again."""
    origin = checkpoint_of(rt.store.checkpoints(fork.run_id), fork.version)
    if origin is None:
        raise InvalidRequest(
            f"the run it forks from ({fork.run_id} v{fork.version}) is gone (past its retention)"
        )
    if origin.message_count == 0:
        return []  # forked from the very start: begin afresh
    messages = rt.store.load_messages(fork.run_id, 0, origin.message_count - 1)
    return fork_conversation(messages, None)


def render_prompts(agent: Agent, head: RunHead) -> tuple[str, str]:
    """The system prompt and the user message of a run, its templates filled from input and metadata."""
    system = agent.system_prompt
    if isinstance(system, Prompt):
        system = system.render(head.input, head.metadata)
    user = head.input
    if agent.input_template is not None:
        user = agent.input_template.render(head.input, head.metadata)
    return system, user


def _create(rt: Runtime, run_id: str, create: dict[str, Any]) -> InvalidRequest | None:
    """Create the run a bare producer asked for (a no-op if it exists); the request's fault, if any."""
    check_run_id(run_id)  # no run can be recorded under a bad id: the task fails, visibly
    if rt.store.load(run_id) is not None:
        return None
    rejected: InvalidRequest | None = None
    try:
        # The same run the Python client would create for this request: every field, the tenant
        # and the callback included (``new_run``), its assistant pinned to a version now.
        request = validate_request(create, rt.settings.limits)
        request = AssistantStore(rt.store.redis, rt.store.keys).pin(request)[0]
        head = new_run(run_id, request)
    except InvalidRequest as exc:
        # Record the run anyway, with what can be kept of the request, so the sender can read why.
        rejected = exc
        agent, text = create.get("agent"), create.get("input")
        head = RunHead.new_idle(
            run_id,
            (excerpt(agent, 200) or "?") if isinstance(agent, str) and agent else "?",
            (excerpt(text, 200) or "") if isinstance(text, str) else "",
        )
        log.warning("run %s: request refused: %s", run_id, exc)
    rt.store.create(head, [start_task(run_id, namespace=head.namespace)])
    return rejected


def _earlier_in_thread(rt: Runtime, head: RunHead) -> list[str]:
    """The runs before this one in its thread, oldest first (joining the thread, once, fixes its
    place: the order the runs of a thread start in)."""
    if head.thread_id is None:
        return []
    ids = rt.store.join_thread(head.tenant, head.thread_id, head.run_id)
    return ids[: ids.index(head.run_id)] if head.run_id in ids else ids


def _unended_predecessor(rt: Runtime, head: RunHead) -> str | None:
    """The run just before this one in its thread, while it has not ended (None: none, or ended).

    Each run waits for the one before it only: so the runs of a thread start in thread order,
    however many wait. A fork starts from its own checkpoint and waits for nothing.
    """
    if head.thread_id is None or head.fork is not None:
        return None
    earlier = _earlier_in_thread(rt, head)
    if not earlier:
        return None
    previous = rt.store.load(earlier[-1])
    return earlier[-1] if previous is not None and not previous.terminal else None


def _wait_for(rt: Runtime, head: RunHead, claim: ClaimRef, previous: str) -> None:
    """Give the start back and publish it again after a countdown: the run stays queued, holding no
    worker, until the thread's previous run has ended. The claim is released with its attempt
    uncounted and the run's queued time pushed past the countdown (``throttle.lua``, as for a
    think waiting for provider capacity), so the sweeper neither takes the wait for a lost
    message nor counts it towards poison, and sends the start again should the message be lost."""
    waited = rt.store.throttled(head.run_id)
    wait = min(THREAD_WAIT_S * 2 ** min(waited[1] if waited else 0, 8), THREAD_WAIT_MAX_S)
    why = json.dumps(
        {
            "version": head.version,
            "step": head.step,
            "limit": f"thread {head.thread_id}",
            "reason": f"waiting for the thread's previous run {previous} to end",
        }
    )
    if rt.store.throttle(head.run_id, head.version, claim.token, wait, why) == 0:
        return  # taken over meanwhile: the new holder goes on
    log.info("run %s: waits for run %s of its thread to end; again in %.2fs", head.run_id, previous, wait)
    (spec,) = task_for(head)
    rt.publish([spec.model_copy(update={"countdown": wait})], head.epoch)


def _thread_history(rt: Runtime, head: RunHead, window_size: int) -> list[Message]:
    earlier = _earlier_in_thread(rt, head)
    if not earlier:
        return []
    previous: list[Message] = _answered(
        [m for m in rt.store.load_messages(earlier[-1]) if not isinstance(m, SystemMessage)]
    )
    window: list[Message] = previous[-window_size:] if window_size else []
    # Never start the window mid-exchange (e.g. with a tool result whose call was cut off).
    while window and not isinstance(window[0], UserMessage):
        window.pop(0)
    return window


def _answered(messages: list[Message]) -> list[Message]:
    """``messages`` without any tool call left unanswered: providers refuse an assistant message
    whose tool calls have no results (a run that ended mid-step, failed or cancelled, leaves one).
    An assistant message with such a call keeps its text, if any, without its calls; the results
    of its other calls go with them."""
    results = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    kept: list[Message] = []
    dropped: set[str] = set()
    for m in messages:
        if isinstance(m, AssistantMessage) and any(c.id not in results for c in m.tool_calls):
            dropped.update(c.id for c in m.tool_calls)
            if m.content:
                kept.append(AssistantMessage(content=m.content))
        elif not (isinstance(m, ToolMessage) and m.tool_call_id in dropped):
            kept.append(m)
    return kept
