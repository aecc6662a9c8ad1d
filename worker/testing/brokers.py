"""Which broker the workers and clients of a test's redis-server use.

By default a server's own Redis is its broker, but for a Redis Cluster (which Celery's Redis
transport cannot use): :class:`~worker.testing.cluster.ClusterStore` registers a standalone
redis-server as its broker here, and :func:`broker_env` hands it (and ``WESICHAIN_REDIS_CLUSTER=1``)
to the processes it starts. A test suite that runs its workers on another broker (RabbitMQ, a
virtual host per server) installs its own rule with :func:`use_brokers`.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.settings import ENV_BROKER_URL, ENV_REDIS_CLUSTER

__all__ = [
    "broker_env",
    "broker_for",
    "cluster_broker",
    "drop_broker_for",
    "is_cluster",
    "register_cluster",
    "unregister_cluster",
    "use_brokers",
]

#: Run-state URLs that are a Redis Cluster -> the standalone redis-server that is their broker.
_clusters: dict[str, str] = {}


def register_cluster(store_url: str, broker_url: str) -> None:
    """``store_url`` is a Redis Cluster's; its workers and clients use ``broker_url``'s Redis as the
    broker (or what the installed rule makes of it)."""
    _clusters[store_url] = broker_url


def unregister_cluster(store_url: str) -> None:
    _clusters.pop(store_url, None)


def is_cluster(redis_url: str) -> bool:
    return redis_url in _clusters


def cluster_broker(redis_url: str) -> str:
    """The registered broker of a cluster's URL; empty for any other URL (its own Redis)."""
    return _clusters.get(redis_url, "")


def _no_drop(redis_url: str) -> None:
    pass


_broker_for: Callable[[str], str] = cluster_broker
_drop: Callable[[str], None] = _no_drop


def use_brokers(broker_for: Callable[[str], str], drop: Callable[[str], None]) -> None:
    """Give the servers' processes the broker ``broker_for(redis_url)`` (empty: that Redis), and
    call ``drop(redis_url)`` when a server goes away (to delete what was made for it)."""
    global _broker_for, _drop
    _broker_for, _drop = broker_for, drop


def broker_for(redis_url: str) -> str:
    """The broker of the workers and clients of one redis-server: empty means that Redis."""
    return _broker_for(redis_url)


def drop_broker_for(redis_url: str) -> None:
    """Whatever was made for the broker of a redis-server that is going away."""
    _drop(redis_url)


def broker_env(redis_url: str) -> dict[str, str]:
    """The environment that gives a subprocess the broker of ``redis_url`` (nothing on Redis), and
    tells it when ``redis_url`` is a Redis Cluster."""
    url = broker_for(redis_url)
    env = {ENV_BROKER_URL: url} if url else {}
    if is_cluster(redis_url):
        env[ENV_REDIS_CLUSTER] = "1"
    return env
