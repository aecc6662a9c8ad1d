"""The archiver killed mid-way, and its database down: no run lost, none archived twice.

A real archiver process (``tests/chaos/archive_victim.py``) is SIGKILLed while its batch's rows
are written but not committed, right after the commit before any Redis delete, and with half of
the batch deleted from Redis. Every run then still reads the same (from Redis or the archive),
and the next pass finishes the work. A PostgreSQL database refusing connections stops a pass
with every run still in Redis; the pass after it has come back archives them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import httpx
import pytest
import redis

from producer.client import Client
from shared import fsm
from shared.archive import Archive
from shared.archiver import Archiver
from shared.errors import ArchiveUnavailable, RunErrorInfo
from shared.llm.base import Usage
from shared.messages import SystemMessage, UserMessage
from shared.state import RunHead
from shared.store import RunStore
from shared.tasks import start_task
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.archive_support import BACKENDS, FullRead, archive_url, full_read, set_connections
from tests.broker import Settings, broker_env
from tests.harness import ROOT, RedisServer, wait_until
from worker.testing.runs import commit, started

RUNS = 25
BATCH = 10


@pytest.fixture
def rds(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def _settings(server: RedisServer, url: str) -> Settings:
    # One shard: the batches are the archiver's batches, in a known order.
    return Settings(
        redis_url=server.url,
        prefix=f"t-{uuid.uuid4().hex[:8]}:",
        shards=1,
        retention_s=3600,
        archive_url=url,
        archive_batch=BATCH,
    )


def _ended_runs(store: RunStore) -> list[str]:
    """RUNS runs ended through real commits: completed, failed and interrupted in turn."""
    run_ids = []
    for i in range(RUNS):
        thinking = started(store)
        if i % 3 == 0:
            t = thinking.fail(RunErrorInfo(kind="ToolDispatch", message=f"boom {i}"))
            commit(store, thinking, t)
        elif i % 3 == 1:
            commit(store, thinking, thinking.interrupt("cancelled"))
        else:
            commit(store, thinking, thinking.complete(f"answer {i}", Usage(input_tokens=i)))
        run_ids.append(thinking.head.run_id)
    return run_ids


def _in_redis(store: RunStore, run_ids: list[str]) -> set[str]:
    return {r for r in run_ids if store.redis.exists(store.keys.run(r))}


def _rows(archive: Archive) -> int:
    with archive.db.transaction() as cur:  # type: ignore[attr-defined]
        cur.execute("SELECT COUNT(*) FROM wesichain_runs")
        return int(cur.fetchone()[0])


def _assert_reads(client: Client, before: dict[str, FullRead]) -> None:
    for run_id, read in before.items():
        now = full_read(client, run_id)
        for field in fields(FullRead):
            assert getattr(now, field.name) == getattr(read, field.name), (run_id, field.name)
    listed = [h.run_id for h in client.list_runs(limit=500).runs]
    assert sorted(listed) == sorted(before), "a run listed twice or missing"


def _kill_at(point: str, batch: int, settings: Settings, tmp_path: Path) -> None:
    marker = tmp_path / f"{point}.pid"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WESICHAIN_REDIS_URL": settings.redis_url,
        "WESICHAIN_PREFIX": settings.prefix,
        "WESICHAIN_SHARDS": str(settings.shards),
        "WESICHAIN_ARCHIVE_URL": settings.archive_url,
        "WESICHAIN_ARCHIVE_BATCH": str(settings.archive_batch),
        **broker_env(settings.redis_url),  # the run state's topology (a cluster?) and broker
    }
    victim = subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.archive_victim", point, str(batch), str(marker)],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(
            lambda: marker.exists() or victim.poll() is not None, 60, what=f"the archiver to reach {point}"
        )
        assert victim.poll() is None, (victim.stderr.read() if victim.stderr else b"").decode()[-2000:]
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=30) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
        if victim.stderr:
            victim.stderr.close()


# (point, runs in the archive after the kill, runs still in Redis after it). The kill hits the second
# batch: the first (10 runs) was archived and deleted whole.
KILLS = {
    "in_transaction": (BATCH, RUNS - BATCH),  # the second batch's rows were never committed
    "after_commit": (2 * BATCH, RUNS - BATCH),  # committed, nothing of it deleted
    "mid_delete": (2 * BATCH, RUNS - BATCH - BATCH // 2),  # committed, half of it deleted
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("point", sorted(KILLS))
def test_an_archiver_killed_mid_pass_loses_and_doubles_nothing(
    point: str, backend: str, server: RedisServer, rds: redis.Redis, tmp_path: Path
) -> None:
    with archive_url(backend, tmp_path) as url:
        settings = _settings(server, url)
        store = RunStore(rds, settings)
        client = Client(settings, store=store)
        run_ids = _ended_runs(store)
        before = {run_id: full_read(client, run_id) for run_id in run_ids}
        archive = store.archive
        assert archive is not None

        _kill_at(point, 2, settings, tmp_path)
        # The dead archiver's lock keeps the shard until it expires (checked at once: the lock
        # lives LOCK_S seconds, and the reads below may take longer on a loaded machine).
        assert Archiver(store).run_once(after_s=0).shards_busy == 1

        in_archive, in_redis = KILLS[point]
        assert (_rows(archive), len(_in_redis(store, run_ids))) == (in_archive, in_redis)
        _assert_reads(client, before)  # in between, every run reads the same, and is listed once

        # Once the lock expired, the next pass takes over.
        lock = store.keys.archiver_lock(0)
        wait_until(lambda: not rds.exists(lock), 30, what="the dead archiver's lock to expire")
        report = Archiver(store).run_once(after_s=0)

        both = in_archive + in_redis - RUNS  # in the archive and still in Redis: only deleted now
        assert (report.archived, report.already_archived, report.mismatched) == (RUNS - in_archive, both, 0)
        assert _rows(archive) == RUNS and _in_redis(store, run_ids) == set()
        summaries = archive.summaries(run_ids)
        for run_id, read in before.items():
            summary = summaries[run_id]
            assert (summary.version, summary.events, summary.checkpoints, summary.messages) == (
                read.status.version,
                len(read.events),
                len(read.checkpoints),
                len(read.messages),
            )
        _assert_reads(client, before)
        assert rds.zcard(store.keys.ended(0)) == 0
        archive.close()


def test_a_database_outage_keeps_runs_in_redis_until_it_is_back(
    server: RedisServer, rds: redis.Redis, tmp_path: Path
) -> None:
    with archive_url("postgresql", tmp_path) as url:
        settings = _settings(server, url)
        store = RunStore(rds, settings)
        client = Client(settings, store=store)
        archive = store.archive  # opened (and its schema made) while the database is up
        assert archive is not None
        first = _ended_runs(store)
        assert Archiver(store).run_once(after_s=0).archived == RUNS
        run_ids = _ended_runs(store)
        before = {run_id: full_read(client, run_id) for run_id in run_ids}

        set_connections(url, allowed=False)
        try:
            report = Archiver(store).run_once(after_s=0)
            assert report.archived == 0 and "PostgreSQL archive" in report.error
            assert _in_redis(store, run_ids) == set(run_ids)
            for run_id, read in before.items():  # still in Redis: read as before
                assert client.handle(run_id).status() == read.status
            with pytest.raises(ArchiveUnavailable):  # an archived run cannot be read meanwhile
                client.handle(first[0]).status()
        finally:
            set_connections(url, allowed=True)

        moved = 0

        def resumed() -> bool:
            nonlocal moved
            moved += Archiver(store).run_once(after_s=0).archived
            return moved == RUNS

        wait_until(resumed, 60, interval=0.5, what="archiving to resume")
        assert _in_redis(store, run_ids) == set()
        _assert_reads(client, {**before, **{r: full_read(client, r) for r in first}})
        archive.close()


def _tenant_run(store: RunStore, tenant: str) -> str:
    """A run of ``tenant`` taken to COMPLETED through real commits."""
    head = RunHead.new_idle(uuid.uuid4().hex, "agent", "q", tenant=tenant)
    assert store.create(head, [start_task(head.run_id)])
    idle = fsm.Idle(head)
    start = idle.start(
        [SystemMessage(content="sys"), UserMessage(content="q")], agent_version="1", model="m", max_steps=5
    )
    commit(store, idle, start)
    commit(store, start.to, start.to.complete("done", Usage()))
    return head.run_id


def test_the_api_answers_503_for_archived_runs_while_the_database_is_down(
    server: RedisServer, rds: redis.Redis, tmp_path: Path
) -> None:
    with archive_url("postgresql", tmp_path) as url:
        settings = _settings(server, url)
        store = RunStore(rds, settings)
        tenant = f"t-{uuid.uuid4().hex[:6]}"
        archived = _tenant_run(store, tenant)
        assert Archiver(store).run_once(after_s=0).archived == 1
        live = _tenant_run(store, tenant)
        key, _ = Tenants(rds, store.keys).create_key(tenant)
        env = {
            "WESICHAIN_PREFIX": settings.prefix,
            "WESICHAIN_SHARDS": str(settings.shards),
            "WESICHAIN_ARCHIVE_URL": url,
        }
        api = ApiProcess(server.url, env=env).start()
        try:
            with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
                assert http.get(f"/v1/runs/{archived}").json()["answer"] == "done"
                set_connections(url, allowed=False)
                try:
                    down = http.get(f"/v1/runs/{archived}")
                    assert down.status_code == 503 and down.headers["Retry-After"] == "5"
                    assert down.json()["error"]["kind"] == "unavailable"
                    assert "127.0.0.1" not in down.text  # the database's address stays in the log
                    assert http.get(f"/v1/runs/{live}").json()["status"] == "completed"  # from Redis
                    assert http.get("/v1/runs").status_code == 503  # a listing would miss archived runs
                finally:
                    set_connections(url, allowed=True)
                wait_until(
                    lambda: http.get(f"/v1/runs/{archived}").status_code == 200, 60, what="reads to come back"
                )
        finally:
            api.stop()
            store.close_archive()
