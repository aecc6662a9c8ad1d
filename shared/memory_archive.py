"""Long-term memory in the run archive: each tenant's items copied to the archive database.

Items belong to a tenant, not to a run, so they are not archived with a run. Instead an *export*
makes the archive's copy of one tenant's memory follow Redis (each archiver pass exports every
tenant's; ``wesichain memory export`` does it at once):

- an item live in Redis is written to the archive when it is new there or changed since (its
  version or its write time differ); an unchanged one is not written again;
- an archived item Redis no longer has is kept when it *expired* (its archived ``expires_at`` has
  passed): that is what the archive is for, reading it after Redis let it go
  (``wesichain memory archived``);
- and removed when it did not expire: it was deleted, and a deletion is honoured in the archive.

So the archive holds each item as of the last export: an item written and expired between two
exports was never copied, and an item changed and then expired keeps its last exported value. The
archive is read by operators (the CLI); tools and the HTTP API read Redis only.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from shared.archive.base import MemoryArchive
from shared.archive.sql_memory import memory_path
from shared.memory import Item, Memory

__all__ = ["MemoryExport", "export_memory"]

#: Items written to the archive per transaction.
_BATCH = 500


@dataclass
class MemoryExport:
    """What one export of one tenant's memory did."""

    #: Items written to the archive (new, or changed since the last export).
    copied: int = 0
    #: Items the archive held already as they are in Redis.
    unchanged: int = 0
    #: Archived items that expired in Redis: kept in the archive.
    kept_expired: int = 0
    #: Archived items deleted from Redis: removed from the archive too.
    removed: int = 0

    def add(self, other: MemoryExport) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


def export_memory(memory: Memory, archive: MemoryArchive) -> MemoryExport:
    """Make the archive's copy of ``memory``'s tenant's items follow Redis (see the module)."""
    report = MemoryExport()
    archived = archive.archived_memory(memory.tenant)
    seen: set[tuple[str, str]] = set()
    changed: list[Item] = []
    for item in memory.items():
        entry = (memory_path(item.namespace), item.key)
        seen.add(entry)
        known = archived.get(entry)
        if known is not None and known[0] == item.version and known[1] == item.updated_at:
            report.unchanged += 1
            continue
        changed.append(item)
        if len(changed) >= _BATCH:
            report.copied += archive.put_memory(memory.tenant, changed)
            changed = []
    report.copied += archive.put_memory(memory.tenant, changed)
    now = time.time()
    deleted = []
    for entry, (_, _, expires_at) in archived.items():
        if entry in seen:
            continue
        if expires_at is not None and expires_at <= now:
            report.kept_expired += 1
        else:
            deleted.append(entry)
    report.removed = archive.drop_memory(memory.tenant, deleted)
    return report
