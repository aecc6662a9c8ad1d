"""The pool's archiving task: one bounded pass of the archiver, then of the archive's retention."""

from __future__ import annotations

from shared.archive.retention import ArchivePruner
from shared.archiver import Archiver
from shared.errors import ArchiveUnavailable
from shared.store import RunStore
from shared.tenants import Tenants

__all__ = ["ARCHIVE_PASS_BATCHES", "archive_pass"]

#: Batches one archiving task moves (and deletes) at most: a long backlog takes several beats,
#: none of them long.
ARCHIVE_PASS_BATCHES = 20


def archive_pass(store: RunStore) -> int:
    """Move ended runs to the archive, then delete what outlived its retention there; how many
    runs left Redis. Raises :class:`ArchiveUnavailable` when the database failed (the next beat
    tries again; the runs stay in Redis meanwhile)."""
    settings = store.settings
    limit = ARCHIVE_PASS_BATCHES * settings.archive_batch
    report = Archiver(store).run_once(max_runs=limit)
    if report.error:
        raise ArchiveUnavailable(report.error)
    if store.archive is not None:
        tenants = Tenants(store.redis, store.keys)
        ArchivePruner(store.archive, tenants, settings.archive_retention_days).prune(max_runs=limit)
    return report.archived + report.already_archived
