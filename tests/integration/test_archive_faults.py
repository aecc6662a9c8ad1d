"""The run archive's database failing under real processes: a PostgreSQL database of the test's own
that starts refusing connections and ends the ones it has, then accepts them again.
"""

from __future__ import annotations

import pytest

from shared.archive.databases import Postgres
from shared.archive.sql import SqlArchive
from shared.errors import ArchiveUnavailable
from tests.archive_support import postgres_database, set_connections


def test_the_first_read_after_the_database_is_back_connects() -> None:
    """Reads that failed while the database refused connections leave no connect attempt asleep in
    a long pause: the first read once the database is back reaches it."""
    with postgres_database() as url:
        # One connection and a one-second wait: each read that fails takes the wait. After four,
        # a connect attempt still retrying with doubling pauses (1, 2, 4 s) would be in a pause
        # that outlasts the next read's wait, which then failed with the database back.
        archive = SqlArchive(Postgres(url, max_connections=1, timeout_s=1.0))
        try:
            assert archive.load("no-such-run") is None
            set_connections(url, allowed=False)
            try:
                for _ in range(4):
                    with pytest.raises(ArchiveUnavailable):
                        archive.load("no-such-run")
            finally:
                set_connections(url, allowed=True)
            assert archive.load("no-such-run") is None
        finally:
            archive.close()
