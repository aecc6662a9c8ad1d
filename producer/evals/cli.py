"""``wesichain eval run|status|cancel|resume|results|report|list|compare|watch|annotate|index``.

``eval run`` with a Redis URL (``--redis`` or ``$WESICHAIN_REDIS_URL``) creates the eval for the
pool and returns its id at once (``--wait`` follows it); with neither (or ``--embedded``) it runs
the eval in this process, as ``wesichain demo`` does, waits and writes the report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from producer.client import Client
from producer.evals.client import EvalClient, EvalTimeout, Progress
from producer.evals.export import FORMATS, export
from producer.evals.report import index_entry, render_index, render_report
from producer.evals.watch import watch
from producer.runtimes import run_embedded
from shared.evals.annotations import Agreement, AnnotationInput, agreement
from shared.evals.compare import ALPHA, Comparison, compare
from shared.evals.outcome import CaseResult
from shared.evals.spec import describe_errors
from shared.settings import ENV_REDIS_URL

__all__ = [
    "EXIT_BELOW_THRESHOLD",
    "EXIT_TIMEOUT",
    "annotate",
    "export_index",
    "cancel",
    "compare_evals",
    "dispatch",
    "list_evals",
    "register",
    "render_progress",
    "report",
    "results",
    "resume",
    "run",
    "status",
    "watch_eval",
]

#: ``eval run --wait`` / ``eval status --gate``: a variant's pass rate is below the threshold.
EXIT_BELOW_THRESHOLD = 1
EXIT_TIMEOUT = 3


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> dict[str, Any]:
    e = sub.add_parser("eval", help="batch-evaluate agents on the worker pool (run, status, results, report)")
    verbs = e.add_subparsers(dest="eval_command", required=True)
    r = verbs.add_parser("run", parents=[common], help="create an eval from a spec (TOML) and start it")
    r.add_argument("spec", help="the eval spec, e.g. examples/research-eval.toml")
    r.add_argument(
        "--wait", action="store_true", help="follow it until it completes (CI: exit 1 below threshold)"
    )
    r.add_argument(
        "--timeout", type=float, default=24 * 3600.0, help="with --wait: give up after this many seconds"
    )
    r.add_argument(
        "--id", dest="eval_id", help="the eval's id (default: the spec's name and a content digest)"
    )
    r.add_argument("--model", help="run every variant on this model (PROVIDER:MODEL)")
    r.add_argument(
        "--namespace",
        "--queue",
        dest="namespace",
        metavar="NAME",
        help="run the case runs on the queues NAME.model, NAME.tools, NAME.callbacks"
        " (workers started with --namespace NAME), not on production's",
    )
    r.add_argument("--embedded", action="store_true", help="run in this process (no server)")
    r.add_argument("--report", "-o", metavar="HTML", help="write the report here when it completes")
    r.add_argument("--no-check", action="store_true", help="create it even if no live worker serves an agent")
    r.add_argument(
        "--tenant",
        metavar="NAME",
        help="the tenant the eval belongs to: only its API keys see and review it in wesichain api",
    )
    for verb, text in (
        ("status", "show an eval's progress per variant"),
        ("cancel", "start no more case runs (those in flight finish)"),
        ("resume", "start case runs again after a cancel"),
    ):
        v = verbs.add_parser(verb, parents=[common], help=text)
        v.add_argument("eval_id")
        if verb == "status":
            v.add_argument("--json", action="store_true", help="print the progress as JSON")
            v.add_argument("--gate", action="store_true", help="exit 1 if a variant is below the threshold")
    res = verbs.add_parser("results", parents=[common], help="one row per case run")
    res.add_argument("eval_id")
    res.add_argument("--format", choices=FORMATS, default="jsonl", help="output format (default jsonl)")
    res.add_argument("--output", "-o", help="write to this file (default stdout)")
    rep = verbs.add_parser("report", parents=[common], help="write the self-contained HTML report")
    rep.add_argument("eval_id")
    rep.add_argument("--output", "-o", required=True, help="the HTML file to write")
    cmp = verbs.add_parser(
        "compare",
        parents=[common],
        help="per-case regressions and improvements, with a paired test (exit 1 on a significant regression)",
    )
    cmp.add_argument("baseline", help="the baseline eval's id")
    cmp.add_argument("candidate", nargs="?", help="the candidate eval's id (default: the baseline's)")
    cmp.add_argument("--variants", nargs=2, metavar=("BASE", "CANDIDATE"), help="compare these two variants")
    cmp.add_argument("--alpha", type=float, default=ALPHA, help=f"significance level (default {ALPHA})")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    ann = verbs.add_parser(
        "annotate", parents=[common], help="review a case run: label, score overrides, note"
    )
    ann.add_argument("eval_id")
    ann.add_argument("item", help="the case run, VARIANT:CASE:REPEAT indexes (as the viewer shows them)")
    ann.add_argument("--label", choices=("pass", "fail"), help="the reviewer's verdict")
    ann.add_argument(
        "--score", action="append", default=[], metavar="SCORER=VALUE", help="override a score (0..1)"
    )
    ann.add_argument("--note", default="", help="a comment")
    ann.add_argument(
        "--by", default=os.environ.get("USER") or "operator", help="the reviewer (default $USER)"
    )
    idx = verbs.add_parser(
        "index", parents=[common], help="export the index of evals and each eval's report as static HTML"
    )
    idx.add_argument("--output", "-o", required=True, metavar="DIR", help="the directory to write into")
    idx.add_argument("--limit", type=int, default=50, help="the newest this many evals (default 50)")
    idx.add_argument("--tenant", metavar="NAME", help="the evals of this tenant (default: the operator's)")
    w = verbs.add_parser("watch", parents=[common], help="a live view: progress, pass rate, cost, ETA")
    w.add_argument("eval_id")
    w.add_argument("--timeout", type=float, default=24 * 3600.0, help="stop watching after this many seconds")
    ls = verbs.add_parser("list", parents=[common], help="the newest evals")
    ls.add_argument("--limit", type=int, default=20, help="list at most this many (default 20)")
    return {"eval": dispatch}


def dispatch(args: argparse.Namespace) -> int:
    handler = {
        "run": run,
        "status": status,
        "cancel": cancel,
        "resume": resume,
        "results": results,
        "report": report,
        "list": list_evals,
        "compare": compare_evals,
        "watch": watch_eval,
        "annotate": annotate,
        "index": export_index,
    }[args.eval_command]
    return handler(args)


def _spec_path(raw: str) -> Path:
    """The spec file; ``examples/NAME.toml`` falls back to the bundled example of that name."""
    path = Path(raw)
    if path.exists() or path.parent.name != "examples":
        return path
    bundled = resources.files("shared.examples").joinpath(path.name)
    return Path(str(bundled)) if bundled.is_file() else path


def run(args: argparse.Namespace) -> int:
    embedded = args.embedded or not os.environ.get(ENV_REDIS_URL)
    context: AbstractContextManager[Client]
    if embedded:
        # One process: the in-memory broker, the Redis stand-in and a worker (as ``wesichain demo``).
        context = run_embedded(os.environ.get("WESICHAIN_AGENTS"), concurrency=8, archive=True)
    else:
        context = nullcontext(Client.from_env())
    with context as client:
        evals = EvalClient(client)
        eval_id, created = evals.submit_file(
            _spec_path(args.spec),
            eval_id=args.eval_id,
            model=args.model,
            check_agents=not args.no_check,
            namespace=args.namespace,
            tenant=args.tenant,
        )
        word = "created" if created else "exists already; following it"
        print(f"eval {eval_id} {word}" + (" (embedded: no server)" if embedded else ""), file=sys.stderr)
        if not (args.wait or embedded):
            print(eval_id)
            return 0
        try:
            progress = _follow(evals, eval_id, args.timeout)
        except EvalTimeout as exc:
            print(f"wesichain: {exc}", file=sys.stderr)
            return EXIT_TIMEOUT
        print(render_progress(progress))
        target = args.report or (f"{eval_id}-report.html" if embedded else None)
        if target:
            _write_report(evals, eval_id, target)
            print(f"report: {target}")
        return _gate(progress)


def _follow(evals: EvalClient, eval_id: str, timeout: float) -> Progress:
    """Wait for the eval: the live view on a terminal, else a line on stderr every few seconds."""
    if sys.stderr.isatty():
        return watch(evals, eval_id, timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return evals.wait(eval_id, min(5.0, max(0.0, deadline - time.monotonic())))
        except EvalTimeout:
            if time.monotonic() >= deadline:
                raise
            print(render_progress(evals.progress(eval_id)).splitlines()[0], file=sys.stderr, flush=True)


def _gate(progress: Progress) -> int:
    threshold = progress.meta.spec.pass_threshold
    below = [
        v.name
        for v, c in zip(progress.meta.spec.variants, progress.counts, strict=True)
        if (c.passed / c.done if c.done else 0.0) < threshold
    ]
    if below:
        print(f"below the pass threshold {threshold:.0%}: {', '.join(below)}", file=sys.stderr)
        return EXIT_BELOW_THRESHOLD
    return 0


def render_progress(p: Progress) -> str:
    spec = p.meta.spec
    total_per_variant = p.meta.cases * spec.repeats
    lines = [
        f"eval {p.meta.eval_id}: {p.meta.status}, {p.recorded}/{p.meta.items} case runs recorded,"
        f" {p.in_flight} in flight, {p.pending} not started"
    ]
    for variant, c in zip(spec.variants, p.counts, strict=True):
        rate = f"{c.passed / c.done:.1%}" if c.done else "-"
        lines.append(
            f"  {variant.name}: {c.done}/{total_per_variant} done, {c.failed} failed, pass {rate},"
            f" {c.tokens} tokens, ${c.cost_usd:.4f}"
        )
    return "\n".join(lines)


def status(args: argparse.Namespace) -> int:
    p = EvalClient(Client.from_env()).progress(args.eval_id)
    if args.json:
        print(
            json.dumps(
                {
                    "eval_id": p.meta.eval_id,
                    "status": p.meta.status,
                    "items": p.meta.items,
                    "recorded": p.recorded,
                    "in_flight": p.in_flight,
                    "pending": p.pending,
                    "judge_waits": p.judge_waits,
                    "variants": [
                        {"name": v.name, **c.__dict__}
                        for v, c in zip(p.meta.spec.variants, p.counts, strict=True)
                    ],
                }
            )
        )
    else:
        print(render_progress(p))
    return _gate(p) if args.gate else 0


def cancel(args: argparse.Namespace) -> int:
    was = EvalClient(Client.from_env()).cancel(args.eval_id)
    print(
        f"eval {args.eval_id}: " + ("cancelled; runs in flight finish" if was == "running" else f"was {was}")
    )
    return 0


def resume(args: argparse.Namespace) -> int:
    was = EvalClient(Client.from_env()).resume(args.eval_id)
    print(f"eval {args.eval_id}: " + ("resumed" if was != "completed" else "completed already"))
    return 0


def results(args: argparse.Namespace) -> int:
    evals = EvalClient(Client.from_env())
    rows = evals.results(args.eval_id)
    text = export(rows, args.format, args.eval_id, evals.labels(args.eval_id))
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _write_report(evals: EvalClient, eval_id: str, target: str) -> None:
    meta = evals.store.meta(eval_id)
    page = render_report(meta, evals.store.cases(eval_id), evals.results(eval_id), evals.labels(eval_id))
    Path(target).write_text(page, encoding="utf-8")


def report(args: argparse.Namespace) -> int:
    _write_report(EvalClient(Client.from_env()), args.eval_id, args.output)
    print(f"report: {args.output}")
    return 0


def list_evals(args: argparse.Namespace) -> int:
    evals = EvalClient(Client.from_env())
    for eval_id in evals.store.list_evals(args.limit):
        print(render_progress(evals.progress(eval_id)).splitlines()[0])
    return 0


def _by_variant(rows: list[CaseResult]) -> dict[str, list[CaseResult]]:
    grouped: dict[str, list[CaseResult]] = {}
    for r in rows:
        grouped.setdefault(r.variant, []).append(r)
    return grouped


def _pairs(args: argparse.Namespace, evals: EvalClient) -> list[Comparison]:
    base = _by_variant(evals.results(args.baseline))
    cand = base if args.candidate is None else _by_variant(evals.results(args.candidate))
    b_id, c_id = args.baseline, args.candidate or args.baseline
    if args.variants:
        v_base, v_cand = args.variants
        for name, rows, eval_id in ((v_base, base, b_id), (v_cand, cand, c_id)):
            if name not in rows:
                raise ValueError(f"eval {eval_id} has no results of variant {name!r} (it has {sorted(rows)})")
        return [compare(base[v_base], cand[v_cand], f"{b_id}/{v_base}", f"{c_id}/{v_cand}")]
    if args.candidate is None:
        raise ValueError("give a candidate eval, or --variants BASE CANDIDATE to compare two variants of one")
    shared_names = [n for n in base if n in cand]
    if shared_names:
        return [compare(base[n], cand[n], f"{b_id}/{n}", f"{c_id}/{n}") for n in shared_names]
    if len(base) == 1 and len(cand) == 1:
        (vb, rb), (vc, rc) = next(iter(base.items())), next(iter(cand.items()))
        return [compare(rb, rc, f"{b_id}/{vb}", f"{c_id}/{vc}")]
    raise ValueError("the evals share no variant name: name the two with --variants")


def _agreements(args: argparse.Namespace, evals: EvalClient) -> dict[str, Agreement]:
    """Each compared eval's human labels against its automatic verdicts."""
    ids = dict.fromkeys([args.baseline, args.candidate or args.baseline])
    return {eval_id: agreement(evals.results(eval_id), evals.labels(eval_id)) for eval_id in ids}


