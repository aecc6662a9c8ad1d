"""CPU per transition of the phase tasks, run one after another in this process: a figure that
another process's load on the machine barely moves.

    python -m benchmarks.inprocess [--steps 10] [--runs 5] [--system wesichain|bare] [--profile FILE]

Starts its own redis-server, then runs ``--runs`` runs of the ``long`` agent (``steps=N``: N one-tool
steps, 3N+1 transitions) the way a worker would, but with no worker: each Celery message the
runtime pushes (commit and publish in one script, as on the Redis broker) is popped from its queue
list and its task run eagerly with ``Task.apply``, until the run has ended. ``--system bare`` does
the same with the bare Celery hop of ``benchmarks/bare.py`` (3N+1 hops), the floor the
per-transition target is measured against. Prints process CPU time and wall time per transition
(one warm-up run first, not counted).

What it leaves out: the prefork pool (the parent's receive, acknowledgement and pipe to the child),
Celery's worker-side request handling and redis-server's CPU; what it keeps is everything a pool
child does for a transition. Wall time still waits on redis-server; CPU time is this process's only.

For a figure independent of the machine's load, count instructions with valgrind and difference
two run counts (the start-up cancels out)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.inprocess --runs 1
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.inprocess --runs 4

(instructions per transition = difference of the two totals / difference of the transitions).
``--profile FILE`` writes a cProfile of the counted runs (CPU time) for ``python -m pstats FILE``.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import importlib
import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis

from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings
from tests.harness import RedisServer

AGENTS = "benchmarks.agents"


def decode(raw: bytes) -> tuple[str, str, list[Any], dict[str, Any]]:
    """Task name, id, args and kwargs of a Celery message as kombu's Redis channel stores it."""
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _ = json.loads(body)
    return message["headers"]["task"], message["headers"]["id"], args, kwargs


def drain(
    r: redis.Redis, queues: list[str], run_task: Callable[[str, str, list[Any], dict[str, Any]], None]
) -> int:
    """Run every message on ``queues`` (and what they publish) until they are empty; returns how many."""
    done = 0
    while True:
        raw = next((m for q in queues if (m := cast(bytes | None, r.rpop(q))) is not None), None)
        if raw is None:
            return done
        run_task(*decode(raw))
        done += 1


def wesichain_runs(url: str, steps: int) -> Callable[[], int]:
    """A function doing one run of ``long`` in this process; returns its transitions."""
    from producer.client import Client
    from worker.app import create_app

    os.environ.update({"WESICHAIN_REDIS_URL": url, "WESICHAIN_AGENTS": AGENTS, "WESICHAIN_SWEEPER": "0"})
    settings = Settings.from_env()
    app = create_app(settings)
    client = Client(settings, app=app)
    r = redis.Redis.from_url(url)

    def run_task(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        app.tasks[name].apply(args=args, kwargs=kwargs, task_id=task_id, throw=True)

    def one() -> int:
        handle = client.submit("long", f"steps={steps}", check_agent=False)
        drain(r, [QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS], run_task)
        head = client.store.load(handle.run_id)
        if head is None or head.phase.value != "completed":
            raise SystemExit(f"run {handle.run_id} did not complete: {head.phase if head else 'missing'}")
        return head.version - 1

    return one


def bare_runs(url: str, steps: int) -> Callable[[], int]:
    """One chain of 3 x ``steps`` + 1 bare hops in this process; returns its hops."""
    from benchmarks import bare

    # The bare module's app (whose hops publish the next) reads the floor's URL when the module
    # runs: run it again with this server's.
    os.environ[bare.ENV_URL] = bare.floor_url(url)
    bare = importlib.reload(bare)
    app = bare.app
    r = redis.Redis.from_url(bare.floor_url(url))
    hops = 3 * steps + 1
    queues: list[str] = []

    def run_task(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        app.tasks[name].apply(args=args, kwargs=kwargs, task_id=task_id, throw=True)

    def one() -> int:
        app.send_task(bare.TASK_HOP, kwargs={"chain": uuid.uuid4().hex, "hop": 0, "total": hops})
        if not queues:  # the floor's queue, as its routing names it
            queues.extend(k.decode() for k in cast(list[bytes], r.keys("*")) if r.type(k) == b"list")
        done = drain(r, queues, run_task)
        if done != hops:
            raise SystemExit(f"the bare chain ran {done} hops, not {hops}")
        return done

    return one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inprocess", description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=["wesichain", "bare"], default="wesichain")
    p.add_argument("--steps", type=int, default=10, help="tool steps per run (3N+1 transitions)")
    p.add_argument("--runs", type=int, default=5, help="runs counted (after one warm-up run)")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile (CPU time) of the counted runs")
    args = p.parse_args(argv)
    server = RedisServer()
    server.start()
    try:
        one = (wesichain_runs if args.system == "wesichain" else bare_runs)(server.url, args.steps)
        one()
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        if profiler is not None:
            profiler.enable()
        cpu0, wall0, transitions = time.process_time(), time.perf_counter(), 0
        for _ in range(args.runs):
            transitions += one()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
    finally:
        server.stop()
    print(
        json.dumps(
            {
                "system": args.system,
                "transitions": transitions,
                "cpu_ms_per_transition": round(1000 * cpu / transitions, 4),
                "wall_ms_per_transition": round(1000 * wall / transitions, 4),
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
