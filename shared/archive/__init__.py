"""The run archive: finished runs moved out of Redis into PostgreSQL or SQLite, read back as if
they were still there (see ``docs/operations.md``, "Archive")."""

from __future__ import annotations

from shared.archive.base import Archive, ListingFilter
from shared.archive.databases import open_database
from shared.archive.record import RunRecord, RunSummary, StoredRun
from shared.archive.sql import SqlArchive

__all__ = ["Archive", "ListingFilter", "RunRecord", "RunSummary", "StoredRun", "open_archive"]


def open_archive(url: str) -> Archive:
    """The archive at ``url`` (``postgresql://...`` or ``sqlite:///PATH``), its schema migrated."""
    return SqlArchive(open_database(url))
