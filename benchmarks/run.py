"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--only NAME[,NAME]] [--out DIR]``.

Starts one redis-server on a free loopback port, then per scenario the worker processes it needs
(the durability scenario starts its own servers), emptying the server between scenarios, and
writes ``results/latest.json`` and ``results/latest.md`` (see README.md for what each scenario
measures). Without ``--only`` every scenario runs but ``backlog``, which is run by name. Every
scenario is bounded in time; one that fails or overruns is recorded as an error and the others
still run. Exit status: 0 when every scenario ran (targets missed or not), 1 when one failed, 2 on
bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import bare
from benchmarks.harness import Cluster, environment
from benchmarks.report import render
from benchmarks.scenarios import DEFAULT_SCENARIOS, FULL, QUICK, SCENARIO_FUNCS, Context, Sizes
from shared.settings import Settings, celery_config

RESULTS = Path(__file__).resolve().parent / "results"
#: Wall-clock bound of one scenario, seconds (quick, full).
SCENARIO_LIMIT_S = {"quick": 150, "full": 420}


class ScenarioTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise ScenarioTimeout("scenario exceeded its time limit")


def _celery_settings() -> dict[str, Any]:
    """The Celery configuration of the runtime's workers and of the bare floor (one and the same)."""
    conf = celery_config(Settings(redis_url="redis://127.0.0.1:6379/0"))
    conf.pop("broker_url")
    return conf


def _limit_s(name: str, mode: str, sizes: Sizes) -> int:
    """The wall-clock bound of one scenario: the backlog's grows with its number of runs."""
    if name == "backlog":
        return max(SCENARIO_LIMIT_S[mode], 180 + sizes.backlog_runs // 2)
    return SCENARIO_LIMIT_S[mode]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (fewer runs and rounds)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these scenarios (repeatable or comma-separated): {', '.join(SCENARIO_FUNCS)};"
        f" default: all but {', '.join(n for n in SCENARIO_FUNCS if n not in DEFAULT_SCENARIOS)}",
    )
    p.add_argument("--backlog-runs", type=int, help="runs of the backlog scenario (quick 120, full 600)")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for latest.json and latest.md")
    p.add_argument("--name", default="latest", help="base name of the result files (default: latest)")
    args = p.parse_args(argv)
    only = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in only if n not in SCENARIO_FUNCS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIO_FUNCS)}")
    args.only = only or list(DEFAULT_SCENARIOS)
    if args.backlog_runs is not None and args.backlog_runs < 1:
        p.error("--backlog-runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sizes = QUICK if args.quick else FULL
    if args.backlog_runs is not None:
        sizes = replace(sizes, backlog_runs=args.backlog_runs)
    mode = "quick" if args.quick else "full"
    started = time.monotonic()
    results: dict[str, Any] = {
        "schema": 1,
        "quick": args.quick,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "settings": {
            "sizes": asdict(sizes),
            "celery": _celery_settings(),
            "bare_floor": f"the same Celery configuration, its broker in Redis database {bare.DB}"
            " of the same server (the runtime's workers use database 0)",
            "wesichain": {k: v for k, v in asdict(Settings()).items() if k != "redis_url"},
        },
        "scenarios": {},
    }
    signal.signal(signal.SIGALRM, _alarm)
    cluster = Cluster.start()
    failed = False
    try:
        for name in args.only:
            title, fn = SCENARIO_FUNCS[name]
            print(f"[{time.monotonic() - started:6.1f}s] {name}: {title}", flush=True)
            ctx_started = time.monotonic()
            signal.alarm(_limit_s(name, mode, sizes))
            try:
                cluster.reset()  # no worker runs between scenarios: nothing left from the last one
                ctx = _context(cluster, sizes, args.quick, results)
                outcome = fn(ctx)
            except Exception as exc:  # record and go on with the other scenarios
                traceback.print_exc()
                outcome = {"error": f"{type(exc).__name__}: {exc}"}
                failed = True
            finally:
                signal.alarm(0)
            outcome["title"] = title
            outcome["elapsed_s"] = round(time.monotonic() - ctx_started, 1)
            results["scenarios"][name] = outcome
            for tid, t in outcome.get("targets", {}).items():
                print(
                    f"    {tid}: {t['value']} (goal {t['op']} {t['target']})"
                    f" -> {'met' if t['pass'] else 'MISSED'}"
                )
    finally:
        cluster.close(keep_logs=failed)
    results["environment"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["summary"] = {
        f"{name}.{tid}": t["pass"]
        for name, sc in results["scenarios"].items()
        for tid, t in sc.get("targets", {}).items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / f"{args.name}.json", args.out / f"{args.name}.md"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(json_path)
    md_path.write_text(render(results))
    print(f"[{results['elapsed_s']:6.1f}s] wrote {json_path} and {md_path}")
    return 1 if failed else 0


_shared_cache: dict[str, Any] = {}


def _context(cluster: Cluster, sizes: Any, quick: bool, results: dict[str, Any]) -> Context:
    # One cache for the whole run: "transition" and "flat" share the same long runs.
    return Context(
        cluster=cluster,
        sizes=sizes,
        quick=quick,
        cache=_shared_cache,
        log=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    sys.exit(main())
