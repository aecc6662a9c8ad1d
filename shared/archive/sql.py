"""The archive in SQL: one implementation of :class:`~shared.archive.base.Archive` over two databases.

:class:`~shared.archive.databases.Database` hides what differs between PostgreSQL and SQLite
(connections, placeholders, column types); the queries here are written once, with ``?``
placeholders. Every JSON value is validated by its pydantic model when it is read back, as the
store validates what it reads from Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from shared.archive.base import Archive, ListingFilter
from shared.archive.databases import Cursor, Database
from shared.archive.record import Deletion, RunRecord, RunSummary, StoredRun
from shared.archive.schema import MIGRATIONS, SCHEMA_TABLE, TABLES, migration, tenant_column
from shared.archive.sql_evals import SqlEvalArchive
from shared.archive.sql_memory import SqlMemoryArchive
from shared.errors import ArchiveUnavailable
from shared.events import Event, load_event
from shared.messages import MESSAGE_ADAPTER, Message
from shared.state import RunHead, ToolResult

__all__ = ["SqlArchive", "parse_stream_id"]


def parse_stream_id(stream_id: str) -> tuple[int, int]:
    """A Redis stream id ``ms-seq`` as numbers (they order the archived events)."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


class SqlArchive(SqlEvalArchive, SqlMemoryArchive, Archive):
    """Finished runs in PostgreSQL or SQLite, in the tables of :mod:`shared.archive.schema`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.kind = db.kind
        try:
            self.migrate()
        except BaseException:
            # An archive that could not be opened (its database down, its schema lock held) leaves
            # no pool behind: the next open makes its own, and each failed one kept its threads.
            db.close()
            raise

    # -- schema -----------------------------------------------------------------------------------

    def migrate(self) -> int:
        """Apply the migrations the database lacks (one transaction each); its version after."""
        db = self.db
        with db.transaction(exclusive=True) as cur:
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} "
                f"(version INTEGER PRIMARY KEY, applied_at {db.float_type} NOT NULL)"
            )
        while True:
            with db.transaction(exclusive=True) as cur:
                cur.execute(f"SELECT MAX(version) FROM {SCHEMA_TABLE}")
                current = int(cur.fetchone()[0] or 0)
                if current > len(MIGRATIONS):
                    raise ArchiveUnavailable(
                        f"the archive's schema is at version {current}, newer than this release knows"
                        f" ({len(MIGRATIONS)}): upgrade wesichain"
                    )
                if current == len(MIGRATIONS):
                    return current
                meta_tenant = db.json_member("meta", "tenant")
                for statement in migration(current + 1, db.json_type, db.float_type, meta_tenant):
                    cur.execute(statement)
                cur.execute(
                    db.sql(f"INSERT INTO {SCHEMA_TABLE} (version, applied_at) VALUES (?, ?)"),
                    (current + 1, time.time()),
                )

    # -- writing ----------------------------------------------------------------------------------

    def put(self, records: Sequence[StoredRun]) -> int:
        if not records:
            return 0
        with self.db.transaction() as cur:
            held = self._present(cur, [r.run_id for r in records])
            return self._write(cur, [r for r in records if r.run_id not in held])

    def put_and_summarize(self, records: Sequence[StoredRun]) -> tuple[set[str], dict[str, RunSummary]]:
        if not records:
            return set(), {}
        run_ids = [r.run_id for r in records]
        with self.db.transaction() as cur:
            held = self._present(cur, run_ids)
            self._write(cur, [r for r in records if r.run_id not in held])
            # Read back in the transaction that wrote: what it counts is what its commit keeps.
            return held, self._summaries(cur, run_ids)

    def _write(self, cur: Cursor, new: Sequence[StoredRun]) -> int:
        """Every row of these runs (none of them archived yet), each table in bulk."""
        if not new:
            return 0
        now = time.time()
        self._insert(
            cur,
            "wesichain_runs (run_id, tenant, agent, status, thread_id, created_ms, ended_at, archived_at,"
            " version, head, callback_state)",
            11,
            (_run_row(r, now) for r in new),
        )
        self._insert(
            cur,
            "wesichain_messages (run_id, seq, body)",
            3,
            ((r.run_id, i, body) for r in new for i, body in enumerate(r.messages)),
        )
        self._insert(
            cur,
            "wesichain_events (run_id, stream_ms, stream_seq, body)",
            4,
            ((r.run_id, *parse_stream_id(sid), body) for r in new for sid, body in r.events),
        )
        self._insert(
            cur,
            "wesichain_checkpoints (run_id, version, body)",
            3,
            ((r.run_id, version, body) for r in new for version, body in r.checkpoints),
        )
        self._insert(
            cur,
            "wesichain_tool_results (run_id, step, call_id, body)",
            4,
            ((r.run_id, step, call_id, body) for r in new for step, call_id, body in r.results),
        )
        return len(new)

    def _insert(self, cur: Cursor, table: str, width: int, rows: Iterable[tuple[Any, ...]]) -> None:
        batch = list(rows)
        if batch:
            self.db.insert_many(cur, table, width, batch)

    def _present(self, cur: Cursor, run_ids: Sequence[str]) -> set[str]:
        where, params = self.db.any_of("run_id", run_ids)
        cur.execute(f"SELECT run_id FROM wesichain_runs WHERE {where}", params)
        return {row[0] for row in cur.fetchall()}

    def present(self, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        with self.db.transaction() as cur:
            return self._present(cur, run_ids)

    def summaries(self, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        if not run_ids:
            return {}
        with self.db.transaction() as cur:
            return self._summaries(cur, run_ids)

    def _summaries(self, cur: Cursor, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        where, params = self.db.any_of("r.run_id", run_ids)
        # One statement; each part counted for its run through its table's primary key, so the
        # work follows the batch, not the table's size, with or without the planner's statistics
        # (a filter on the batch's ids scanned every table whole while they were small or new).
        counts = ", ".join(
            f"(SELECT COUNT(*) FROM {table} p WHERE p.run_id = r.run_id)" for table in _COUNTED
        )
        cur.execute(f"SELECT r.run_id, r.version, {counts} FROM wesichain_runs r WHERE {where}", params)
        return {
            run_id: RunSummary(int(version), int(messages), int(checkpoints), int(events), int(results))
            for run_id, version, messages, checkpoints, events, results in cur.fetchall()
        }

    # -- reading ----------------------------------------------------------------------------------

    def _rows(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self.db.transaction() as cur:
            cur.execute(self.db.sql(query), tuple(params))
            return list(cur.fetchall())

    def load(self, run_id: str) -> RunHead | None:
        j = self.db.json_text
        rows = self._rows(f"SELECT {j('head')} FROM wesichain_runs WHERE run_id = ?", (run_id,))
        return RunHead.model_validate_json(rows[0][0]) if rows else None

    def messages(self, run_id: str, start: int = 0, end: int = -1) -> list[Message]:
        j = self.db.json_text
        rows = self._rows(
            f"SELECT {j('body')} FROM wesichain_messages WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        return [MESSAGE_ADAPTER.validate_json(row[0]) for row in _lrange(rows, start, end)]

    def checkpoints(self, run_id: str) -> list[RunHead]:
        head = self.load(run_id)
        if head is None:
            return []
        j = self.db.json_text
        rows = self._rows(
            f"SELECT {j('body')} FROM wesichain_checkpoints WHERE run_id = ? ORDER BY version", (run_id,)
        )
        request = head.dump_request()
        return [RunHead.compose(row[0], request, 0) for row in rows]

    def events(self, run_id: str, after: str = "0-0", count: int = 1000) -> list[tuple[str, Event]]:
        ms, seq = parse_stream_id(after)
        j = self.db.json_text
        rows = self._rows(
            f"SELECT stream_ms, stream_seq, {j('body')} FROM wesichain_events WHERE run_id = ?"
            " AND (stream_ms > ? OR (stream_ms = ? AND stream_seq > ?))"
            " ORDER BY stream_ms, stream_seq LIMIT ?",
            (run_id, ms, ms, seq, count),
        )
        entries = []
        for stream_ms, stream_seq, body in rows:
            event = load_event(body)
            event.stream_id = f"{stream_ms}-{stream_seq}"
            entries.append((event.stream_id, event))
        return entries

    def results(self, run_id: str, step: int) -> list[ToolResult]:
        j = self.db.json_text
        rows = self._rows(
            f"SELECT {j('body')} FROM wesichain_tool_results WHERE run_id = ? AND step = ? ORDER BY call_id",
            (run_id, step),
        )
        return [ToolResult.model_validate_json(row[0]) for row in rows]

    def _all_results(self, run_id: str) -> list[tuple[int, ToolResult]]:
        j = self.db.json_text
        rows = self._rows(
            f"SELECT step, {j('body')} FROM wesichain_tool_results WHERE run_id = ? ORDER BY step, call_id",
            (run_id,),
        )
        return [(int(step), ToolResult.model_validate_json(body)) for step, body in rows]

    def callback_state(self, run_id: str) -> str | None:
        j = self.db.json_text
        rows = self._rows(f"SELECT {j('callback_state')} FROM wesichain_runs WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows and rows[0][0] is not None else None

    def record(self, run_id: str) -> RunRecord | None:
        rows = self._rows("SELECT created_ms FROM wesichain_runs WHERE run_id = ?", (run_id,))
        head = self.load(run_id)
        if not rows or head is None:
            return None
        return RunRecord(
            head=head,
            created_ms=int(rows[0][0]),
            messages=self.messages(run_id),
            checkpoints=self.checkpoints(run_id),
            events=self.events(run_id, count=1_000_000),
            results=self._all_results(run_id),
            callback_state=self.callback_state(run_id),
        )

    def list_runs(
        self, where: ListingFilter, before: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, RunHead]]:
        clauses: list[str] = ["tenant = ?"]
        params: list[Any] = [tenant_column(where.tenant)]
        filters = (("agent", where.agent), ("status", where.status), ("thread_id", where.thread_id))
        if any(value is not None and "\x00" in value for _, value in filters):
            # No run's agent, status or thread holds NUL (PostgreSQL's text cannot, and a
            # parameter holding one is refused, not compared): nothing archived matches.
            return []
        for column, value in filters:
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if where.since_ms is not None:
            clauses.append("created_ms >= ?")
            params.append(where.since_ms)
        paths = [(("agent_version",), where.version), (("error", "kind"), where.error_kind)]
        paths += [(("metadata", key), value) for key, value in sorted(where.metadata.items())]
        for path, wanted in paths:
            if wanted is not None:
                clause, values = self.db.json_string_is("head", path, wanted)
                clauses.append(clause)
                params += values
        if before is not None:
            clauses.append("(created_ms < ? OR (created_ms = ? AND run_id < ?))")
            params += [before[0], before[0], before[1]]
        j = self.db.json_text
        rows = self._rows(
            f"SELECT created_ms, {j('head')} FROM wesichain_runs WHERE {' AND '.join(clauses)}"
            " ORDER BY created_ms DESC, run_id DESC LIMIT ?",
            (*params, limit),
        )
        return [(int(ms), RunHead.model_validate_json(head)) for ms, head in rows]

    def thread_runs(self, tenant: str | None, thread_id: str) -> list[str]:
        rows = self._rows(
            "SELECT run_id FROM wesichain_runs WHERE tenant = ? AND thread_id = ?"
            " ORDER BY created_ms, run_id",
            (tenant_column(tenant), thread_id),
        )
        return [row[0] for row in rows]

    # -- retention --------------------------------------------------------------------------------

    def expired(
        self, ended_before: float, limit: int, *, tenant: str | None = None, exclude: Sequence[str] = ()
    ) -> list[tuple[str, str]]:
        clauses: list[str] = ["ended_at < ?"]
        params: list[Any] = [ended_before]
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if exclude:
            clauses.append(f"tenant NOT IN ({', '.join('?' * len(exclude))})")
            params += list(exclude)
        rows = self._rows(
            f"SELECT run_id, tenant FROM wesichain_runs WHERE {' AND '.join(clauses)}"
            " ORDER BY ended_at LIMIT ?",
            (*params, limit),
        )
        return [(row[0], row[1]) for row in rows]

    def delete(self, run_ids: Sequence[str], reason: str) -> int:
        if not run_ids:
            return 0
        db = self.db
        with db.transaction() as cur:
            where, params = db.any_of("run_id", run_ids)
            cur.execute(
                db.sql(
                    "INSERT INTO wesichain_deletions (run_id, tenant, agent, status, created_ms, ended_at,"
                    " deleted_at, reason) SELECT run_id, tenant, agent, status, created_ms, ended_at, ?, ?"
                    f" FROM wesichain_runs WHERE {where.replace('%s', '?')}"
                ),
                (time.time(), reason[:500], *params),
            )
            deleted = 0
            for table in TABLES:  # children first, the runs last
                cur.execute(f"DELETE FROM {table} WHERE {where}", params)
                if table == "wesichain_runs":
                    deleted = int(cur.rowcount)
            return deleted

    def deletions(self, tenant: str | None = None, limit: int = 1000) -> list[Deletion]:
        where = "WHERE tenant = ?" if tenant is not None else ""
        rows = self._rows(
            "SELECT run_id, tenant, agent, status, created_ms, ended_at, deleted_at, reason"
            f" FROM wesichain_deletions {where} ORDER BY deleted_at DESC, run_id LIMIT ?",
            (*([tenant] if tenant is not None else []), limit),
        )
        return [
            Deletion(
                run_id=r[0],
                tenant=r[1],
                agent=r[2],
                status=r[3],
                created_ms=int(r[4]),
                ended_at=float(r[5]),
                deleted_at=float(r[6]),
                reason=r[7],
            )
            for r in rows
        ]

    def close(self) -> None:
        self.db.close()


#: The tables of a run's parts, counted to verify what was written.
_COUNTED = ("wesichain_messages", "wesichain_checkpoints", "wesichain_events", "wesichain_tool_results")


def _run_row(record: StoredRun, now: float) -> tuple[Any, ...]:
    head = record.head
    return (
        head.run_id,
        tenant_column(head.tenant),
        head.agent,
        head.status,
        head.thread_id,
        record.created_ms,
        head.updated_at,
        now,
        head.version,
        head.model_dump_json(),
        record.callback_state,
    )


def _lrange(rows: list[tuple[Any, ...]], start: int, end: int) -> list[tuple[Any, ...]]:
    """Rows sliced as Redis's LRANGE slices a list (``end`` inclusive; negatives count from the end)."""
    n = len(rows)
    first = max(start + n if start < 0 else start, 0)
    last = min(end + n if end < 0 else end, n - 1)
    return rows[first : last + 1] if first <= last else []
