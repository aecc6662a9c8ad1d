"""Markdown rendering of a results JSON (``python -m benchmarks.report results/latest.json``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TARGET_LABELS = {
    "transition_over_bare_hop": "Per-transition time / bare Celery hop",
    "late_over_early": "Transition cost at steps 46-50 / steps 1-5",
    "eight_over_one": "Fan-out: 8 x 500 ms calls / 1 call (dispatch -> observe commit)",
    "speedup_vs_sequential": "Fan-out: speed-up over 8 sequential calls",
    "throughput_over_bare": "Throughput on 2 workers / bare hop chains",
    "rss_over_bare": "Worker RSS / bare Celery worker RSS (prefork, 1 child)",
    "growth_mib": "Worker RSS growth over the soak (MiB)",
    "transition_over_langgraph_sqlite_node": "Per-transition time / LangGraph per-node time (SQLite)",
    "failed_runs": "Backlog: runs that did not complete",
    "duplicate_deliveries": "Backlog: tasks delivered more than once",
    "republished_tasks": "Backlog: tasks re-published by the sweeper (epoch suffix)",
}


def _fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def targets_table(results: dict[str, Any]) -> list[str]:
    lines = ["| Scenario | Target | Measured | Goal | Result |", "|---|---|---:|---:|---|"]
    for name, sc in results["scenarios"].items():
        for tid, t in sc.get("targets", {}).items():
            verdict = "met" if t["pass"] else "**missed**"
            lines.append(
                f"| {name} | {TARGET_LABELS.get(tid, tid)} | {_fmt(t['value'])}"
                f" | {t['op']} {t['target']} | {verdict} |"
            )
        if "error" in sc:
            lines.append(f"| {name} | (scenario failed) | | | **error**: {sc['error'][:120]} |")
        elif "skipped" in sc and not sc.get("targets"):
            lines.append(f"| {name} | (skipped) | | | {sc['skipped'][:120]} |")
    return lines


def latency_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    lines = [
        f"Bare Celery hop in the same scenario: p50 {m['bare_hop_ms']['p50']} ms;"
        f" bare worker RSS {m['bare_worker_rss_mib']} MiB.",
        "",
        "| Scenario | Model latency | p50 ms | p95 ms | Overhead p50 ms | Peak worker RSS MiB | Steps"
        " | Model calls | Transitions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in m["scenarios"].values():
        lines.append(
            f"| {r['agent']} | {r['model_latency_ms']:.0f} ms | {r['latency_ms']['p50']:.2f}"
            f" | {r['latency_ms']['p95']:.2f} | {r['overhead_p50_ms']:.2f} | {r['peak_worker_rss_mib']:.1f}"
            f" | {r['steps']} | {r['model_calls']}"
            f" | {r['transitions']} |"
        )
    return lines


def transition_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    return [
        "| Measure | p50 ms | p95 ms | n |",
        "|---|---:|---:|---:|",
        f"| Bare Celery hop | {m['bare_hop_ms']['p50']} | {m['bare_hop_ms']['p95']}"
        f" | {m['bare_hop_ms']['n']} chains |",
        f"| Bare hop + 4 KB pydantic state (GET/SET) | {m['bare_state_hop_ms']['p50']} |"
        f" {m['bare_state_hop_ms']['p95']} | {m['bare_state_hop_ms']['n']} chains |",
        f"| Wesichain transition (per step / 3) | {m['transition_ms']['p50']} | {m['transition_ms']['p95']} |"
        f" {m['transition_ms']['n']} steps |",
        "",
        f"State hop / bare hop: {m['state_hop_over_hop']}x; transition / state hop:"
        f" {m['transition_over_state_hop']}x.",
    ]


def flat_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    return [
        f"Steps 1-5: p50 {m['early_transition_ms']['p50']} ms per transition; steps"
        f" {sc['settings']['late_steps'][0]}-{sc['settings']['late_steps'][1]}:"
        f" p50 {m['late_transition_ms']['p50']} ms;"
        f" fitted growth {m['slope_us_per_step']} µs per transition per step.",
    ]


def fanout_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    return [
        "| Step | p50 ms | p95 ms |",
        "|---|---:|---:|",
        f"| 1 call of 500 ms | {m['one_call_ms']['p50']} | {m['one_call_ms']['p95']} |",
        f"| 8 calls of 500 ms on 8 slots | {m['eight_calls_ms']['p50']} | {m['eight_calls_ms']['p95']} |",
        "",
        f"Fan-in overhead above 500 ms: {m['fan_in_overhead_ms']} ms; speed-up over sequential:"
        f" {m['speedup_vs_sequential']}x; peak worker RSS (main + 8 children):"
        f" {m['peak_worker_rss_mib']} MiB.",
    ]


def throughput_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    return [
        "| System | median per second | CPU ms per transition (workers + redis) | rounds |",
        "|---|---:|---:|---:|",
        f"| Wesichain, committed transitions | {m['transitions_per_s']['p50']}"
        f" | {m['cpu_ms_per_transition']['p50']} | {m['transitions_per_s']['n']} |",
        f"| Bare Celery, hops | {m['bare_hops_per_s']['p50']} | {m['bare_cpu_ms_per_hop']['p50']}"
        f" | {m['bare_hops_per_s']['n']} |",
        "",
        f"Paired per-round ratios: {m['paired_ratio']['min']}..{m['paired_ratio']['max']}"
        f" (median {m['paired_ratio']['p50']}); CPU per transition / per bare hop: {m['cpu_ratio']}x.",
    ]


def memory_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    lines = [
        "| Measure | Value |",
        "|---|---:|",
        f"| Wesichain worker RSS (main + child), warm | {m['worker_rss_mib']['total_mib']} MiB"
        f" ({m['worker_rss_mib']['main_mib']} + {m['worker_rss_mib']['children_mib']}) |",
        f"| Bare Celery worker RSS (main + child) | {m['bare_worker_rss_mib']['total_mib']} MiB"
        f" ({m['bare_worker_rss_mib']['main_mib']} + {m['bare_worker_rss_mib']['children_mib']}) |",
        f"| Growth over {sc['settings']['runs'] - sc['settings']['warm_up_runs']} runs (total / main) |"
        f" {m['growth_mib']} / {m['growth_main_mib']} MiB |",
        f"| Peak worker RSS during the soak | {m['peak_worker_rss_mib']} MiB |",
        f"| Redis used_memory per retained run (direct) | {m['redis_bytes_per_run']} B |",
        "",
        "Redis bytes of one run's keys (MEMORY USAGE):",
        "",
        "| Run | Total B | Keys |",
        "|---|---:|---|",
    ]
    for run, sizes in m["redis_key_bytes_by_scenario"].items():
        keys = ", ".join(f"{k} {v}" for k, v in sizes.items() if k != "total")
        lines.append(f"| {run} | {sizes['total']} | {keys} |")
    return lines


def peers_table(sc: dict[str, Any]) -> list[str]:
    lines = []
    if "skipped" in sc:
        lines += [f"Skipped in part: {sc['skipped']}", ""]
    lines += ["| Run | System | p50 ms per transition/node | p50 ms per model step |", "|---|---|---:|---:|"]
    for case, row in sc["metrics"].items():
        lines.append(
            f"| {case} | wesichain (distributed, durable) | {row['wesichain_per_transition_ms']['p50']}"
            f" | {row['wesichain_per_step_ms']['p50']} |"
        )
        lines.append(
            f"| {case} | asyncio loop (in-process, nothing kept) | | {row['asyncio_per_step_ms']['p50']} |"
        )
        for kind in ("none", "memory", "sqlite", "sqlite-wal"):
            node = row.get(f"langgraph_{kind}_per_node_ms")
            if node:
                step = row[f"langgraph_{kind}_per_step_ms"]
                lines.append(f"| {case} | LangGraph, checkpointer: {kind} | {node['p50']} | {step['p50']} |")
    if sc.get("ratios"):
        lines += [
            "",
            "Wesichain per transition / LangGraph per node (chain): "
            + ", ".join(
                f"{k.removeprefix('transition_over_langgraph_').removesuffix('_node')} {v}x"
                for k, v in sc["ratios"].items()
            )
            + ".",
        ]
    return lines


def durability_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    lines = [
        "| Run-state Redis | Transition p50 ms | Ratio to no AOF (median of rounds) | Bare hop p50 ms"
        " | Bare hop ratio | fsync cost ms per transition | AOF bytes per transition |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, label in sc["settings"]["modes"].items():
        lines.append(
            f"| {label} | {m['transition_ms'][mode]['p50']} | {m['transition_ratio'][mode]['p50']}"
            f" | {m['bare_hop_ms'][mode]['p50']} | {m['bare_hop_ratio'][mode]['p50']}"
            f" | {m['fsync_cost_ms_per_transition'][mode]} | {m['aof_bytes_per_transition'][mode]} |"
        )
    fs: dict[str, Any] = next(iter(m["persistence"].values()), {})
    lines += [
        "",
        f"Per-round ratios are each mode's figure over the no-AOF server's in the same round"
        f" ({sc['settings']['rounds']} rounds, server order rotating). The AOF files were on"
        f" {fs.get('device', '?')} ({fs.get('fstype', '?')}, mounted on {fs.get('mountpoint', '?')}).",
    ]
    return lines


def backlog_table(sc: dict[str, Any]) -> list[str]:
    m = sc["metrics"]
    lat = m["run_latency_ms"]
    return [
        "| Measure | Value |",
        "|---|---:|",
        f"| Runs (one tool call each, one tool slot) | {sc['settings']['runs']} |",
        f"| Runs that did not complete | {m['failed_runs']} |",
        f"| Tasks delivered more than once | {m['delivered_more_than_once']} |",
        f"| Task ids re-published by the sweeper (`:e<n>`) | {m['republished_task_ids']} |",
        f"| Runs whose epoch moved | {m['runs_with_epoch_above_0']} |",
        f"| Tasks delivered / expected | {m['tasks_delivered']} / {m['tasks_expected']} |",
        f"| Peak tool-queue depth | {m['peak_tool_queue_depth']} |",
        f"| Wall time, first submit to last commit | {m['wall_s']} s ({m['runs_per_s']} runs/s) |",
        f"| Run latency p50 / p95 / max | {lat['p50']} / {lat['p95']} / {lat['max']} ms |",
        "",
        f"Queued lease {sc['settings']['queued_lease_s']} s; outcomes: {m['outcomes']}.",
    ]


RENDERERS = {
    "latency": latency_table,
    "transition": transition_table,
    "flat": flat_table,
    "fanout": fanout_table,
    "throughput": throughput_table,
    "memory": memory_table,
    "peers": peers_table,
    "durability": durability_table,
    "backlog": backlog_table,
}


def render(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        f"# Benchmark results ({'quick' if results['quick'] else 'full'} run)",
        "",
        f"{results['started_at']}; {results['elapsed_s']:.0f} s. Python {env['python']},"
        f" Celery {env['celery']},"
        f" {env['redis_server'].split(' sha=')[0]}, {env['cpu_count']} CPUs, {env['memory_gib']} GiB;"
        f" load average at start {env['loadavg_at_start']}, at end {env.get('loadavg_at_end')}.",
        "",
        "## Targets",
        "",
        *targets_table(results),
    ]
    for name, sc in results["scenarios"].items():
        lines += ["", f"## {sc.get('title', name)}", ""]
        if "error" in sc:
            lines.append(f"Failed: `{sc['error']}`")
            continue
        renderer = RENDERERS.get(name)
        if renderer is not None:
            lines += renderer(sc)
        for note in sc.get("notes", []):
            lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0] if args else Path(__file__).parent / "results" / "latest.json")
    print(render(json.loads(path.read_text())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
