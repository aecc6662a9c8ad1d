"""The delivery probe (``tests/delivery_probe.py``) counts into the store of the runtime that received
each task, configured as that runtime was: in a process with no ``WESICHAIN_REDIS_URL`` (a test
process running the embedded mode after another test imported the probe) it neither raises from
Celery's signal nor counts anywhere else."""

from __future__ import annotations

import importlib
import logging

import pytest

from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL
from tests.broker import DELIVERIES_KEY
from worker.embedded import embedded

TIMEOUT_S = 60


def test_the_probe_counts_into_the_runtime_s_store_without_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)
    importlib.import_module("tests.delivery_probe")  # connects its handler here, as --include does
    with caplog.at_level(logging.ERROR), embedded("tests.agents_fixture", concurrency=2) as client:
        handle = client.submit("direct", "go")
        assert handle.wait(TIMEOUT_S).answer == "The answer is 42."
        counted = client.store.redis.hgetall(DELIVERIES_KEY)
    deliveries = {_s(k): int(v) for k, v in counted.items() if _s(k).startswith(handle.run_id)}
    # A one-answer run: its start and its think, each received once.
    assert sorted(deliveries.values()) == [1, 1]
    assert sorted(task_id.removeprefix(handle.run_id) for task_id in deliveries) == [":v1:start", ":v2:think"]
    assert [r.getMessage() for r in caplog.records if "Signal handler" in r.getMessage()] == []


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
