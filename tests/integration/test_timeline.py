"""A run's timeline, from a real run on real workers: phases on the workers that ran them, tool
calls fanned out across processes, queue waits, and the same picture from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from producer.client import Client
from shared.state import Phase
from shared.timeline import Timeline
from tests.broker import broker_env
from tests.conftest import InProcessCli
from tests.harness import WorkerProcess

TIMEOUT = 30


def test_timeline_of_a_fan_out_run(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("parallel", "go")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    timeline = handle.timeline()
    events = list(handle.events(follow=False))

    assert timeline.run_id == handle.run_id and timeline.status == "completed"
    phases = [(b.name, b.step, b.ref) for b in timeline.bars if b.kind == "phase"]
    # The fan-in (v4) is committed by the last tool result, not a phase delivery: it has no bar.
    assert phases == [("start", 0, "v2"), ("think", 1, "v3"), ("observe", 1, "v5"), ("think", 2, "v6")]
    checkpoints = {c.version: c for c in client.store.checkpoints(handle.run_id)}
    worker_pids = set().union(*(w.pids() for w in workers))
    for bar in (b for b in timeline.bars if b.kind == "phase"):
        committed = checkpoints[int(bar.ref[1:])]
        assert committed.ran is not None and bar.end == committed.updated_at
        assert bar.start == committed.ran.claimed_at <= bar.end and bar.attempt == 1
        assert int(bar.lane.rsplit(":", 1)[1]) in worker_pids

    tools = [b for b in timeline.bars if b.kind == "tool"]
    completed = {e.call_id: e for e in events if e.kind == "ToolCompleted"}
    assert sorted(b.ref for b in tools) == sorted(completed) == ["call_0", "call_1", "call_2", "call_3"]
    for bar in tools:
        done = completed[bar.ref]
        assert bar.ok and bar.end == done.ts and bar.lane == f"{done.worker.host}:{done.worker.pid}"
    assert len({b.lane for b in tools}) >= 2, "the four calls ran in one process"

    # Every phase and every call waited in a queue before it was claimed (never a negative wait).
    assert sorted(w.name for w in timeline.waits) == sorted(
        ["start", "think", "observe", "think", *(["slow"] * 4)]
    )
    assert all(w.end >= w.start for w in timeline.waits)
    assert set(timeline.lanes) == {b.lane for b in timeline.bars}
    assert [m.kind for m in timeline.markers] == ["end"]
    assert timeline.start == head.created_at and timeline.end >= max(b.end for b in timeline.bars)


def test_cli_timeline(workers: list[WorkerProcess], client: Client, cli_in_process: InProcessCli) -> None:
    handle = client.submit("one_hop", "go")
    handle.wait(TIMEOUT)
    url = client.settings.redis_url
    env = {"WESICHAIN_REDIS_URL": url, "COLUMNS": "120", **broker_env(url)}
    cli = [sys.executable, "-m", "producer.cli", "timeline", handle.run_id]
    # The installed entry point once, in a process of its own; the picture and the refusal in this one.
    out = subprocess.run(
        [*cli, "--json"], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    assert Timeline.model_validate_json(out.stdout) == handle.timeline()

    drawn = cli_in_process("timeline", handle.run_id, env=env)
    assert drawn.returncode == 0, drawn.stderr
    picture = drawn.stdout
    timeline = json.loads(out.stdout)
    assert f"run {handle.run_id}" in picture and "completed" in picture
    for lane in timeline["lanes"]:
        assert lane in picture
    assert "queued think" in picture and "tool add" in picture

    missing = cli_in_process("timeline", "no-such-run", env=env)
    assert missing.returncode != 0 and "no run 'no-such-run'" in missing.stderr
