"""What an eval costs on top of its runs, and how fast its report is.

    python -m benchmarks.evals                 # 1,000 cases, 2 rounds; report of 10,000 results
    python -m benchmarks.evals --quick         # 200 cases, 1 round
    python -m benchmarks.evals --cases 500 --rounds 3 --workers 2 --concurrency 4

Overhead: the same workers run N ``direct`` runs (one think each) submitted straight from a client,
then an eval of N cases on that agent (pumped, called back, scored and recorded on the pool), round
by round; the figure is the eval's wall time over the direct submits' (goal: at most 1.10). The
eval's cap is N, so it measures the eval's machinery, not a throttle. Report: rendering the HTML
report of 10,000 synthetic case results with varied texts (goal: at most 5 s and 10 MB).
Writes ``benchmarks/results/evals.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Cluster, new_prefix
from producer.evals.client import EvalClient
from producer.evals.report import render_report
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult, Score, Step
from shared.evals.spec import EvalSpec, parse_spec
from shared.evals.store import EvalMeta
from shared.state import Phase
from worker.testing.harness import wait_until

RESULTS = Path(__file__).parent / "results" / "evals.json"


def _direct(cluster: Cluster, prefix: str, n: int) -> float:
    client = cluster.client(prefix)
    try:
        started = time.perf_counter()
        handles = [client.submit("direct", f"case {i}", check_agent=False) for i in range(n)]

        def all_done() -> bool:
            return all(
                (h := client.store.load(x.run_id)) is not None and h.phase is Phase.COMPLETED for x in handles
            )

        wait_until(all_done, timeout=600, interval=0.05, what="the direct runs")
        return time.perf_counter() - started
    finally:
        client.close()


def bench_eval(n: int, round_: int) -> tuple[EvalSpec, list[Case]]:
    """The benchmark's eval of round ``round_``: ``n`` cases of the one-think ``direct`` agent,
    scored by a contains check, all of them running at once (a cap of ``n``)."""
    spec = parse_spec(
        {
            "name": f"bench{round_}",
            "dataset": "cases.jsonl",
            "variants": [{"agent": "direct"}],
            "scorers": [{"kind": "contains", "text": "42"}],
            "concurrency": n,
        }
    )
    return spec, [Case(id=f"c{i}", input=f"case {i}", expected="42") for i in range(n)]


def _eval(cluster: Cluster, prefix: str, n: int, round_: int) -> float:
    spec, cases = bench_eval(n, round_)
    client = cluster.client(prefix)
    evals = EvalClient(client)
    try:
        started = time.perf_counter()
        eval_id, _ = evals.submit(spec, cases, b"", "cases.jsonl", check_agents=False)
        progress = evals.wait(eval_id, timeout=600, poll_s=0.05)
        assert progress.recorded == n and progress.counts[0].passed == n, progress
        return time.perf_counter() - started
    finally:
        client.close()


def overhead(cases: int, rounds: int, workers: int, concurrency: int) -> dict[str, Any]:
    cluster = Cluster.start()
    prefix = new_prefix("evals")
    try:
        pool = [
            cluster.wesichain_worker(f"b{i}", prefix, concurrency=concurrency) for i in range(1, workers + 1)
        ]
        cluster.up(*pool)
        direct, evaluated = [], []
        for r in range(rounds):
            direct.append(_direct(cluster, prefix, cases))
            evaluated.append(_eval(cluster, prefix, cases, r))
            print(f"round {r + 1}: direct {direct[-1]:.2f}s, eval {evaluated[-1]:.2f}s", flush=True)
        ratios = [e / d for e, d in zip(evaluated, direct, strict=True)]
        return {
            "cases": cases,
            "workers": workers,
            "concurrency": concurrency,
            "direct_s": direct,
            "eval_s": evaluated,
            "ratio_per_round": [round(x, 3) for x in ratios],
            "ratio_median": round(statistics.median(ratios), 3),
            "goal": 1.10,
        }
    finally:
        cluster.close()


def report(results: int = 10_000) -> dict[str, Any]:
    """Render the report of ``results`` synthetic case results (2 variants), with varied texts."""
    n = results // 2
    spec = parse_spec(
        {
            "name": "r",
            "dataset": "d.jsonl",
            "variants": [{"name": "a", "agent": "x"}, {"name": "b", "agent": "x"}],
            "scorers": [{"kind": "exact"}, {"kind": "contains"}],
        }
    )
    cases = {
        i: Case(id=f"case-{i}", input=f"Question {i}: what is {i} times {i + 7}?", expected=str(i * (i + 7)))
        for i in range(n)
    }
    rows = []
    for i in range(n):
        for v in range(2):
            answer = (
                f"The product of {i} and {i + 7} is {i * (i + 7) + v * (i % 3 == 0)}, as the calculator said."
            )
            trajectory = [
                Step(kind="thought", text="Let me calculate that."),
                Step(kind="call", tool="calculator", arguments={"expression": f"{i} * {i + 7}"}),
                Step(
                    kind="result",
                    tool="calculator",
                    text=json.dumps({"expression": f"{i} * {i + 7}", "value": i * (i + 7)}),
                ),
                Step(kind="thought", text=answer),
            ]
            ok = v == 0 or i % 3 != 0
            rows.append(
                CaseResult(
                    item=f"{v}:{i}:0",
                    variant="ab"[v],
                    case_id=f"case-{i}",
                    repeat=0,
                    run_id=f"r:v{v}:c{i}:r0",
                    status="completed",
                    passed=ok,
                    answer=answer,
                    steps=2,
                    input_tokens=300 + i % 50,
                    output_tokens=40 + i % 9,
                    latency_s=1.0 + (i % 17) / 10,
                    scores=[
                        Score(
                            name="exact",
                            value=0.0,
                            passed=False,
                            explanation=f"expected {str(i * (i + 7))!r}, got {answer[:60]!r}",
                        ),
                        Score(
                            name="contains",
                            value=float(ok),
                            passed=ok,
                            explanation=f"the answer contains {str(i * (i + 7))!r}"
                            if ok
                            else f"missing {str(i * (i + 7))!r}",
                        ),
                    ],
                    trajectory=trajectory,
                )
            )
    meta = EvalMeta("r-1", spec, "completed", len(rows), n, 0.0, None, "d.jsonl")
    started = time.perf_counter()
    page = render_report(meta, cases, rows)
    seconds = time.perf_counter() - started
    size = len(page.encode())
    path = Path(tempfile.mkdtemp(prefix="wesichain-report-")) / "report.html"
    path.write_text(page, encoding="utf-8")
    return {
        "results": len(rows),
        "seconds": round(seconds, 3),
        "bytes": size,
        "mib": round(size / 2**20, 2),
        "goal_seconds": 5.0,
        "goal_mib": 10.0,
        "file": str(path),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 cases, 1 round")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--report-results", type=int, default=10_000)
    parser.add_argument("--skip-overhead", action="store_true")
    args = parser.parse_args()
    cases, rounds = (200, 1) if args.quick else (args.cases, args.rounds)
    out: dict[str, Any] = {"report": report(args.report_results)}
    r = out["report"]
    print(f"report: {r['results']} results in {r['seconds']}s, {r['mib']} MiB")
    if not args.skip_overhead:
        out["overhead"] = overhead(cases, rounds, args.workers, args.concurrency)
        print(f"eval / direct wall time: {out['overhead']['ratio_median']} (goal <= 1.10)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