def compare_evals(args: argparse.Namespace) -> int:
    evals = EvalClient(Client.from_env())
    comparisons = _pairs(args, evals)
    agreements = _agreements(args, evals)
    for c in comparisons:
        c.alpha = args.alpha
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "baseline": c.a,
                        "candidate": c.b,
                        "pairs": c.pairs,
                        "baseline_passed": c.a_passed,
                        "candidate_passed": c.b_passed,
                        "regressions": c.regressions,
                        "improvements": c.improvements,
                        "p_value": c.p_value,
                        "significant_regression": c.significant_regression,
                        "human_agreement": {
                            "baseline": agreements[c.a.rsplit("/", 1)[0]].as_dict(),
                            "candidate": agreements[c.b.rsplit("/", 1)[0]].as_dict(),
                        },
                    }
                    for c in comparisons
                ]
            )
        )
    else:
        for c in comparisons:
            rates = f"pass {c.a_passed}/{c.pairs} -> {c.b_passed}/{c.pairs}"
            changes = f"{c.worse} worse, {c.better} better"
            print(f"{c.a} -> {c.b}: {c.pairs} paired runs, {rates}; {changes}: {c.verdict()}")
            if c.regressions:
                print(f"  regressions: {', '.join(c.regressions[:50])}")
            if c.improvements:
                print(f"  improvements: {', '.join(c.improvements[:50])}")
        for eval_id, agreed in agreements.items():
            if agreed.labelled:
                kappa = "-" if agreed.kappa is None else f"{agreed.kappa:.2f}"
                print(
                    f"human review of {eval_id}: {agreed.labelled} case runs labelled, the scorers agree"
                    f" on {agreed.agreed} ({agreed.rate:.1%}), Cohen's kappa {kappa}"
                )
    return EXIT_BELOW_THRESHOLD if any(c.significant_regression for c in comparisons) else 0


