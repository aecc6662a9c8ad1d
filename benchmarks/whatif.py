"""What-if worker apps for the profile: the bare app with one Celery setting changed.

Not a product configuration: ``python -m benchmarks.profile --target bare+events`` starts a worker
from this module to measure what a setting would cost the floor, without editing
``shared.settings.celery_config``. (The runtime's own workers get the same change through their
settings: ``WESICHAIN_TASK_EVENTS=1``.) ``BENCH_WHATIF`` selects the change (default ``events``):

* ``events``: ``worker_send_task_events`` and ``task_send_sent_event`` on (a monitoring event
  published to the ``celeryev`` fanout exchange for every task, as with Flower watching), the
  runtime's default before the profile turned them off.

``BENCH_WHATIF_TARGET=wesichain`` applies the change to the runtime's app instead.
"""

from __future__ import annotations

import os
from typing import Any

WHATIF: dict[str, dict[str, Any]] = {
    "events": {"worker_send_task_events": True, "task_send_sent_event": True},
}

CHANGES = WHATIF[os.environ.get("BENCH_WHATIF", "events")]

if os.environ.get("BENCH_WHATIF_TARGET", "bare") == "bare":
    from benchmarks.bare import app
else:
    from worker.app import app

app.conf.update(CHANGES)

__all__ = ["app"]
