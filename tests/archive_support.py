"""Archives for tests: a PostgreSQL database of their own (created and dropped) or a SQLite file,
and a run read whole through the client, to compare before and after archiving."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from shared.archive import RunRecord
from shared.archive.databases import Database
from shared.archive.schema import SCHEMA_TABLE, migration
from shared.errors import RunErrorInfo
from shared.evals.store import EvalStore
from shared.events import Completed, Event, RunStarted, StepStarted
from shared.llm.base import Usage
from shared.messages import AssistantMessage, Message, SystemMessage, UserMessage
from shared.state import CallbackState, Phase, RunHead, ToolResult

# Runs made straight on a store live in the testing package (the archive benchmark makes them too).
from worker.testing.runs import ended_run, live_run

__all__ = [
    "BACKENDS",
    "POSTGRES",
    "FullRead",
    "archive_at_version_5",
    "archive_url",
    "ended_run",
    "eval_keys",
    "full_read",
    "sample_record",
    "stamped",
    "live_run",
    "postgres_database",
    "put_evals_without_tenant",
    "set_connections",
]

#: The PostgreSQL server of these machines (trust auth); tests create and drop their own database.
POSTGRES = "postgresql://postgres@127.0.0.1:5432"
BACKENDS = ("sqlite", "postgresql")


def _admin() -> Any:
    import psycopg

    return psycopg.connect(f"{POSTGRES}/postgres", autocommit=True, connect_timeout=5)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty database; its URL. Dropped afterwards (its connections are ended first)."""
    name = f"wesichain_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = _admin()
    except Exception as exc:  # no server: skip locally, fail under CI, as the Redis tests do
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is not reachable at {POSTGRES}: {exc}")
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def archive_url(backend: str, directory: Path) -> Iterator[str]:
    if backend == "postgresql":
        with postgres_database() as url:
            yield url
    else:
        yield f"sqlite:///{directory / 'archive.db'}"


def set_connections(url: str, allowed: bool) -> None:
    """Let a test database accept connections, or refuse them and end the ones it has (an outage)."""
    name = url.rsplit("/", 1)[1]
    with _admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
            )


@dataclass
class FullRead:
    """Everything a client can read of one run."""

    status: RunHead
    events: list[tuple[str | None, Event]]
    checkpoints: list[RunHead]
    messages: list[Message]
    results: dict[int, list[ToolResult]]
    callback: CallbackState | None
    listed: RunHead | None
    listed_by_status: RunHead | None


def full_read(client: Client, run_id: str) -> FullRead:
    handle = client.handle(run_id)
    status = handle.status()
    results = {
        step: sorted(client.store.load_results(run_id, step), key=lambda r: r.call_id)
        for step in range(1, status.step + 1)
    }

    def listed(**filters: Any) -> RunHead | None:
        cursor = None
        while True:
            page = client.list_runs(tenant=status.tenant, limit=100, cursor=cursor, **filters)
            for head in page.runs:
                if head.run_id == run_id:
                    return head
            if page.next_cursor is None:
                return None
            cursor = page.next_cursor

    return FullRead(
        status=status,
        events=[(e.stream_id, e) for e in handle.events(follow=False)],
        checkpoints=client.store.checkpoints(run_id),
        messages=client.store.load_messages(run_id),
        results=results,
        callback=handle.callback(),
        listed=listed(agent=status.agent),
        listed_by_status=listed(status=status.status),
    )


# -- records and evals as the archive holds them -------------------------------------------------


def stamped(stream_id: str, event: Event) -> tuple[str, Event]:
    event.stream_id = stream_id
    return stream_id, event


def sample_record(
    run_id: str,
    created_ms: int,
    *,
    tenant: str | None = "acme",
    agent: str = "a",
    thread_id: str | None = None,
    **head: object,
) -> RunRecord:
    start = RunHead.new_idle(run_id, agent, "question", tenant=tenant, thread_id=thread_id)
    done = start.model_copy(
        update={"phase": Phase.COMPLETED, "version": 3, "step": 1, "answer": "42", **head}
    )
    return RunRecord(
        head=done,
        created_ms=created_ms,
        messages=[
            SystemMessage(content="sys"),
            UserMessage(content="question"),
            AssistantMessage(content="42"),
        ],
        checkpoints=[start, start.model_copy(update={"version": 2}), done.model_copy(update={"epoch": 0})],
        events=[
            stamped(
                f"{created_ms}-0",
                RunStarted(run_id=run_id, step=0, agent=agent, agent_version="1", model="m"),
            ),
            stamped(f"{created_ms}-1", StepStarted(run_id=run_id, step=1)),
            stamped(f"{created_ms + 5}-0", Completed(run_id=run_id, step=1, answer="42", usage=Usage())),
        ],
        results=[
            (1, ToolResult(call_id="b", name="add", ok=True, output="3")),
            (
                1,
                ToolResult(
                    call_id="a",
                    name="add",
                    ok=False,
                    output="",
                    error=RunErrorInfo(kind="ToolDispatch", message="no"),
                ),
            ),
        ],
        callback_state=CallbackState(status="delivered", attempts=2).model_dump_json(),
    )


def eval_keys(store: EvalStore, eval_id: str) -> int:
    """How many of the eval's keys Redis holds."""
    k = store.keys
    return int(
        store.redis.exists(
            k.eval_meta(eval_id),
            k.eval_cases(eval_id),
            k.eval_pending(eval_id),
            k.eval_slots(eval_id),
            k.eval_scoring(eval_id),
            k.eval_results(eval_id),
            k.eval_counts(eval_id),
        )
    )


def archive_at_version_5(db: Database) -> None:
    """Make ``db``'s schema the one before the evals' tenant column (migrations 1 to 5)."""
    with db.transaction(exclusive=True) as cur:
        cur.execute(f"CREATE TABLE {SCHEMA_TABLE} (version INTEGER PRIMARY KEY, applied_at {db.float_type})")
        for number in range(1, 6):
            for statement in migration(number, db.json_type, db.float_type, db.json_member("meta", "tenant")):
                cur.execute(statement)
            cur.execute(db.sql(f"INSERT INTO {SCHEMA_TABLE} VALUES (?, ?)"), (number, time.time()))


def put_evals_without_tenant(db: Database, evals: list[tuple[str, float, dict[str, Any]]]) -> None:
    """Archive ``(eval id, created_at, meta)`` as a release before migration 6 writes an eval: no
    tenant column."""
    with db.transaction() as cur:
        for eval_id, created, meta in evals:
            cur.execute(
                db.sql(
                    "INSERT INTO wesichain_evals (eval_id, created_at, finished_at, archived_at, meta,"
                    " counts, cases, results) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                (eval_id, created, created, created, json.dumps(meta), "{}", 0, 0),
            )
