"""The broker a test session runs against: the run state's Redis (the default) or RabbitMQ.

``pytest --broker rabbitmq`` runs the integration and chaos suites with RabbitMQ as the broker
(127.0.0.1:5672, guest/guest); the run state stays in the tests' own redis-servers. Each
redis-server a test starts gets a RabbitMQ virtual host of its own, created with ``rabbitmqctl``
when first asked for and deleted with the server, so tests stay as isolated as their servers make
them (a worker of one test never consumes another's messages). :class:`Settings` (the runtime's
settings, as the tests build them) and :mod:`worker.testing`'s processes both take the broker
of their Redis URL from :func:`broker_for`, installed there when this module is imported.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import amqp
import redis
from kombu.connection import Connection

from shared.settings import ENV_REDIS_CLUSTER
from shared.settings import Settings as RuntimeSettings
from worker.testing import brokers
from worker.testing.brokers import broker_env, is_cluster, register_cluster, unregister_cluster

__all__ = [
    "ENV_TEST_BROKER",
    "RABBITMQ",
    "Settings",
    "broker_env",
    "broker_for",
    "commit_publishes",
    "drop_all",
    "drop_broker_for",
    "is_cluster",
    "on_rabbitmq",
    "queued",
    "rabbitmq_available",
    "ready_on_rabbitmq",
    "redis_from_env",
    "register_cluster",
    "unregister_cluster",
    "vhost",
]

#: The RabbitMQ server of the machine (its default guest user only connects from loopback).
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"
#: ``rabbitmq`` while the session runs against RabbitMQ (set by ``--broker rabbitmq``).
ENV_TEST_BROKER = "WESICHAIN_TEST_BROKER"

_SESSION = uuid.uuid4().hex[:8]
_created: set[str] = set()


def commit_publishes(redis_url: str) -> bool:
    """Whether a commit script can push the next phase's message itself: the broker is the run
    state's own Redis (not RabbitMQ, nor the standalone broker beside a cluster)."""
    return not on_rabbitmq() and not is_cluster(redis_url)


def _ctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


def on_rabbitmq() -> bool:
    """Whether this test session runs against RabbitMQ."""
    return os.environ.get(ENV_TEST_BROKER) == "rabbitmq"


@functools.cache  # each rabbitmqctl run boots an Erlang VM (~0.5 s of CPU): asked once a process
def rabbitmq_available() -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    try:
        _ctl("list_vhosts")
    except (subprocess.SubprocessError, OSError):
        return False
    return True


def _create(name: str) -> str:
    _ctl("add_vhost", name)
    _created.add(name)
    _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    return f"{RABBITMQ}/{name}"


def _delete(name: str) -> None:
    if name in _created:
        _created.discard(name)
        _ctl("delete_vhost", name)


def _name_for(redis_url: str) -> str:
    return f"wesichain-test-{_SESSION}-{urlsplit(redis_url).port}"


def broker_for(redis_url: str) -> str:
    """The broker of the workers and clients of one redis-server: empty (that Redis) unless the
    session runs against RabbitMQ, then a virtual host of the server's own."""
    if not on_rabbitmq() or redis_url.startswith("memory://"):
        return brokers.cluster_broker(redis_url)
    name = _name_for(redis_url)
    return f"{RABBITMQ}/{name}" if name in _created else _create(name)


def drop_broker_for(redis_url: str) -> None:
    """Delete the virtual host of a redis-server that is going away (if it had one)."""
    _delete(_name_for(redis_url))


brokers.use_brokers(broker_for, drop_broker_for)


def drop_all() -> None:
    for name in list(_created):
        _delete(name)


@dataclass(frozen=True)
class Settings(RuntimeSettings):
    """The runtime's settings, on the broker this test session gives their Redis."""

    def __post_init__(self) -> None:
        if not self.broker_url:
            object.__setattr__(self, "broker_url", broker_for(self.redis_url))
        if is_cluster(self.redis_url):
            object.__setattr__(self, "redis_cluster", True)


@contextmanager
def vhost() -> Iterator[str]:
    """A new RabbitMQ virtual host (guest may do anything in it), deleted afterwards; yields its URL."""
    name = f"wesichain-test-{_SESSION}-{uuid.uuid4().hex[:8]}"
    try:
        yield _create(name)
    finally:
        _delete(name)


#: Where a worker that loaded ``tests.delivery_probe`` counts each task delivery it received (a hash
#: of task id -> deliveries, in its run-state Redis).
DELIVERIES_KEY = "test:deliveries"


def redis_from_env() -> redis.Redis:
    """A client of the run state's Redis named by the environment of a worker process (a cluster
    client when ``WESICHAIN_REDIS_CLUSTER=1``): where the test agents record their effects."""
    url = os.environ["WESICHAIN_REDIS_URL"]
    if os.environ.get(ENV_REDIS_CLUSTER) == "1":
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, decode_responses=True)  # type: ignore[return-value]
    return redis.Redis.from_url(url, decode_responses=True)


def queued(redis_url: str, queue: str) -> int:
    """Messages waiting in ``queue`` on the broker of ``redis_url``'s workers: the length of the
    Redis broker's list, or the ready messages of the RabbitMQ queue (0 for one not declared yet)."""
    url = broker_for(redis_url) or redis_url
    if not url.startswith("amqp"):
        client = redis.Redis.from_url(url)
        try:
            return int(client.llen(queue))
        finally:
            client.close()
    return ready_on_rabbitmq(url, queue)


def ready_on_rabbitmq(broker_url: str, queue: str) -> int:
    """The ready messages of a RabbitMQ queue (0 for one not declared yet), asked over AMQP: a
    passive declare takes milliseconds where ``rabbitmqctl list_queues`` boots an Erlang VM."""
    with Connection(broker_url) as conn:
        try:
            return int(conn.channel().queue_declare(queue=queue, passive=True).message_count)
        except amqp.exceptions.NotFound:
            return 0
