"""The start phase: fill a new run in from its agent spec and begin thinking.

A producer creates the run IDLE (or sends ``wesichain.start`` with no run at all, from any
language); this task adds the agent's version, model and budget, the system prompt and the
thread's earlier conversation, and commits IDLE → THINKING.
"""

from __future__ import annotations

from typing import Any

from shared import fsm
from shared.errors import ConfigError, RunConfigError
from shared.messages import Message, SystemMessage, UserMessage
from shared.state import Phase, RunHead
from shared.tasks import TASK_START, start_task
from worker.runtime import Runtime, initial_messages

#: Messages of earlier runs in the same thread carried into a new run.
HISTORY_WINDOW = 40


def run_start(
    rt: Runtime,
    run_id: str,
    version: int,
    epoch: int = 0,
    create: dict[str, Any] | None = None,
    takeover: bool = False,
) -> None:
    if create is not None and rt.store.load_raw(run_id) == {}:
        # Sent by a bare producer: create the run here (a no-op if a duplicate already did).
        rt.store.commit(None, RunHead.new_idle(run_id, **create), outbox=[start_task(run_id, 1)])
    claim = rt.store.begin(run_id, version, Phase.IDLE, epoch, 0, "0:start", takeover=takeover)
    claim = rt.ready(claim, TASK_START, run_id, version, "start")
    if claim is None:
        return
    current = fsm.view(claim.head)
    assert isinstance(current, fsm.Idle)
    head = current.head
    with rt.heartbeat.hold(run_id, claim.claim_field, claim.token):
        rt.paused(Phase.IDLE, run_id)
    try:
        agent = rt.agents.get(head.agent)
    except ConfigError as exc:
        rt.fail(current, RunConfigError(str(exc), step=0).info())
        return
    limits = rt.settings.limits
    history = _thread_history(rt, head) if head.thread_id else []
    messages = initial_messages(agent.system_prompt, history, head.input[: limits.max_input_chars])
    transition = current.start(
        messages, agent_version=agent.version, model=head.model or agent.model, max_steps=agent.max_steps
    )
    rt.commit(current, transition)


def _thread_history(rt: Runtime, head: RunHead) -> list[Message]:
    assert head.thread_id is not None
    key = rt.store.keys.thread(head.thread_id)
    ids = [str(i) for i in rt.store.redis.lrange(key, 0, -1)]
    if head.run_id not in ids:
        rt.store.redis.rpush(key, head.run_id)
        rt.store.redis.expire(key, rt.settings.retention_s)
    earlier = [r for r in ids if r != head.run_id]
    if not earlier:
        return []
    previous: list[Message] = [
        m for m in rt.store.load_messages(earlier[-1]) if not isinstance(m, SystemMessage)
    ]
    window: list[Message] = previous[-HISTORY_WINDOW:]
    # Never start the window mid-exchange (e.g. with a tool result whose call was cut off).
    while window and not isinstance(window[0], UserMessage):
        window.pop(0)
    return window
