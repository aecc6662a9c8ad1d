"""The start phase: fill a new run in from its agent spec and begin thinking.

A producer creates the run IDLE (or sends ``wesichain.start`` with a ``create`` request and no
run at all, from any language); this task adds the agent's version, model and budget, the system
prompt and the thread's earlier conversation, and commits IDLE → THINKING. A ``create`` request
is checked against the same limits as the client's (``shared/request.py``): a bad one still
becomes a run, failed with ``InvalidRequest``, so its sender can read why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from shared import fsm
from shared.agents import Agent
from shared.configurable import schema_of
from shared.errors import ConfigError, InvalidRequest, RunConfigError, excerpt
from shared.handoffs import conversation_of
from shared.messages import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from shared.middleware import Refuse, on_user_message
from shared.prompts import Prompt
from shared.request import check_run_id, new_run, validate_request
from shared.run_state import StateError, initial_state
from shared.state import HandoffRecord, Phase, RunHead, ToolResult
from shared.store import Claim, PhaseClaim
from shared.tasks import start_task
from worker.heartbeat import Held
from worker.phase import run_phase
from worker.runtime import Delivery, Runtime, middleware_context
from worker.threads import take_thread_turn
from worker.versions import pin

__all__ = [
    "HISTORY_WINDOW",
    "NO_RESULT",
    "render_prompts",
    "run_start",
    "THREAD_LOOKBACK",
]

log = logging.getLogger("wesichain.worker")

#: Messages of earlier runs in the same thread carried into a new run (an agent with a context
#: budget sets its own, its requests trimmed by tokens).
HISTORY_WINDOW = 40
#: Earlier runs of a thread looked at for the conversation a new run continues: the last one kept
#: (not rolled back) that has messages (a run interrupted before it started has none).
THREAD_LOOKBACK = 100


def run_start(rt: Runtime, delivery: Delivery, create: dict[str, Any] | None = None) -> RunHead | None:
    rejected = _create(rt, delivery.run_id, create) if create is not None else None

    def body(current: fsm.Idle, claim: Claim, held: Held) -> RunHead | None:
        if rejected is not None:
            return rt.fail(current, claim.ref, rejected.info())
        head = current.head
        try:
            replay = _replay(rt, head) if head.fork is not None else None
        except InvalidRequest as exc:
            return rt.fail(current, claim.ref, InvalidRequest(exc.message, step=0).info())
        # A fork of a handed-off run starts under the agent in charge at its checkpoint.
        run_as = head.model_copy(update={"handoffs": replay.handoffs}) if replay is not None else head
        try:
            agent = rt.agents.get(run_as.active_agent)
            config = rt.assistant_config(run_as)
        except ConfigError as exc:
            return rt.fail(current, claim.ref, RunConfigError(str(exc), step=0).info())
        if config is not None:
            # Loaded with the first run that names an assistant (Runtime._configured loaded its
            # configuration already): a worker whose runs name none never needs it.
            from shared.assistants import check_config

            try:
                # Checked when it was saved against what the workers then advertised; again here,
                # against this worker's agent, which a deploy may have changed since.
                check_config(agent.name, config, schema_of(agent))
            except InvalidRequest as exc:
                why = f"assistant {head.assistant} v{head.assistant_version}: {exc.message}"
                return rt.fail(current, claim.ref, InvalidRequest(why, step=0).info())
            agent = rt.agent_of(run_as)
        if head.thread_id is not None and head.fork is None:
            # A fork starts from its own checkpoint: it takes no turn in a thread.
            starts, committed = take_thread_turn(rt, current, claim.ref, agent.thread_policy)
            if not starts:
                return committed
        try:
            state = initial_state(agent.state_type, head.state)
        except StateError as exc:
            return rt.fail(current, claim.ref, InvalidRequest(str(exc), step=0).info())
        try:
            messages = _initial_conversation(rt, agent, head, replay)
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
            handoffs=replay.handoffs if replay is not None else (),
        )
        return rt.commit(current, transition, claim.ref)

    want = PhaseClaim(delivery.run_id, delivery.version, Phase.IDLE, delivery.epoch, 0)
    return run_phase(rt, delivery, want, "start", fsm.Idle, body)


def _initial_conversation(rt: Runtime, agent: Agent, head: RunHead, replay: _Replay | None) -> list[Message]:
    """The conversation a run starts thinking from: a fork's replayed one, or a fresh one."""
    ctx = middleware_context(head, rt.phase_memory(head, "start"))
    if head.fork is not None and replay is not None and replay.messages:
        if head.fork.edited_input:
            checked = on_user_message(agent.middleware, ctx, head.input)
            if isinstance(checked, Refuse):
                raise InvalidRequest(f"the input was refused by {checked.reason}")
            from shared.timetravel import fork_conversation

            return fork_conversation(replay.messages, checked)
        return replay.messages
    system, user = render_prompts(agent, head)
    checked = on_user_message(agent.middleware, ctx, user)
    if isinstance(checked, Refuse):
        raise InvalidRequest(f"the input was refused by {checked.reason}")
    window = agent.context.thread_messages if agent.context is not None else HISTORY_WINDOW
    history = _thread_history(rt, head, window) if head.thread_id else []
    return [SystemMessage(content=system), *history, UserMessage(content=checked)]


