"""Run stores of a test's own on a shared redis-server: each under a fresh key prefix."""

from __future__ import annotations

import uuid
from typing import Any

import redis

from shared.settings import Settings
from shared.store import RunStore


def make_store(rds: redis.Redis, **settings: Any) -> RunStore:
    return RunStore(rds, Settings(prefix=f"t-{uuid.uuid4().hex[:10]}:", retention_s=3600, **settings))


def redis_ms(store: RunStore) -> int:
    seconds, micros = store.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000
