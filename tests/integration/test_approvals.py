"""Runs that park in AWAITING_APPROVAL hold no worker and resume when a human decides."""

from __future__ import annotations

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import EFFECTS_KEY
from tests.harness import WorkerProcess, wait_until

TIMEOUT = 30


def test_approved_call_runs_once_and_run_completes(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    head = handle.status()
    assert head.approval is not None and head.approval.kind == "tool_calls"
    # Parked means no lease: the sweeper must leave it alone, no tool has run.
    assert client.store.redis.zscore(client.store.keys.leases_of(handle.run_id), handle.run_id) is None
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") is None
    handle.approve("looks right")
    done = handle.wait(TIMEOUT)
    assert done.phase is Phase.COMPLETED
    assert done.answer is not None and done.answer.startswith("charged:")
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") == "1"
    kinds = [e.kind for e in handle.events(follow=False) if e.kind != "TokenDelta"]
    assert kinds.index("AwaitingApproval") < kinds.index("ToolDispatched") < kinds.index("ToolCompleted")
    with pytest.raises(ValueError, match="not awaiting approval"):
        handle.approve()


def test_denied_call_never_runs_and_model_is_told(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    handle.deny("customer is not eligible")
    done = handle.wait(TIMEOUT)
    assert done.phase is Phase.COMPLETED
    assert done.answer is not None and done.answer.startswith("denied:")
    assert "customer is not eligible" in done.answer
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") is None
    events = list(handle.events(follow=False))
    assert not [e for e in events if e.kind == "ToolDispatched"]


def test_cancel_a_parked_run(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    assert handle.cancel() is Phase.AWAITING_APPROVAL
    assert handle.wait(TIMEOUT).phase is Phase.INTERRUPTED
