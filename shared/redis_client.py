"""Redis connections for the store: one client per process (after fork), bounded timeouts.

A ``rediss://`` URL gets the TLS parameters of :mod:`shared.tls` (the broker gets the same ones),
and a server that fails verification raises :class:`~shared.tls.RedisTlsError`, naming the URL.

With ``Settings.redis_cluster`` the client is redis-py's :class:`~redis.cluster.RedisCluster`,
started from the URL's node (it learns the others from the cluster). It has the same commands;
every script and transaction of the store touches keys of one hash slot (``shared/keys.py``), and
it follows MOVED redirections and retries a failed node's commands once the cluster promoted a
replica, so a failover is an outage of a few seconds, like a restart.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any, cast

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from shared.errors import ConfigError
from shared.settings import ENV_REDIS_CLUSTER, Settings, redact_url
from shared.tls import RedisTlsError, describe, endpoint

__all__ = [
    "RECONNECTS",
    "VerifiedSSLConnection",
    "check_tls",
    "connect",
    "embedded_redis",
    "preflight",
    "reconnect_backoff",
]

#: How many times a command that fails on a dropped connection (or times out) is sent again, on a
#: new connection, with :func:`reconnect_backoff` between: a restarted Redis, or one that closed
#: idle connections, costs a command a reconnect rather than an error. Safe for the run state:
#: every script recognises its own replay, so a write whose reply was lost is not applied twice.
RECONNECTS = 4


def reconnect_backoff() -> ExponentialWithJitterBackoff:
    """The pause before each of :data:`RECONNECTS` (50 ms doubling, at most 1 s, jittered)."""
    return ExponentialWithJitterBackoff(base=0.05, cap=1.0)


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
    """The store's client for ``settings`` (a cluster client with ``redis_cluster``).

    A :class:`~redis.cluster.RedisCluster` is typed as :class:`redis.Redis` here: it answers the
    same commands, and the store relies on nothing else.
    """
    if settings.embedded:
        return embedded_redis()
    if settings.redis_cluster:
        return _connect_cluster(settings, **overrides)
    target = endpoint(settings)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 25,
        "retry": Retry(reconnect_backoff(), RECONNECTS),
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


def _connect_cluster(settings: Settings, **overrides: Any) -> redis.Redis:
    """redis-py's cluster client with the timeouts and TLS of :func:`connect`.

    Its retries are the cluster client's own (``retry``): on a connection error, a timeout or a
    cluster that is down it refreshes the slot map and tries again, which is what carries a command
    over a failover. The node connections themselves never retry (redis-py's rule for clusters).
    """
    from redis.cluster import RedisCluster

    target = endpoint(settings)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        # A failover takes the cluster's node timeout and an election: a few seconds. Retries back
        # off up to 1 s each, so about ten cover it; each replays only replay-safe scripts.
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 10),
    }
    if target.tls is not None:
        options.update(target.tls.options())
        display = target.display

        class _Verified(VerifiedSSLConnection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, display_url=display, **kwargs)

        options.update(ssl=True, connection_class=_Verified)
    overrides.pop("health_check_interval", None)  # node connections of a cluster take none
    options.update(overrides)
    try:
        client = RedisCluster.from_url(target.url, **options)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact_url(settings.redis_url)!r}: {exc}") from exc
    return cast(redis.Redis, client)


def preflight(settings: Settings) -> None:
    """Check, before a worker starts, that the Redis URL leads to a Redis that will take us.

    Raises :class:`RedisTlsError` (the certificate does not verify) or :class:`ConfigError`
    (wrong credentials, or what answers is not Redis). An unreachable Redis passes: that is an
    outage, which the worker waits out like any other.
    """
    if settings.embedded:
        return
    check_tls(settings)
    url = redact_url(settings.redis_url)
    try:
        client = connect(settings, retry=Retry(NoBackoff(), 0), health_check_interval=0, socket_timeout=5)
    except redis.RedisClusterException as exc:  # only the cluster client connects when it is made
        if "not enabled" in str(exc):
            raise ConfigError(
                f"Redis at {url} is not a Redis Cluster node (cluster mode is off there), but"
                f" {ENV_REDIS_CLUSTER}=1: unset it, or give a node of the cluster"
            ) from None
        return  # no node reachable: an outage
    except redis.AuthenticationError as exc:
        raise ConfigError(f"Redis at {url} refused the credentials: {exc}") from None
    try:
        client.ping()
        if not settings.redis_cluster and _cluster_enabled(client):
            raise ConfigError(
                f"Redis at {url} is a Redis Cluster node: set {ENV_REDIS_CLUSTER}=1 (and a broker URL of"
                " its own), or give a standalone Redis"
            )
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


def _cluster_enabled(client: redis.Redis) -> bool:
    try:
        return str(client.info("cluster").get("cluster_enabled", "0")) == "1"
    except redis.ResponseError:  # INFO renamed away: nothing to go by
        return False


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
