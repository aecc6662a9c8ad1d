"""Smoke test of the shipped image: a run submitted from here completes on a worker container.

Needs a Docker engine (skipped otherwise, see conftest.py); the first run builds the image.
"""

from __future__ import annotations

from pytest_celery import CeleryTestSetup

from producer.client import Client
from shared.examples.research import DEMO_QUESTION
from shared.settings import Settings
from shared.state import Phase
from tests.invariants import assert_event_invariants, kinds

DEMO_KINDS = [
    "RunStarted",
    "StepStarted",
    "ModelResponded",
    *["ToolDispatched"] * 3,
    *["ToolCompleted"] * 3,
    "StepStarted",
    "ModelResponded",
    "Completed",
]


def test_a_run_completes_on_the_worker_container(celery_setup: CeleryTestSetup) -> None:
    assert celery_setup.broker is not None and celery_setup.worker is not None
    # The broker container's port as published on this host.
    client = Client(Settings(redis_url=celery_setup.broker.config()["host_url"]))
    try:
        handle = client.submit("research", DEMO_QUESTION)
        head = handle.wait(timeout=60)
        events = list(handle.events(idle_timeout=10))
    finally:
        client.close()
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer is not None and "3.5 days is 302,400 seconds." in head.answer
    assert kinds(events) == DEMO_KINDS
    assert_event_invariants(events)
    # Every phase ran in the container, none in this process.
    assert {e.worker.host for e in events} == {celery_setup.worker.container.attrs["Config"]["Hostname"]}
