"""Profile a worker on the per-transition scenario with py-spy (``pip install py-spy``).

    python -m benchmarks.profile [--target BASE[+MOD...]]... [--seconds 20] [--no-sample] [--out DIR]

Starts redis-server and one worker (prefork, concurrency 1), keeps it busy with back-to-back
50-step runs (or bare hop chains), and samples the worker's main process and its pool child with
``py-spy record --nonblocking --format raw`` (CPU samples only, so a process blocked on a socket
is not counted). Writes, per target, the collapsed stacks and a report of the hottest frames
(inclusive and self), plus CPU milliseconds per transition of the main process, the pool child and
redis-server, measured with psutil over the same window.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import bare
from benchmarks.harness import Cluster, bare_chain, new_prefix, pid_cpu_s, process_cpu_s, run_and_wait
from shared.state import Phase
from worker.testing.harness import WorkerProcess

RESULTS = Path(__file__).resolve().parent / "results"

#: Frames worth naming: (label, substrings of "function (file)"); a sample counts for every label
#: one of its frames matches (inclusive, so labels overlap).
KEY_FRAMES = [
    ("celery task events published (EventDispatcher)", ("EventDispatcher.",)),
    ("new redis client per kombu operation (Redis.__init__)", ("Redis.__init__ (redis/client.py)",)),
    ("broker: BRPOP read", ("Channel._brpop_read",)),
    ("broker: ack (QoS.ack)", ("QoS.ack",)),
    ("broker: publish next task (send_task)", ("Celery.send_task",)),
    ("prefork pipe to/from the child (billiard)", ("billiard/connection.py",)),
    ("logging", ("logging/__init__.py",)),
    ("task execution (trace_task)", ("trace_task",)),
    ("RunStore.claim_phase (claim + head + new messages or results)", ("RunStore.claim_phase",)),
    ("RunStore.claim_call (tool claim)", ("RunStore.claim_call",)),
    ("RunStore.commit", ("RunStore.commit",)),
    ("RunStore.record_result (result + fan-in)", ("RunStore.record_result",)),
    ("RunStore.emit (token deltas)", ("RunStore.emit",)),
    ("Heartbeat.hold", ("Heartbeat.hold",)),
    ("model call (ScriptedModel)", ("ScriptedModel.",)),
    ("ModelRequest construction", ("ModelRequest",)),
    ("accept_tool_calls", ("accept_tool_calls",)),
    ("tool invoke", ("Tool.invoke",)),
    ("state machine (shared/fsm.py)", ("shared/fsm.py",)),
    ("event models (shared/events.py)", ("shared/events.py",)),
    ("pydantic (any)", ("pydantic/", "pydantic_core")),
    (
        "redis-py command round trips",
        ("execute_command (redis/client.py)", "Pipeline.execute (redis/client.py)", "Script.__call__"),
    ),
]


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    return found


def _record(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            _py_spy(),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--duration",
            str(seconds),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _frames(stack: str) -> list[str]:
    return [f for f in stack.split(";") if f]


def split_by_process(raw: Path) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks of a ``--subprocesses`` recording, as "main" and "children" (pool processes).

    A pool child is a fork of the main process (py-spy labels both with the same process frame),
    so a child's stacks are told apart by billiard's process bootstrap frame.
    """
    out: dict[str, list[tuple[list[str], int]]] = {"main": [], "children": []}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in _frames(stack) if not f.startswith("process ")]
        child = any(f.startswith("BaseProcess._bootstrap ") for f in frames)
        out["children" if child else "main"].append((frames, int(count)))
    return out


