"""The pool's archiving task: one bounded pass of the archiver, then of the archive's retention."""

from __future__ import annotations

import logging

from shared.archive.retention import ArchivePruner
from shared.archiver import Archiver
from shared.errors import ArchiveUnavailable
from shared.store import RunStore
from shared.tenants import Tenants

__all__ = ["ARCHIVE_PASS_BATCHES", "archive_pass"]

log = logging.getLogger("wesichain.archiver")

#: Batches one archiving task moves (and deletes) at most: a long backlog takes several beats,
#: none of them long.
ARCHIVE_PASS_BATCHES = 20


def archive_pass(store: RunStore) -> int:
    """Move ended runs to the archive, then delete what outlived its retention there; how many
    runs left Redis. Raises :class:`ArchiveUnavailable` when the database failed (the next beat
    tries again; the runs stay in Redis meanwhile)."""
    settings = store.settings
    limit = ARCHIVE_PASS_BATCHES * settings.archive_batch
    try:
        report = Archiver(store).run_once(max_runs=limit)  # logs a failure of its own pass
        if not report.error and store.archive is not None:
            tenants = Tenants(store.redis, store.keys)
            ArchivePruner(store.archive, tenants, settings.archive_retention_days).prune(max_runs=limit)
    except ArchiveUnavailable as exc:
        # The archive could not be opened, or its retention pass failed: said as the archiver
        # says its own failures (the task itself ends without a traceback, app.py).
        log.warning("archiving stopped, the runs stay in Redis: %s", exc)
        raise
    if report.error:
        raise ArchiveUnavailable(report.error)
    return report.archived + report.already_archived
