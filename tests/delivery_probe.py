"""Counts every task delivery a worker receives, in the test's Redis (``HINCRBY test:deliveries <task id>``).

Loaded into a test worker with ``celery worker --include tests.delivery_probe``: Celery's
``task_received`` signal fires once in the worker's main process for each message the broker hands
it, so tests count deliveries from what really arrived instead of parsing worker logs.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import redis
from celery.signals import task_received

DELIVERIES_KEY = "test:deliveries"


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["WESICHAIN_REDIS_URL"], decode_responses=True)


@task_received.connect
def _count(request: Any = None, **_: Any) -> None:
    if request is not None and request.id:
        _redis().hincrby(DELIVERIES_KEY, request.id, 1)
