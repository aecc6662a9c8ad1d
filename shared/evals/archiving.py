"""Moving completed evals from Redis to the archive, as ended runs are moved: write and commit,
verify, then delete.

An eval that **completed** more than ``Settings.archive_after_s`` ago is read whole (its meta and
spec, its counters, its cases, every result row), written to the archive in one transaction
(skipped if the archive holds it: a pass that died after its commit), counted back from the
archive's rows, and only then are its keys deleted from Redis, by one script that deletes nothing
if the eval is no longer completed. A crash anywhere leaves it in Redis, in the archive or
in both until the next pass; the eval store reads Redis first, so it is never lost or shown twice.
Two archivers at once are harmless: the archive takes an eval once, and the deletion is checked.

A cancelled or budget-exhausted eval is not archived: it may be resumed (its keys stay in Redis
until it completes). Its case runs are ordinary runs, archived by the run archiver.
"""

from __future__ import annotations

import logging
from typing import Any

from shared.archive.base import EvalArchive
from shared.archive.record import EvalRecord
from shared.evals.store import EvalStore

__all__ = ["EvalArchiver"]

log = logging.getLogger("wesichain.archiver")


class EvalArchiver:
    """Moves completed evals of one deployment from its Redis to its archive."""

    def __init__(self, store: EvalStore, archive: EvalArchive) -> None:
        self.store = store
        self.archive = archive

    def run_once(self, ended_before: float) -> tuple[int, int]:
        """Archive every eval that completed before ``ended_before`` (Unix time); returns (archived
        now, found archived already: a pass died after its commit)."""
        archived = already = 0
        for eval_id in self._due(ended_before):
            record = self._read(eval_id)
            if record is None:
                continue
            new = self.archive.put_eval(record)
            held = self.archive.eval_summary(eval_id)
            if held != record.summary():
                log.error(
                    "eval %s: the archive holds %s, Redis %s: kept in Redis", eval_id, held, record.summary()
                )
                continue
            if self.store.drop(eval_id):
                # The reviews are in the archive with the eval: the archive answers for them now.
                tenant = record.meta.get("tenant") or None
                keys = self.store.keys
                self.store.redis.delete(
                    keys.eval_annotations(tenant, eval_id), keys.eval_annotation_log(tenant, eval_id)
                )
                archived += int(new)
                already += int(not new)
        return archived, already

    def _due(self, ended_before: float) -> list[str]:
        """Completed evals that finished before ``ended_before`` (the index holds every live eval)."""
        s = self.store
        ids = [_s(m) for m in s.redis.zrange(s.keys.evals_index(), 0, -1)]
        with s.redis.pipeline(transaction=False) as pipe:
            for eval_id in ids:
                pipe.hmget(s.keys.eval_meta(eval_id), ["status", "finished_at"])
            replies = pipe.execute()
        due = []
        for eval_id, (status, finished_ms) in zip(ids, replies, strict=True):
            if (
                _s(status) == "completed"
                and finished_ms is not None
                and float(finished_ms) / 1000 < ended_before
            ):
                due.append(eval_id)
        return due

    def _read(self, eval_id: str) -> EvalRecord | None:
        s, k = self.store, self.store.keys
        with s.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.eval_meta(eval_id))
            pipe.hgetall(k.eval_counts(eval_id))
            pipe.hgetall(k.eval_cases(eval_id))
            pipe.hgetall(k.eval_results(eval_id))
            meta_raw, counts_raw, cases_raw, results_raw = pipe.execute()
        meta = {_s(f): _s(v) for f, v in meta_raw.items()}
        if meta.get("status") != "completed":
            return None  # expired or resumed meanwhile
        tenant = meta.get("tenant") or None
        with s.redis.pipeline(transaction=True) as pipe:  # a label and its log entry are written together
            pipe.hgetall(k.eval_annotations(tenant, eval_id))
            pipe.lrange(k.eval_annotation_log(tenant, eval_id), 0, -1)
            labels_raw, log_raw = pipe.execute()
        return EvalRecord(
            eval_id=eval_id,
            meta=meta,
            counts={_s(f): int(v) for f, v in counts_raw.items()},
            cases={int(_s(i)): _s(body) for i, body in cases_raw.items()},
            results={_s(item): _s(body) for item, body in results_raw.items()},
            created_at=float(meta["created_at"]),
            finished_at=float(meta["finished_at"]) / 1000,
            annotations={_s(item): _s(body) for item, body in labels_raw.items()},
            annotation_log=[_s(body) for body in log_raw],
        )


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
