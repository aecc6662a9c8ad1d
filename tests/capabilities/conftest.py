"""The agent capability tests: one redis-server and two workers serving ``tests.agents_capabilities``,
shared by the test modules here (those that need workers of their own, like ``test_mcp``, start them).

The modules need no fresh pool: each test's runs, inputs and counters (keyed by run or by an input
no other test sends) are its own, and a test that SIGKILLs a pool child leaves the worker to
replace it. The leases are short, so a phase whose worker is killed is handed on within seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.settings import Settings
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, running

AGENTS = "tests.agents_capabilities"
SHORT_LEASES = {"WESICHAIN_LEASE_S": "2", "WESICHAIN_QUEUED_LEASE_S": "4"}


@pytest.fixture(scope="package")
def server() -> Iterator[RedisServer]:
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="package")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    log_dir = str(tmp_path_factory.mktemp("capability-workers"))
    workers = [
        WorkerProcess(f"cap{i}", server.url, agents=AGENTS, concurrency=2, env=SHORT_LEASES, log_dir=log_dir)
        for i in (1, 2)
    ]
    with running(workers) as started:
        yield started


@pytest.fixture
def client(server: RedisServer, pool: list[WorkerProcess]) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()
