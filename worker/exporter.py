"""``wesichain metrics``: the pool's state for Prometheus, read from Redis and the broker at each scrape.

Each worker serves what it did (``worker/metrics.py``); this exporter serves what is true of the
whole pool at the moment of the scrape, which no single worker knows and which must be counted
once: how deep each queue is, how many messages workers hold unacknowledged, how many runs are in
flight or parked for approval (per tenant), how many leases the sweeper watches and how many are
due, how many workers are live and consuming, how many runs wait for an agent version no live
worker serves, and how many slots of each configured provider limit are in use. Run one per
deployment. A scrape reads a bounded number of keys (a few per
shard, queue and tenant); it never scans the key space.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from shared.limits import scope_of
from shared.pool import DEFAULT_QUEUES, PRIORITY_STEPS, known_queues
from shared.settings import Settings, celery_config
from shared.store import RunStore
from shared.versions import PinnedRuns, VersionLoad, waiting_loads
from shared.workers import LiveWorker, WorkerDirectory

__all__ = [
    "MAX_TENANT_LABELS",
    "MAX_VERSION_LABELS",
    "PoolCollector",
    "QUEUES",
    "serve_pool",
]

log = logging.getLogger("wesichain.exporter")

QUEUES = DEFAULT_QUEUES
#: Tenants given a label of their own; the rest are summed under ``other``.
MAX_TENANT_LABELS = 200
#: Agent versions given a label of their own among those runs wait for; the rest are summed under
#: ``other`` (versions come from deployed code, not producers, but a pool may keep many).
MAX_VERSION_LABELS = 50


class PoolCollector(Collector):
    """Reads the pool's state at each scrape (see the module's docstring for what)."""

    def __init__(self, store: RunStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.directory = WorkerDirectory(store.redis, store.keys, settings.registry_interval_s)
        self.broker_prefix = celery_config(settings)["broker_transport_options"].get("global_keyprefix", "")

    def describe(self) -> list[Any]:
        return []  # collected fresh each scrape; nothing to register up front

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("wesichain_up", "1 if Redis answered this scrape")
        try:
            families = list(self._families())
        except redis.RedisError as exc:
            log.warning("scrape failed: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> Iterator[Any]:
        r, keys = self.store.redis, self.store.keys
        shards = range(keys.shards)
        tenants = ["-", *sorted(str(t) for t in r.smembers(keys.tenants()))]
        now_s, now_us = r.time()
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        sep = "\x06\x16"
        live = self.directory.live()
        queues = self._queues(live)
        with r.pipeline(transaction=False) as pipe:
            for queue in queues:
                for step in PRIORITY_STEPS:
                    pipe.llen(self.broker_prefix + (queue if step == 0 else f"{queue}{sep}{step}"))
            pipe.hlen(self.broker_prefix + "unacked")
            for shard in shards:
                pipe.hgetall(keys.inflight(shard))
                pipe.zcard(keys.leases(shard))
                pipe.zcount(keys.leases(shard), "-inf", now_ms)
            for tenant in tenants:
                for shard in shards:
                    pipe.zcard(
                        keys.index(shard, None if tenant == "-" else tenant, "status", "awaiting_approval")
                    )
            replies = iter(pipe.execute())

        depth = GaugeMetricFamily("wesichain_queue_depth", "Messages waiting in a queue", labels=["queue"])
        for queue in queues:
            depth.add_metric([queue], sum(int(next(replies)) for _ in PRIORITY_STEPS))
        yield depth
        unacked = GaugeMetricFamily(
            "wesichain_broker_unacked",
            "Messages handed to workers and not acknowledged yet (running, or held for a countdown)",
        )
        unacked.add_metric([], int(next(replies)))
        yield unacked

        inflight: dict[str, int] = {}
        leases = due = 0
        for _ in shards:
            for tenant, count in next(replies).items():
                name = _label(tenant)
                inflight[name] = inflight.get(name, 0) + int(count)
            leases += int(next(replies))
            due += int(next(replies))
        parked = {t: sum(int(next(replies)) for _ in shards) for t in tenants}
        yield _per_tenant("wesichain_runs_in_flight", "Runs not ended yet (parked ones included)", inflight)
        yield _per_tenant("wesichain_runs_parked", "Runs awaiting a human's approval", parked)
        watched = GaugeMetricFamily(
            "wesichain_leases", "Runs the sweeper watches (their lease or queued time)"
        )
        watched.add_metric([], leases)
        yield watched
        expiring = GaugeMetricFamily(
            "wesichain_leases_due",
            "Runs whose lease or queued time has passed by Redis's clock: the sweeper looks at them now",
        )
        expiring.add_metric([], due)
        yield expiring

        workers = GaugeMetricFamily(
            "wesichain_workers", "Live workers, consuming or not", labels=["consuming"]
        )
        workers.add_metric(["true"], sum(1 for w in live if w.record.consuming))
        workers.add_metric(["false"], sum(1 for w in live if not w.record.consuming))
        yield workers
        yield _waiting_for_versions(waiting_loads(PinnedRuns(self.store), live))

        slots = GaugeMetricFamily(
            "wesichain_provider_slots_in_use",
            "Concurrent model calls holding a slot of a configured provider limit",
            labels=["limit"],
        )
        for pattern, limit in sorted(self.settings.provider_limits.items()):
            if "*" in pattern or limit.per_tenant or not limit.concurrency:
                continue  # the scopes of wildcard and per-tenant limits are not known in advance
            scope = scope_of(pattern, limit, None)
            slots.add_metric([scope], int(r.zcount(keys.limit_slots(scope), f"({now_ms}", "+inf")))
        yield slots

    @staticmethod
    def _queues(live: list[LiveWorker]) -> list[str]:
        return known_queues(live)


def _label(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _per_tenant(name: str, documentation: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=["tenant"])
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    other = sum(v for _, v in ranked[MAX_TENANT_LABELS:])
    for tenant, value in ranked[:MAX_TENANT_LABELS]:
        family.add_metric([tenant], value)
    if other:
        family.add_metric(["other"], other)
    return family


def _waiting_for_versions(loads: list[VersionLoad]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "wesichain_runs_waiting_for_version",
        "Queued or running runs pinned to an agent version no live worker serves: they wait for one",
        labels=["agent", "version"],
    )
    ranked = sorted(loads, key=lambda v: (-v.active, v.agent, v.version))
    for load in ranked[:MAX_VERSION_LABELS]:
        family.add_metric([load.agent, load.version], load.active)
    if other := sum(v.active for v in ranked[MAX_VERSION_LABELS:]):
        family.add_metric(["other", "other"], other)
    return family


def serve_pool(store: RunStore, settings: Settings, port: int, address: str = "0.0.0.0") -> Any:
    """Serve the pool's metrics on ``port`` (a daemon thread); returns the HTTP server."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    registry.register(PoolCollector(store, settings))
    server, _thread = start_http_server(port, addr=address, registry=registry)
    return server
