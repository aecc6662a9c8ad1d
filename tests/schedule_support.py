"""``wesichain scheduler`` processes (or sweepers firing the schedules) for the schedule tests, and
reading what a schedule started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from producer.client import Client, idempotent_run_id
from shared.schedules import tick_key
from tests.harness import ROOT
from worker.testing.brokers import broker_env

__all__ = ["SchedulerProcess", "tick_run_id"]


def tick_run_id(tenant: str | None, schedule_id: str, tick: int) -> str:
    """The run a tick of a schedule starts (its deterministic id)."""
    return idempotent_run_id(tenant, tick_key(schedule_id, tick))


class SchedulerProcess:
    """``wesichain scheduler`` in its own session, logging to a file."""

    def __init__(
        self,
        name: str,
        redis_url: str,
        *,
        interval_s: float = 0.1,
        log_dir: str | None = None,
        env: dict[str, str] | None = None,
        command: tuple[str, ...] | None = None,
    ) -> None:
        """``command`` replaces ``scheduler --interval S`` (``("sweeper", "--schedules")``: a
        sweeper that fires the schedules); ``env`` adds to the process's environment."""
        self.name = name
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="wesichain-scheduler-")) / f"{name}.log"
        verb = list(command) if command is not None else ["scheduler", "--interval", str(interval_s)]
        self.args = [sys.executable, "-m", "producer.cli", verb[0], "--redis", redis_url, *verb[1:]]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **broker_env(redis_url), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SchedulerProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL it, wherever it is."""
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def started_runs(client: Client, tenant: str | None, schedule_id: str) -> dict[int, str]:
    """Tick -> run id of every tick the schedule's history says started a run."""
    return {t.tick: t.run_id for t in client.schedules.store.history(tenant, schedule_id) if t.run_id}
