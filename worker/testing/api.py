"""A real ``wesichain api`` (uvicorn) process, for the API's tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import httpx
import psutil

from shared.settings import ENV_REDIS_URL
from worker.testing.brokers import broker_env
from worker.testing.harness import ROOT, free_port, wait_until

__all__ = ["ApiProcess", "bearer"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class ApiProcess:
    """``wesichain api`` on a free loopback port, in its own process group, logging to a file."""

    def __init__(
        self, redis_url: str, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="wesichain-api-")) / "api.log"
        self.redis_url = redis_url
        self.extra_args = args
        # The Redis named as the app reads it too (a server started otherwise than by ``wesichain
        # api --redis`` reads only the environment), not one an earlier command of this process
        # left there (``wesichain --redis`` sets it for the commands it runs in-process).
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            ENV_REDIS_URL: redis_url,
            **broker_env(redis_url),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started = False

    def _args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "producer.cli",
            "api",
            "--redis",
            self.redis_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *self.extra_args,
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> ApiProcess:
        if self._log is not None:
            self._log.close()  # of the previous incarnation
        self._log = open(self.log_path, "ab")  # closed in stop()
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            self._args(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            wait_until(self._up, timeout=60, interval=0.1, what="the API to answer /healthz")
        except RuntimeError:
            taken = "address already in use" in self.log()[offset:].lower()
            # Another process took the free port before the bind (test processes running side by
            # side); a restart keeps its port, as the test's clients know it.
            if not taken or self._started or attempts <= 1:
                raise
            self.port = free_port()
            return self.start(attempts - 1)
        self._started = True
        return self

    def _up(self) -> bool:
        return self._answers((200,))

    def _answers(self, statuses: tuple[int, ...]) -> bool:
        """Whether this process listens on its port and ``/healthz`` answers one of ``statuses``."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the API exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        # Whoever answers must be this process: another (a server of a test running beside this
        # one, given the same free port) answers /healthz while this one fails to bind and exits.
        if not self._listening():
            return False
        try:
            return httpx.get(self.url + "/healthz", timeout=2).status_code in statuses
        except httpx.HTTPError:
            return False

    def _listening(self) -> bool:
        assert self.proc is not None
        try:
            process = psutil.Process(self.proc.pid)
            connections = process.net_connections("tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr[1:2] == (self.port,) for c in connections)

    def kill(self) -> None:
        """SIGKILL the server (its port is free again for :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
