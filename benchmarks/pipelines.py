"""What a pipeline adds on top of its child runs: a map against the same runs submitted directly.

    python -m benchmarks.pipelines              # 100 items, 3 rounds
    python -m benchmarks.pipelines --quick      # 100 items, 1 round
    python -m benchmarks.pipelines --items 200 --rounds 5 --workers 2 --concurrency 4

The same workers run N ``direct`` runs (one think each) submitted straight from a client, then a
pipeline run of one map step over N items of that agent (its children created by the pool,
each end recorded by its completion callback, then the pipeline's end), then the same map with a
cap of 8 live children, round by round (each round in another order). The figure is the map's
wall time over the direct submits' (goal: at most 1.05 with a cap that does not throttle).
Writes ``benchmarks/results/pipelines.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Cluster, new_prefix
from shared.state import Phase
from worker.testing.harness import wait_until

RESULTS = Path(__file__).parent / "results" / "pipelines.json"
GOAL = 1.05


def _direct(cluster: Cluster, prefix: str, n: int, round_: int) -> float:
    client = cluster.client(prefix)
    try:
        started = time.perf_counter()
        handles = [client.submit("direct", f"item {round_}:{i}", check_agent=False) for i in range(n)]

        def all_done() -> bool:
            return all(
                (h := client.store.load(x.run_id)) is not None and h.phase is Phase.COMPLETED for x in handles
            )

        wait_until(all_done, timeout=600, interval=0.02, what="the direct runs")
        return time.perf_counter() - started
    finally:
        client.close()


def _pipeline(cluster: Cluster, prefix: str, name: str, n: int, round_: int) -> float:
    client = cluster.client(prefix)
    try:
        text = "\n".join(f"item {round_}:{i}" for i in range(n))
        started = time.perf_counter()
        handle = client.submit_pipeline(name, text, check=False)

        def ended() -> bool:
            meta = handle.store.meta(handle.pipeline_id)
            return meta is not None and meta.terminal

        wait_until(ended, timeout=600, interval=0.02, what="the pipeline run")
        seconds = time.perf_counter() - started
        status = handle.status()
        assert status.status == "completed" and len(status.output) == n, status.error
        return seconds
    finally:
        client.close()


def overhead(items: int, rounds: int, workers: int, concurrency: int) -> dict[str, Any]:
    cluster = Cluster.start()
    prefix = new_prefix("pipelines")
    try:
        pool = [
            cluster.wesichain_worker(f"p{i}", prefix, concurrency=concurrency) for i in range(1, workers + 1)
        ]
        cluster.up(*pool)
        direct: list[float] = []
        mapped: list[float] = []
        capped: list[float] = []
        for r in range(rounds):
            # Each round in another order, so a drift of the machine's load favours none of them.
            for which in ("direct", "map", "cap8")[r % 3 :] + ("direct", "map", "cap8")[: r % 3]:
                if which == "direct":
                    direct.append(_direct(cluster, prefix, items, r))
                elif which == "map":
                    mapped.append(_pipeline(cluster, prefix, "bench-map", items, r))
                else:
                    capped.append(_pipeline(cluster, prefix, "bench-map-8", items, r))
            print(
                f"round {r + 1}: direct {direct[-1]:.2f}s, map {mapped[-1]:.2f}s,"
                f" map cap 8 {capped[-1]:.2f}s",
                flush=True,
            )
        ratios = [m / d for m, d in zip(mapped, direct, strict=True)]
        capped_ratios = [c / d for c, d in zip(capped, direct, strict=True)]
        return {
            "items": items,
            "workers": workers,
            "concurrency": concurrency,
            "direct_s": [round(x, 3) for x in direct],
            "map_s": [round(x, 3) for x in mapped],
            "map_cap8_s": [round(x, 3) for x in capped],
            "ratio_per_round": [round(x, 3) for x in ratios],
            "ratio_median": round(statistics.median(ratios), 3),
            "cap8_ratio_median": round(statistics.median(capped_ratios), 3),
            "goal": GOAL,
        }
    finally:
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    result = overhead(args.items, 1 if args.quick else args.rounds, args.workers, args.concurrency)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
