"""What one API process holds for its requests: the Redis clients, the run client, the tenants."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry

from producer.api.config import ApiConfig
from producer.api.feeds import FeedHub
from producer.api.limits import ScanShares, StreamSlots, SubmitGate
from producer.client import Client
from shared.keys import Keys
from shared.redis_client import RECONNECTS, reconnect_backoff
from shared.scripts import LoopConnections
from shared.tenants import Tenants
from shared.tls import endpoint
from shared.workers import LiveWorker

__all__ = ["RECENT_WORKERS_S", "REFRESH_AHEAD", "Services"]

log = logging.getLogger("wesichain.api")

#: How old the worker list a submit's answer is computed from may be (see ``recent_workers``).
RECENT_WORKERS_S = 1.0
#: A cache the submit on the event loop answers from is read again, in the background, once this
#: share of its life is left (see ``Services.refresh_ahead``).
REFRESH_AHEAD = 0.5


class Services:
    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        settings = config.settings
        self.client = Client(settings)
        self.store = self.client.store
        self.keys: Keys = self.store.keys
        self.tenants = Tenants(self.store.redis, self.keys)
        # Each followed run has one feed waiting in XREAD BLOCK on a connection of its own, and a
        # stream catching up reads on another for a moment: the pool is as large as the number of
        # streams allowed (a stream over that number is refused, not queued).
        target = endpoint(settings)
        # A read waits at most one keep-alive interval in XREAD BLOCK, and a little more for the reply.
        options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": config.keepalive_s + 10}
        if target.tls is not None:
            options.update(target.tls.options())
        self.aredis: aioredis.Redis
        if settings.redis_cluster:
            # redis-py's asyncio cluster client: a pool per node, each as large as the streams allowed.
            cluster = aioredis.RedisCluster.from_url(
                target.url,
                decode_responses=True,
                max_connections=config.max_streams + 8,
                **({"ssl": True} if target.tls is not None else {}),
                **options,
            )
            self.aredis = cast(aioredis.Redis, cluster)
        else:
            self.aredis = aioredis.Redis(
                connection_pool=aioredis.BlockingConnectionPool.from_url(
                    target.url,
                    decode_responses=True,
                    max_connections=config.max_streams + 8,
                    timeout=5,
                    # As the sync client's (shared.redis_client.connect): a pooled connection Redis
                    # closed (a restart, an idle timeout) costs a read or a script a reconnect, not
                    # a 503 or a follower's stream. Every command sent here is a read, or a script
                    # that recognises its own replay (the submit's create).
                    retry=AsyncRetry(reconnect_backoff(), RECONNECTS),
                    retry_on_error=[redis.ConnectionError, redis.TimeoutError],
                    **options,
                )
            )
        #: Connections the event loop keeps for a submit's scripts (a single Redis only): at most
        #: 4 idle, of the 8 the pool holds beyond the streams'.
        self.loop_connections = None if settings.redis_cluster else LoopConnections(self.aredis)
        self.gate = SubmitGate(self.store, self.tenants, loop=self.loop_connections)
        #: Whether a submit can be served on the event loop (``producer/api/runs.py``): a single
        #: Redis, the store's, that is the broker too, so that the create script pushes the start.
        self.submits_on_loop = self.gate.serves_loop and self.client.pushes_starts and not settings.embedded
        self.feeds = FeedHub(self.aredis, max(1, int(config.keepalive_s * 1000)))
        self.streams = StreamSlots(config.max_streams, config.streams_per_tenant)
        self.scans = ScanShares()
        self._recent_workers: tuple[float, list[LiveWorker]] = (-math.inf, [])
        #: The background read of :meth:`refresh_ahead` under way, if any (one at a time).
        self._refreshing: asyncio.Future[None] | None = None

    def recent_workers(self) -> list[LiveWorker]:
        """The live workers as read at most ``RECENT_WORKERS_S`` ago: for the answer to a submit,
        whose ``waiting_for`` needs them, without reading the registry at every submit (it changes
        at the workers' heartbeat, every ``registry_interval_s``)."""
        live = self.cached_workers()
        return live if live is not None else self._read_workers()

    def _read_workers(self) -> list[LiveWorker]:
        """Read the registry: the live workers kept here, and the agents they serve for the client
        (one read serves both)."""
        read_at = time.monotonic()
        live = self.client.workers.live()
        self._recent_workers = (read_at, live)  # one assignment: threads see the old pair or the new
        self.client.note_live_workers(live, read_at)
        return live

    def cached_workers(self, for_s: float = 0.0) -> list[LiveWorker] | None:
        """:meth:`recent_workers` if that reads nothing now (nor for ``for_s`` seconds more); None
        when it would read the registry."""
        read_at, live = self._recent_workers
        return live if time.monotonic() - read_at <= RECENT_WORKERS_S - for_s else None

    def refresh_ahead(self, tenant: str | None) -> None:
        """Read again, once and off the event loop, whichever of the caches a submit on the loop
        answers from (``producer/api/runs.py``) is in the last part of its life: the worker
        registry, how full Redis is, the tenant's settings. Under a steady stream of submits they
        then never expire: had one expired, every submit arriving until it was read again would
        go to a worker thread and read it there, each on its own."""
        if self._refreshing is not None:
            return
        client = self.client
        workers = self.cached_workers(RECENT_WORKERS_S * REFRESH_AHEAD) is None or not client.registry_fresh(
            self.config.settings.registry_interval_s * REFRESH_AHEAD
        )
        memory = not client.memory_guard.fresh(client.memory_guard.interval_s * REFRESH_AHEAD)
        settings = tenant is not None and self.gate.cached(tenant, self.gate.cache_s * REFRESH_AHEAD) is None
        if not (workers or memory or settings):
            return
        job = asyncio.get_running_loop().run_in_executor(
            None, self._refresh, workers, memory, tenant if settings else None
        )
        self._refreshing = job
        job.add_done_callback(self._refreshed)

    def _refresh(self, workers: bool, memory: bool, tenant: str | None) -> None:
        if workers:
            self._read_workers()
        if memory:
            self.client.memory_guard.refresh()
        if tenant is not None:
            self.gate.refresh(tenant)

    def _refreshed(self, job: asyncio.Future[None]) -> None:
        self._refreshing = None
        if not job.cancelled() and (exc := job.exception()) is not None:
            # Nothing lost: a cache that expires sends the submits to read it themselves.
            log.warning("reading the submit's caches again failed: %s", exc)

    async def open(self) -> None:
        """Before the first request: on Redis Cluster, the asyncio client's map of the cluster.
        Left to the first requests, a burst of them met redis-py setting it up while their own
        commands were under way, and a command on a node connection it replaced failed with an
        ``AttributeError`` (a 500). Redis unreachable now: the first request maps it."""
        if self.config.settings.redis_cluster:
            try:
                await cast(aioredis.RedisCluster, self.aredis).initialize()
            except (redis.RedisError, redis.RedisClusterException, OSError) as exc:
                log.warning("the Redis Cluster could not be mapped yet: %s", exc)

    async def close(self) -> None:
        if self.loop_connections is not None:
            await self.loop_connections.close()
        await self.aredis.aclose()
        self.client.close()
