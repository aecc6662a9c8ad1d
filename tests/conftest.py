"""Session fixtures: a real redis-server on a free loopback port and real worker processes.

A missing ``redis-server`` skips the integration tests locally and fails them under CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.settings import Settings
from tests.harness import RedisServer, WorkerProcess

CI = os.environ.get("CI") == "true"

# What the embedded mode keeps (``wesichain demo``'s archive) goes to a directory of the session's,
# never the home directory of whoever runs the tests.
os.environ.setdefault("WESICHAIN_HOME", tempfile.mkdtemp(prefix="wesichain-home-"))


def _need_redis() -> None:
    if shutil.which("redis-server") is None:
        if CI:
            pytest.fail("redis-server is not installed; .ci/run installs it")
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    _need_redis()
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def workers(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    """Two prefork workers (two children each) shared by the integration tests."""
    log_dir = str(tmp_path_factory.mktemp("workers"))
    pool = [WorkerProcess(f"w{i}", redis_server.url, concurrency=2, log_dir=log_dir) for i in (1, 2)]
    for w in pool:
        w.start(wait=False)
    for w in pool:
        w.wait_ready()
    yield pool
    for w in pool:
        w.stop()


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=redis_server.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()
