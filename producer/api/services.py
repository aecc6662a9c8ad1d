"""What one API process holds for its requests: the Redis clients, the run client, the tenants."""

from __future__ import annotations

import math
import time
from typing import Any, cast

import redis.asyncio as aioredis

from producer.api.config import ApiConfig
from producer.api.feeds import FeedHub
from producer.api.limits import StreamSlots, SubmitGate
from producer.client import Client
from shared.keys import Keys
from shared.scripts import LoopConnections
from shared.tenants import Tenants
from shared.tls import endpoint
from shared.workers import LiveWorker

__all__ = ["RECENT_WORKERS_S", "Services"]

#: How old the worker list a submit's answer is computed from may be (see ``recent_workers``).
RECENT_WORKERS_S = 1.0


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
        self._recent_workers: tuple[float, list[LiveWorker]] = (-math.inf, [])

    def recent_workers(self) -> list[LiveWorker]:
        """The live workers as read at most ``RECENT_WORKERS_S`` ago: for the answer to a submit,
        whose ``waiting_for`` needs them, without reading the registry at every submit (it changes
        at the workers' heartbeat, every ``registry_interval_s``)."""
        now = time.monotonic()
        read_at, live = self._recent_workers
        if now - read_at > RECENT_WORKERS_S:
            live = self.client.workers.live()
            self._recent_workers = (now, live)  # one assignment: threads see the old pair or the new
        return live

    def cached_workers(self) -> list[LiveWorker] | None:
        """:meth:`recent_workers` if that reads nothing now; None when it would read the registry."""
        read_at, live = self._recent_workers
        return live if time.monotonic() - read_at <= RECENT_WORKERS_S else None

    async def close(self) -> None:
        if self.loop_connections is not None:
            await self.loop_connections.close()
        await self.aredis.aclose()
        self.client.close()
