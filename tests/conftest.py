"""Session fixtures: a real redis-server on a free loopback port and real worker processes.

A missing ``redis-server`` skips the integration tests locally and fails them under CI.
``--broker rabbitmq`` runs them with RabbitMQ as the broker, in a virtual host of the session's own
(see ``tests/broker.py``). ``--store cluster`` keeps the run state on a real Redis Cluster (three
primaries, a replica each, started by the session: ``tests/redis_cluster.py``) with a standalone
redis-server of each test's own as the broker (or RabbitMQ, with both options).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, cast

import pytest

from producer.cli import main
from producer.client import Client
from shared.settings import ENV_AGENTS, ENV_BROKER_URL, ENV_REDIS_URL
from tests.broker import ENV_TEST_BROKER, Settings, drop_all, rabbitmq_available
from tests.chaos.support import RECOVERY_PROPERTY, SOAK_PROPERTY
from tests.harness import RedisServer, WorkerProcess, running
from tests.redis_cluster import ClusterStore, RedisCluster

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
    parser.addoption(
        "--store",
        choices=("redis", "cluster"),
        default="redis",
        help="where the integration and chaos suites keep the run state (cluster: a Redis Cluster of"
        " 3 primaries and 3 replicas started by the session, see tests/redis_cluster.py)",
    )


def on_cluster(config: pytest.Config) -> bool:
    """Whether this session keeps the run state on a Redis Cluster (``--store cluster``)."""
    return bool(config.getoption("--store", "redis") == "cluster")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--broker", "redis") != "rabbitmq":
        return
    if not rabbitmq_available():
        raise pytest.UsageError("--broker rabbitmq: rabbitmqctl cannot reach a RabbitMQ server")
    os.environ[ENV_TEST_BROKER] = "rabbitmq"


#: The lane of each directory of tests/ (docs/testing.md): its marker, applied to every test there,
#: so ``-m unit`` or ``-m "not chaos"`` selects by directory. A module never restates its lane; its
#: own marks add meaning (``redis_broker``, ``standalone_redis``, ``long``, ``soak``).
LANES = {
    "unit": "unit",
    "integration": "integration",
    "chaos": "chaos",
    "console": "browser",
    "capabilities": "capabilities",
    "plugin": "plugin",
    "inprocess": "inprocess",
    "docker": "docker",
}
#: The modules at the top of tests/: the CLI, the embedded mode and the bundled examples as a user
#: runs them; the eval report's module drives the browser as the console's do.
LOOSE_LANE = "cli"
LOOSE_LANES = {"test_eval_report.py": "browser"}
TESTS = os.path.dirname(os.path.abspath(__file__))


def lane_of(path: str) -> str | None:
    """The lane of a test module, from where it lies under tests/ (None outside tests/)."""
    parts = os.path.relpath(os.path.abspath(path), TESTS).split(os.sep)
    if parts[0] == os.pardir:
        return None
    if len(parts) == 1:
        return LOOSE_LANES.get(parts[0], LOOSE_LANE)
    if parts[0] not in LANES:
        raise pytest.UsageError(f"tests/{parts[0]}/ has no lane: add it to LANES in tests/conftest.py")
    return LANES[parts[0]]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (lane := lane_of(str(item.path))) is not None:
            item.add_marker(getattr(pytest.mark, lane))
    skips: list[tuple[str, pytest.MarkDecorator]] = []
    if config.getoption("--broker", "redis") == "rabbitmq":
        skips.append(
            ("redis_broker", pytest.mark.skip(reason="about the Redis broker itself (--broker rabbitmq)"))
        )
    if on_cluster(config):
        reason = "about the Redis broker being the run state's server (--store cluster)"
        skips.append(("redis_broker", pytest.mark.skip(reason=reason)))
        reason = "about a standalone Redis itself (--store cluster)"
        skips.append(("standalone_redis", pytest.mark.skip(reason=reason)))
    for item in items:
        for marker, skip in skips:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    drop_all()


def _need_redis() -> None:
    if shutil.which("redis-server") is None:
        if CI:
            pytest.fail("redis-server is not installed; .ci/run installs it")
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """The session's run-state Redis: a redis-server, or with ``--store cluster`` a cluster of the
    session's own (and a redis-server as the broker)."""
    _need_redis()
    if not on_cluster(request.config):
        server = RedisServer().start()
        yield server
        server.cleanup()
        return
    cluster = RedisCluster().start()
    store = ClusterStore(cluster).start()
    yield store
    store.cleanup()
    cluster.cleanup()


