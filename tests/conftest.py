"""Session fixtures: a real redis-server on a free loopback port and real worker processes.

A missing ``redis-server`` skips the integration tests locally and fails them under CI.
``--broker rabbitmq`` runs them with RabbitMQ as the broker, in a virtual host of the session's own
(see ``tests/broker.py``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from producer.client import Client
from tests.broker import ENV_TEST_BROKER, Settings, drop_all, rabbitmq_available
from tests.chaos.support import RECOVERY_PROPERTY, SOAK_PROPERTY
from tests.harness import RedisServer, WorkerProcess, running

CI = os.environ.get("CI") == "true"

# What the embedded mode keeps (``wesichain demo``'s archive) goes to a directory of the session's,
# never the home directory of whoever runs the tests.
os.environ.setdefault("WESICHAIN_HOME", tempfile.mkdtemp(prefix="wesichain-home-"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broker",
        choices=("redis", "rabbitmq"),
        default="redis",
        help="the broker of the integration and chaos suites (rabbitmq: 127.0.0.1:5672, see tests/broker.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--broker", "redis") != "rabbitmq":
        return
    if not rabbitmq_available():
        raise pytest.UsageError("--broker rabbitmq: rabbitmqctl cannot reach a RabbitMQ server")
    os.environ[ENV_TEST_BROKER] = "rabbitmq"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--broker", "redis") != "rabbitmq":
        return
    skip = pytest.mark.skip(reason="about the Redis broker itself (--broker rabbitmq)")
    for item in items:
        if item.get_closest_marker("redis_broker") is not None:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    drop_all()


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
    with running(pool) as started:
        yield started


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=redis_server.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()


# -- the chaos suite's measurements ---------------------------------------------------------------
# A chaos test hands what it measured to its report (tests/chaos/conftest.py); they are gathered
# here, where the reports of every test arrive, also those of worker processes of a parallel run.

_RECOVERIES: list[tuple[str, float]] = []
_SOAKS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == RECOVERY_PROPERTY:
            case, seconds = value
            _RECOVERIES.append((str(case), float(seconds)))
        elif name == SOAK_PROPERTY:
            _SOAKS.append(dict(value))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _RECOVERIES:
        terminalreporter.section("chaos recovery times (kill -> next committed event)")
        for case, seconds in _RECOVERIES:
            terminalreporter.write_line(f"{seconds:7.2f} s  {case}")
    for soak in _SOAKS:
        terminalreporter.section("backlog" if "backlog_runs" in soak else "crash soak")
        for key, value in soak.items():
            terminalreporter.write_line(f"{key}: {value}")
