"""Policy retries are not crashes: a run may retry its model call as often as its policy allows,
whatever the limit on crashed attempts."""

from __future__ import annotations

import uuid

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import FLAKY_FAILURES, MODEL_CALLS_KEY
from tests.broker import Settings
from tests.harness import WorkerProcess

TIMEOUT = 60


def test_more_policy_retries_than_the_crash_limit(workers: list[WorkerProcess], client: Client) -> None:
    assert FLAKY_FAILURES + 1 > Settings().max_phase_attempts, "the test must retry past the crash limit"
    text = f"flaky-{uuid.uuid4().hex}"
    handle = client.submit("flaky", text)
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED, f"{head.phase} {head.error}"
    assert head.answer == "answered after the provider recovered"
    assert client.store.redis.hget(MODEL_CALLS_KEY, f"{text}:0") == str(FLAKY_FAILURES + 1)
    retried = [e for e in handle.events(follow=False) if e.kind == "StepFailed"]
    assert [e.decision for e in retried] == ["retry"] * FLAKY_FAILURES
