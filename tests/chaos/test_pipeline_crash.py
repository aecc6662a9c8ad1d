"""SIGKILL every worker in the middle of a pipeline run's map, and of its reduce: it still
completes, with the same output, and every item's child run exists once (one id, started once).

Killing the whole pool loses whatever pipeline task was running (a child's completion callback,
a move to the next step) with its unacknowledged message (the broker gives it back only after its
visibility timeout): the sweeper's pipeline repairs must find and finish that work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.client import Client
from shared.pipeline.status import PipelineStatus
from shared.pipeline.store import PipelineStore, child_run_id
from shared.state import Phase
from tests.agents_pipelines import CALLS_KEY
from tests.broker import Settings
from tests.chaos.support import CHAOS_ENV
from tests.harness import RedisServer, WorkerProcess, wait_until

AGENTS = "tests.agents_pipelines"
ITEMS = 30
CAP = 6


class Pool:
    """Two prefork workers serving the pipeline agents, killed and restarted together."""

    def __init__(self, server: RedisServer, log_dir: Path, env: dict[str, str]) -> None:
        self.workers = [
            WorkerProcess(
                f"pw{i}",
                server.url,
                agents=AGENTS,
                concurrency=3,
                log_dir=str(log_dir),
                env={**CHAOS_ENV, "WESICHAIN_HOOKS": "", "PIPE_CAP": str(CAP), **env},
            )
            for i in (1, 2)
        ]

    def start(self) -> None:
        for w in self.workers:
            w.start(wait=False)
        for w in self.workers:
            w.wait_ready(timeout=60)

    def kill(self) -> None:
        for w in self.workers:
            w.kill()

    def restart(self) -> None:
        for w in self.workers:
            w.stop()
        self.start()

    def stop(self) -> None:
        for w in self.workers:
            w.kill()
            w.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _pool(server: RedisServer, tmp_path: Path, env: dict[str, str]) -> Pool:
    pool = Pool(server, tmp_path, env)
    pool.start()
    return pool


def _calls(r: redis.Redis, agent: str) -> dict[str, int]:
    prefix = f"{agent}|"
    raw = {str(k): int(v) for k, v in r.hgetall(CALLS_KEY).items()}
    return {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}


def _assert_each_child_once(client: Client, status: PipelineStatus) -> None:
    """One child run per item (attempt 0, the only id there is), started once, completed."""
    pipeline_id = status.pipeline_id
    for step in status.steps:
        for child in step.children:
            assert child.run_id == child_run_id(pipeline_id, step.seq, child.item, 0)
            assert child.status == "completed"
            assert client.store.load(child_run_id(pipeline_id, step.seq, child.item, 1)) is None
            head = client.handle(child.run_id).status()
            assert head.phase is Phase.COMPLETED
            started = [e for e in client.handle(child.run_id).events(follow=False) if e.kind == "RunStarted"]
            assert len(started) == 1, f"{child.run_id} started {len(started)} times"
    events = list(client.pipeline(pipeline_id).events(follow=False))
    for kind in ("child_started", "child_ended"):
        seen = [(e["seq"], e["item"]) for e in events if e["kind"] == kind]
        assert len(seen) == len(set(seen)) == sum(s.total for s in status.steps), kind


def test_every_worker_killed_mid_map(server: RedisServer, client: Client, tmp_path: Path) -> None:
    pool = _pool(server, tmp_path, {"PIPE_SLOW_S": "0.4"})
    try:
        items = [f"slow k{i}" for i in range(ITEMS)]
        handle = client.submit_pipeline("fan", ",".join(items), pipeline_id="crash-map")
        store = PipelineStore(client.store.redis, client.store.keys)

        def mid_map() -> bool:
            meta = store.meta("crash-map")
            return meta is not None and meta.kind == "map" and meta.done >= 8

        wait_until(mid_map, 60)
        pool.kill()
        meta = store.meta("crash-map")
        assert meta is not None and meta.kind == "map" and meta.done < ITEMS, "the kill missed the map"
        pool.restart()
        status = handle.wait(timeout=120)
        assert status.status == "completed", status.error
        assert status.output == " | ".join(f"{i}:done slow k{i}" for i in range(ITEMS))
        _assert_each_child_once(client, status)
        calls = _calls(client.store.redis, "worker")
        assert set(calls) == set(items)
        # A think the kill interrupted is asked again; only the children live at the kill can be.
        assert sum(n - 1 for n in calls.values()) <= CAP
    finally:
        pool.stop()


def test_every_worker_killed_mid_reduce(server: RedisServer, client: Client, tmp_path: Path) -> None:
    pool = _pool(server, tmp_path, {"PIPE_SLOW_S": "0", "PIPE_SLOW_REDUCE_S": "3"})
    try:
        items = [f"r{i}" for i in range(12)]
        handle = client.submit_pipeline("fan", ",".join(items), pipeline_id="crash-reduce")
        reduce_run = child_run_id("crash-reduce", 2, 0, 0)

        def reducing() -> bool:
            head = client.store.load(reduce_run)
            return head is not None and head.phase is Phase.THINKING

        wait_until(reducing, 60)
        pool.kill()
        pool.restart()
        status = handle.wait(timeout=120)
        assert status.status == "completed", status.error
        expected = " | ".join(f"{i}:done r{i}" for i in range(12))
        assert status.output == expected
        _assert_each_child_once(client, status)
        assert _calls(client.store.redis, "joiner")[expected] in (1, 2)  # its think asked again at most once
        assert all(n == 1 for n in _calls(client.store.redis, "worker").values())
    finally:
        pool.stop()
