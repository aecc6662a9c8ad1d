"""Completed evals in the SQL archive (the tables of schema migration 3): written whole in one
transaction, read back as the eval store reads Redis (the same JSON, the same fields)."""

from __future__ import annotations

import json
import time
from typing import Any

from shared.archive.base import EvalArchive
from shared.archive.databases import Database
from shared.archive.record import EvalHead, EvalRecord
from shared.archive.schema import tenant_column

__all__ = ["SqlEvalArchive"]


class SqlEvalArchive(EvalArchive):
    """The eval half of :class:`~shared.archive.sql.SqlArchive`."""

    db: Database

    def _eval_rows(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self.db.transaction() as cur:
            cur.execute(self.db.sql(query), params)
            return list(cur.fetchall())

    def put_eval(self, record: EvalRecord) -> bool:
        db = self.db
        with db.transaction() as cur:
            cur.execute(db.sql("SELECT eval_id FROM wesichain_evals WHERE eval_id = ?"), (record.eval_id,))
            if cur.fetchall():
                return False
            cur.execute(
                db.sql(
                    "INSERT INTO wesichain_evals (eval_id, created_at, finished_at, archived_at, meta,"
                    " counts, cases, results, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                (
                    record.eval_id,
                    record.created_at,
                    record.finished_at,
                    time.time(),
                    json.dumps(record.meta),
                    json.dumps(record.counts),
                    len(record.cases),
                    len(record.results),
                    tenant_column(record.meta.get("tenant")),
                ),
            )
            cases = [(record.eval_id, index, body) for index, body in sorted(record.cases.items())]
            if cases:
                db.insert_many(cur, "wesichain_eval_cases (eval_id, idx, body)", 3, cases)
            results = [(record.eval_id, item, body) for item, body in sorted(record.results.items())]
            if results:
                db.insert_many(cur, "wesichain_eval_results (eval_id, item, body)", 3, results)
            reviews = [(record.eval_id, seq, 0, body) for seq, body in enumerate(record.annotation_log)]
            first = len(reviews)
            reviews += [
                (record.eval_id, first + n, 1, body)
                for n, (_, body) in enumerate(sorted(record.annotations.items()))
            ]
            if reviews:
                db.insert_many(cur, "wesichain_eval_annotations (eval_id, seq, latest, body)", 4, reviews)
            return True

    def eval_summary(self, eval_id: str) -> tuple[int, int] | None:
        """Counted from the rows themselves, not from the figures written beside them."""
        rows = self._eval_rows(
            "SELECT (SELECT COUNT(*) FROM wesichain_eval_cases WHERE eval_id = ?),"
            " (SELECT COUNT(*) FROM wesichain_eval_results WHERE eval_id = ?)"
            " FROM wesichain_evals WHERE eval_id = ?",
            (eval_id, eval_id, eval_id),
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def eval_head(self, eval_id: str) -> EvalHead | None:
        j = self.db.json_text
        rows = self._eval_rows(
            f"SELECT {j('meta')}, {j('counts')}, results FROM wesichain_evals WHERE eval_id = ?", (eval_id,)
        )
        if not rows:
            return None
        meta, counts, results = rows[0]
        return EvalHead(
            eval_id=eval_id,
            meta={str(k): str(v) for k, v in json.loads(meta).items()},
            counts={str(k): int(v) for k, v in json.loads(counts).items()},
            results=int(results),
        )

    def eval_cases(self, eval_id: str) -> dict[int, str]:
        j = self.db.json_text
        rows = self._eval_rows(
            f"SELECT idx, {j('body')} FROM wesichain_eval_cases WHERE eval_id = ?", (eval_id,)
        )
        return {int(index): str(body) for index, body in rows}

    def eval_results(self, eval_id: str) -> dict[str, str]:
        j = self.db.json_text
        rows = self._eval_rows(
            f"SELECT item, {j('body')} FROM wesichain_eval_results WHERE eval_id = ?", (eval_id,)
        )
        return {str(item): str(body) for item, body in rows}

    def eval_annotations(self, eval_id: str) -> tuple[dict[str, str], list[str]]:
        j = self.db.json_text
        rows = self._eval_rows(
            f"SELECT latest, {j('body')} FROM wesichain_eval_annotations WHERE eval_id = ? ORDER BY seq",
            (eval_id,),
        )
        latest: dict[str, str] = {}
        log: list[str] = []
        for is_latest, body in rows:
            if int(is_latest):
                latest[str(json.loads(body)["item"])] = str(body)
            else:
                log.append(str(body))
        return latest, log

    def list_evals(self, limit: int) -> list[tuple[float, str]]:
        rows = self._eval_rows(
            "SELECT created_at, eval_id FROM wesichain_evals ORDER BY created_at DESC, eval_id DESC LIMIT ?",
            (limit,),
        )
        return [(float(created), str(eval_id)) for created, eval_id in rows]

    def tenant_evals(self, tenant: str | None, limit: int) -> list[tuple[float, str]]:
        db = self.db
        with db.transaction() as cur:
            cur.execute(
                db.sql(
                    "SELECT created_at, eval_id FROM wesichain_evals WHERE tenant = ?"
                    " ORDER BY created_at DESC, eval_id DESC LIMIT ?"
                ),
                (tenant_column(tenant), limit),
            )
            rows = list(cur.fetchall())
            # An older release that had the archive open when it was migrated writes no tenant
            # (NULL): those evals (what it archived until it stopped) are told apart by their meta.
            # Without parameters: the member's expression holds '?' and backslashes of its own.
            cur.execute(
                f"SELECT created_at, eval_id, {db.json_member('meta', 'tenant')} FROM wesichain_evals"
                " WHERE tenant IS NULL"
            )
            rows += [(created, eval_id) for created, eval_id, of in cur.fetchall() if (of or None) == tenant]
        newest = sorted(((float(created), str(eval_id)) for created, eval_id in rows), reverse=True)
        return newest[:limit]
