"""A human's decision on a parked run is kept in its events (approve or deny, note, who), and the
note reaches the model either way."""

from __future__ import annotations

import pytest

from producer.cli import main
from producer.client import Client
from shared.state import Phase
from tests.broker import broker_env
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 30


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_the_decision_is_an_event_and_its_note_reaches_the_model(
    verb: str, workers: list[WorkerProcess], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in broker_env(client.settings.redis_url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    note = f"{verb}d: the customer called twice"
    args = [verb, handle.run_id, "--note", note, "--by", "alice"]
    assert main([*args, "--redis", client.settings.redis_url, "--agents", "tests.agents_fixture"]) == 0
    done = handle.wait(TIMEOUT)
    assert done.phase is Phase.COMPLETED
    decided = [e for e in handle.events(follow=False) if e.kind == "ApprovalDecided"]
    assert [(e.approve, e.note, e.by, e.step) for e in decided] == [(verb == "approve", note, "alice", 1)]
    # The scripted model answers with the last tool message it was sent: the note is in it.
    assert done.answer is not None and note in done.answer
    assert done.answer.startswith("charged:" if verb == "approve" else "denied:")
