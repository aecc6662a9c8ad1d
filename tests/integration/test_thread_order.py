"""Runs of one thread never see a step in the middle: a run started while the thread's previous run
is still going waits, queued and holding no worker, and starts once it ended, in thread order."""

from __future__ import annotations

import uuid
from typing import Any

from producer.client import Client
from shared.messages import AssistantMessage, ToolMessage
from shared.state import Phase
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 30


def test_a_run_on_a_busy_thread_waits_for_the_previous_one(
    workers: list[WorkerProcess], client: Client
) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    first = client.submit("needs_approval", "please refund", thread_id=thread)
    wait_until(lambda: first.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the first run to park")
    # Parked mid-step: its last message is a tool call without a result.
    (parked_call,) = [m for m in client.store.load_messages(first.run_id) if isinstance(m, AssistantMessage)]
    assert parked_call.tool_calls
    second = client.submit("echo", "what happened?", thread_id=thread)
    third = client.submit("echo", "and then?", thread_id=thread)
    # Each start found the run before it not ended, and was parked to wait for it.
    for waiting, previous in ((second, first), (third, second)):

        def waits(run_id: str = waiting.run_id) -> dict[str, Any] | None:
            return client.store.thread_wait(run_id)

        noted = wait_until(waits, TIMEOUT, what="the start to wait")
        assert noted == {"thread_id": thread, "waiting_for": previous.run_id}
    # Still queued while the first is parked: nothing of theirs ran.
    for waiting in (second, third):
        head = waiting.status()
        assert (head.phase, head.status, head.message_count) == (Phase.IDLE, "queued", 0)

    first.approve()
    assert first.wait(TIMEOUT).phase is Phase.COMPLETED
    done = second.wait(TIMEOUT)
    # The first run's whole exchange (its question, the call, its result, its answer), then its own.
    assert (done.phase, done.answer) == (Phase.COMPLETED, "seen 1 tool results in 6 messages")
    assert third.wait(TIMEOUT).answer == "seen 1 tool results in 8 messages"  # after the second
    # Every tool call the later runs were given has its result.
    for run in (second, third):
        messages = client.store.load_messages(run.run_id)
        calls = {c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}
        assert calls == {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
