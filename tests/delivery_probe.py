"""Counts every task delivery a worker receives, in its run-state Redis (``HINCRBY test:deliveries
<task id>``).

Loaded into a test worker with ``celery worker --include tests.delivery_probe``: Celery's
``task_received`` signal fires once in the worker's main process for each message the broker hands
it, so tests count deliveries from what really arrived instead of parsing worker logs.

The count goes to the Redis of the runtime whose consumer received the message (its settings, as
the worker was configured), never to one named by an environment variable: a process that imported
this module without being a worker started from the environment (a test process running the
embedded mode) counts into its own store, or not at all for an app that is not a wesichain worker.
Tests read the key from :data:`tests.broker.DELIVERIES_KEY`, importing nothing that connects.
"""

from __future__ import annotations

from typing import Any

from celery.signals import task_received

from tests.broker import DELIVERIES_KEY

__all__ = ["DELIVERIES_KEY"]


@task_received.connect
def _count(sender: Any = None, request: Any = None, **_: Any) -> None:
    # ``sender`` is the consumer that received the message; its app carries the worker's runtime.
    holder = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
    if holder is None or request is None or not request.id:
        return
    holder.get().store.redis.hincrby(DELIVERIES_KEY, request.id, 1)
