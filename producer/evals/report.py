"""One self-contained HTML report of an eval: no network, no CDN, it opens from an email attachment.

A summary per variant (pass rate with its 95% interval, mean score per scorer, pass@k, latency and
token distributions as inline SVG, cost), failures grouped by error kind, and a case table that
sorts and filters, each row opening a drill-down: the input, the expected answer, every variant's
answer side by side with its scores, explanations and the run's trajectory.
"""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from shared.evals.annotations import Annotation, agreement
from shared.evals.breakdown import breakdown, case_fields, variant_figures
from shared.evals.compare import Comparison, compare
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult
from shared.evals.store import EvalMeta, Item
from shared.evals.summary import VariantSummary, summarise
from shared.llm.text import clean_text

__all__ = [
    "MAX_REPORT_TEXT",
    "comparison_data",
    "index_entry",
    "inline_assets",
    "render_index",
    "render_live",
    "render_report",
    "report_data",
    "variant_comparisons",
    "verdict",
]

#: Characters kept per text in the report's data (answers, trajectory entries).
MAX_REPORT_TEXT = 400


def _cut(text: str | None, limit: int = MAX_REPORT_TEXT) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + "…"


#: What may not stand as itself in JSON inside a ``<script>`` element. ``<`` and ``>``: with them
#: escaped no text can close the element (``</script>``, in any case), open a comment (``<!--``,
#: after which a ``<script>`` keeps the element open past its end) or end a CDATA section. ``&``:
#: the data stays the same text where character references are decoded (XHTML, an attribute).
#: U+2028 and U+2029: line breaks to JavaScript parsers older than ES2019. All of them only occur
#: inside JSON strings, where ``\uXXXX`` is the same character to ``JSON.parse``.
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029]")


def _u_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _e(value: object) -> str:
    """``value`` as HTML text or attribute value.

    A lone surrogate (half a character, which the report's data may hold in values of any type)
    becomes U+FFFD, as a UTF-8 decoder does: no UTF-8 file can hold it.
    """
    return html.escape(clean_text(str(value)), quote=True)


def _script_json(value: Any) -> str:
    """``value`` as JSON text to put inside ``<script type="application/json">``, which
    ``JSON.parse(element.textContent)`` reads back exactly, whatever the texts in it hold (lone
    surrogates become U+FFFD, as in :func:`_e`)."""
    text = clean_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return _SCRIPT_UNSAFE.sub(_u_escape, text)


