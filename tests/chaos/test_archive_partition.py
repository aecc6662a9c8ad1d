"""The archive's PostgreSQL hanging instead of refusing: a partition that keeps its connections open.

Between the archive's readers and PostgreSQL sits a forwarder that freezes (``tests/tcp_proxy.py``):
connections stay open and new ones are accepted, but no byte passes, as behind a stalled NAT or a
silent network path. A read of an archived run through the HTTP API and an archiver pass must give
up (503 ``unavailable``; a pass that stops with its error) rather than hang, the API goes on serving
runs held in Redis meanwhile, no run leaves Redis unarchived, and once the path thaws reads and
archiving resume.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from shared.archiver import Archiver, ArchiveReport
from shared.errors import ArchiveUnavailable
from shared.store import RunStore
from tests.api_support import ApiProcess
from tests.archive_support import postgres_database
from tests.broker import Settings
from tests.harness import RedisServer, wait_until
from tests.tcp_proxy import TcpProxy
from worker.testing.runs import ended_run, live_run

pytestmark = pytest.mark.timeout(120)

#: How long a client waits for an answer: far longer than the archive's own bounds (its pool's
#: 5 s wait for a connection, and as long again to connect), so that only a hang runs it out.
CLIENT_DEADLINE_S = 30.0
RUNS = 6


@pytest.fixture
def rds(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def _through(proxy: TcpProxy, url: str) -> str:
    """``url`` with the database reached through ``proxy``."""
    parts = urlsplit(url)
    return parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()


def _in_thread(fn: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())  # type: ignore[operator]
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_silent_archive_database_is_given_up_on_and_comes_back(
    server: RedisServer, rds: redis.Redis
) -> None:
    with postgres_database() as direct:
        proxy = TcpProxy(("127.0.0.1", urlsplit(direct).port or 5432))
        url = _through(proxy, direct)
        prefix = f"t-{uuid.uuid4().hex[:8]}:"
        settings = Settings(redis_url=server.url, prefix=prefix, shards=1, retention_s=3600, archive_url=url)
        store = RunStore(rds, settings)
        api: ApiProcess | None = None
        try:
            archived = [ended_run(store) for _ in range(RUNS)]
            assert Archiver(store).run_once(after_s=0).archived == RUNS
            waiting = [ended_run(store) for _ in range(RUNS)]  # ended, not archived yet
            live = live_run(store)
            env = {
                "WESICHAIN_PREFIX": settings.prefix,
                "WESICHAIN_SHARDS": "1",
                "WESICHAIN_ARCHIVE_URL": url,
                "WESICHAIN_API_AUTH": "off",  # the operator's view, on loopback: runs of no tenant
            }
            api = ApiProcess(server.url, env=env).start()
            with httpx.Client(base_url=api.url, timeout=CLIENT_DEADLINE_S) as http:
                # The API process and this one each hold an open connection to the archive.
                assert http.get(f"/v1/runs/{archived[0]}").status_code == 200
                assert store.load(archived[1]) is not None

                proxy.freeze()
                read, read_out = _in_thread(lambda: http.get(f"/v1/runs/{archived[0]}"))
                archiving, archiving_out = _in_thread(lambda: Archiver(store).run_once(after_s=0))
                # Meanwhile, runs in Redis are served as ever.
                for _ in range(3):
                    answer = http.get(f"/v1/runs/{live}")
                    assert answer.status_code == 200 and answer.json()["status"] == "running"
                read.join(CLIENT_DEADLINE_S)
                archiving.join(CLIENT_DEADLINE_S)
                assert not read.is_alive(), "a read of an archived run hung on the silent database"
                assert not archiving.is_alive(), "an archiver pass hung on the silent database"
                (down,) = read_out
                assert isinstance(down, httpx.Response), down
                assert down.status_code == 503 and down.json()["error"]["kind"] == "unavailable"
                assert down.headers["Retry-After"] == "5"
                (report,) = archiving_out
                assert isinstance(report, ArchiveReport), report
                assert report.archived == 0 and "PostgreSQL archive" in report.error
                assert all(rds.exists(store.keys.run(r)) for r in waiting), "a run left Redis unarchived"

                proxy.thaw()
                wait_until(
                    lambda: http.get(f"/v1/runs/{archived[0]}").status_code == 200,
                    60,
                    interval=0.5,
                    what="reads of archived runs to come back",
                )
                moved = 0

                def resumed() -> bool:
                    nonlocal moved
                    moved += Archiver(store).run_once(after_s=0).archived
                    return moved == RUNS

                wait_until(resumed, 60, interval=0.5, what="archiving to resume")
                assert not any(rds.exists(store.keys.run(r)) for r in waiting)
                for run_id in [*archived, *waiting]:
                    answer = http.get(f"/v1/runs/{run_id}")
                    assert answer.status_code == 200 and answer.json()["status"] == "completed", run_id
        finally:
            proxy.thaw()
            if api is not None:
                api.stop()
            store.close_archive()
            proxy.close()


def test_a_migrating_process_cut_off_from_postgresql_gives_its_schema_lock_back() -> None:
    """A process holding the archive's schema lock (a migration's transaction) whose path to
    PostgreSQL freezes, as when its host vanishes: PostgreSQL sees a connection that is open and
    silent, idle in its transaction. The server ends that transaction after the archive's bound on
    a transaction (``_TRANSACTION_TIMEOUTS`` × ``timeout_s``), so the lock comes back and another
    process opens the archive, instead of being refused until someone kills the session by hand."""
    from shared.archive.databases import _TRANSACTION_TIMEOUTS, Postgres
    from shared.archive.sql import SqlArchive

    with postgres_database() as direct:
        SqlArchive(Postgres(direct, timeout_s=1)).db.close()  # the schema in place
        proxy = TcpProxy(("127.0.0.1", urlsplit(direct).port or 5432))
        doomed = Postgres(_through(proxy, direct), timeout_s=1)
        holding, vanished = threading.Event(), threading.Event()

        def hold_the_lock() -> None:
            with doomed.transaction(exclusive=True):
                proxy.freeze()
                holding.set()
                vanished.wait(CLIENT_DEADLINE_S * 4)

        holder, _ = _in_thread(hold_the_lock)
        try:
            assert holding.wait(CLIENT_DEADLINE_S)
            opened: list[SqlArchive] = []

            def opens() -> bool:
                try:
                    opened.append(SqlArchive(Postgres(direct, timeout_s=1)))
                except ArchiveUnavailable as exc:
                    assert "being migrated by another process" in str(exc), exc
                    return False
                return True

            started = time.monotonic()
            assert not opens()  # held: refused after its lock_timeout
            wait_until(opens, CLIENT_DEADLINE_S * 2, what="the vanished holder's schema lock to come back")
            # Not before the bound: the server waited out a transaction's whole allowance.
            assert time.monotonic() - started >= _TRANSACTION_TIMEOUTS * 1 - 1.5
            opened[0].db.close()
        finally:
            vanished.set()
            proxy.close()
            holder.join(CLIENT_DEADLINE_S)
            doomed.close()
