"""The archive's costs and speed (``python -m benchmarks.archive``).

On a real redis-server of its own and a PostgreSQL database created for the run (dropped after),
with runs taken to their end through the real scripts (start, one step of two parallel tool calls,
an answer):

* Redis memory per live run, per ended run not archived yet, and what is left after archiving;
* archive throughput: runs per second one archiver moves into PostgreSQL (read from Redis, written
  with ``COPY`` and read back in one transaction per batch, compared, deleted from Redis), the
  archiver's runs per CPU second and redis-server's CPU per archived run;
* database bytes per archived run (tables, indexes and TOAST);
* the latency of an archived run's status read (``RunHandle.status()``: Redis, then PostgreSQL).

Writes ``benchmarks/results/archive.json`` and prints a summary. ``--runs`` sets the number of
runs (default 5,000); ``--sqlite`` measures a SQLite file instead of PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from producer.client import Client
from shared.archive import Archive
from shared.archiver import Archiver
from shared.settings import Settings
from shared.store import RunStore
from worker.testing.harness import ROOT, RedisServer
from worker.testing.runs import ended_run, live_run

#: The PostgreSQL server of these machines (trust auth); each measurement makes and drops a database.
POSTGRES = "postgresql://postgres@127.0.0.1:5432"

RESULTS = Path(__file__).resolve().parent / "results" / "archive.json"
#: Status reads timed (random archived runs).
READS = 2000


def _admin() -> Any:
    import psycopg  # the postgres extra: only the PostgreSQL backend needs it

    return psycopg.connect(f"{POSTGRES}/postgres", autocommit=True, connect_timeout=5)


@contextmanager
def archive_url(backend: str, directory: Path) -> Iterator[str]:
    """The archive to measure: a new PostgreSQL database (dropped afterwards) or a SQLite file."""
    if backend != "postgresql":
        yield f"sqlite:///{directory / 'archive.db'}"
        return
    name = f"wesichain_bench_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _used(store: RunStore) -> int:
    return int(store.redis.info("memory")["used_memory"])


def _make(store: RunStore, n: int, make: Any) -> list[str]:
    # A few threads: each run is a dozen round trips, mostly waiting on the loopback.
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda _: make(store), range(n)))


def _db_bytes(archive: Archive, url: str) -> int:
    if archive.kind == "sqlite":
        return Path(url[len("sqlite:///") :]).stat().st_size
    with archive.db.transaction() as cur:  # type: ignore[attr-defined]
        cur.execute(
            "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c"
            " WHERE c.relkind = 'r' AND c.relname LIKE 'wesichain%%'"
        )
        return int(cur.fetchone()[0])


def _redis_cpu_s(store: RunStore) -> float:
    cpu = store.redis.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _settle(store: RunStore, timeout_s: float = 15.0) -> int:
    """Redis's memory once its housekeeping stopped shrinking its key tables (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    used = _used(store)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _used(store)
        if now >= used:
            return now
        used = now
    return used


