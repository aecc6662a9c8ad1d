"""Counts every task delivery a worker receives, in the test's Redis (``HINCRBY test:deliveries <task id>``).

Loaded into a test worker with ``celery worker --include tests.delivery_probe``: Celery's
``task_received`` signal fires once in the worker's main process for each message the broker hands
it, so tests count deliveries from what really arrived instead of parsing worker logs.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import redis
from celery.signals import task_received

from tests.broker import redis_from_env

DELIVERIES_KEY = "test:deliveries"


@cache
def _redis() -> redis.Redis:
    return redis_from_env()


@task_received.connect
def _count(request: Any = None, **_: Any) -> None:
    if request is not None and request.id:
        _redis().hincrby(DELIVERIES_KEY, request.id, 1)
