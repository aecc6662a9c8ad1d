"""Moving finished runs from Redis to the archive: write and commit, verify, then delete.

The commit script enters every run that ends in its shard's *ended* set, scored by when it ended.
A pass of the archiver takes, shard by shard, the runs that ended more than
``Settings.archive_after_s`` ago, in batches of ``Settings.archive_batch``:

1. read each run whole from Redis (head, conversation, checkpoints, events, tool results) with
   the ``archive_read`` and ``archive_results`` scripts: the head parsed, every other part kept
   as the JSON the runtime wrote (``StoredRun``);
2. write the batch to the database and read back what it holds of each run, in one transaction,
   and commit it (runs already there are skipped: a pass that died after its commit left them);
3. compare what was read back with what was read;
4. only then delete the runs' keys and index entries from Redis with the ``archive_drop``
   script, which deletes nothing of a run unless it is still ended at the version archived.

Each script takes up to ``_RUNS_PER_CALL`` runs a call (a call holds Redis for its whole length);
a batch's calls go in one round trip.

A crash anywhere leaves each run in Redis, in the archive, or in both until the next pass (reads
prefer Redis and listings show it once): never lost, never archived twice. A database outage
stops the pass with every run still in Redis. One archiver works a shard at a time (a lock per
shard), so archivers on several hosts share the work.

A run whose completion callback is still being delivered waits (its entry is moved to the back);
everything else that ended is archived, so Redis keeps live and recently ended runs only. Each
pass then moves the evals that completed as long ago (``shared/evals/archiving.py``), and exports
every tenant's long-term memory items (``shared/memory_archive.py``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from shared.archive import Archive, StoredRun
from shared.errors import ArchiveUnavailable
from shared.evals.archiving import EvalArchiver
from shared.evals.store import EvalStore
from shared.memory import memory_of
from shared.memory_archive import export_memory
from shared.scripts import register_scripts, run_many
from shared.search_index import index_dimensions
from shared.state import RunHead
from shared.store import RunStore
from shared.tenants import Tenants

__all__ = ["ArchiveReport", "Archiver"]

log = logging.getLogger("wesichain.archiver")

_T = TypeVar("_T")


@dataclass
class ArchiveReport:
    """What one pass did."""

    #: Runs written to the archive and removed from Redis.
    archived: int = 0
    #: Runs the archive already held (a pass died after its commit): removed from Redis now.
    already_archived: int = 0
    #: Ended runs left for later: a callback still being delivered, or the run changed meanwhile.
    deferred: int = 0
    #: Entries of runs whose keys had expired before they were archived (nothing to archive).
    gone: int = 0
    #: Runs whose archived copy did not match Redis's: kept in Redis (an error is logged) and
    #: tried again by the next pass.
    mismatched: int = 0
    #: Shards another archiver was working on.
    shards_busy: int = 0
    #: Completed evals written to the archive and removed from Redis.
    evals_archived: int = 0
    #: Completed evals the archive already held (a pass died after its commit): removed now.
    evals_already_archived: int = 0
    #: Long-term memory items copied to the archive (new or changed), and archived items removed
    #: because they were deleted from Redis (``shared/memory_archive.py``).
    memory_copied: int = 0
    memory_removed: int = 0
    #: Why the pass stopped early (the database failed), else "".
    error: str = ""
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class Archiver:
    """Moves ended runs of one deployment from its Redis to its archive."""

    def __init__(self, store: RunStore, archive: Archive | None = None, *, lock_s: float = 30.0) -> None:
        archive = archive or store.archive
        if archive is None:
            raise ArchiveUnavailable("no archive is configured (WESICHAIN_ARCHIVE_URL)")
        self.store = store
        self.archive = archive
        self.settings = store.settings
        self.keys = store.keys
        self.redis = store.redis
        scripts = register_scripts(store.redis)
        self._lock = scripts["lock"]
        self._read_runs = scripts["archive_read"]
        self._read_results = scripts["archive_results"]
        self._drop = scripts["archive_drop"]
        self.token = uuid.uuid4().hex
        #: How long a shard stays locked to this archiver without a new batch (renewed per batch).
        #: A batch that outlasts it is still safe: the database refuses a run written twice.
        self.lock_s = lock_s

    def run_once(self, *, after_s: float | None = None, max_runs: int | None = None) -> ArchiveReport:
        """One pass over every shard: archive the runs that ended ``after_s`` ago or earlier."""
        started = time.monotonic()
        report = ArchiveReport()
        wait_s = self.settings.archive_after_s if after_s is None else after_s
        cutoff_ms = self._now_ms() - int(wait_s * 1000)
        try:
            for shard in range(self.keys.shards):
                if max_runs is not None and report.archived + report.already_archived >= max_runs:
                    break
                if not self._hold(shard):
                    report.shards_busy += 1
                    continue
                try:
                    self._shard(shard, cutoff_ms, report, max_runs)
                finally:
                    self._release(shard)
            evals = EvalStore(self.redis, self.keys, self.settings.retention_s)
            report.evals_archived, report.evals_already_archived = EvalArchiver(evals, self.archive).run_once(
                cutoff_ms / 1000
            )
            self._memory(report)
        except ArchiveUnavailable as exc:
            report.error = str(exc)
            log.warning("archiving stopped, the runs stay in Redis: %s", exc)
        report.seconds = round(time.monotonic() - started, 3)
        return report

    def _memory(self, report: ArchiveReport) -> None:
        """Export every tenant's long-term memory (and that of runs without a tenant)."""
        for tenant in [None, *Tenants(self.redis, self.keys).names()]:
            done = export_memory(memory_of(self.redis, self.keys, tenant), self.archive)
            report.memory_copied += done.copied
            report.memory_removed += done.removed

    def _shard(self, shard: int, cutoff_ms: int, report: ArchiveReport, max_runs: int | None) -> None:
        ended = self.keys.ended(shard)
        batch_size = self.settings.archive_batch
        while True:
            if max_runs is not None:
                batch_size = min(batch_size, max_runs - report.archived - report.already_archived)
                if batch_size <= 0:
                    return
            ids = [_s(r) for r in self.redis.zrangebyscore(ended, "-inf", cutoff_ms, start=0, num=batch_size)]
            if not ids:
                return
            self._hold(shard)  # extend the lock for this batch
            self._batch(shard, ids, report)

    def _batch(self, shard: int, ids: list[str], report: ArchiveReport) -> None:
        records, later, gone = self._read(ids)
        if later:
            # Its callback is still being delivered: look again once it has waited as long again.
            self._to_back(shard, later)
            report.deferred += len(later)
        if gone:
            self._drop_many([(run_id, None) for run_id in gone])
            report.gone += len(gone)
        if not records:
            return
        before, after = self.archive.put_and_summarize(records)
        verified, mismatched = [], []
        for record in records:
            held = after.get(record.run_id)
            if held != record.summary():
                mismatched.append(record.run_id)
                log.error(
                    "run %s: the archive holds %s, Redis %s: kept in Redis",
                    record.run_id,
                    held,
                    record.summary(),
                )
                continue
            verified.append(record)
        if mismatched:
            # To the back of the ended set, as if it had just ended: this pass goes on with the
            # others instead of reading it again and again, and the next one tries it again.
            self._to_back(shard, mismatched)
            report.mismatched += len(mismatched)
        outcomes = self._drop_many([(r.run_id, r.head) for r in verified])
        for record, outcome in zip(verified, outcomes, strict=True):
            if outcome == "changed":
                report.deferred += 1
            elif record.run_id in before:
                report.already_archived += 1
            else:
                report.archived += 1

    # -- Redis -----------------------------------------------------------------------------------

    def _to_back(self, shard: int, run_ids: list[str]) -> None:
        """Score ended runs as if they had ended now (only runs still in the set)."""
        self.redis.zadd(self.keys.ended(shard), dict.fromkeys(run_ids, self._now_ms()), xx=True)

    def _read(self, ids: list[str]) -> tuple[list[StoredRun], list[str], list[str]]:
        """The runs of ``ids`` read whole; the ones to look at later; the ones whose keys are gone."""
        k = self.keys
        calls: list[tuple[list[str], list[str]]] = [
            (
                [
                    key
                    for run_id in chunk
                    for key in (k.run(run_id), k.messages(run_id), k.checkpoints(run_id), k.events(run_id))
                ],
                [],
            )
            for chunk in _chunks(ids)
        ]
        replies = [reply for chunk in run_many(self.redis, self._read_runs, calls) for reply in chunk]
        ready: list[tuple[RunHead, list[Any]]] = []
        later: list[str] = []
        gone: list[str] = []
        for run_id, reply in zip(ids, replies, strict=True):
            if not reply:
                gone.append(run_id)
            elif len(reply) == 1:
                later.append(run_id)
            else:
                # Only the head is parsed (its columns and indexes come from it): every other part
                # is copied as the JSON the runtime wrote (``StoredRun``).
                ready.append((RunHead.compose(_s(reply[0]), _s(reply[1]), int(reply[2])), reply))
        steps = [k.results(head.run_id, step) for head, _ in ready for step in range(1, head.step + 1)]
        results = (
            dict(zip(fields[::2], fields[1::2], strict=True))
            for chunk in run_many(self.redis, self._read_results, [(keys, []) for keys in _chunks(steps)])
            for fields in chunk
        )
        records = []
        for head, (_, _, _, created, callback_state, messages, checkpoints, events) in ready:
            records.append(
                StoredRun(
                    head=head,
                    created_ms=int(created or 0),
                    messages=[_s(m) for m in messages],
                    checkpoints=[(_checkpoint_version(b), _s(b)) for b in checkpoints],
                    events=[
                        (_s(events[i]), _event_json(events[i], events[i + 1]))
                        for i in range(0, len(events), 2)
                    ],
                    results=[
                        (step, _s(call_id), _s(raw))
                        for step in range(1, head.step + 1)
                        for call_id, raw in sorted(next(results).items())
                    ],
                    callback_state=None if callback_state is None else _s(callback_state),
                )
            )
        return records, later, gone

    def _parts(self, head: RunHead) -> list[str]:
        """Every key of the run but its hash."""
        k, run_id = self.keys, head.run_id
        return [
            k.messages(run_id),
            k.checkpoints(run_id),
            k.events(run_id),
            k.attempts(run_id),
            *(k.results(run_id, step) for step in range(1, head.step + 1)),
        ]

    def _indexes(self, head: RunHead) -> list[str]:
        """The listing indexes the run is in (its status index is its final status's)."""
        k, run_id, tenant = self.keys, head.run_id, head.tenant
        declared = self.settings.search_attributes
        return [k.index_of(run_id, tenant, dim, value) for dim, value in index_dimensions(head, declared)]

    def _drop_many(self, runs: list[tuple[str, RunHead | None]]) -> list[str]:
        """Delete runs from Redis, each with the head archived (None: its keys are gone already)."""
        k = self.keys
        calls = []
        for chunk in _chunks(runs):
            keys: list[str] = []
            args: list[str | int] = []
            for run_id, head in chunk:
                parts = self._parts(head) if head is not None else []
                indexes = self._indexes(head) if head is not None else []
                keys += [k.run(run_id), k.leases_of(run_id), k.runs_index_of(run_id), k.ended_of(run_id)]
                keys += parts
                keys += indexes
                args += [run_id, head.version if head is not None else 0, len(parts), len(indexes)]
            calls.append((keys, args))
        return [_s(outcome) for outcomes in run_many(self.redis, self._drop, calls) for outcome in outcomes]

    def _hold(self, shard: int) -> bool:
        ttl_ms = int(self.lock_s * 1000)
        return int(self._lock(keys=[self.keys.archiver_lock(shard)], args=[self.token, ttl_ms, "hold"])) == 1

    def _release(self, shard: int) -> None:
        self._lock(keys=[self.keys.archiver_lock(shard)], args=[self.token, 0, "release"])

    def _now_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


#: Runs (or step results) per call of the archiver's scripts: a call holds Redis for its whole
#: length, so a batch goes in several calls, sent together in one round trip.
_RUNS_PER_CALL = 25


def _chunks(items: list[_T]) -> list[list[_T]]:
    return [items[i : i + _RUNS_PER_CALL] for i in range(0, len(items), _RUNS_PER_CALL)]


def _event_json(stream_id: Any, event: Any) -> str:
    if event is None:  # written by something else than the runtime: not an event to archive
        raise ValueError(f"the stream entry {_s(stream_id)} holds no event")
    return _s(event)


def _checkpoint_version(body: str | bytes) -> int:
    """The version a checkpoint's body (``RunHead.dump_body``) records: a JSON parse, no model."""
    return int(json.loads(body).get("version", 0))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
