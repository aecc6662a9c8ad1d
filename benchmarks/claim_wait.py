"""What the replication wait after a non-retry-safe call's claim costs on a Redis Cluster.

    python -m benchmarks.claim_wait [--n 500]

Starts a cluster of three primaries with a replica each (``worker.testing.cluster``) and times, from
one client, ``n`` of each: a claim-sized script call (``renew`` of a claim, one EVALSHA on the
run's primary), and :meth:`RunStore.replicate` (a write and ``WAIT 1`` on that primary), which the
worker adds before a non-retry-safe tool runs (``WESICHAIN_CLAIM_WAIT_MS``). Prints the median
and 99th percentile of each, in milliseconds. Loopback replication: a network between the
primary and its replica adds its round trip to the wait.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

from shared.redis_client import connect
from shared.settings import Settings
from shared.store import RunStore
from worker.testing.cluster import RedisCluster
from worker.testing.harness import RedisServer


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(1000 * statistics.median(ordered), 3),
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3),
    }


def measure(n: int) -> dict[str, Any]:
    cluster = RedisCluster(masters=3, replicas=1).start()
    broker = RedisServer().start()
    try:
        settings = Settings(redis_url=cluster.url, redis_cluster=True, broker_url=broker.url)
        store = RunStore(connect(settings), settings)
        run_ids = [uuid.uuid4().hex for _ in range(n)]
        claim: list[float] = []
        wait: list[float] = []
        for run_id in run_ids:
            started = time.perf_counter()
            store.renew([(run_id, "running", "token", True)])
            claim.append(time.perf_counter() - started)
            started = time.perf_counter()
            acknowledged = store.replicate(run_id, 1000)
            wait.append(time.perf_counter() - started)
            if acknowledged != 1:
                raise RuntimeError(f"no replica acknowledged the write of {run_id}")
        store.redis.close()
        return {"n": n, "claim_script": _percentiles(claim), "replication_wait": _percentiles(wait)}
    finally:
        broker.cleanup()
        cluster.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=500)
    args = p.parse_args(argv)
    print(json.dumps(measure(args.n), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
