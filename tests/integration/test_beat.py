"""The sweeper also runs as a celery beat schedule (for deployments that prefer beat)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.settings import QUEUE_MODEL
from tests.harness import ROOT, RedisServer, wait_until

pytestmark = pytest.mark.redis_broker  # reads the Redis queue list


def test_beat_schedules_the_sweep_task(tmp_path: Path) -> None:
    # A server of its own: the session's workers would consume the sweep messages before we look.
    server = RedisServer().start()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WESICHAIN_REDIS_URL": server.url}
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "worker.app", "beat", "-s", str(tmp_path / "schedule")],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    queue = QUEUE_MODEL  # the broker keys carry no prefix
    client = server.client()
    try:
        # The schedule is every sweep_interval_s (1 s): two messages prove it repeats.
        wait_until(lambda: client.llen(queue) >= 2, 30, interval=0.1, what="beat to publish two sweeps")
        messages = [json.loads(m) for m in client.lrange(queue, 0, -1)]
        assert {m["headers"]["task"] for m in messages} == {"wesichain.sweep"}
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(timeout=15)
        client.close()
        server.cleanup()
