"""Whole runs through Celery's classic in-process worker fixture: no worker process to start."""

from __future__ import annotations

import os

from celery.contrib.testing.worker import TestWorkController

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import EFFECTS_KEY
from tests.harness import wait_until
from tests.invariants import ONE_HOP, assert_event_invariants, kinds

TIMEOUT = 30


def test_one_hop_runs_on_the_worker_thread(celery_worker: TestWorkController, client: Client) -> None:
    assert isinstance(celery_worker, TestWorkController)  # the classic fixture, not a container
    handle = client.submit("one_hop", "add 1 and 2")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    events = list(handle.events())
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert {e.worker.pid for e in events} == {os.getpid()}
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") == "1"


def test_parallel_calls_fan_in_once(celery_worker: TestWorkController, client: Client) -> None:
    handle = client.submit("parallel", "four slow calls")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "all four done"
    events = list(handle.events())
    assert kinds(events) == [
        "RunStarted",
        "StepStarted",
        "ModelResponded",
        *["ToolDispatched"] * 4,
        *["ToolCompleted"] * 4,
        "StepStarted",
        "ModelResponded",
        "Completed",
    ]
    assert_event_invariants(events)
    outputs = sorted(e.output for e in events if e.kind == "ToolCompleted")
    assert outputs == [f'{{"label":"p{i}","pid":{os.getpid()}}}' for i in range(4)]
    # One observe for the four results: step 2 started exactly once.
    assert [e.step for e in events if e.kind == "StepStarted"] == [1, 2]


def test_an_approved_call_runs_once(celery_worker: TestWorkController, client: Client) -> None:
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") is None
    handle.approve("fine")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer is not None and head.answer.startswith("charged:")
    assert client.store.redis.hget(EFFECTS_KEY, f"{handle.run_id}:1:call_0") == "1"
    assert_event_invariants(list(handle.events()))
