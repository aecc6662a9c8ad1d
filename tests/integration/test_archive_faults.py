"""The run archive's database failing under real processes: between the pages of an archived run's
event stream (a real API process, a PostgreSQL database of the test's own that starts refusing and
ends its connections), its connection pool after the database is back, a process's first open of
its archive failing under a burst of reads, a schema migration whose connection is ended half-way
while other processes wait to open the archive, a migration under way while an API process opens
the archive, and the disk under a SQLite archive filling up while ``wesichain archive`` moves runs.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import shared.archive
from producer.api.feeds import BATCH
from producer.client import Client
from shared.archive import Archive, open_archive
from shared.archive.databases import Postgres, open_database
from shared.archive.schema import MIGRATIONS, SCHEMA_TABLE
from shared.archive.sql import SqlArchive
from shared.errors import ArchiveUnavailable
from shared.events import Completed, CustomEvent, RunStarted
from shared.keys import Keys
from shared.llm.base import Usage
from shared.settings import ENV_ARCHIVE_BATCH, ENV_ARCHIVE_URL
from shared.store import RunStore
from shared.tasks import TASK_ARCHIVE
from shared.tenants import Tenants
from tests.api_support import SSE, ApiProcess, bearer, frames
from tests.archive_support import (
    POSTGRES,
    archive_at_version_5,
    full_read,
    postgres_database,
    put_evals_without_tenant,
    sample_record,
    set_connections,
    stamped,
)
from tests.broker import Settings, broker_env
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until
from worker.testing.runs import ended_run

#: An archived run's events: this many pages of the stream's reads of the archive, each event about
#: 4 KB, so the socket buffers between the API and a client that stops reading hold a few pages at
#: most and the API reads the rest only as the client reads on.
PAGES = 8


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.cleanup()


def _archived_run(url: str, tenant: str) -> tuple[str, list[str]]:
    """A completed run of ``tenant`` with ``PAGES`` pages of events, written straight to the archive
    at ``url``: its id, and its event ids in order."""
    run_id = uuid.uuid4().hex
    events = [stamped("1000-0", RunStarted(run_id=run_id, step=0, agent="a", agent_version="1", model="m"))]
    events += [
        stamped(
            f"1000-{i}",
            CustomEvent(run_id=run_id, step=1, call_id="c", tool="t", attempt=1, name="p", data="x" * 4000),
        )
        for i in range(1, PAGES * BATCH)
    ]
    events.append(stamped("1001-0", Completed(run_id=run_id, step=1, answer="42", usage=Usage())))
    archive = open_archive(url)
    try:
        archive.put([replace(sample_record(run_id, 1000, tenant=tenant), events=events).stored()])
    finally:
        archive.close()
    return run_id, [event_id for event_id, _ in events]


def test_an_archived_runs_stream_ends_cleanly_when_the_archive_fails_between_pages_and_resumes(
    server: RedisServer,
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    with postgres_database() as url:
        run_id, ids = _archived_run(url, tenant)
        key, _ = Tenants(server.client(), Keys()).create_key(tenant, "test")
        # One stream per tenant: the resume opens only if the broken stream gave its place back.
        env = {"WESICHAIN_ARCHIVE_URL": url, "WESICHAIN_API_MAX_STREAMS_PER_TENANT": "1"}
        api = ApiProcess(server.url, env=env).start()
        try:
            # A small receive buffer: the API is held between pages while the test does not read.
            small = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)])
            got: list[str] = []
            with httpx.Client(base_url=api.url, headers=bearer(key), timeout=60, transport=small) as http:
                path = f"/v1/runs/{run_id}/events"
                with http.stream("GET", path, headers=SSE) as response:
                    assert response.status_code == 200
                    for frame in frames(response):
                        if frame.id is None:
                            continue
                        got.append(frame.id)
                        if len(got) == 10:  # the first page read; most are still in the archive
                            set_connections(url, allowed=False)
                    # The loop ended: the answer ended as an HTTP answer ends (no cut chunk, which
                    # httpx raises as RemoteProtocolError), after whole events, before the end event.
            assert 10 <= len(got) < len(ids) and got == ids[: len(got)]
            with httpx.Client(base_url=api.url, headers=bearer(key), timeout=60) as http:
                assert http.get("/healthz").status_code == 200  # the API serves on meanwhile
                resume = {**SSE, "Last-Event-ID": got[-1]}
                assert http.get(f"/v1/runs/{run_id}/events", headers=resume).status_code == 503
                set_connections(url, allowed=True)
                with http.stream("GET", f"/v1/runs/{run_id}/events", headers=resume) as response:
                    assert response.status_code == 200
                    rest = [frame.id for frame in frames(response) if frame.id is not None]
            assert got + rest == ids  # every event once, in order, across the resume
            said = f"the archived events of run {run_id} stopped after {got[-1]}"
            wait_until(lambda: said in api.log(), 30, what="the API to log why the stream ended")
        finally:
            api.stop()


def test_the_first_read_after_the_database_is_back_connects() -> None:
    """Reads that failed while the database refused connections leave no connect attempt asleep in
    a long pause: the first read once the database is back reaches it."""
    with postgres_database() as url:
        # One connection and a one-second wait: each read that fails takes the wait. After four,
        # a connect attempt still retrying with doubling pauses (1, 2, 4 s) would be in a pause
        # that outlasts the next read's wait, which then failed with the database back.
        archive = SqlArchive(Postgres(url, max_connections=1, timeout_s=1.0))
        try:
            assert archive.load("no-such-run") is None
            set_connections(url, allowed=False)
            try:
                for _ in range(4):
                    with pytest.raises(ArchiveUnavailable):
                        archive.load("no-such-run")
            finally:
                set_connections(url, allowed=True)
            assert archive.load("no-such-run") is None
        finally:
            archive.close()


#: A process of its own opening the archive (which applies the migrations it lacks): its version.
_OPENER = (
    "import sys; from shared.archive import open_archive; archive = open_archive(sys.argv[1]);"
    " print('version', archive.migrate(), flush=True); archive.close()"
)
#: A backend applying a migration, held at its record (see :func:`_held_record`).
_MIGRATING = f"query LIKE 'INSERT INTO {SCHEMA_TABLE}%%' AND wait_event_type = 'Lock'"


def _openers(url: str, count: int) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(count)
    ]


@contextmanager
def _held_record(url: str) -> Iterator[Callable[[str], list[int]]]:
    """An uncommitted record of migration 6 in the archive at ``url``: an opener applying migration
    6 runs its every statement, then its own record waits for this one, until the block ends. The
    block gets the pids of the archive's backends matching a condition on ``pg_stat_activity``."""
    name = url.rsplit("/", 1)[1]
    with (
        psycopg.connect(f"{POSTGRES}/{name}") as holder,
        psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin,
    ):

        def backends(where: str) -> list[int]:
            query = f"SELECT pid FROM pg_stat_activity WHERE datname = %s AND {where}"
            return [int(row[0]) for row in admin.execute(query, (name,)).fetchall()]

        holder.execute(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (6, 0)")
        try:
            yield backends
        finally:
            holder.rollback()


def test_a_migration_whose_connection_ends_midway_is_undone_whole_and_the_next_opener_completes_it() -> None:
    """Three processes open an archive one migration behind at once. The one applying it has its
    connection ended after the migration's every statement but its record: it refuses clearly, the
    archive is left whole at the version before, and another opener applies the migration."""
    evals = [("acme-1", 1.0, {"tenant": "acme"}), ("ops-1", 2.0, {"status": "completed"})]
    with postgres_database() as url:
        db = open_database(url)
        archive_at_version_5(db)
        put_evals_without_tenant(db, evals)
        db.close()
        with _held_record(url) as backends:
            openers = _openers(url, 3)
            waiting = "wait_event = 'advisory'"  # the others, on the migrations' lock
            wait_until(
                lambda: len(backends(_MIGRATING)) == 1 and len(backends(waiting)) == 2,
                60,
                what="one opener to be mid-migration and two to wait for it",
            )
            (pid,) = backends(_MIGRATING)
            with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # Another opener applies every statement of the migration again (its new column among
            # them: none of the first attempt's was left behind) and waits in turn.
            wait_until(
                lambda: backends(_MIGRATING) not in ([], [pid]),
                60,
                what="another opener to apply the whole migration again",
            )
        outcomes = [opener.communicate(timeout=60) for opener in openers]
        codes = sorted(opener.returncode for opener in openers)
        assert codes == [0, 0, 1], outcomes
        refused = next(err for opener, (_, err) in zip(openers, outcomes, strict=True) if opener.returncode)
        assert "ArchiveUnavailable: the PostgreSQL archive at" in refused
        assert sorted(out for out, _ in outcomes if out) == ["version 6\n", "version 6\n"]
        migrated = open_archive(url)
        try:
            assert isinstance(migrated, SqlArchive) and migrated.migrate() == len(MIGRATIONS)
            assert migrated.tenant_evals("acme", 10) == [(1.0, "acme-1")]
            assert migrated.tenant_evals(None, 10) == [(2.0, "ops-1")]
        finally:
            migrated.close()


def test_a_process_opening_the_archive_while_another_migrates_it_is_answered_within_its_wait(
    server: RedisServer,
) -> None:
    """A migration under way holds the schema lock that every process takes on its first use of
    the archive: an API process's read of an archived run meanwhile is answered 503 once it waited
    as long as for a connection (it waited for the migration's end, and a process whose every
    worker thread waited so answered nothing), and reads the run once the migration is done."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    run_id = uuid.uuid4().hex
    with postgres_database() as url:
        archive = open_archive(url)
        archive.put([sample_record(run_id, 1000, tenant=tenant).stored()])
        archive.close()
        with psycopg.connect(url) as conn:  # one migration behind: migration 6 undone
            conn.execute("ALTER TABLE wesichain_evals DROP COLUMN tenant")
            conn.execute(f"DELETE FROM {SCHEMA_TABLE} WHERE version = 6")
        key, _ = Tenants(server.client(), Keys()).create_key(tenant, "test")
        api = ApiProcess(server.url, env={"WESICHAIN_ARCHIVE_URL": url}).start()
        try:
            with (
                _held_record(url) as backends,
                httpx.Client(base_url=api.url, headers=bearer(key), timeout=60) as http,
            ):
                (opener,) = _openers(url, 1)
                wait_until(lambda: len(backends(_MIGRATING)) == 1, 60, what="the opener to be mid-migration")

                during = http.get(f"/v1/runs/{run_id}")

                assert during.status_code == 503 and during.json()["error"]["kind"] == "unavailable"
                assert "is being migrated by another process" in api.log()
            assert opener.communicate(timeout=60)[0] == "version 6\n"
            with httpx.Client(base_url=api.url, headers=bearer(key), timeout=60) as http:
                assert http.get(f"/v1/runs/{run_id}").json()["answer"] == "42"
        finally:
            api.stop()


@contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only: skipped where it cannot be mounted)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode(errors='replace')[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def _fill(disk: Path, leave: int) -> Path:
    """A file filling ``disk`` but ``leave`` bytes; its path."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    os.close(fd)
    return filler


def test_a_full_disk_under_a_sqlite_archive_keeps_runs_in_redis_until_there_is_room(
    server: RedisServer, tmp_path: Path
) -> None:
    """``wesichain archive`` on a SQLite archive whose disk fills: the pass says why and exits 1,
    each run is whole in Redis or whole in the archive (a batch that fits is archived, the others
    wait), and once there is room again the next pass archives the rest, which read the same."""
    with _small_disk(tmp_path / "disk", "8m") as disk:
        url = f"sqlite:///{disk / 'archive.db'}"
        settings = Settings(
            redis_url=server.url, agents_module="tests.agents_fixture", archive_url=url, archive_batch=10
        )
        client = Client(settings)
        store = client.store
        env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_ARCHIVE_URL: url, ENV_ARCHIVE_BATCH: "10"}

        def archive_pass() -> tuple[int, dict[str, Any]]:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "producer.cli",
                    "archive",
                    "--redis",
                    server.url,
                    "--after",
                    "0",
                    "--json",
                ],
                capture_output=True,
                text=True,
                env={**env, **broker_env(server.url)},
                timeout=120,
            )
            report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
            return done.returncode, report

        def in_redis(run_ids: list[str]) -> set[str]:
            return {run_id for run_id in run_ids if store.redis.exists(store.keys.run(run_id))}

        try:
            first = [ended_run(store) for _ in range(10)]
            code, report = archive_pass()
            assert (code, report["archived"], in_redis(first)) == (0, 10, set()), report
            filler = _fill(disk, leave=300 * 1024)  # room for a batch or so, not for all
            run_ids = [ended_run(store) for _ in range(40)]
            before = {run_id: full_read(client, run_id) for run_id in run_ids}

            code, report = archive_pass()

            assert code == 1 and "database or disk is full" in report["error"], report
            kept = in_redis(run_ids)
            assert kept, "every run was archived: the disk was not full"
            archived = set(run_ids) - kept
            assert store.archive is not None
            held = store.archive.summaries(run_ids)
            assert set(held) == archived and report["archived"] == len(archived)  # none half-moved
            for run_id in run_ids:
                assert full_read(client, run_id) == before[run_id], run_id

            filler.unlink()
            code, report = archive_pass()

            assert (code, report["error"], report["archived"]) == (0, "", len(kept)), report
            assert in_redis(run_ids) == set()
            for run_id in run_ids:
                assert full_read(client, run_id) == before[run_id], run_id
        finally:
            client.close()
            store.close_archive()


