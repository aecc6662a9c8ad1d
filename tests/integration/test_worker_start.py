"""A worker that cannot work refuses to start, before it consumes anything; one that can says how
durably its Redis keeps what it acknowledged."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.cli import main
from producer.client import Client
from shared.settings import QUEUE_MODEL
from shared.state import Phase
from tests.broker import Settings
from tests.harness import ROOT, RedisServer, WorkerProcess, free_port, wait_until

TIMEOUT = 60


def _worker_exit(proc: WorkerProcess) -> int:
    proc.start(wait=False)
    assert proc.proc is not None
    try:
        return proc.proc.wait(timeout=TIMEOUT)
    finally:
        proc.stop()


@pytest.mark.redis_broker  # the message it must not have taken is read from the Redis queue list
def test_a_worker_without_its_agents_module_exits_before_consuming(tmp_path: Path) -> None:
    redis_server = RedisServer().start()  # its own: the suite's workers would take the message
    client = Client(Settings(redis_url=redis_server.url, agents_module="tests.agents_fixture"))
    raw = redis_server.client()
    try:
        raw.delete(QUEUE_MODEL)
        handle = client.submit("direct", "waits for a worker with its agents", check_agent=False)
        assert raw.llen(QUEUE_MODEL) == 1
        bad = WorkerProcess(
            "no-agents", redis_server.url, agents="no_such_agents_module", log_dir=str(tmp_path)
        )
        assert _worker_exit(bad) == 2
        log = bad.log()
        assert (
            "wesichain: refusing to start the worker: cannot import agents module 'no_such_agents_module'"
            in log
        )
        assert "Traceback" not in log and "ready." not in log
        # Nothing was consumed.
        assert raw.llen(QUEUE_MODEL) == 1
        assert handle.status().phase is Phase.IDLE
    finally:
        raw.close()
        client.close()
        redis_server.cleanup()


def test_celery_s_own_worker_command_refuses_too(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # Nothing is reached: it refuses before it connects to anything.
        "WESICHAIN_REDIS_URL": "redis://127.0.0.1:1/0",
        "WESICHAIN_AGENTS": "no_such_agents_module",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "--pool=solo", "--without-mingle"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot import agents module 'no_such_agents_module'" in proc.stderr
    assert "ready." not in proc.stderr


@pytest.fixture
def not_redis() -> Iterator[int]:
    """A TCP service on a loopback port that answers like a web server, not like Redis."""
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    server.close()


def test_something_that_is_not_redis_gets_a_clean_error(
    not_redis: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{not_redis}/0"
    assert main(["status", "some-run", "--redis", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wesichain: Redis at {url} failed: ") and err.count("\n") == 1
    assert "Traceback" not in err

    worker = WorkerProcess("not-redis", url, log_dir=str(tmp_path))
    assert _worker_exit(worker) == 2
    log = worker.log()
    assert f"wesichain: refusing to start the worker: what answers at {url} does not speak Redis" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(("appendonly", "expected"), [(False, "none"), (True, "aof-always")])
def test_the_registry_says_how_durable_redis_is(tmp_path: Path, appendonly: bool, expected: str) -> None:
    server = RedisServer(appendonly=appendonly).start()
    worker = WorkerProcess("durable", server.url, log_dir=str(tmp_path))
    client = Client(Settings(redis_url=server.url))
    try:
        worker.start()
        (live,) = wait_until(client.workers.live, TIMEOUT, what="the worker's record")
        assert live.record.redis_persistence == expected
        warned = "Redis keeps the run state with persistence 'none'" in worker.log()
        assert warned is (expected == "none")
    finally:
        client.close()
        worker.stop()
        server.cleanup()


def test_a_celery_option_the_worker_does_not_take_is_a_one_line_error(redis_server: RedisServer) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "producer.cli",
            "worker",
            "--redis",
            redis_server.url,
            "--",
            "--no-such-option",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr == "wesichain worker: No such option '--no-such-option'.\n"


def test_the_worker_runs_celery_s_worker_command_without_its_command_line_plugins() -> None:
    # Celery's `celery` group imports every installed `celery.commands` plugin (Flower and its web
    # server, the shell's REPL) into the worker, and every pool process forked from it.
    probe = (
        "import sys\n"
        "from worker.app import app\n"
        "from worker.commands import run_celery_worker\n"
        "code = run_celery_worker(app, ['--help'])\n"
        "plugins = ('flower', 'tornado', 'prompt_toolkit', 'click_repl')\n"
        "print(code, sorted(m for m in plugins if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "--concurrency" in done.stdout  # Celery's own worker options
    assert done.stdout.splitlines()[-1] == "0 []"