def analyse(stacks: list[tuple[list[str], int]], top: int = 30) -> dict[str, Any]:
    """Inclusive and self sample counts per frame ("function (file)"), and the key frames."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    total = 0
    for raw_frames, n in stacks:
        total += n
        frames = [_strip_line(f) for f in raw_frames]
        for f in set(frames):
            inclusive[f] += n
        if frames:
            own[frames[-1]] += n
        for label, patterns in KEY_FRAMES:
            if any(p in f for f in frames for p in patterns):
                keys[label] += n
    # Frames every sample shares (the worker's startup stack) say nothing: drop them.
    inclusive_top = [(f, c) for f, c in inclusive.most_common() if c < total][:top]
    key_frames = [(label, keys[label]) for label, _ in KEY_FRAMES if keys[label]]
    return {"samples": total, "inclusive": inclusive_top, "self": own.most_common(top), "keys": key_frames}


#: The checkout the profiled code runs from: its files are named relative to it.
_PROJECT = str(Path(__file__).resolve().parents[1])


def _strip_line(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (path/to/file.py)", with site-packages paths shortened.
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", f"{_PROJECT}/", str(Path.cwd()) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"


PHASES = ("run_start", "run_think", "run_tool", "run_observe")
#: Frames between a phase task function and its work that say nothing: the one phase skeleton
#: (``worker/phase.py``), the bodies it calls (``run_think.<locals>.body``) and think's own body.
PASS_THROUGH = frozenset({"run_phase", "_think"})


def _passes_through(name: str) -> bool:
    return name in PASS_THROUGH or name.endswith(".<locals>.body")


def phase_breakdown(stacks: list[tuple[list[str], int]], top: int = 8) -> dict[str, list[tuple[str, int]]]:
    """For each phase task function, samples by the first frame beneath it that does real work."""
    out: dict[str, Counter[str]] = {}
    for raw_frames, n in stacks:
        frames = [_strip_line(f) for f in raw_frames]
        for i, f in enumerate(frames):
            name = f.split(" (", 1)[0]
            if name in PHASES:
                beneath = [b.split(" (", 1)[0] for b in frames[i + 1 :]]
                below = next((b for b in beneath if not _passes_through(b)), "(self)")
                out.setdefault(name, Counter())[below] += n
                out[name]["(total)"] += n
                break
    return {k: c.most_common(top + 1) for k, c in out.items()}


def _render(title: str, a: dict[str, Any], cpu_ms: float, phases: dict[str, Any] | None = None) -> list[str]:
    """Percentages of the process's samples, and the same as CPU ms per transition."""
    n = a["samples"] or 1

    def ms(c: int) -> str:
        return f"{cpu_ms * c / n:.3f}"

    lines = [
        f"### {title}: {a['samples']} CPU samples, {cpu_ms:.3f} CPU ms per transition",
        "",
        "| inclusive % | CPU ms per transition | key frames |",
        "|---:|---:|---|",
    ]
    lines += [f"| {100 * c / n:.1f} | {ms(c)} | {label} |" for label, c in a["keys"]]
    if phases:
        lines += [
            "",
            "Phase tasks, by the call directly beneath them:",
            "",
            "| phase | CPU ms per transition | % | beneath |",
            "|---|---:|---:|---|",
        ]
        for phase, rows in phases.items():
            for below, c in rows:
                label = "**all**" if below == "(total)" else f"`{below}`"
                lines.append(f"| {phase} | {ms(c)} | {100 * c / n:.1f} | {label} |")
    lines += ["", "| inclusive % | frame |", "|---:|---|"]
    lines += [f"| {100 * c / n:.1f} | `{f}` |" for f, c in a["inclusive"]]
    lines += ["", "| self % | frame |", "|---:|---|"]
    lines += [f"| {100 * c / n:.1f} | `{f}` |" for f, c in a["self"][:20]]
    return lines + [""]


#: A target is a base system plus modifiers joined by "+": "wesichain", "bare+events",
#: "wesichain+events+threads", ... Task events are off and hiredis is installed by default (both
#: results of this profile), so the what-ifs now turn events back on.
BASES = ("wesichain", "bare")
MODIFIERS = {
    "events": "Celery task events on, as Flower would have them (wesichain: WESICHAIN_TASK_EVENTS=1;"
    " bare: benchmarks/whatif.py)",
    "threads": "threads pool (concurrency 1) instead of prefork",
}
DEFAULT_TARGETS = ["wesichain", "bare"]
ALL_TARGETS = [
    "wesichain",
    "bare",
    "wesichain+events",
    "bare+events",
    "wesichain+threads",
    "bare+threads",
]


