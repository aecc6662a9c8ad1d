"""What keeping 10,000 in-flight runs alive costs Redis: the claims' renewals and worker liveness.

    python -m benchmarks.renewals [--runs 10000] [--seconds 15] [--out benchmarks/results/renewals.json]

Starts one ``redis-server`` and puts ``runs`` runs mid-phase in it, each with a live claim held by
one of ``workers`` x ``processes`` pool processes (prefork). Then, for ``seconds`` each, two
configurations are driven at the cadence the product uses, and redis-server's own counters are
read before and after (``INFO stats`` commands processed, ``INFO cpu`` user + system seconds):

* ``before``: what every in-flight claim cost until worker liveness: each pool process's heartbeat
  renews every claim it holds, in one pipelined round trip, every ``min(lease/3, 1 s)``
  (``renew.lua``, one EVALSHA per claim);
* ``after``: the same renewals, plus each worker's main process saying it is alive every quarter
  of ``worker_lease_s`` with the list of the claims its pool holds (``worker_live.lua``; the list
  is rewritten at every beat here, as when phases turn over faster than a beat), plus the
  sweeper's look for dead workers every sweep (``TIME`` and one ``ZRANGEBYSCORE``).

One load-generating process sends every configuration's commands; the achieved rates are reported
beside the targets, so a generator that cannot keep up shows as such. The sweeper's inspection of
runs whose lease time came is the same in both (the claims' lease is unchanged) and not driven.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared import protocol  # noqa: E402
from shared.liveness import HeldClaim, Lives  # noqa: E402
from shared.redis_client import connect  # noqa: E402
from shared.settings import Settings  # noqa: E402
from shared.store import RunStore  # noqa: E402
from worker.testing.harness import RedisServer  # noqa: E402


def _redis_counters(client: Any) -> tuple[int, float]:
    stats, cpu = client.info("stats"), client.info("cpu")
    return int(stats["total_commands_processed"]), float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _populate(store: RunStore, runs: int, holders: list[str]) -> dict[str, list[tuple[str, str]]]:
    """``runs`` runs thinking, each claimed by one holder; returns each holder's (run id, token)."""
    held: dict[str, list[tuple[str, str]]] = {h: [] for h in holders}
    seconds, _ = store.redis.time()
    deadline = (int(seconds) + 3600) * 1000
    with store.redis.pipeline(transaction=False) as pipe:
        for i in range(runs):
            run_id, token, holder = f"bench{i:06d}", f"t{i}", holders[i % len(holders)]
            claim = protocol.ClaimValue(token, deadline, holder).dump()
            pipe.hset(
                store.keys.run(run_id),
                mapping={protocol.VERSION: 2, protocol.PHASE: "thinking", protocol.STEP: 0, "running": claim},
            )
            pipe.zadd(store.keys.leases_of(run_id), {run_id: deadline})
            held[holder].append((run_id, token))
        pipe.execute()
    return held


def drive(
    store: RunStore,
    lives: Lives,
    held: dict[str, list[tuple[str, str]]],
    workers: dict[str, list[str]],
    seconds: float,
    with_liveness: bool,
) -> dict[str, Any]:
    settings = store.settings
    renew_s = min(settings.lease_s / 3, 1.0)
    beat_s = settings.worker_lease_s / 4
    lists = {
        life: [HeldClaim(run_id, "running", h, 2) for h in holders for run_id, _ in held[h]]
        for life, holders in workers.items()
    }
    commands0, cpu0 = _redis_counters(store.redis)
    started = time.monotonic()
    next_renew = next_beat = next_sweep = started
    renewed = beats = sweeps = 0
    while (now := time.monotonic()) < started + seconds:
        if now >= next_renew:
            for claims in held.values():
                store.renew([(run_id, "running", token, True) for run_id, token in claims])
                renewed += len(claims)
            next_renew += renew_s
        if with_liveness and now >= next_beat:
            for life, listed in lists.items():
                lives.beat(life, settings.worker_lease_s, listed)
                beats += 1
            next_beat += beat_s
        if with_liveness and now >= next_sweep:
            lives.dead(lives.now_ms())
            sweeps += 1
            next_sweep += settings.sweep_interval_s
        time.sleep(max(0.0, min(next_renew, next_beat if with_liveness else next_renew) - time.monotonic()))
    elapsed = time.monotonic() - started
    commands1, cpu1 = _redis_counters(store.redis)
    return {
        "seconds": round(elapsed, 2),
        "claim_renewals_per_s": round(renewed / elapsed),
        "claim_renewals_target_per_s": round(sum(len(c) for c in held.values()) / renew_s),
        "liveness_beats_per_s": round(beats / elapsed, 1),
        "redis_commands_per_s": round((commands1 - commands0) / elapsed),
        "redis_cpu_percent": round(100 * (cpu1 - cpu0) / elapsed, 1),
        "sweeps_per_s": round(sweeps / elapsed, 2),
    }


def measure(runs: int, workers: int, processes: int, seconds: float) -> dict[str, Any]:
    server = RedisServer().start()
    try:
        settings = Settings(redis_url=server.url)
        store = RunStore(connect(settings), settings)
        lives = Lives(store.redis, store.keys, settings.lease_s)
        by_worker = {
            f"w{w}:{1000 + w}:bench": [f"w{w}:{20000 + w * processes + p}" for p in range(processes)]
            for w in range(workers)
        }
        held = _populate(store, runs, [h for holders in by_worker.values() for h in holders])
        results = {
            "before": drive(store, lives, held, by_worker, seconds, with_liveness=False),
            "after": drive(store, lives, held, by_worker, seconds, with_liveness=True),
        }
        store.redis.close()
    finally:
        server.cleanup()
    return {
        "benchmark": "renewals",
        "runs_in_flight": runs,
        "workers": workers,
        "pool_processes_per_worker": processes,
        "settings": {
            "lease_s": settings.lease_s,
            "claim_renew_interval_s": min(settings.lease_s / 3, 1.0),
            "worker_lease_s": settings.worker_lease_s,
            "liveness_beat_interval_s": settings.worker_lease_s / 4,
            "sweep_interval_s": settings.sweep_interval_s,
        },
        "environment": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=50)
    p.add_argument("--processes", type=int, default=4, help="pool processes per worker")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "renewals.json"))
    args = p.parse_args(argv)
    report = measure(args.runs, args.workers, args.processes, args.seconds)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
