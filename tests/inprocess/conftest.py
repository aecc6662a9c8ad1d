"""Celery's classic in-process worker fixtures (``celery.contrib.pytest``) on the real phase tasks.

pytest-celery, a dev dependency for the Docker suite (``tests/docker``), registers Celery's classic
fixtures (``celery_app``, ``celery_session_worker``, ...) but replaces ``celery_worker`` with a
worker in a Docker container. This directory restores the classic one: a worker thread in the test
process, started for each test by ``celery.contrib.testing.worker.start_worker``. The app is the
real one (``worker.app.create_app``) on the session's redis-server, under a key prefix of its own
so the suite's worker processes never take its tasks. Nothing here can crash a worker: a SIGKILL
would kill pytest too (crashes are in ``tests/chaos``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.pytest import celery_worker  # noqa: F401  the classic in-process fixture

from producer.client import Client
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS, Settings
from tests import agents_fixture
from tests.harness import RedisServer
from worker.app import create_app


@pytest.fixture
def inprocess_settings(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    # The fixture agents' tools record their effects through WESICHAIN_REDIS_URL (one cached client).
    monkeypatch.setenv("WESICHAIN_REDIS_URL", redis_server.url)
    agents_fixture._redis.cache_clear()
    prefix = f"wesichain-inprocess-{uuid.uuid4().hex[:8]}"
    yield Settings(
        redis_url=redis_server.url,
        agents_module="tests.agents_fixture",
        prefix=f"{prefix}:",
        # The broker's keys too: the suite's worker processes consume the default queues.
        broker_prefix=f"{prefix}-broker:",
    )
    agents_fixture._redis.cache_clear()


@pytest.fixture
def celery_app(inprocess_settings: Settings) -> Celery:
    """The classic fixtures' app: the worker package's app with its phase tasks."""
    return create_app(inprocess_settings)


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"  # the pool model phases use in production; tool calls of a step run in parallel


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    # No ping check: it waits on a task result, and the app keeps no result backend.
    return {"concurrency": 4, "perform_ping_check": False, "queues": [QUEUE_MODEL, QUEUE_TOOLS]}


@pytest.fixture
def client(celery_app: Celery, celery_worker: Any, inprocess_settings: Settings) -> Iterator[Client]:  # noqa: F811
    # The test worker sends no worker_ready: it joins the registry here, as a worker does when ready.
    holder = celery_app.wesichain_runtime
    holder.start_registry(celery_worker.consumer)
    c = Client(inprocess_settings, app=celery_app)
    yield c
    c.close()
    holder.stop_registry()
