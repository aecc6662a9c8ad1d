"""The archive's SQL store on SQLite (PostgreSQL runs the same queries in the integration tests):
schema migrations, idempotent batches, and reads shaped as the Redis reads are."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shared.archive import ListingFilter, RunSummary, open_archive
from shared.archive.databases import open_database, sqlite_path
from shared.archive.record import EvalRecord
from shared.archive.schema import MIGRATIONS, SCHEMA_TABLE
from shared.archive.sql import SqlArchive
from shared.errors import ArchiveUnavailable, ConfigError, RunErrorInfo
from shared.events import Failed
from shared.settings import Settings
from shared.state import CallbackState, Phase
from tests.archive_support import (
    BACKENDS,
    archive_at_version_5,
    archive_url,
    postgres_database,
    put_evals_without_tenant,
    sample_record,
    stamped,
)


@pytest.fixture
def archive(tmp_path: Path) -> SqlArchive:
    opened = open_archive(f"sqlite:///{tmp_path / 'a.db'}")
    assert isinstance(opened, SqlArchive)
    return opened


def test_a_run_reads_back_as_it_was_written(archive: SqlArchive) -> None:
    record = sample_record("r1", 1000)
    assert archive.put([record.stored()]) == 1
    assert archive.load("r1") == record.head
    assert archive.messages("r1") == record.messages
    assert archive.messages("r1", 1) == record.messages[1:]
    assert archive.messages("r1", -2, -1) == record.messages[-2:]
    assert archive.messages("r1", 0, 0) == record.messages[:1]
    assert archive.messages("r1", 5) == []
    assert archive.checkpoints("r1") == record.checkpoints
    assert archive.events("r1") == record.events
    assert [e.stream_id for _, e in archive.events("r1")] == ["1000-0", "1000-1", "1005-0"]
    assert archive.events("r1", after="1000-0") == record.events[1:]
    assert archive.events("r1", after="1000-1", count=1) == record.events[2:]
    assert sorted(archive.results("r1", 1), key=lambda r: r.call_id) == sorted(
        (r for _, r in record.results), key=lambda r: r.call_id
    )
    assert archive.results("r1", 2) == []
    assert CallbackState.model_validate_json(archive.callback_state("r1") or "") == CallbackState(
        status="delivered", attempts=2
    )
    whole = archive.record("r1")
    assert whole is not None and whole.summary() == record.summary() == RunSummary(3, 3, 3, 3, 2)
    assert (
        archive.load("nope") is None and archive.record("nope") is None and archive.checkpoints("nope") == []
    )


def test_batches_are_idempotent(archive: SqlArchive) -> None:
    assert archive.put([sample_record("r1", 1000).stored(), sample_record("r2", 1001).stored()]) == 2
    # r1 was there already
    assert archive.put([sample_record("r1", 1000).stored(), sample_record("r3", 1002).stored()]) == 1
    assert archive.put([]) == 0
    assert set(archive.summaries(["r1", "r2", "r3", "r4"])) == {"r1", "r2", "r3"}
    assert archive.summaries([]) == {}
    assert archive.summaries(["r1"])["r1"].events == 3


def test_a_batch_is_written_and_read_back_in_one_go(archive: SqlArchive) -> None:
    first = [sample_record("r1", 1000).stored(), sample_record("r2", 1001).stored()]
    held, summaries = archive.put_and_summarize(first)
    assert held == set() and summaries == {r.run_id: r.summary() for r in first}
    # r1 was there already: it is not written again, and is read back as it was
    again = [sample_record("r1", 1000).stored(), sample_record("r3", 1002).stored()]
    held, summaries = archive.put_and_summarize(again)
    assert held == {"r1"} and summaries == {r.run_id: r.summary() for r in again}
    assert archive.put_and_summarize([]) == (set(), {})
    assert archive.present(["r1", "r2", "r3", "r4"]) == {"r1", "r2", "r3"}


def test_listing_is_newest_first_by_time_then_id(archive: SqlArchive) -> None:
    records = [
        sample_record("a", 1000),
        sample_record("b", 2000, agent="other"),
        sample_record("c", 2000, thread_id="t"),
        sample_record("d", 3000, phase=Phase.FAILED, error=RunErrorInfo(kind="BudgetExceeded", message="x")),
        sample_record("e", 4000, tenant=None),
    ]
    archive.put([record.stored() for record in records])

    def ids(where: ListingFilter, before: tuple[int, str] | None = None, limit: int = 10) -> list[str]:
        return [head.run_id for _, head in archive.list_runs(where, before, limit)]

    assert ids(ListingFilter("acme")) == ["d", "c", "b", "a"]
    assert ids(ListingFilter("acme"), limit=2) == ["d", "c"]
    assert ids(ListingFilter("acme"), before=(2000, "c")) == ["b", "a"]
    assert ids(ListingFilter("acme"), before=(2000, "b")) == ["a"]
    assert ids(ListingFilter("acme", agent="other")) == ["b"]
    assert ids(ListingFilter("acme", status="failed")) == ["d"]
    assert ids(ListingFilter("acme", thread_id="t")) == ["c"]
    assert ids(ListingFilter("acme", since_ms=2000)) == ["d", "c", "b"]
    assert ids(ListingFilter(None)) == ["e"]
    assert archive.list_runs(ListingFilter("acme"), None, 1)[0][0] == 3000
    assert archive.thread_runs("acme", "t") == ["c"] and archive.thread_runs("other", "t") == []


def test_the_schema_is_migrated_once_and_a_newer_one_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"
    first = open_archive(url)
    assert isinstance(first, SqlArchive)
    assert first.migrate() == len(MIGRATIONS)
    first.put([sample_record("r1", 1).stored()])
    first.close()
    again = open_archive(url)  # opening again applies nothing and keeps the data
    assert again.load("r1") is not None
    assert isinstance(again, SqlArchive)
    with again.db.transaction() as cur:
        cur.execute(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (?, ?)", (99, time.time()))
    again.close()
    with pytest.raises(ArchiveUnavailable, match="newer than this release"):
        open_archive(url)


def test_archive_urls_are_checked() -> None:
    assert sqlite_path("sqlite:///relative/a.db") == "relative/a.db"
    assert sqlite_path("sqlite:////abs/a.db") == "/abs/a.db"
    assert sqlite_path("sqlite:///:memory:") == ":memory:"
    with pytest.raises(ConfigError):
        sqlite_path("sqlite://")
    with pytest.raises(ConfigError, match="WESICHAIN_ARCHIVE_URL"):
        Settings(archive_url="mysql://x/y").validate()
    with pytest.raises(ConfigError):
        Settings(archive_batch=0).validate()
    Settings(archive_url="postgresql://u:secret@h/db").validate()
    assert "secret" not in repr(Settings(archive_url="postgresql://u:secret@h/db"))


def test_a_failed_run_keeps_its_error(archive: SqlArchive) -> None:
    error = RunErrorInfo(kind="ToolDispatch", message="boom")
    record = sample_record("f", 10, phase=Phase.FAILED, error=error)
    failed = Failed(run_id="f", step=1, error=error)
    record.events.append(stamped("20-0", failed))
    archive.put([record.stored()])
    head = archive.load("f")
    assert head is not None and head.error == error and head.status == "failed"
    assert archive.events("f")[-1][1] == failed


@pytest.mark.parametrize("backend", BACKENDS)
def test_evals_archived_before_their_tenant_had_a_column_are_listed_by_tenant(
    backend: str, tmp_path: Path
) -> None:
    """Migration 6 fills the new ``tenant`` column of the evals already archived from their meta."""
    with archive_url(backend, tmp_path) as url:
        db = open_database(url)
        archive_at_version_5(db)
        put_evals_without_tenant(
            db,
            [
                ("acme-1", 1.0, {"tenant": "acme", "note": "a \u0000 in the meta"}),
                ("ops-1", 2.0, {"status": "completed"}),
                ("rival-1", 3.0, {"tenant": "rival"}),
            ],
        )
        db.close()
        migrated = open_archive(url)
        try:
            assert isinstance(migrated, SqlArchive) and migrated.migrate() == len(MIGRATIONS) == 6
            assert migrated.tenant_evals("acme", 10) == [(1.0, "acme-1")]
            assert migrated.tenant_evals(None, 10) == [(2.0, "ops-1")]
            assert migrated.tenant_evals("rival", 10) == [(3.0, "rival-1")]
            assert [e for _, e in migrated.list_evals(10)] == ["rival-1", "ops-1", "acme-1"]
        finally:
            migrated.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_evals_an_older_release_archives_after_the_migration_are_listed_by_their_tenant(
    backend: str, tmp_path: Path
) -> None:
    """A process of the release before migration 6 that opened the archive before it was migrated
    (a worker of a rolling upgrade) goes on archiving evals without their tenant: they are listed by
    their meta's tenant, not taken for the operator's nor lost to their tenant's listing."""
    with archive_url(backend, tmp_path) as url:
        archive = open_archive(url)
        try:
            assert isinstance(archive, SqlArchive)
            for eval_id, created, tenant in [("acme-new", 1.0, "acme"), ("ops-new", 2.0, None)]:
                meta = {"status": "completed"} | ({"tenant": tenant} if tenant else {})
                assert archive.put_eval(EvalRecord(eval_id, meta, {}, {}, {}, created, created))
            put_evals_without_tenant(
                archive.db,
                [
                    ("acme-old", 3.0, {"tenant": "acme", "note": "a \u0000 in the meta"}),
                    ("ops-old", 4.0, {"status": "completed"}),
                    ("rival-old", 5.0, {"tenant": "rival"}),
                ],
            )
            assert archive.tenant_evals("acme", 10) == [(3.0, "acme-old"), (1.0, "acme-new")]
            assert archive.tenant_evals("acme", 1) == [(3.0, "acme-old")]
            assert archive.tenant_evals(None, 10) == [(4.0, "ops-old"), (2.0, "ops-new")]
            assert archive.tenant_evals("rival", 10) == [(5.0, "rival-old")]
            assert archive.tenant_evals("nobody", 10) == []
        finally:
            archive.close()


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_the_tenant_migration_reads_metas_whatever_the_strings_setting(conforming: str) -> None:
    """Migration 6 reads each meta's tenant on PostgreSQL with its backslashes in escape strings:
    with ``standard_conforming_strings`` off, plain strings take backslashes as escapes, and the
    migration failed (the archive could not be opened at all)."""
    metas = {
        "acme-nul": {"tenant": "acme", "note": "a \u0000 and a \u0001"},
        "acme-text": {"note": "\\u0000 written out, then \\\u0000", "tenant": "acme"},
        "ops-nul": {"status": "completed", "note": "\u0000"},
        "rival-1": {"tenant": "rival", "note": 'it\'s "quoted"'},
    }
    with postgres_database() as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                f"ALTER DATABASE {url.rsplit('/', 1)[1]} SET standard_conforming_strings = {conforming}"
            )
        db = open_database(url)
        archive_at_version_5(db)
        put_evals_without_tenant(
            db, [(eval_id, float(created), meta) for created, (eval_id, meta) in enumerate(metas.items())]
        )
        with db.transaction() as cur:
            cur.execute("SHOW standard_conforming_strings")
            assert cur.fetchone()[0] == conforming
        db.close()
        migrated = open_archive(url)
        try:
            assert isinstance(migrated, SqlArchive) and migrated.migrate() == len(MIGRATIONS)
            assert migrated.tenant_evals("acme", 10) == [(1.0, "acme-text"), (0.0, "acme-nul")]
            assert migrated.tenant_evals(None, 10) == [(2.0, "ops-nul")]
            assert migrated.tenant_evals("rival", 10) == [(3.0, "rival-1")]
        finally:
            migrated.close()


def test_a_postgresql_connection_keeps_the_url_s_options_and_adds_the_server_s_bounds() -> None:
    from shared.archive.databases import _server_bounds

    bounds = "-c idle_in_transaction_session_timeout=30000 -c tcp_user_timeout=30000"
    assert _server_bounds("postgresql://u@h/db", 5.0) == bounds
    assert _server_bounds("postgresql://u@h/db?options=-c%20search_path%3Darchive", 5.0) == (
        f"-c search_path=archive {bounds}"
    )
