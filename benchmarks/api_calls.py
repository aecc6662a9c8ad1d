"""What one API submit costs, in counts the machine's load does not move.

The ASGI app is driven in this process through httpx's ASGI transport, one submit at a time, with a
profile hook on every thread (the sync route runs on anyio's worker threads): Python and C function
calls per submit, grouped by package, and the commands Redis ran per submit (``INFO commandstats``,
scripts' inner commands included). httpx's own calls (the client side) are in the totals.

    python -m benchmarks.api_calls --redis redis://127.0.0.1:6379/9 --submits 300 --warmup 50

The Redis named must have a live worker serving the ``direct`` agent (``tests.agents_fixture``);
it may consume a queue nobody sends to, so the submitted runs stay queued, e.g.
``wesichain worker --redis URL --agents tests.agents_fixture --queues bench.nobody``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

import httpx
import redis

from producer.api.app import create_app
from producer.api.config import ApiConfig
from shared.keys import Keys
from shared.settings import Settings
from shared.tenants import TenantLimits, Tenants

__all__ = ["GROUPS", "count_submits", "main"]

#: The packages calls are grouped by (the first that a code object's file path contains).
GROUPS = (
    "/redis/",
    "/fastapi/",
    "/starlette/",
    "/anyio/",
    "/httpx/",
    "/httpcore/",
    "/pydantic/",
    "/asyncio/",
    "/shared/",
    "/producer/",
)


class _Counter:
    """A profile hook counting calls while ``on``; set on every thread before the threads start."""

    def __init__(self) -> None:
        self.on = False
        self.python: Counter[str] = Counter()
        self.c_calls = 0

    def __call__(self, frame: FrameType, event: str, _: Any) -> None:
        if not self.on:
            return
        if event == "call":
            path = frame.f_code.co_filename
            self.python[next((g.strip("/") for g in GROUPS if g in path), "other")] += 1
        elif event == "c_call":
            self.c_calls += 1


def _commands(client: redis.Redis) -> int:
    return sum(int(stat["calls"]) for stat in client.info("commandstats").values())


async def _submits(url: str, key: str, n: int, warmup: int, counter: _Counter) -> tuple[float, int]:
    app = create_app(ApiConfig(settings=Settings(redis_url=url)))
    stats = redis.Redis.from_url(url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as http:
            for _ in range(warmup):
                answer = await http.post("/v1/runs", json={"agent": "direct", "input": "x"})
                if answer.status_code != 202:
                    raise RuntimeError(f"warm-up submit answered {answer.status_code}: {answer.text}")
            commands = _commands(stats)
            cpu = time.process_time()
            counter.on = True
            for _ in range(n):
                await http.post("/v1/runs", json={"agent": "direct", "input": "x"})
            counter.on = False
            cpu = time.process_time() - cpu
            commands = _commands(stats) - commands - 1  # this INFO itself
    stats.close()
    return cpu, commands


def count_submits(url: str, n: int, warmup: int) -> dict[str, Any]:
    """Per-submit counts of ``n`` submits after ``warmup`` (a new tenant without limits)."""
    tenants = Tenants(redis.Redis.from_url(url), Keys())
    key, record = tenants.create_key("api-calls")
    tenants.set_limits(record.tenant, TenantLimits(max_inflight=10_000_000, submits_per_minute=10_000_000))
    counter = _Counter()
    threading.setprofile(counter)
    sys.setprofile(counter)
    try:
        cpu, commands = asyncio.run(_submits(url, key, n, warmup, counter))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return {
        "submits": n,
        "python_calls_per_submit": round(sum(counter.python.values()) / n, 1),
        "c_calls_per_submit": round(counter.c_calls / n, 1),
        "python_calls_by_package": {g: round(v / n, 1) for g, v in counter.python.most_common()},
        "redis_commands_per_submit": round(commands / n, 2),
        # Under the profile hook: a share, not the API's CPU.
        "profiled_cpu_ms_per_submit": round(cpu * 1000 / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", required=True, help="the Redis URL (a live worker serves 'direct')")
    parser.add_argument("--submits", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    counts = count_submits(args.redis, args.submits, args.warmup)
    for name, value in counts.items():
        if isinstance(value, dict):
            print(name)
            for group, calls in value.items():
                print(f"  {group:12s} {calls:8.1f}")
        else:
            print(f"{name}: {value}")


if __name__ == "__main__":
    main()
