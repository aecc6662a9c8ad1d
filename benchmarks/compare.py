"""Compare two benchmark results and say what regressed.

    python benchmarks/compare.py NEW.json BASELINE.json

Absolute times drift 20-35 % between runs on the same machine, so metrics are compared by the
ratios each run measured against its own reference (the ``normalized`` value of a gated metric:
a scenario's latency over its floor in the same run, the model's time plus a bare Celery hop per
transition; memory over the bare worker's RSS; targets as ratios); a metric without a reference,
or whose reference differs from the baseline's (its ``normalized_unit``), is compared as is.

Gates, on the relative change in the bad direction:

* p50 latencies and target ratios: +7 % -> REVIEW (printed, exit status unchanged);
* p95 latencies: +10 % -> BLOCK;
* peak memory: +5 % -> BLOCK.

Exit status: 0 when nothing blocks, 1 when something does, 2 on unreadable input. Standard
library only, so it runs anywhere the JSON files are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: kind -> (threshold, verdict when exceeded)
GATES: dict[str, tuple[float, str]] = {
    "p50": (0.07, "REVIEW"),
    "ratio": (0.07, "REVIEW"),
    "p95": (0.10, "BLOCK"),
    "memory": (0.05, "BLOCK"),
}


#: The unit of the latency scenario's gates (``benchmarks/scenarios.py``): a run's latency over its
#: floor in the same run, the model's time plus a bare hop per transition. Results written before
#: it gated overhead in bare hops; their figures give the new unit as well.
LATENCY_UNIT = "x floor (model time + a bare hop per transition)"


def _latency_over_floor(results: dict[str, Any], gid: str) -> float | None:
    """Latency gate ``gid`` (``latency.AGENT@VARIANT.p50|p95``) of ``results`` in
    :data:`LATENCY_UNIT`, from the scenario's own figures; None if they are not there."""
    parts = gid.split(".")
    if len(parts) != 3 or parts[0] != "latency" or parts[2] not in ("p50", "p95"):
        return None
    metrics = results["scenarios"].get("latency", {}).get("metrics", {})
    run = metrics.get("scenarios", {}).get(parts[1])
    hop = metrics.get("bare_hop_ms", {}).get("p50")
    try:
        floor = run["model_calls"] * run["model_latency_ms"] + run["transitions"] * hop
        return round(float(run["latency_ms"][parts[2]]) / float(floor), 4)
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def _load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    if "scenarios" not in data:
        raise ValueError(f"{path}: not a benchmark result (no 'scenarios')")
    return data


def _gated(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for sc in results["scenarios"].values():
        for g in sc.get("gated", []):
            out[g["id"]] = g
    return out


def _targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{name}.{tid}": t
        for name, sc in results["scenarios"].items()
        for tid, t in sc.get("targets", {}).items()
    }


def compare(new: dict[str, Any], base: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for every gated metric present in both, and notes (missing metrics, target changes)."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    if new.get("quick") != base.get("quick"):
        notes.append("one run is --quick and the other is not: sample sizes differ")
    g_new, g_base = _gated(new), _gated(base)
    for gid in sorted(set(g_new) | set(g_base)):
        if gid not in g_new or gid not in g_base:
            notes.append(f"{gid}: only in {'the new run' if gid in g_new else 'the baseline'}")
            continue
        n, b = g_new[gid], g_base[gid]
        # Normalized values compare only in the same unit: a baseline in an older unit is put in
        # the new one from its own figures where it can be (:func:`_latency_over_floor`), else
        # the gate is compared on its raw values (and says so).
        use_norm = "normalized" in n and "normalized" in b
        if use_norm and n.get("normalized_unit") != b.get("normalized_unit"):
            again = _latency_over_floor(base, gid) if n.get("normalized_unit") == LATENCY_UNIT else None
            if again is not None:
                b = {**b, "normalized": again, "normalized_unit": LATENCY_UNIT}
            else:
                use_norm = False
                notes.append(
                    f"{gid}: normalized as {n.get('normalized_unit')!r}, the baseline as"
                    f" {b.get('normalized_unit')!r}: compared on the raw values"
                )
        nv, bv = (n["normalized"], b["normalized"]) if use_norm else (n["value"], b["value"])
        if not bv or not nv:
            continue
        worse = (nv / bv - 1) if n.get("better", "lower") == "lower" else (bv / nv - 1)
        threshold, verdict = GATES.get(n["kind"], (0.07, "REVIEW"))
        rows.append(
            {
                "id": gid,
                "kind": n["kind"],
                "baseline": bv,
                "new": nv,
                "unit": n.get("normalized_unit") if use_norm else n.get("unit"),
                "raw": (b["value"], n["value"], n.get("unit")),
                "worse_by": worse,
                "threshold": threshold,
                "verdict": verdict if worse > threshold else "ok",
            }
        )
    t_new, t_base = _targets(new), _targets(base)
    for tid in sorted(set(t_new) & set(t_base)):
        if t_base[tid]["pass"] and not t_new[tid]["pass"]:
            notes.append(
                f"target {tid} now missed: {t_new[tid]['value']} (goal {t_new[tid]['op']} "
                f"{t_new[tid]['target']}; baseline {t_base[tid]['value']})"
            )
        elif not t_base[tid]["pass"] and t_new[tid]["pass"]:
            notes.append(f"target {tid} now met: {t_new[tid]['value']} (baseline {t_base[tid]['value']})")
    for name, sc in new["scenarios"].items():
        if "error" in sc:
            notes.append(f"scenario {name} failed in the new run: {sc['error']}")
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 2
    try:
        new, base = _load(args[0]), _load(args[1])
    except (OSError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    rows, notes = compare(new, base)
    width = max([len(r["id"]) for r in rows] + [6])
    print(f"{'metric':<{width}}  {'kind':<6} {'baseline':>10} {'new':>10} {'change':>8}  verdict")
    for r in rows:
        print(
            f"{r['id']:<{width}}  {r['kind']:<6} {r['baseline']:>10.4g} {r['new']:>10.4g}"
            f" {100 * r['worse_by']:>+7.1f}%  {r['verdict']}"
        )
    flagged = [r for r in rows if r["verdict"] != "ok"]
    print()
    for r in flagged:
        b, n, unit = r["raw"]
        print(
            f"{r['verdict']}: {r['id']} is {100 * r['worse_by']:.1f}% worse ({r['kind']} gate"
            f" {100 * r['threshold']:.0f}%): {r['baseline']:.4g} -> {r['new']:.4g} {r['unit'] or ''}"
            f" (raw {b} -> {n} {unit})"
        )
    for note in notes:
        print(f"note: {note}")
    blocked = [r for r in flagged if r["verdict"] == "BLOCK"]
    reviews = [r for r in flagged if r["verdict"] == "REVIEW"]
    print(f"\n{len(rows)} metrics compared: {len(blocked)} block, {len(reviews)} for review.")
    return 1 if blocked else 0


if __name__ == "__main__":
    sys.exit(main())
