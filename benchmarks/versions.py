"""What a read of the agent versions costs with many live pinned runs (``GET /v1/versions``, the
version counts of ``wesichain workers versions`` and of the exporter), against a real redis-server.

    python -m benchmarks.versions [--runs 2000] [--repeat 7] [--out DIR]

Builds ``runs`` live runs pinned to one agent version (each taken through its real start commit),
then times counting them (:meth:`shared.versions.PinnedRuns.count`) two ways, side by side, round
by round: the heads of each scanned page read in one pipelined round trip (what the runtime does),
and read one ``HMGET`` at a time (how it read them before). Writes ``results/versions.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from shared.settings import Settings
from shared.state import Phase
from shared.store import RunStore
from shared.versions import PinnedRuns
from worker.testing.harness import RedisServer
from worker.testing.runs import started

RESULTS = Path(__file__).parent / "results"


def _count_one_at_a_time(pinned: PinnedRuns, agent: str, version: str) -> tuple[int, int]:
    """The count as it was read before the batching: a round trip per pinned run."""
    active = parked = 0
    cursor: int = 0
    while True:
        cursor, members = pinned.redis.sscan(pinned.keys.pinned(agent, version), cursor, count=pinned.CHUNK)
        for raw in members:
            head = pinned.store.load(raw.decode() if isinstance(raw, bytes) else str(raw))
            if head is None or head.terminal:
                continue
            if head.phase is Phase.AWAITING_APPROVAL:
                parked += 1
            else:
                active += 1
        if int(cursor) == 0:
            return active, parked


def _pages(pinned: PinnedRuns, agent: str, version: str) -> int:
    pages, cursor = 0, 0
    while True:
        cursor, _ = pinned.redis.sscan(pinned.keys.pinned(agent, version), cursor, count=pinned.CHUNK)
        pages += 1
        if int(cursor) == 0:
            return pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        store = RunStore(server.client(), Settings(redis_url=server.url))
        pinned = PinnedRuns(store)
        for _ in range(args.runs):
            head = started(store).head
            pinned.pin(head.run_id, head.agent, head.agent_version)
        agent, version = "agent", "1"
        batched, one_by_one = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            count = pinned.count(agent, version)
            batched.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            single = _count_one_at_a_time(pinned, agent, version)
            one_by_one.append(time.perf_counter() - t0)
            assert (count.active, count.parked) == single == (args.runs, 0), (count, single)
        result = {
            "runs": args.runs,
            "repeat": args.repeat,
            "batched_ms": round(statistics.median(batched) * 1000, 2),
            "one_at_a_time_ms": round(statistics.median(one_by_one) * 1000, 2),
        }
        # Round trips of one count: a scan and a pipelined read per page, against a scan per page
        # and a read per run.
        pages = _pages(pinned, agent, version)
        result["scan_pages"] = pages
        result["round_trips_batched"] = 2 * pages
        result["round_trips_one_at_a_time"] = pages + args.runs
        result["speedup"] = round(result["one_at_a_time_ms"] / result["batched_ms"], 1)
    finally:
        server.cleanup()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "versions.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
