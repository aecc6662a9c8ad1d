"""Archiving gives Redis its memory back: after many runs are archived, Redis uses about what it used
before they existed. The suite archives a few hundred runs; the full 10,000 runs with
``WESICHAIN_LONG=1 pytest -m long tests/integration/test_archive_memory.py``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared.archiver import Archiver
from shared.store import RunStore
from tests.archive_support import ended_run
from tests.broker import Settings
from tests.conftest import _need_redis
from tests.harness import RedisServer, wait_until


@pytest.fixture
def rds() -> Iterator[redis.Redis]:
    """A redis-server of its own: its memory is this test's alone."""
    _need_redis()
    server = RedisServer().start()
    client = server.client()
    yield client
    client.close()
    server.cleanup()


def _used(rds: redis.Redis) -> int:
    return int(rds.info("memory")["used_memory"])


@pytest.mark.parametrize(
    "runs",
    [
        300,
        pytest.param(
            10_000,
            marks=[
                pytest.mark.long,
                pytest.mark.skipif(
                    not os.environ.get("WESICHAIN_LONG"), reason="10,000 runs: WESICHAIN_LONG=1"
                ),
            ],
        ),
    ],
)
def test_redis_memory_is_back_near_its_baseline_after_archiving(
    runs: int, rds: redis.Redis, tmp_path: Path
) -> None:
    settings = Settings(
        prefix=f"t-{uuid.uuid4().hex[:8]}:",
        retention_s=3600,
        archive_url=f"sqlite:///{tmp_path / 'archive.db'}",
    )
    store = RunStore(rds, settings)
    archiver = Archiver(store)
    # Warm up: the scripts loaded, every shard's index registry and in-flight counter made once.
    warm, shards = 0, set[int]()
    while len(shards) < settings.shards:
        shards.add(store.keys.shard(ended_run(store)))
        warm += 1
    assert archiver.run_once(after_s=0).archived == warm
    baseline, keys = _used(rds), rds.dbsize()

    run_ids = [ended_run(store) for _ in range(runs)]
    full = _used(rds)
    per_run = (full - baseline) / runs
    assert per_run > 5_000, per_run  # one tool step: head, conversation, checkpoints, events, results

    report = archiver.run_once(after_s=0)

    assert (report.archived, report.mismatched, report.error) == (runs, 0, "")
    assert rds.dbsize() == keys

    # Redis shrinks its key tables (grown for the runs' keys) in its periodic housekeeping.
    def near_baseline() -> bool:
        return _used(rds) - baseline < 0.02 * (full - baseline)

    try:
        wait_until(near_baseline, 30, interval=0.2, what="Redis's memory to come back near its baseline")
    except TimeoutError:
        left = _used(rds) - baseline
        raise AssertionError(f"{left} bytes left of {full - baseline} ({per_run:.0f} per run)") from None
    assert store.load(run_ids[-1]) is not None  # read from the archive
    store.close_archive()
