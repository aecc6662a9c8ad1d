"""Fixtures of the chaos suite: each test gets its own redis-server and its own worker processes.

Nothing is shared between tests, so a test that kills workers, restarts Redis or leaves duplicate
messages queued cannot disturb the next one. When a test fails, the tail of every worker's log is
attached to its report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from tests.broker import Settings
from tests.chaos.support import (
    RECOVERIES,
    RECOVERY_PROPERTY,
    SOAK_PROPERTY,
    SOAK_REPORT,
    Cluster,
    start_eval_pool,
)
from tests.harness import RedisServer, WorkerProcess


@pytest.fixture
def server(store_factory: Callable[..., RedisServer]) -> RedisServer:
    """The test's own run-state Redis (a redis-server; the shared cluster with --store cluster)."""
    return store_factory()


@pytest.fixture
def aof_server(store_factory: Callable[..., RedisServer]) -> RedisServer:
    """A redis-server that persists every write (AOF, fsync always), so it can be restarted."""
    return store_factory(appendonly=True)


def _cluster(request: pytest.FixtureRequest, server: RedisServer, tmp_path: Any) -> Iterator[Cluster]:
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    cluster = Cluster(server, log_dir)
    yield cluster
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        report.sections.append(("worker logs", cluster.log_tails()))
    cluster.stop()


@pytest.fixture
def cluster(request: pytest.FixtureRequest, server: RedisServer, tmp_path: Any) -> Iterator[Cluster]:
    yield from _cluster(request, server, tmp_path)


@pytest.fixture
def eval_pool(server: RedisServer, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """The pool of the eval crash tests (:func:`~tests.chaos.support.start_eval_pool`)."""
    workers = start_eval_pool(server, tmp_path)
    yield workers
    for w in workers:
        w.kill()
        w.stop()


@pytest.fixture
def aof_cluster(request: pytest.FixtureRequest, aof_server: RedisServer, tmp_path: Any) -> Iterator[Cluster]:
    yield from _cluster(request, aof_server, tmp_path)


def _client(s: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=s.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    yield from _client(server)


@pytest.fixture
def aof_client(aof_server: RedisServer) -> Iterator[Client]:
    yield from _client(aof_server)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def _measurements(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hands what the test measured (recoveries, soak figures) to the session's summary through the
    test's report, which also reaches it from a worker process of a parallel run."""
    recoveries, soaks = len(RECOVERIES), len(SOAK_REPORT)
    yield
    for case, seconds in RECOVERIES[recoveries:]:
        request.node.user_properties.append((RECOVERY_PROPERTY, [case, seconds]))
    for report in SOAK_REPORT[soaks:]:
        request.node.user_properties.append((SOAK_PROPERTY, report))