def test_reads_that_wait_for_an_open_of_the_archive_that_fails_take_its_answer(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that has not opened its archive yet, its database refusing connections: reads
    asking for it at once wait for one open and all take its failure, rather than each open in
    turn (each waiting the database's timeout, one after another: minutes of an API process's
    worker threads for a burst of reads)."""
    opens: list[str] = []

    def counted(url: str) -> Archive:
        opens.append(url)
        return open_archive(url)

    with postgres_database() as url:
        set_connections(url, allowed=False)
        monkeypatch.setattr(shared.archive, "open_archive", counted)
        store = RunStore(server.client(), Settings(redis_url=server.url, archive_url=url))
        readers = 4
        together = threading.Barrier(readers)

        def read() -> str:
            together.wait()
            try:
                store.load("an-archived-run")
            except ArchiveUnavailable as exc:
                return str(exc)
            return "read"

        with ThreadPoolExecutor(readers) as pool:
            answers = list(pool.map(lambda _: read(), range(readers)))

        assert len(opens) == 1 and len(set(answers)) == 1, (opens, answers)
        assert "the PostgreSQL archive at" in answers[0]
        set_connections(url, allowed=True)
        assert store.load("an-archived-run") is None and len(opens) == 2  # asked after it failed: opened anew
        store.close_archive()


def test_an_archive_that_cannot_be_opened_leaves_no_pool_behind() -> None:
    # Each failed open kept its connection pool, whose threads went on trying to connect: four
    # more threads a failed open, until the garbage collector came by.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections to it are refused
        before = threading.active_count()
        for _ in range(2):
            with pytest.raises(ArchiveUnavailable):
                open_archive(f"postgresql://postgres@127.0.0.1:{port}/nothing")
        assert threading.active_count() == before


def test_the_archiving_task_of_a_database_that_refuses_logs_its_warning_without_a_traceback(
    tmp_path: Path,
) -> None:
    # Each beat's task raised ArchiveUnavailable, and Celery logged a traceback beside the
    # archiver's own warning, once per beat for as long as the database was down.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"postgresql://postgres@127.0.0.1:{closed.getsockname()[1]}/nothing"
        server = RedisServer().start()
        env = {ENV_ARCHIVE_URL: refused, "WESICHAIN_ARCHIVE_AFTER_S": "0"}
        worker = WorkerProcess("archiver", server.url, concurrency=1, log_dir=str(tmp_path), env=env)
        client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
        try:
            worker.start()
            client.submit("direct", "to be archived").wait(60)
            # Two passes on one process: the second's warning comes after the first task ended.
            client.app.send_task(TASK_ARCHIVE)
            client.app.send_task(TASK_ARCHIVE)
            warning = "archiving stopped, the runs stay in Redis"
            wait_until(lambda: worker.log().count(warning) >= 2, 90, what="two passes' warnings")
            assert "Traceback" not in worker.log()
        finally:
            client.close()
            worker.stop()
            server.cleanup()
