"""A cancel requested before a commit wins over it, terminal or not; a model call in flight,
streaming or not, is given up as soon as the heartbeat sees the cancel."""

from __future__ import annotations

import time

import pytest

from producer.client import Client
from shared import protocol
from shared.state import Phase
from tests.agents_fixture import SLOW_MODEL_S
from tests.harness import WorkerProcess, wait_until
from tests.invariants import assert_event_invariants, kinds


@pytest.mark.parametrize("agent", ["slow_answer", "slow_answer_stream"])
def test_cancel_ends_a_run_during_its_model_call(
    workers: list[WorkerProcess], client: Client, agent: str
) -> None:
    handle = client.submit(agent, "take your time")

    def thinking_claimed() -> bool:
        fields = client.store.load_raw(handle.run_id)
        return fields.get(protocol.PHASE) == "thinking" and protocol.RUNNING in fields

    wait_until(thinking_claimed, 30, what="a worker to be in the model call")
    cancelled_at = time.time()
    handle.cancel()
    head = handle.wait(SLOW_MODEL_S * 2)
    events = list(handle.events(follow=False))
    assert head.phase is Phase.INTERRUPTED, f"{head.phase} {head.answer}"
    assert head.answer is None
    assert kinds(events) == ["RunStarted", "StepStarted", "Interrupted"]
    assert_event_invariants(events)
    # Given up within a heartbeat or so, not when the model would have answered.
    assert events[-1].ts - cancelled_at < SLOW_MODEL_S / 2