@dataclass(frozen=True)
class _Replay:
    """What a fork takes from its checkpoint (``shared/timetravel.py``)."""

    #: The original's conversation there, up to where the model is asked again (empty: forked
    #: from the very start, which begins afresh).
    messages: list[Message]
    #: The handoffs it keeps: it goes on under the last one's target.
    handoffs: list[HandoffRecord]


def _replay(rt: Runtime, head: RunHead) -> _Replay:
    """The checkpoint a fork replays, as ``head.fork`` names it."""
    # Only forks replay: a worker whose runs never fork does not load the fork code.
    from shared.timetravel import checkpoint_of, fork_conversation, forked_handoffs

    fork = head.fork
    assert fork is not None
    origin = checkpoint_of(rt.store.checkpoints(fork.run_id), fork.version)
    if origin is None:
        raise InvalidRequest(
            f"the run it forks from ({fork.run_id} v{fork.version}) is gone (past its retention)"
        )
    if origin.message_count == 0:
        return _Replay([], [])
    replayed = fork_conversation(rt.store.load_messages(fork.run_id, 0, origin.message_count - 1), None)
    # An edited input cuts the conversation at the last user message: the middleware that checks
    # it changes what it says, never where it is, so the length is known before the check.
    kept = len(fork_conversation(replayed, head.input)) if fork.edited_input else len(replayed)
    return _Replay(replayed, forked_handoffs(origin, kept))


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
        if request.assistant is not None:
            # Loaded by the first request that names an assistant (see Runtime._configured).
            from shared.assistant_store import AssistantStore

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


def _thread_history(rt: Runtime, head: RunHead, window_size: int) -> list[Message]:
    """The thread's conversation so far: the messages of the last earlier run that is kept (not
    rolled back) and has any, which begin with the conversation it continued itself."""
    earlier = _earlier_in_thread(rt, head)
    if not earlier or head.thread_id is None:
        return []
    rolled_back = rt.store.rolled_back(head.tenant, head.thread_id)
    previous: list[Message] = []
    recorded: dict[str, ToolResult] = {}
    for run_id in reversed(earlier[-THREAD_LOOKBACK:]):
        if run_id in rolled_back:
            continue
        previous = [m for m in _conversation_of_run(rt, run_id, head) if not isinstance(m, SystemMessage)]
        if previous:
            recorded = _recorded_results(rt, run_id)
            break
    previous = _answered(previous, recorded)
    window: list[Message] = previous[-window_size:] if window_size else []
    # Never start the window mid-exchange (e.g. with a tool result whose call was cut off).
    while window and not isinstance(window[0], UserMessage):
        window.pop(0)
    return window


def _conversation_of_run(rt: Runtime, run_id: str, head: RunHead) -> list[Message]:
    """The conversation an earlier run of the thread ended with, as its last agent saw it: after a
    handoff, not the stored list, which keeps what came before the handoff too (with a filtered
    history, the user's words twice). Nothing of a run of another tenant or thread: the thread's
    keys name only this one, but a conversation is never read on a key's word alone."""
    earlier = rt.store.load(run_id)
    if earlier is None or (earlier.tenant, earlier.thread_id) != (head.tenant, head.thread_id):
        return []
    return conversation_of(earlier.handoffs, rt.store.load_messages(run_id))


def _recorded_results(rt: Runtime, run_id: str) -> dict[str, ToolResult]:
    """The tool results recorded for the last step of an ended run, by call id: a run stopped
    after a call finished and before the results were observed has them here, not in its messages."""
    ended = rt.store.load(run_id)
    if ended is None or ended.step == 0:
        return {}
    return {r.call_id: r for r in rt.store.load_results(run_id, ended.step)}


#: What the next run of a thread reads for a call of an earlier run that has no recorded result.
NO_RESULT = (
    "No result: the run that asked for this call ended before its result was recorded, "
    "so whether it took effect is unknown."
)


def _answered(messages: list[Message], recorded: dict[str, ToolResult] | None = None) -> list[Message]:
    """``messages`` with every tool call answered: providers refuse an assistant message whose
    tool calls have no results, and a run that ended mid-step (interrupted, cancelled, failed)
    leaves one. Each such call is answered right after it, in call order, by its result recorded
    for the run (``recorded``: the call ran, and the next run must know its effect happened),
    else by an error saying its outcome is unknown (it may have run: a kill mid-call)."""
    recorded = recorded or {}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    kept: list[Message] = []
    for m in messages:
        kept.append(m)
        if not isinstance(m, AssistantMessage) or all(c.id in answered for c in m.tool_calls):
            continue
        for call in m.tool_calls:
            if call.id in answered:
                continue
            result = recorded.get(call.id)
            if result is None:
                kept.append(
                    ToolMessage(tool_call_id=call.id, name=call.name, content=NO_RESULT, is_error=True)
                )
            else:
                kept.append(
                    ToolMessage(
                        tool_call_id=call.id, name=call.name, content=result.output, is_error=not result.ok
                    )
                )
    return kept
