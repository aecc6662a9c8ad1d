"""What a run costs in Redis, and how much Redis a deployment needs (``python -m benchmarks.sizing``).

Runs of the ``long`` benchmark agent with 1 to 50 tool steps go through a real worker on a real
redis-server; afterwards ``MEMORY USAGE`` of every key of each run (head, messages, checkpoints,
events, per-step results, attempts) gives its bytes. A least-squares line through (steps, bytes)
gives the cost of a run and of each further step; the message list and the event stream of the
longest run give the cost of one message and one event beyond their JSON text. The sizing table
multiplies a run's bytes by the runs a deployment keeps (runs a day times the retention in days).

Writes ``benchmarks/results/sizing.json`` and prints the table as Markdown.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any, cast

from benchmarks.harness import Cluster, new_prefix, run_and_wait
from benchmarks.scenarios import _run_bytes
from shared.events import load_event

RESULTS = Path(__file__).resolve().parent / "results" / "sizing.json"
STEPS = (1, 2, 5, 10, 20, 50)
#: Shapes of runs the table is drawn for, in tool steps.
SHAPES = {"direct answer": 0, "3 tool steps": 3, "10 tool steps": 10}
#: Runs kept: runs a day x retention days (the default retention is 7 days).
VOLUMES = (10_000, 100_000, 1_000_000)
RETENTION_DAYS = 7


def _fit(points: list[tuple[int, int]]) -> tuple[float, float]:
    """Least squares: bytes = base + per_step * steps."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def measure(cluster: Cluster) -> dict[str, Any]:
    prefix = new_prefix("sizing")
    worker = cluster.wesichain_worker("size-w", prefix, pool="threads", concurrency=4)
    cluster.up(worker)
    client = cluster.client(prefix)
    try:
        by_steps: dict[int, dict[str, int]] = {}
        last = ""
        for steps in STEPS:
            head, _ = run_and_wait(client, "long", f"steps={steps}")
            by_steps[steps] = _run_bytes(client, head.run_id)
            last = head.run_id
        direct, _ = run_and_wait(client, "direct", "hi")
        direct_bytes = _run_bytes(client, direct.run_id)
        r, keys = client.store.redis, client.store.keys
        # The store's client decodes its replies: text, never bytes.
        messages = cast(list[str], r.lrange(keys.messages(last), 0, -1))
        events = cast(list[tuple[str, dict[str, str]]], r.xrange(keys.events(last)))
        message_json = sum(len(m.encode()) for m in messages)
        event_json = sum(len(fields["e"].encode()) for _, fields in events)
        kinds = sorted({load_event(fields["e"]).kind for _, fields in events})
    finally:
        cluster.down(worker)
        client.close()
    base, per_step = _fit([(s, b["total"]) for s, b in by_steps.items()])
    longest = by_steps[STEPS[-1]]
    per_message = longest.get("messages", 0) / len(messages)
    per_event = longest.get("events", 0) / len(events)
    return {
        "bytes_by_steps": {str(s): b for s, b in by_steps.items()},
        "direct_answer_bytes": direct_bytes,
        "fit": {"base_bytes": round(base), "bytes_per_step": round(per_step)},
        "per_message": {
            "bytes": round(per_message),
            "json_bytes": round(message_json / len(messages)),
            "overhead_bytes": round(per_message - message_json / len(messages)),
            "count": len(messages),
        },
        "per_event": {
            "bytes": round(per_event),
            "json_bytes": round(event_json / len(events)),
            "overhead_bytes": round(per_event - event_json / len(events)),
            "count": len(events),
            "kinds": kinds,
        },
    }


def table(result: dict[str, Any]) -> str:
    fit = result["fit"]
    rows = [
        "| Run shape | Bytes per run | "
        + " | ".join(f"{v:,} runs/day x {RETENTION_DAYS} days" for v in VOLUMES)
        + " |",
        "|---|---:|" + "---:|" * len(VOLUMES),
    ]
    for name, steps in SHAPES.items():
        size = (
            result["direct_answer_bytes"]["total"]
            if steps == 0
            else fit["base_bytes"] + fit["bytes_per_step"] * steps
        )
        cells = [f"{size * v * RETENTION_DAYS / 2**30:.2f} GiB" for v in VOLUMES]
        rows.append(f"| {name} | {size:,} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None).parse_args(argv)
    cluster = Cluster.start()
    try:
        started = time.time()
        result = measure(cluster)
        version = cluster.redis.client().info("server")["redis_version"]
    finally:
        cluster.close()
    output = {
        "environment": {
            "redis": version,
            "python": platform.python_version(),
            "seconds": round(time.time() - started, 1),
        },
        **result,
        "table": table(result),
    }
    RESULTS.write_text(json.dumps(output, indent=2) + "\n")
    print(json.dumps({k: v for k, v in output.items() if k != "table"}, indent=2))
    print(output["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
