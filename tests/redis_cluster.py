"""The suite's Redis Cluster: :mod:`worker.testing.cluster`, on the session's broker rule."""

from __future__ import annotations

import tests.broker  # noqa: F401  (installs the session's broker rule)
from worker.testing.cluster import ClusterNode, ClusterStore, RedisCluster, broker_redis, free_cluster_port

__all__ = ["ClusterNode", "ClusterStore", "RedisCluster", "broker_redis", "free_cluster_port"]
