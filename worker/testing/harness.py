"""Real processes for integration tests, chaos tests and benchmarks: a redis-server and workers.

Nothing here is mocked: :class:`RedisServer` runs the ``redis-server`` binary on a free loopback
port, :class:`WorkerProcess` runs ``wesichain worker`` in its own process group, so a test can
SIGKILL the whole worker or just one prefork child.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis

from worker.testing.brokers import broker_env, drop_broker_for

__all__ = [
    "ROOT",
    "PortTaken",
    "RedisServer",
    "ServerTls",
    "WorkerProcess",
    "free_port",
    "running",
    "start_all",
    "stop_all",
    "wait_until",
]

#: The directory that holds the ``worker`` package (the source tree, in a checkout): the workers'
#: working directory and import path, so agents modules beside the packages import.
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class ServerTls:
    """PEM files of a TLS-only redis-server (``--port 0 --tls-port PORT``)."""

    cert_file: str
    key_file: str
    #: The CA the harness's own client trusts, and the one client certificates must chain to.
    ca_file: str
    #: Require a client certificate (mutual TLS); the harness's client then presents this one.
    auth_clients: bool = False
    client_cert_file: str | None = None
    client_key_file: str | None = None


class PortTaken(RuntimeError):
    """A server exited at start: the port it was given is no longer free."""


class RedisServer:
    def __init__(
        self, *, appendonly: bool = False, tls: ServerTls | None = None, bind: str = "127.0.0.1"
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (Debian: apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="wesichain-redis-")
        self.appendonly = appendonly
        self.tls = tls
        #: The address it listens on (another than loopback: reachable from simulated hosts).
        self.bind = bind
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.bind}:{self.port}/0"

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            self.tls.cert_file,
            "--tls-key-file",
            self.tls.key_file,
            "--tls-ca-cert-file",
            self.tls.ca_file,
            "--tls-auth-clients",
            "yes" if self.tls.auth_clients else "no",
        ]

    def start(self) -> RedisServer:
        return self._start(attempts=3)

    def _start(self, attempts: int) -> RedisServer:
        args = [
            self.binary,
            *self._listen_args(),
            "--bind",
            self.bind,
            "--save",
            "",
            "--dir",
            self.dir,
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            # Off only on a simulated hosts' bridge, which nothing outside this machine reaches.
            "--protected-mode",
            "yes" if self.bind == "127.0.0.1" else "no",
            "--loglevel",
            "warning",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        try:
            wait_until(lambda: self._serving(client), timeout=10, what="redis-server to accept connections")
        except PortTaken:
            self.stop(signal.SIGKILL)
            # A restart keeps its port (the test's clients know it), and a server that exits on
            # every port has another reason to: both fail here.
            if self._started or attempts <= 1:
                raise
            # Another process took the free port between free_port() and the bind (test
            # processes running side by side, or any client's ephemeral port): take another.
            self.port = free_port()
            return self._start(attempts - 1)
        finally:
            client.close()
        self._started = True
        return self

    def _serving(self, client: redis.Redis) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise PortTaken(f"redis-server exited with {self.proc.returncode} on port {self.port}")
        if not _pings(client):
            return False
        # Whoever answers must be this server, not another that holds the port (this one then exits).
        if int(client.info("server")["process_id"]) != self.proc.pid:
            raise PortTaken(f"another redis-server answers on port {self.port}")
        return True

    def client(self, **kwargs: Any) -> redis.Redis:
        if self.tls is not None:
            kwargs = {
                "ssl": True,
                "ssl_ca_certs": self.tls.ca_file,
                "ssl_certfile": self.tls.client_cert_file,
                "ssl_keyfile": self.tls.client_key_file,
                **kwargs,
            }
        return redis.Redis(host=self.bind, port=self.port, decode_responses=True, **kwargs)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
        drop_broker_for(self.url)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class WorkerProcess:
    """``wesichain worker`` in its own session (process group), logging to a file.

    It serves the agents module ``agents``, or with None the one ``$WESICHAIN_AGENTS`` names.
    """

    def __init__(
        self,
        name: str,
        redis_url: str,
        *,
        agents: str | None = None,
        pool: str = "prefork",
        concurrency: int = 1,
        queues: str | None = None,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        include: tuple[str, ...] = (),
        namespaces: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="wesichain-worker-")) / f"{name}.log"
        self.args = [
            sys.executable,
            "-m",
            "producer.cli",
            "worker",
            "--redis",
            redis_url,
            *(["--agents", agents] if agents else []),
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--name",
            f"{name}@test",
            "--loglevel",
            "INFO",
        ]
        if queues:
            self.args += ["--queues", queues]
        for namespace in namespaces:
            self.args += ["--namespace", namespace]
        # Event heartbeats stay on as in production: they let a monitor (Flower) switch task events on.
        self.args += ["--", "--without-mingle", "--without-gossip"]
        if include:
            self.args.append("--include=" + ",".join(include))
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "WESICHAIN_WORKER_NAME": name,
            **broker_env(redis_url),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        #: The main pid of every incarnation of this worker, in start order.
        self.main_pids: list[int] = []

    def start(self, wait: bool = True) -> WorkerProcess:
        self._log = open(self.log_path, "ab")  # closed in stop()
        self._offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.main_pids.append(self.proc.pid)
        if wait:
            self.wait_ready()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def received(self, task_id_part: str) -> bool:
        """Whether this worker received a wesichain task whose id starts with ``task_id_part``
        (a run's id) or with ``eval:`` and it (an eval's pump), by Celery's log of receipts."""
        pattern = r"Task wesichain\.[\w.]+\[(eval:)?" + re.escape(task_id_part)
        return re.search(pattern, self.log()) is not None

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}"
                )
            return "ready." in self.log_path.read_text(errors="replace")[self._offset :]

        wait_until(ready, timeout=timeout, interval=0.05, what=f"worker {self.name} to be ready")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> set[int]:
        return {self.pid, *self.children()}

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and its pool children."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self) -> None:
        """Ask the worker for a warm shutdown (SIGTERM) without waiting for it; see :meth:`stop`."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 15) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None  # type: ignore[assignment]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


#: A worker of this module's kind or of a subclass (a suite's own defaults): what goes in comes out.
W = TypeVar("W", bound=WorkerProcess)


def start_all(workers: Sequence[W], timeout: float = 30) -> list[W]:
    """Start ``workers`` side by side and wait until every one is ready."""
    for w in workers:
        w.start(wait=False)
    for w in workers:
        w.wait_ready(timeout)
    return list(workers)


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """Stop ``workers`` side by side: each warm shutdown takes a while, and they need not queue."""
    workers = list(workers)
    for w in workers:
        w.terminate()
    for w in workers:
        w.stop()


@contextmanager
def running(workers: Sequence[W], timeout: float = 30) -> Iterator[list[W]]:
    """The workers, started side by side and ready; stopped side by side afterwards (also when one
    of them failed to start)."""
    try:
        yield start_all(workers, timeout)
    finally:
        stop_all(workers)
