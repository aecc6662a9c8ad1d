"""Recovery benchmark: time from SIGKILL to the run's next committed transition.

Two failures, each on real worker processes and a real redis-server:

* ``whole``: the worker's whole process group is SIGKILLed while it is inside a think phase; its
  main process stops saying it is alive (``worker_lease_s``) and the sweeper in the surviving
  worker hands the phase on without waiting for the run's lease;
* ``child``: only the prefork child running the phase is SIGKILLed; the worker's main process sees
  its child die and expires the dead process's claim at once, and Celery's
  ``retry_on_worker_lost`` redelivers the task, whose new delivery takes the phase over.

The phase is held open with the chaos suite's ``pause:thinking`` fault, installed as the workers'
hooks (``WESICHAIN_HOOKS=worker.testing.faults:ChaosHooks``). Default settings are used unless
overridden (``--lease``), and reported with the results.

    python -m benchmarks.recovery --trials 3 --out benchmarks/results/recovery.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from producer.client import Client  # noqa: E402
from shared.settings import Settings  # noqa: E402
from shared.state import Phase  # noqa: E402
from worker.testing.faults import pid_key  # noqa: E402
from worker.testing.harness import RedisServer, WorkerProcess, wait_until  # noqa: E402

#: The chaos suite's fault hooks, pausing every run once in its think phase.
#: The agents the workers serve: the suite's fixture, whose slow agent a paused phase holds.
AGENTS = "tests.agents_fixture"
HOOKS = "worker.testing.faults:ChaosHooks"


def one_trial(kind: str, redis: RedisServer, workers: list[WorkerProcess], client: Client) -> float:
    handle = client.submit("direct", "recover me")
    r = redis.client()
    pid = int(wait_until(lambda: r.get(pid_key(Phase.THINKING, handle.run_id)), 30, what="think to pause"))
    victim = next(w for w in workers if pid in w.pids())
    killed_at = time.time()
    if kind == "whole":
        victim.kill()
    else:
        os.kill(pid, 9)
    head = handle.wait(timeout=120)
    assert head.answer == "The answer is 42.", head
    committed = next(e.ts for e in handle.events(follow=False) if e.kind == "ModelResponded")
    if kind == "whole":
        victim.start()
    return committed - killed_at


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--lease", type=float, default=None, help="override lease_s (default: the product default)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "recovery.json"))
    args = parser.parse_args()

    settings = Settings()
    lease = args.lease or settings.lease_s
    env = {
        "WESICHAIN_HOOKS": HOOKS,
        "WESICHAIN_FAULT": "pause:thinking",
        "WESICHAIN_FAULT_PAUSE_S": "120",
        "WESICHAIN_LEASE_S": str(lease),
    }
    redis = RedisServer().start()
    workers = [WorkerProcess(f"r{i}", redis.url, agents=AGENTS, env=env, concurrency=1) for i in (1, 2)]
    try:
        for w in workers:
            w.start(wait=False)
        for w in workers:
            w.wait_ready()
        client = Client(Settings(redis_url=redis.url, agents_module=AGENTS))
        results: dict[str, list[float]] = {"whole": [], "child": []}
        for _ in range(args.trials):
            for kind in ("whole", "child"):
                results[kind].append(round(one_trial(kind, redis, workers, client), 3))
    finally:
        for w in workers:
            w.stop()
        redis.cleanup()

    summary = {
        kind: {"samples_s": v, "median_s": round(statistics.median(v), 3), "max_s": max(v)}
        for kind, v in results.items()
    }
    report = {
        "benchmark": "recovery",
        "settings": {
            "lease_s": lease,
            "worker_lease_s": settings.worker_lease_s,
            "sweep_interval_s": settings.sweep_interval_s,
            "heartbeat_interval_s": min(lease / 3, 1.0),
            "celery": "acks_late, prefetch 1, reject_on_worker_lost, retry_on_worker_lost (delay 1 s)",
            "pool": "prefork -c 1, two workers",
        },
        "environment": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": summary,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
