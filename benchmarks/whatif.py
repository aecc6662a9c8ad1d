"""What-if worker apps for the profile: the runtime's app and the bare app with one setting changed.

Not a product configuration: ``python -m benchmarks.profile --whatif no-events`` starts workers
from these modules to measure what a proposed change to ``shared.settings.celery_config`` would
save, without editing it. ``BENCH_WHATIF`` selects the change (default ``no-events``):

* ``no-events``: ``worker_send_task_events`` and ``task_send_sent_event`` off (no monitoring
  events published to the ``celeryev`` fanout exchange for every task).
"""

from __future__ import annotations

import os
from typing import Any

WHATIF: dict[str, dict[str, Any]] = {
    "no-events": {"worker_send_task_events": False, "task_send_sent_event": False},
}

CHANGES = WHATIF[os.environ.get("BENCH_WHATIF", "no-events")]

if os.environ.get("BENCH_WHATIF_TARGET", "wesichain") == "bare":
    from benchmarks.bare import app
else:
    from worker.app import app

app.conf.update(CHANGES)

__all__ = ["app"]