class _Strings:
    """A table of the texts that repeat across runs (scorer names, explanations, thoughts, tool
    calls): each is written once and referred to by its index, which keeps large reports small."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str | None, limit: int = 160) -> int | None:
        if text is None:
            return None
        text = _cut(text, limit) or ""
        if (at := self._index.get(text)) is None:
            at = self._index[text] = len(self.table)
            self.table.append(text)
        return at


def variant_comparisons(meta: EvalMeta, results: Sequence[CaseResult]) -> list[Comparison]:
    """The first variant (the baseline) against each other one."""
    names = [v.name for v in meta.spec.variants]
    by_variant: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_variant[r.variant].append(r)
    return [compare(by_variant[names[0]], by_variant[n], names[0], n) for n in names[1:]]


def _json_text(value: Any) -> str:
    """A value shown as JSON (an expected answer, a tool call's arguments): its texts as they are,
    not as ``\\uXXXX`` escapes."""
    return json.dumps(value, ensure_ascii=False)


def _data(meta: EvalMeta, cases: dict[int, Case], results: Sequence[CaseResult]) -> dict[str, Any]:
    variants = [v.name for v in meta.spec.variants]
    rows: dict[int, dict[str, Any]] = {}
    s = _Strings()
    for r in results:
        index = Item.parse(r.item).case
        case = cases.get(index)
        row = rows.setdefault(
            index,
            {
                "i": index,
                "id": r.case_id,
                "input": _cut(case.input if case else ""),
                "expected": _cut(_json_text(case.expected) if case and case.expected is not None else ""),
                "runs": [],
            },
        )
        row["runs"].append(
            {
                "v": variants.index(r.variant) if r.variant in variants else 0,
                "r": r.repeat,
                "ok": r.passed,
                "st": r.status,
                "a": _cut(r.answer),
                "e": _cut((r.error or {}).get("message")) if r.error else None,
                "ek": r.error_kind,
                "lat": r.latency_s,
                "tok": r.input_tokens + r.output_tokens,
                "steps": r.steps,
                "sc": [[s(x.name), round(x.value, 4), x.passed, s(x.explanation)] for x in r.scores],
                "tr": [
                    [t.kind[0], s(t.tool), s(t.text), s(_json_text(t.arguments)) if t.arguments else None]
                    for t in r.trajectory
                ],
            }
        )
    return {
        "eval": meta.eval_id,
        "variants": variants,
        "strings": s.table,
        "cases": [rows[i] for i in sorted(rows)],
    }


def comparison_data(c: Comparison) -> dict[str, Any]:
    """A paired comparison as JSON: pass rates, regressions, improvements, McNemar's p-value."""
    return {
        "a": c.a,
        "b": c.b,
        "pairs": c.pairs,
        "a_passed": c.a_passed,
        "b_passed": c.b_passed,
        "worse": c.worse,
        "better": c.better,
        "regressions": c.regressions[:_MAX_LISTED],
        "improvements": c.improvements[:_MAX_LISTED],
        "more_regressions": max(0, len(c.regressions) - _MAX_LISTED),
        "more_improvements": max(0, len(c.improvements) - _MAX_LISTED),
        "p": c.p_value,
        "alpha": c.alpha,
        "significant_regression": c.significant_regression,
        "verdict": c.verdict(),
    }


#: Case ids listed per regression or improvement list, and examples per failure kind.
_MAX_LISTED = 20


def _histogram(values: Sequence[float], bins: int = 20) -> dict[str, Any]:
    """A histogram's bins (the viewer draws it as inline SVG)."""
    if not values:
        return {"low": 0, "high": 0, "counts": []}
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - low) / span * bins))] += 1
    return {"low": low, "high": high, "counts": counts}