def annotate(args: argparse.Namespace) -> int:
    scores: dict[str, float] = {}
    for pair in args.score:
        name, sep, value = pair.partition("=")
        try:
            scores[name] = float(value)
        except ValueError:
            raise ValueError(f"--score {pair!r}: write SCORER=VALUE, a value within 0..1") from None
        if not sep:
            raise ValueError(f"--score {pair!r}: write SCORER=VALUE")
    try:
        value = AnnotationInput(label=args.label, scores=scores, note=args.note)
    except ValidationError as exc:
        raise ValueError(describe_errors(exc)) from None
    saved = EvalClient(Client.from_env()).annotate(args.eval_id, args.item, value, args.by)
    print(f"eval {args.eval_id} case run {saved.item}: {saved.label or 'no verdict'} by {saved.by}")
    return 0


def _file_name(eval_id: str) -> str:
    """A file name for the eval's report (ids may hold ``/`` and ``:``)."""
    return re.sub(r"[^A-Za-z0-9._@-]", "_", eval_id) + ".html"


def export_index(args: argparse.Namespace) -> int:
    evals = EvalClient(Client.from_env())
    target = Path(args.output)
    target.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    links: dict[str, str] = {}
    for eval_id in evals.store.tenant_evals(args.tenant, args.limit + 10):
        meta = evals.store.meta(eval_id)
        if meta.tenant != args.tenant:
            continue
        rows = evals.results(eval_id)
        name = _file_name(eval_id)
        if name in links.values():
            name = f"{name[:-5]}-{len(links)}.html"
        page = render_report(meta, evals.store.cases(eval_id), rows, evals.labels(eval_id))
        (target / name).write_text(page, encoding="utf-8")
        entries.append(index_entry(meta, rows))
        links[eval_id] = name
        if len(entries) >= args.limit:
            break
    (target / "index.html").write_text(render_index(entries, links), encoding="utf-8")
    print(f"index: {target / 'index.html'} ({len(entries)} evals)")
    return 0


def watch_eval(args: argparse.Namespace) -> int:
    try:
        progress = watch(EvalClient(Client.from_env()), args.eval_id, args.timeout)
    except EvalTimeout as exc:
        print(f"wesichain: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    return _gate(progress)