@pytest.fixture(scope="session")
def redis_cluster(request: pytest.FixtureRequest) -> Iterator[RedisCluster | None]:
    """With ``--store cluster``, a second cluster the tests with a server of their own share (each
    flushes it when it ends); None otherwise."""
    if not on_cluster(request.config):
        yield None
        return
    _need_redis()
    cluster = RedisCluster().start()
    yield cluster
    cluster.cleanup()


@contextmanager
def own_store(redis_cluster: RedisCluster | None, appendonly: bool = False) -> Iterator[RedisServer]:
    """A run-state Redis for one module or test: a redis-server of its own, or with ``--store
    cluster`` the session's shared cluster (``redis_cluster``), emptied afterwards. One at a time
    per cluster: its broker is looked up by the cluster's URL."""
    _need_redis()
    server = ClusterStore(redis_cluster) if redis_cluster is not None else RedisServer(appendonly=appendonly)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def store_factory(redis_cluster: RedisCluster | None) -> Iterator[Callable[..., RedisServer]]:
    """Starts a run-state Redis of the test's own: a redis-server (``appendonly`` as asked), or with
    ``--store cluster`` the shared cluster, emptied when the test ends. Each is cleaned up after
    the test."""
    started: list[RedisServer] = []

    def start(appendonly: bool = False) -> RedisServer:
        _need_redis()
        server: RedisServer
        if redis_cluster is not None:
            if any(isinstance(s, ClusterStore) for s in started):
                raise RuntimeError("a test gets one run-state cluster (--store cluster)")
            server = ClusterStore(redis_cluster)
        else:
            server = RedisServer(appendonly=appendonly)
        started.append(server.start())
        return server

    yield start
    for server in reversed(started):
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


#: Runs ``wesichain ARGV`` in the test's process (see :func:`cli_in_process`).
InProcessCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> InProcessCli:
    """``wesichain ARGV`` through :func:`producer.cli.main` in the test's process, with ``env`` set
    (a value of None unsets it): the command's own parsing, handler, output and exit status,
    without the second of CPU a new interpreter spends importing the package. A test that
    proves the installed entry point keeps one ``python -m producer.cli`` subprocess for that."""
    # main() exports --redis/--agents/--broker for worker children: whatever it sets is undone
    # after the test (setenv records the value to restore, also the absence of one).
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_BROKER_URL):
        monkeypatch.setenv(name, os.environ.get(name, ""))
        if not os.environ[name]:
            monkeypatch.delenv(name)

    def run(*argv: str, env: Mapping[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
        for name, value in (env or {}).items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        capsys.readouterr()
        # A command leaves its clients for the process's exit to close (an API command's HTTP
        # connection): here they close when collected, which is no leak of the command's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                status = main(list(argv))
            except SystemExit as exc:  # argparse refusing the arguments
                status = exc.code if isinstance(exc.code, int) else 1
            gc.collect()
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["wesichain", *argv], status, out, err)

    return run


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
            case, seconds = cast(list[Any], value)
            _RECOVERIES.append((str(case), float(seconds)))
        elif name == SOAK_PROPERTY:
            _SOAKS.append(dict(cast(dict[str, Any], value)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _RECOVERIES:
        terminalreporter.section("chaos recovery times (kill -> next committed event)")
        for case, seconds in _RECOVERIES:
            terminalreporter.write_line(f"{seconds:7.2f} s  {case}")
    for soak in _SOAKS:
        terminalreporter.section("backlog" if "backlog_runs" in soak else "crash soak")
        for key, value in soak.items():
            terminalreporter.write_line(f"{key}: {value}")