def _failures(results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    by_kind: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        if (kind := r.error_kind) is not None:
            by_kind[kind].append(r)
    out = []
    for kind, rows in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        first = rows[0]
        message = (first.error or {}).get("message") or next(
            (s.explanation for s in first.scores if s.error), ""
        )
        out.append(
            {
                "kind": kind,
                "n": len(rows),
                "message": _cut(str(message), 200),
                "examples": [f"{r.case_id} ({r.variant})" for r in rows[:8]],
            }
        )
    return out


def _failed_checks(summaries: Sequence[VariantSummary], results: Sequence[CaseResult]) -> dict[str, Any]:
    """How often each scorer failed a completed run, per variant."""
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for r in results:
        for score in r.scores:
            if not score.passed:
                failed[(r.variant, score.name)] += 1
    scorers = sorted({name for _, name in failed})
    return {
        "scorers": scorers,
        "rows": [[s.name, *(failed.get((s.name, n), 0) for n in scorers)] for s in summaries]
        if scorers
        else [],
    }


def verdict(summaries: Sequence[VariantSummary], threshold: float, status: str) -> dict[str, Any]:
    """The CI gate's verdict: ``pass`` when every variant reaches the threshold, ``fail`` when
    none does, ``mixed`` when some do (the gate then fails: it requires every variant)."""
    above = [s.name for s in summaries if s.runs and s.pass_rate >= threshold]
    below = [s.name for s in summaries if not (s.runs and s.pass_rate >= threshold)]
    word = "pass" if not below else ("fail" if not above else "mixed")
    return {
        "verdict": word,
        "threshold": threshold,
        "above": above,
        "below": below,
        "final": status == "completed",
        "gate_exit": 0 if word == "pass" else 1,
    }


def _header(meta: EvalMeta) -> dict[str, Any]:
    spec = meta.spec
    return {
        "status": meta.status,
        "name": spec.name,
        "dataset": meta.dataset,
        "created_at": meta.created_at,
        "finished_at": meta.finished_at,
        "cases": meta.cases,
        "repeats": spec.repeats,
        "concurrency": spec.concurrency,
        "namespace": spec.namespace,
        "scorers": [s.model_dump(mode="json", exclude_defaults=True) for s in spec.scorers],
        "variants": [
            {"name": v.name, "agent": v.agent, "model": v.model, "metadata": v.metadata}
            for v in spec.variants
        ],
        "context": meta.context,
    }


def report_data(
    meta: EvalMeta,
    cases: dict[int, Case],
    results: Sequence[CaseResult],
    labels: Mapping[str, Annotation] | None = None,
) -> dict[str, Any]:
    """Everything the viewer shows of one eval, as JSON: the static report embeds it, the HTTP
    API serves it (``GET /v1/evals/{id}``)."""
    spec = meta.spec
    variants = [v.name for v in spec.variants]
    summaries = summarise(results, variants, spec.repeats)
    data = _data(meta, cases, results)
    fields = case_fields(cases)
    for row in data["cases"]:
        row["f"] = {name: values[row["i"]] for name, values in fields.items() if row["i"] in values}
    labels = labels or {}
    by_variant: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_variant[r.variant].append(r)
    data.update(
        {
            "header": _header(meta),
            "verdict": verdict(summaries, spec.pass_threshold, meta.status),
            "summary": [
                {
                    **variant_figures(s),
                    "pass_at": {str(k): v for k, v in s.pass_at.items() if k > 1},
                    "latency": _histogram(s.latencies),
                    "token_hist": _histogram([float(t) for t in s.token_counts]),
                }
                for s in summaries
            ],
            "failures": _failures(results),
            "checks": _failed_checks(summaries, results),
            "comparisons": [comparison_data(c) for c in variant_comparisons(meta, results)],
            "breakdown": breakdown(cases, results, variants, spec.repeats),
            "labels": {item: a.model_dump(mode="json") for item, a in labels.items()},
            "agreement": {name: agreement(by_variant[name], labels).as_dict() for name in variants}
            | {"all": agreement(results, labels).as_dict()},
        }
    )
    return data


def index_entry(meta: EvalMeta, results: Sequence[CaseResult]) -> dict[str, Any]:
    """One eval in the index of evals: when, what, and each variant's figures (for trends)."""
    spec = meta.spec
    summaries = summarise(results, [v.name for v in spec.variants], spec.repeats)
    return {
        "id": meta.eval_id,
        "name": spec.name,
        "status": meta.status,
        "created_at": meta.created_at,
        "finished_at": meta.finished_at,
        "dataset": meta.dataset,
        "cases": meta.cases,
        "code_version": meta.context.get("code_version"),
        "verdict": verdict(summaries, spec.pass_threshold, meta.status)["verdict"],
        "variants": [variant_figures(s) for s in summaries],
    }


@cache
def _asset(name: str) -> str:
    """The viewer's stylesheet or script, inlined into every page."""
    return resources.files("producer.evals").joinpath(name).read_text(encoding="utf-8")


def _page(title: str, data: Any) -> str:
    return _PAGE.format(
        title=_e(title), data=_script_json(data), style=_asset("report.css"), script=_asset("report.js")
    )


def render_report(
    meta: EvalMeta,
    cases: dict[int, Case],
    results: Sequence[CaseResult],
    labels: Mapping[str, Annotation] | None = None,
) -> str:
    """The report as one self-contained HTML string (write it to a ``.html`` file): the viewer with
    the eval's data in it. Annotations made so far show, read-only; it links to no server."""
    return _page(f"Eval {meta.eval_id}", {"page": "eval", **report_data(meta, cases, results, labels)})


def render_index(entries: Sequence[dict[str, Any]], links: Mapping[str, str]) -> str:
    """The index of evals as one HTML file: trends per variant and scorer; each eval links to its
    report file in ``links`` (eval id -> relative file name)."""
    return _page("Evals", {"page": "index", "evals": list(entries), "links": dict(links)})


def inline_assets() -> tuple[str, str]:
    """The script and the stylesheet every page has inline (a page's policy allows them by hash)."""
    return _asset("report.js"), _asset("report.css")


def render_live(page: str) -> str:
    """The viewer served by ``wesichain api`` (``/evals/`` and ``/evals/{id}``): no data in it, its
    script reads the caller's evals from the JSON API with the caller's key."""
    return _page("Evals", {"page": page, "live": True})


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<link rel="icon" href="data:,"><title>{title}</title><style>{style}</style></head>
<body>
<main id="viewer"><p class="loading">Loading…</p></main>
<script type="application/json" id="eval-data">{data}</script>
<script>{script}</script>
</body></html>
"""