def _archive_in_processes(settings: Settings, archivers: int) -> None:
    """``archivers`` processes of ``wesichain archive`` at once; they share the shards by lock."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WESICHAIN_REDIS_URL": settings.redis_url,
        "WESICHAIN_PREFIX": settings.prefix,
        "WESICHAIN_ARCHIVE_URL": settings.archive_url,
        "WESICHAIN_ARCHIVE_BATCH": str(settings.archive_batch),
    }
    command = [sys.executable, "-m", "producer.cli", "archive", "--after", "0", "--json"]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE) for _ in range(archivers)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out


def measure(runs: int, backend: str, batch: int, archivers: int = 1) -> dict[str, Any]:
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="wesichain-archive-")))
        url = stack.enter_context(archive_url(backend, directory))
        server = RedisServer().start()
        stack.callback(server.cleanup)
        settings = Settings(
            redis_url=server.url,
            prefix=f"bench-{uuid.uuid4().hex[:6]}:",
            archive_url=url,
            archive_batch=batch,
        )
        store = RunStore(server.client(), settings)
        stack.callback(store.close_archive)
        archive = store.archive
        assert archive is not None
        archiver = Archiver(store)
        # Warm up every shard's keys, the scripts and the database's tables.
        shards: set[int] = set()
        while len(shards) < settings.shards:
            shards.add(store.keys.shard(ended_run(store)))
        archiver.run_once(after_s=0)
        db_base = _db_bytes(archive, url)
        base = _settle(store)

        live = _make(store, min(runs, 1000), live_run)
        live_bytes = (_used(store) - base) / len(live)
        for run_id in live:  # out of the way: only ended runs are archived
            store.redis.delete(*store.redis.keys(f"*{run_id}*"))
        base = _settle(store)

        started = time.monotonic()
        run_ids = _make(store, runs, ended_run)
        made_s = time.monotonic() - started
        full = _used(store)
        ended_bytes = (full - base) / runs

        redis_cpu = _redis_cpu_s(store)
        started, cpu = time.monotonic(), time.process_time()
        if archivers == 1:
            report = archiver.run_once(after_s=0)
            assert report.archived == runs and report.mismatched == 0, report
        else:
            _archive_in_processes(settings, archivers)
        archive_s, archive_cpu_s = time.monotonic() - started, time.process_time() - cpu
        redis_cpu = _redis_cpu_s(store) - redis_cpu
        assert not any(store.redis.exists(store.keys.run(r)) for r in run_ids[:100])
        assert len(archive.present(run_ids)) == runs
        left = _settle(store) - base
        db_bytes = (_db_bytes(archive, url) - db_base) / runs

        client = Client(settings, store=store)
        sample = random.sample(run_ids, min(READS, runs))
        timings = []
        for run_id in sample:
            t0 = time.perf_counter()
            head = client.handle(run_id).status()
            timings.append((time.perf_counter() - t0) * 1000)
            assert head.terminal
        timings.sort()
        return {
            "backend": backend,
            "runs": runs,
            "batch": batch,
            "archivers": archivers,
            "run_shape": "start, one step of two parallel tool calls, an answer",
            "redis_bytes_per_live_run": round(live_bytes),
            "redis_bytes_per_ended_run": round(ended_bytes),
            "redis_bytes_left_after_archiving": left,
            "redis_bytes_left_per_archived_run": round(left / runs, 1),
            "db_bytes_per_archived_run": round(db_bytes),
            "archive_seconds": round(archive_s, 3),
            "archive_runs_per_s": round(runs / archive_s),
            "archive_runs_per_s_per_archiver": round(runs / archive_s / archivers),
            # The archiver's own CPU (one process only): runs per CPU second of the archiver.
            "archive_runs_per_cpu_s": round(runs / archive_cpu_s) if archivers == 1 else None,
            # redis-server's CPU over the archiving (the scripts' reads and deletes), per run.
            "archive_redis_cpu_ms_per_run": round(redis_cpu / runs * 1000, 3),
            "runs_made_per_s": round(runs / made_s),
            "status_read_ms_p50": round(statistics.median(timings), 3),
            "status_read_ms_p99": round(timings[int(len(timings) * 0.99) - 1], 3),
            "status_reads": len(timings),
            "machine": f"{platform.machine()}, {platform.python_version()}",
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument(
        "--batch", type=int, default=500, help="runs per transaction (WESICHAIN_ARCHIVE_BATCH)"
    )
    parser.add_argument("--sqlite", action="store_true", help="measure a SQLite file instead of PostgreSQL")
    parser.add_argument(
        "--archivers", type=int, default=1, help="archiver processes at once (they share the shards)"
    )
    args = parser.parse_args()
    result = measure(args.runs, "sqlite" if args.sqlite else "postgresql", args.batch, args.archivers)
    result["load_average"] = round(os.getloadavg()[0], 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[f"{result['backend']} x{args.archivers}"] = result
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
