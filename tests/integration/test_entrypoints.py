"""Ways into a run besides Client.submit: a bare Celery message, threads carrying history."""

from __future__ import annotations

import uuid

import pytest

from producer.client import Client
from shared.messages import AssistantMessage, SystemMessage, UserMessage
from shared.state import Phase
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 30


def test_bare_send_task_creates_and_runs(workers: list[WorkerProcess], client: Client) -> None:
    """A producer in any language only needs the task name and JSON kwargs."""
    run_id = uuid.uuid4().hex
    create = {"agent": "one_hop", "input": "from a bare message"}
    kwargs = {"run_id": run_id, "version": 1, "create": create}
    # Sent twice: the duplicate must neither create a second run nor disturb the first.
    client.app.send_task("wesichain.start", kwargs=kwargs)
    client.app.send_task("wesichain.start", kwargs=kwargs)
    handle = client.handle(run_id)
    wait_until(lambda: client.store.load(run_id) is not None, TIMEOUT, what="run to be created")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert head.input == "from a bare message"
    started = [e for e in handle.events(follow=False) if e.kind == "RunStarted"]
    assert len(started) == 1


def test_thread_carries_history_across_runs(workers: list[WorkerProcess], client: Client) -> None:
    thread = f"t-{uuid.uuid4().hex[:8]}"
    first = client.submit("echo", "first question", thread_id=thread)
    assert first.wait(TIMEOUT).answer == "seen 0 tool results in 2 messages"
    second = client.submit("echo", "second question", thread_id=thread)
    head = second.wait(TIMEOUT)
    # system + (first user, first answer) carried over + the new user message
    assert head.answer == "seen 0 tool results in 4 messages"
    messages = client.store.load_messages(second.run_id)
    assert isinstance(messages[0], SystemMessage)
    assert [type(m) for m in messages[1:]] == [UserMessage, AssistantMessage, UserMessage, AssistantMessage]
    assert messages[1].content == "first question" and messages[3].content == "second question"
    other = client.submit("echo", "unrelated", thread_id=f"{thread}-other")
    assert other.wait(TIMEOUT).answer == "seen 0 tool results in 2 messages"


def test_model_override_per_run(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("direct", "hi", model="scripted:echo")
    head = handle.wait(TIMEOUT)
    assert head.model == "scripted:echo"
    assert head.answer == "seen 0 tool results in 2 messages"


def test_submit_rejects_oversized_and_empty_input(client: Client) -> None:
    with pytest.raises(ValueError, match="limit"):
        client.submit("direct", "x" * (client.settings.limits.max_input_chars + 1))
    with pytest.raises(ValueError, match="empty"):
        client.submit("direct", "   ")
    with pytest.raises(ValueError, match="metadata"):
        client.submit("direct", "hi", metadata={"blob": "y" * client.settings.limits.max_metadata_chars})
