"""Runs taken through real claims and commits straight on a :class:`~shared.store.RunStore`, with no
worker: for tests and benchmarks of what reads or moves stored runs (archive, retention, limits).

Each step claims the phase (or the tool call) as a worker would, then commits the transition the
state machine computes, so what is stored is what a worker would have stored.
"""

from __future__ import annotations

import uuid
from typing import Any

from shared import events as ev
from shared import fsm
from shared.llm.base import Usage
from shared.messages import SystemMessage, ToolCall, UserMessage
from shared.state import RunHead, ToolResult
from shared.store import CallClaim, Claim, PhaseClaim, RunStore
from shared.tasks import start_task, task_for

__all__ = [
    "CALLS",
    "HOLDER",
    "call_claim",
    "claim",
    "commit",
    "create",
    "ended_run",
    "live_run",
    "record",
    "record_all",
    "started",
    "tool_done",
]

#: The two parallel tool calls of each step of these runs.
CALLS = [
    ToolCall(id="a", name="add", arguments={"a": 1, "b": 2}),
    ToolCall(id="b", name="add", arguments={"a": 3, "b": 4}),
]
#: Who holds the claims taken here.
HOLDER = "test-host:1"


def create(store: RunStore, run_id: str | None = None) -> RunHead:
    head = RunHead.new_idle(run_id or uuid.uuid4().hex, "agent", "question")
    assert store.create(head, [start_task(head.run_id)])
    return head


def claim(store: RunStore, head: RunHead, **read: bool) -> Claim:
    outcome = store.claim_phase(
        PhaseClaim(head.run_id, head.version, head.phase, head.epoch, head.step, **read), HOLDER
    )
    assert isinstance(outcome, Claim), outcome
    return outcome


def commit(store: RunStore, current: fsm.PhaseView, t: fsm.Transition[Any]) -> None:
    held = claim(store, current.head)
    assert store.commit(current.head, t.head, held.ref, t.messages, t.events, task_for(t.head)).status == (
        "committed"
    )


def started(store: RunStore) -> fsm.Thinking:
    """A run committed through start: THINKING at version 2 with two messages."""
    idle = fsm.Idle(create(store))
    t = idle.start(
        [SystemMessage(content="sys"), UserMessage(content="question")],
        agent_version="1",
        model="scripted:x",
        max_steps=100,
    )
    commit(store, idle, t)
    return t.to


def call_claim(store: RunStore, head: RunHead, call_id: str, *, step: int | None = None) -> Any:
    want = CallClaim(head.run_id, head.version, head.epoch, head.step if step is None else step, call_id)
    return store.claim_call(want, HOLDER)


def tool_done(head: RunHead, call: ToolCall, output: str) -> tuple[ToolResult, ev.ToolCompleted]:
    result = ToolResult(call_id=call.id, name=call.name, ok=True, output=output)
    event = ev.ToolCompleted(
        run_id=head.run_id, step=head.step, call_id=call.id, tool=call.name, ok=True, output=output
    )
    return result, event


def record(store: RunStore, act: fsm.Acting, held: Claim, call: ToolCall, output: str) -> str:
    observing = act.observe().head
    result, event = tool_done(act.head, call, output)
    return store.record_result(act.head, held.ref, result, event, observing, task_for(observing)[0]).status


def record_all(store: RunStore, act: fsm.Acting) -> None:
    for call, output in zip(CALLS, ("3", "7"), strict=True):
        held = call_claim(store, act.head, call.id)
        record(store, act, held, call, output)


def ended_run(store: RunStore, tool_steps: int = 1) -> str:
    """A run taken to COMPLETED through real claims and commits: start, ``tool_steps`` steps of two
    parallel tool calls (each result recorded, the step observed), then a final answer."""
    thinking = started(store)
    for _ in range(tool_steps):
        t = thinking.act("calling", CALLS, Usage(input_tokens=10, output_tokens=5))
        commit(store, thinking, t)
        record_all(store, t.to)
        head = store.load(thinking.head.run_id)
        assert head is not None
        observing = fsm.Observing(head)
        nxt = observing.next_step(store.load_results(head.run_id, head.step))
        commit(store, observing, nxt)
        thinking = nxt.to
    commit(store, thinking, thinking.complete("the answer", Usage(input_tokens=20, output_tokens=10)))
    return thinking.head.run_id


def live_run(store: RunStore) -> str:
    """A run at work: started and thinking."""
    return started(store).head.run_id