def parse_target(target: str) -> tuple[str, set[str]]:
    base, *mods = target.split("+")
    if base not in BASES or any(m not in MODIFIERS for m in mods):
        raise SystemExit(f"bad target {target!r}: BASE[+MOD...], BASE in {BASES}, MOD in {list(MODIFIERS)}")
    return base, set(mods)


def _worker(cluster: Cluster, target: str, prefix: str) -> WorkerProcess:
    base, mods = parse_target(target)
    pool = "threads" if "threads" in mods else "prefork"
    name = "prof-" + target.replace("+", "-")
    if base == "wesichain":
        # Task events are a product setting: the runtime's own switch turns them on.
        env = {"WESICHAIN_TASK_EVENTS": "1"} if "events" in mods else {}
        return cluster.wesichain_worker(name, prefix, pool=pool, env=env)
    if "events" in mods:
        whatif = {"BENCH_WHATIF": "events", "BENCH_WHATIF_TARGET": base}
        return cluster.celery_worker(name, "benchmarks.whatif", pool=pool, env=whatif)
    return cluster.celery_worker(name, "benchmarks.bare", pool=pool)


@dataclass
class Load:
    """What the load thread got through: transitions (or bare hops) and per-run medians."""

    transitions: int = 0
    per_transition_ms: list[float] = field(default_factory=list)


