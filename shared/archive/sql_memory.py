"""Long-term memory items in the SQL archive (the table of schema migration 4): a copy of each
tenant's items as last exported from Redis (``shared/memory_archive.py``), read back as items."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from shared.archive.base import MemoryArchive
from shared.archive.databases import Database
from shared.archive.schema import tenant_column
from shared.memory import Item

__all__ = ["SqlMemoryArchive", "memory_path"]


def memory_path(namespace: Sequence[str]) -> str:
    """A namespace as the archive's ``path`` (labels hold no ``/``)."""
    return "/".join(namespace)


class SqlMemoryArchive(MemoryArchive):
    """The memory half of :class:`~shared.archive.sql.SqlArchive`."""

    db: Database

    def archived_memory(self, tenant: str | None) -> dict[tuple[str, str], tuple[int, float, float | None]]:
        db = self.db
        with db.transaction() as cur:
            cur.execute(
                db.sql(
                    "SELECT path, item_key, version, updated_at, expires_at FROM wesichain_memory"
                    " WHERE tenant = ?"
                ),
                (tenant_column(tenant),),
            )
            rows = cur.fetchall()
        return {
            (str(path), str(key)): (int(version), float(updated), None if expires is None else float(expires))
            for path, key, version, updated, expires in rows
        }

    def put_memory(self, tenant: str | None, items: Sequence[Item]) -> int:
        if not items:
            return 0
        db, who, now = self.db, tenant_column(tenant), time.time()
        with db.transaction() as cur:
            for item in items:
                cur.execute(
                    db.sql("DELETE FROM wesichain_memory WHERE tenant = ? AND path = ? AND item_key = ?"),
                    (who, memory_path(item.namespace), item.key),
                )
            rows = [
                (
                    who,
                    memory_path(item.namespace),
                    item.key,
                    json.dumps(item.value, ensure_ascii=False, separators=(",", ":")),
                    item.version,
                    item.created_at,
                    item.updated_at,
                    item.expires_at,
                    now,
                )
                for item in items
            ]
            cur.executemany(
                db.sql(
                    "INSERT INTO wesichain_memory (tenant, path, item_key, value, version, created_at,"
                    " updated_at, expires_at, exported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                rows,
            )
        return len(items)

    def drop_memory(self, tenant: str | None, entries: Sequence[tuple[str, str]]) -> int:
        if not entries:
            return 0
        db, who, dropped = self.db, tenant_column(tenant), 0
        with db.transaction() as cur:
            for path, key in entries:
                cur.execute(
                    db.sql("DELETE FROM wesichain_memory WHERE tenant = ? AND path = ? AND item_key = ?"),
                    (who, path, key),
                )
                dropped += max(cur.rowcount, 0)
        return dropped

    def memory_items(
        self,
        tenant: str | None,
        prefix: Sequence[str] = (),
        *,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> list[Item]:
        db = self.db
        where, params = "tenant = ?", [tenant_column(tenant)]
        if prefix:
            start = memory_path(prefix)
            where += " AND (path = ? OR path LIKE ? ESCAPE '\\')"
            params += [start, _like_prefix(start + "/")]
        if after is not None:
            where += " AND (path > ? OR (path = ? AND item_key > ?))"
            params += [after[0], after[0], after[1]]
        query = (
            f"SELECT path, item_key, {db.json_text('value')}, version, created_at, updated_at, expires_at"
            f" FROM wesichain_memory WHERE {where} ORDER BY path, item_key LIMIT ?"
        )
        with db.transaction() as cur:
            cur.execute(db.sql(query), (*params, limit))
            rows = cur.fetchall()
        return [_item(row) for row in rows]


def _like_prefix(text: str) -> str:
    # Labels are letters, digits and _ . : @ + = - : only _ is a LIKE wildcard among them.
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"


def _item(row: tuple[Any, ...]) -> Item:
    path, key, value, version, created, updated, expires = row
    return Item(
        namespace=str(path).split("/"),
        key=str(key),
        value=json.loads(value) if isinstance(value, str) else dict(value),
        created_at=float(created),
        updated_at=float(updated),
        expires_at=None if expires is None else float(expires),
        version=int(version),
    )
