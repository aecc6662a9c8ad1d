"""An archiver that stops at a chosen point of its pass and waits there to be SIGKILLed.

``python -m tests.chaos.archive_victim POINT BATCH MARKER`` runs one pass of the real archiver
(settings from the environment, as ``wesichain archive``) and, at ``POINT`` of its ``BATCH``-th
batch (1-based), writes its pid to ``MARKER`` and sleeps until the test kills it:

* ``in_transaction`` — the batch's rows are written but not committed;
* ``after_commit`` — the batch is committed in the database, nothing is deleted from Redis yet;
* ``mid_delete`` — half of the batch is deleted from Redis, the other half not yet.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from shared.archiver import Archiver
from shared.redis_client import connect
from shared.settings import Settings
from shared.store import RunStore

#: How long the shard stays locked by the killed archiver (the next pass waits it out).
#: Long enough for the test to see the shard busy after the kill on a loaded machine, short
#: enough that waiting for it to expire costs the suite little.
LOCK_S = 5.0


def _stop_here(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    time.sleep(120)  # the test SIGKILLs this process meanwhile
    raise SystemExit("not killed")


def main(point: str, batch: int, marker: Path) -> None:
    settings = Settings.from_env()
    archiver = Archiver(RunStore(connect(settings), settings), lock_s=LOCK_S)
    seen = {"batches": 0}

    def this_batch() -> bool:
        seen["batches"] += 1
        return seen["batches"] == batch

    if point == "in_transaction":
        db = archiver.archive.db  # type: ignore[attr-defined]
        insert_many = db.insert_many

        def insert_then_stop(cur: Any, table: str, width: int, rows: Any) -> None:
            insert_many(cur, table, width, rows)
            if table.startswith("wesichain_checkpoints") and this_batch():  # rows written, no commit
                _stop_here(marker)

        db.insert_many = insert_then_stop
    elif point == "after_commit":
        put = archiver.archive.put_and_summarize

        def put_then_stop(records: Any) -> Any:
            written = put(records)
            if this_batch():
                _stop_here(marker)
            return written

        archiver.archive.put_and_summarize = put_then_stop  # type: ignore[method-assign]
    elif point == "mid_delete":
        drop_many = archiver._drop_many

        def drop_half_then_stop(runs: Any) -> list[str]:
            if not runs or runs[0][1] is None or not this_batch():
                return drop_many(runs)
            drop_many(runs[: len(runs) // 2])
            _stop_here(marker)
            return []

        archiver._drop_many = drop_half_then_stop  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown point {point!r}")
    archiver.run_once(after_s=0)
    raise SystemExit("the pass ended without reaching its stop")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