def profile(
    cluster: Cluster,
    target: str,
    seconds: int,
    out: Path,
    sample: bool = True,
    keep_raw: bool = False,
) -> tuple[list[str], dict[str, Any]]:
    prefix = new_prefix("profile-" + target.replace("+", "-"))
    worker = _worker(cluster, target, prefix)
    base, mods = parse_target(target)
    cluster.up(worker)
    client = cluster.client(prefix)
    floor = cluster.floor_redis()
    app = bare.make_app(cluster.floor_url)
    if "events" in mods:
        app.conf.update(task_send_sent_event=True)  # the first hop's publish, as the workers do
    ours = base == "wesichain"
    stop = threading.Event()
    counted = Load()

    def load() -> None:
        while not stop.is_set():
            if ours:
                head, _ = run_and_wait(client, "long", "steps=50")
                counted.transitions += head.version - 1
                cps = client.store.checkpoints(head.run_id)
                first = next(cp for cp in cps if cp.phase is Phase.THINKING)
                counted.per_transition_ms.append(
                    1000 * (head.updated_at - first.updated_at) / (head.version - first.version)
                )
            else:
                counted.per_transition_ms.append(bare_chain(floor, app, bare.TASK_HOP, 150))
                counted.transitions += 150

    raw = out / f"profile-{target.replace('+', '-')}.raw"
    try:
        if ours:
            run_and_wait(client, "long", "steps=10")
        else:
            bare_chain(floor, app, bare.TASK_HOP, 50)
        redis_pid = cluster.redis.proc.pid if cluster.redis.proc else 0
        thread = threading.Thread(target=load, daemon=True)
        thread.start()
        time.sleep(0.5)
        before, n_before = counted.transitions, len(counted.per_transition_ms)
        cpu0, redis0 = process_cpu_s(worker), pid_cpu_s(redis_pid)
        started = time.monotonic()
        if sample:
            _record(worker.pid, seconds, raw).wait(timeout=seconds + 60)
        else:
            time.sleep(seconds)
        elapsed = time.monotonic() - started
        cpu1, redis1 = process_cpu_s(worker), pid_cpu_s(redis_pid)
        transitions = counted.transitions - before
        wall = statistics.median(counted.per_transition_ms[n_before:] or [float("nan")])
        stop.set()
        thread.join(timeout=60)
    finally:
        cluster.down(worker)
        client.close()
        floor.close()
    n = max(1, transitions)
    per = {
        "main": 1000 * (cpu1["main"] - cpu0["main"]) / n,
        "pool child": 1000 * (cpu1["children"] - cpu0["children"]) / n,
        "redis-server": 1000 * (redis1 - redis0) / n,
    }
    figures = {
        "transitions": transitions,
        "per_s": transitions / elapsed,
        "wall_ms": wall,
        "cpu_ms": per,
        "cpu_total_ms": sum(per.values()),
    }
    lines = [
        f"## {target}: {transitions} transitions in {elapsed:.0f} s ({transitions / elapsed:.0f}/s);"
        f" median {wall:.3f} ms per transition",
        "",
        "CPU per transition: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in per.items())
        + f" (sum {sum(per.values()):.3f} ms).",
        "",
    ]
    if sample and raw.exists():
        split = split_by_process(raw)
        for proc, cpu_key, label in (
            ("children", "pool child", "pool child"),
            ("main", "main", "main process"),
        ):
            if split[proc]:
                phases = phase_breakdown(split[proc]) if proc == "children" else None
                lines += _render(f"{target} {label}", analyse(split[proc]), per[cpu_key], phases)
        if not keep_raw:
            raw.unlink()
    return lines, figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--target",
        action="append",
        default=[],
        help="BASE[+MOD...] (repeatable; 'all' for the what-if matrix; default: wesichain, bare);"
        f" BASE: {', '.join(BASES)}; MOD: " + "; ".join(f"{k}: {v}" for k, v in MODIFIERS.items()),
    )
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--no-sample", action="store_true", help="only measure CPU and wall time (no py-spy)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="profile", help="base name of the report files")
    p.add_argument("--keep-raw", action="store_true", help="keep py-spy's collapsed stacks (*.raw) in --out")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the list of targets this many times, interleaved; the summary takes medians",
    )
    args = p.parse_args(argv)
    targets = ALL_TARGETS if "all" in args.target else (args.target or DEFAULT_TARGETS)
    for t in targets:
        parse_target(t)
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.start()
    title = "CPU samples with py-spy" if not args.no_sample else "CPU and wall time, no sampling"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"# Workers on the per-transition scenario ({title})",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average at start {load} (1, 5, 15 min)."
        " On a loaded machine py-spy also counts time a thread spends in a system call the"
        " machine is slow to serve: compare shares within one report, not across reports.",
        "",
    ]
    if not args.no_sample:
        lines += [
            "py-spy samples the worker from beside it on the same cores, so wall times here run higher"
            " than unsampled ones; CPU per transition is measured with psutil (main process, pool"
            " children including reaped ones, redis-server). Percentages are of each process's CPU"
            " samples; 'CPU ms per transition' is that share of the process's CPU per transition."
            " Labels overlap (a frame inside another counts for both).",
            "",
        ]
    figures: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    try:
        for rnd in range(args.rounds):
            for target in targets:
                print(f"[round {rnd + 1}] profiling {target} for {args.seconds} s ...", flush=True)
                more, fig = profile(
                    cluster,
                    target,
                    args.seconds,
                    args.out,
                    sample=not args.no_sample and rnd == 0,
                    keep_raw=args.keep_raw,
                )
                figures[target].append(fig)
                print(more[0], more[2], sep="\n", flush=True)
                if rnd == 0:
                    lines += more
    finally:
        cluster.close()
    lines += [
        f"## Summary (medians over {args.rounds} interleaved round(s) of {args.seconds} s)",
        "",
        "| target | transitions/s | median ms per transition | CPU ms per transition"
        " (main + pool child + redis-server) |",
        "|---|---:|---:|---|",
    ]
    summary: dict[str, Any] = {}
    for t, figs in figures.items():
        if not figs:
            continue

        def med(get: Any, figs: list[dict[str, Any]] = figs) -> float:
            return float(statistics.median(get(f) for f in figs))

        summary[t] = {
            "rounds": figs,
            "per_s": med(lambda f: f["per_s"]),
            "wall_ms": med(lambda f: f["wall_ms"]),
            "cpu_total_ms": med(lambda f: f["cpu_total_ms"]),
            "cpu_ms": {k: med(lambda f, k=k: f["cpu_ms"][k]) for k in ("main", "pool child", "redis-server")},
        }
        m = summary[t]
        cpu = m["cpu_ms"]
        lines.append(
            f"| {t} | {m['per_s']:.0f} | {m['wall_ms']:.3f} | {m['cpu_total_ms']:.3f}"
            f" ({cpu['main']:.3f} + {cpu['pool child']:.3f} + {cpu['redis-server']:.3f}) |"
        )
    report = args.out / f"{args.name}.md"
    report.write_text("\n".join(lines) + "\n")
    (args.out / f"{args.name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
