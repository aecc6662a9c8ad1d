"""Redis connections for the store: one client per process (after fork), bounded timeouts.

A ``rediss://`` URL gets the TLS parameters of :mod:`shared.tls` (the broker gets the same ones),
and a server that fails verification raises :class:`~shared.tls.RedisTlsError`, naming the URL.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from shared.errors import ConfigError
from shared.settings import Settings, redact_url
from shared.tls import RedisTlsError, describe, endpoint

__all__ = ["VerifiedSSLConnection", "check_tls", "connect", "embedded_redis", "preflight"]

_embedded_lock = threading.Lock()
_embedded: redis.Redis | None = None


class VerifiedSSLConnection(redis.SSLConnection):
    """redis-py's TLS connection; a failed verification raises :class:`RedisTlsError`."""

    def __init__(self, *args: Any, display_url: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.display_url = display_url

    def _connect(self) -> Any:
        try:
            return super()._connect()  # type: ignore[no-untyped-call]
        except ssl.SSLCertVerificationError as exc:
            raise RedisTlsError(self.display_url, describe(exc), self.ca_certs) from exc


def connect(settings: Settings, **overrides: Any) -> redis.Redis:
    if settings.embedded:
        return embedded_redis()
    target = endpoint(settings)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 25,
        # A command that fails on a dropped connection is sent again on a new one. Safe for the
        # run state: every script recognises its own replay (an op id), so a write whose reply
        # was lost is not applied twice.
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 4),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }
    if target.tls is not None:
        options.update(target.tls.options())
        options.update(connection_class=VerifiedSSLConnection, display_url=target.display)
    options.update(overrides)
    try:
        return redis.Redis.from_url(target.url, **options)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact_url(settings.redis_url)!r}: {exc}") from exc


def preflight(settings: Settings) -> None:
    """Check, before a worker starts, that the Redis URL leads to a Redis that will take us.

    Raises :class:`RedisTlsError` (the certificate does not verify) or :class:`ConfigError`
    (wrong credentials, or what answers is not Redis). An unreachable Redis passes: that is an
    outage, which the worker waits out like any other.
    """
    if settings.embedded:
        return
    check_tls(settings)
    client = connect(settings, retry=Retry(NoBackoff(), 0), health_check_interval=0, socket_timeout=5)
    url = redact_url(settings.redis_url)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise ConfigError(f"Redis at {url} refused the credentials: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError):
        return
    except redis.RedisError as exc:
        raise ConfigError(
            f"what answers at {url} does not speak Redis: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        client.close()


def check_tls(settings: Settings) -> None:
    """Raise :class:`RedisTlsError` if the ``rediss://`` server fails verification.

    One connection attempt, no retries. Only a verification failure raises: an unreachable Redis
    is an outage, which the caller's own retries are for.
    """
    if endpoint(settings).tls is None:
        return
    client = connect(settings, retry=Retry(NoBackoff(), 0), health_check_interval=0)
    try:
        client.ping()
    except RedisTlsError:
        raise
    except redis.RedisError:
        return
    finally:
        client.close()


def embedded_redis() -> redis.Redis:
    """The in-process Redis stand-in of the embedded mode (one per process, shared by all threads)."""
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            import fakeredis

            _embedded = fakeredis.FakeRedis(decode_responses=True)
        return _embedded
