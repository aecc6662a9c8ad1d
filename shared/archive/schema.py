"""The archive's schema, created and migrated by the project: numbered steps and a version table.

Each migration is applied once, in order, in its own transaction, and recorded in
``wesichain_schema``; opening an archive applies the ones it lacks. A database at a newer version
than this code knows is refused (an older release must not write to a newer schema).

JSON columns hold pydantic models' JSON (``json`` in PostgreSQL, text in SQLite): the JSON the
runtime wrote to Redis, validated by its model when it was written, copied as it is, and
validated again whenever it is read back. Ended evals (their spec, counters,
cases and result rows) have tables of their own, keyed by eval id.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "NO_TENANT", "SCHEMA_TABLE", "TABLES", "migration", "tenant_column"]

SCHEMA_TABLE = "wesichain_schema"

#: The ``tenant`` column's value for what has no tenant (runs and memory without one, the operator's
#: evals): no tenant's name is ``-``.
NO_TENANT = "-"


def tenant_column(tenant: str | None) -> str:
    """``tenant`` as the tables' ``tenant`` column holds it."""
    return tenant or NO_TENANT


#: The run tables, children first (the order a run's rows are deleted in).
TABLES = (
    "wesichain_messages",
    "wesichain_events",
    "wesichain_checkpoints",
    "wesichain_tool_results",
    "wesichain_runs",
)

# ``{json}`` is the JSON column type, ``{float}`` a double. Listing reads (tenant, filter,
# created_ms, run_id) newest first; each filter of the listing has its index.
_V1 = """
CREATE TABLE wesichain_runs (
    run_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    thread_id TEXT,
    created_ms BIGINT NOT NULL,
    ended_at {float} NOT NULL,
    archived_at {float} NOT NULL,
    version INTEGER NOT NULL,
    head {json} NOT NULL,
    callback_state {json}
);
CREATE INDEX wesichain_runs_by_tenant ON wesichain_runs (tenant, created_ms, run_id);
CREATE INDEX wesichain_runs_by_agent ON wesichain_runs (tenant, agent, created_ms, run_id);
CREATE INDEX wesichain_runs_by_status ON wesichain_runs (tenant, status, created_ms, run_id);
CREATE INDEX wesichain_runs_by_thread ON wesichain_runs (tenant, thread_id, created_ms, run_id);
CREATE INDEX wesichain_runs_by_end ON wesichain_runs (ended_at);
CREATE TABLE wesichain_messages (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE wesichain_events (
    run_id TEXT NOT NULL,
    stream_ms BIGINT NOT NULL,
    stream_seq BIGINT NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (run_id, stream_ms, stream_seq)
);
CREATE TABLE wesichain_checkpoints (
    run_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (run_id, version)
);
CREATE TABLE wesichain_tool_results (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (run_id, step, call_id)
)
"""

# Deleting an archived run (its retention ran out, or an operator asked) leaves this record of it,
# written in the same transaction as the deletion.
_V2 = """
CREATE TABLE wesichain_deletions (
    run_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    agent TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    ended_at {float} NOT NULL,
    deleted_at {float} NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX wesichain_deletions_by_tenant ON wesichain_deletions (tenant, deleted_at);
CREATE INDEX wesichain_deletions_by_run ON wesichain_deletions (run_id)
"""

# A completed eval moved out of Redis: its meta hash and counters as JSON objects of their fields,
# each case and each result row (``variant:case:repeat``) as the JSON Redis held.
_V3 = """
CREATE TABLE wesichain_evals (
    eval_id TEXT PRIMARY KEY,
    created_at {float} NOT NULL,
    finished_at {float} NOT NULL,
    archived_at {float} NOT NULL,
    meta {json} NOT NULL,
    counts {json} NOT NULL,
    cases INTEGER NOT NULL,
    results INTEGER NOT NULL
);
CREATE INDEX wesichain_evals_by_creation ON wesichain_evals (created_at, eval_id);
CREATE TABLE wesichain_eval_cases (
    eval_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (eval_id, idx)
);
CREATE TABLE wesichain_eval_results (
    eval_id TEXT NOT NULL,
    item TEXT NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (eval_id, item)
)
"""

# A tenant's long-term memory items as last exported from Redis (``shared/memory_archive.py``):
# ``path`` is the namespace's labels joined by ``/`` (labels hold none), the value the item's JSON.
_V4 = """
CREATE TABLE wesichain_memory (
    tenant TEXT NOT NULL,
    path TEXT NOT NULL,
    item_key TEXT NOT NULL,
    value {json} NOT NULL,
    version INTEGER NOT NULL,
    created_at {float} NOT NULL,
    updated_at {float} NOT NULL,
    expires_at {float},
    exported_at {float} NOT NULL,
    PRIMARY KEY (tenant, path, item_key)
)
"""

# The human reviews of an archived eval: ``latest`` 1 for each reviewed case run's label, 0 for the
# entries of its log in order (``seq``), each the annotation's JSON.
_V5 = """
CREATE TABLE wesichain_eval_annotations (
    eval_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    latest INTEGER NOT NULL,
    body {json} NOT NULL,
    PRIMARY KEY (eval_id, seq)
)
"""

# Each archived eval's tenant ('-': the operator's, as in ``wesichain_runs``) in a column of its
# own, filled in for the evals archived before from their meta, so that a tenant's listing reads its
# own newest evals from an index, however many other tenants have. NULL is an eval written by an
# older release that still had the archive open (it knows no such column): the listing reads those
# by their meta. ``{meta_tenant}`` is the meta's ``tenant`` as text.
_V6 = """
ALTER TABLE wesichain_evals ADD COLUMN tenant TEXT;
UPDATE wesichain_evals SET tenant = COALESCE(NULLIF({meta_tenant}, ''), '-');
CREATE INDEX wesichain_evals_by_tenant ON wesichain_evals (tenant, created_at, eval_id)
"""

#: Migration n (1-based) is ``MIGRATIONS[n - 1]``: statements separated by ``;``.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)


def migration(number: int, json_type: str, float_type: str, meta_tenant: str) -> list[str]:
    """The statements of one migration in a dialect's column types (and its expression of an eval
    meta's tenant)."""
    text = MIGRATIONS[number - 1].format(json=json_type, float=float_type, meta_tenant=meta_tenant)
    return [statement.strip() for statement in text.split(";") if statement.strip()]
