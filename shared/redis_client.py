"""Redis connections for the store: one client per process (after fork), bounded timeouts."""

from __future__ import annotations

import threading

import redis

from shared.errors import ConfigError
from shared.settings import Settings, redact_url

_embedded_lock = threading.Lock()
_embedded: redis.Redis | None = None


def connect(settings: Settings) -> redis.Redis:
    if settings.embedded:
        return embedded_redis()
    try:
        return redis.Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            socket_timeout=10,
            socket_connect_timeout=5,
            health_check_interval=25,
            retry_on_timeout=True,
        )
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact_url(settings.redis_url)!r}: {exc}") from exc


def embedded_redis() -> redis.Redis:
    """The in-process Redis stand-in of the embedded mode (one per process, shared by all threads)."""
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            import fakeredis

            _embedded = fakeredis.FakeRedis(decode_responses=True)
        return _embedded
