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
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from shared.evals.compare import Comparison, compare
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult
from shared.evals.store import EvalMeta, Item
from shared.evals.summary import VariantSummary, percentile, summarise
from shared.llm.text import clean_text

__all__ = ["MAX_REPORT_TEXT", "comparison_html", "render_report", "variant_comparisons"]

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


def _histogram(values: Sequence[float], width: int = 260, height: int = 70, bins: int = 20) -> str:
    """A histogram as inline SVG."""
    if not values:
        return '<svg class="hist" width="0" height="0"></svg>'
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - low) / span * bins))] += 1
    top = max(counts)
    bar = width / bins
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - c / top * height:.1f}" width="{bar - 1:.1f}"'
        f' height="{c / top * height:.1f}"><title>{c}</title></rect>'
        for i, c in enumerate(counts)
        if c
    )
    return (
        f'<svg class="hist" viewBox="0 0 {width} {height + 14}" width="{width}" height="{height + 14}"'
        f' role="img">{rects}<text x="0" y="{height + 12}">{low:.3g}</text>'
        f'<text x="{width}" y="{height + 12}" text-anchor="end">{high:.3g}</text></svg>'
    )


def _rate_bar(s: VariantSummary) -> str:
    low, high = s.interval
    w = 160
    return (
        f'<svg class="rate" viewBox="0 0 {w} 14" width="{w}" height="14" role="img">'
        f'<rect class="track" x="0" y="3" width="{w}" height="8"/>'
        f'<rect class="ci" x="{low * w:.1f}" y="1" width="{max(1.0, (high - low) * w):.1f}" height="12"/>'
        f'<rect class="point" x="{s.pass_rate * w - 1:.1f}" y="0" width="3" height="14"/>'
        f"<title>{s.pass_rate:.1%} (95% CI {low:.1%}-{high:.1%})</title></svg>"
    )


def _summary(summaries: Sequence[VariantSummary], threshold: float) -> str:
    scorers = sorted({name for s in summaries for name in s.scores})
    ks = sorted({k for s in summaries for k in s.pass_at})
    head = "".join(f"<th>{_e(n)}</th>" for n in scorers) + "".join(f"<th>pass@{k}</th>" for k in ks if k > 1)
    rows = []
    for s in summaries:
        low, high = s.interval
        gate = "ok" if s.pass_rate >= threshold else "below"
        means = s.mean_scores()
        cells = "".join(f"<td>{means[n]:.3f}</td>" if n in means else "<td>-</td>" for n in scorers)
        cells += "".join(f"<td>{s.pass_at.get(k, 0):.1%}</td>" for k in ks if k > 1)
        rows.append(
            f'<tr class="{gate}"><th>{_e(s.name)}</th><td>{s.runs}</td><td>{s.pass_rate:.1%}'
            f" <small>[{low:.1%}-{high:.1%}]</small><br>{_rate_bar(s)}</td><td>{s.failed_runs}</td>"
            f"{cells}<td>{percentile(s.latencies, 50):.2f}s / {percentile(s.latencies, 95):.2f}s</td>"
            f"<td>{s.tokens}</td><td>${s.cost_usd:.4f}</td></tr>"
        )
    return (
        '<table class="summary"><thead><tr><th>variant</th><th>runs</th><th>pass rate [95% CI]</th>'
        f"<th>runs failed</th>{head}<th>latency p50 / p95</th><th>tokens</th><th>cost</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _charts(summaries: Sequence[VariantSummary]) -> str:
    blocks = []
    for s in summaries:
        blocks.append(
            f"<figure><figcaption>{_e(s.name)}: latency (s)</figcaption>{_histogram(s.latencies)}</figure>"
            f"<figure><figcaption>{_e(s.name)}: tokens per run</figcaption>"
            f"{_histogram([float(t) for t in s.token_counts])}</figure>"
        )
    return f'<div class="charts">{"".join(blocks)}</div>'


def _failures(summaries: Sequence[VariantSummary], results: Sequence[CaseResult]) -> str:
    by_kind: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        if (kind := r.error_kind) is not None:
            by_kind[kind].append(r)
    checks = _failed_checks(summaries, results)
    if not by_kind:
        return "<p>No run failed and no scorer raised.</p>" + checks
    items = []
    for kind, rows in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        examples = ", ".join(_e(f"{r.case_id} ({r.variant})") for r in rows[:8])
        first = rows[0]
        message = (first.error or {}).get("message") or next(
            (s.explanation for s in first.scores if s.error), ""
        )
        items.append(
            f"<li><b>{_e(kind)}</b> x{len(rows)}: <q>{_e(_cut(str(message), 200))}</q>"
            f" <small>e.g. {examples}</small></li>"
        )
    return f'<ul class="failures">{"".join(items)}</ul>' + checks


def _failed_checks(summaries: Sequence[VariantSummary], results: Sequence[CaseResult]) -> str:
    """How often each scorer failed a completed run, per variant."""
    failed: dict[tuple[str, str], int] = defaultdict(int)
    for r in results:
        for s in r.scores:
            if not s.passed:
                failed[(r.variant, s.name)] += 1
    if not failed:
        return ""
    scorers = sorted({name for _, name in failed})
    head = "".join(f"<th>{_e(n)}</th>" for n in scorers)
    rows = "".join(
        f"<tr><th>{_e(s.name)}</th>"
        + "".join(f"<td>{failed.get((s.name, n), 0)}</td>" for n in scorers)
        + "</tr>"
        for s in summaries
    )
    table = f'<table class="checks"><thead><tr><th>failed checks</th>{head}</tr></thead>'
    return f"{table}<tbody>{rows}</tbody></table>"


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


def comparison_html(comparisons: Sequence[Comparison]) -> str:
    """A table of paired comparisons: pass rates, regressions, improvements, McNemar's p-value."""
    if not comparisons:
        return ""
    rows = []
    for c in comparisons:
        worse = ", ".join(_e(x) for x in c.regressions[:20]) + (" …" if len(c.regressions) > 20 else "")
        better = ", ".join(_e(x) for x in c.improvements[:20]) + (" …" if len(c.improvements) > 20 else "")
        cls = "below" if c.significant_regression else ""
        rows.append(
            f'<tr class="{cls}"><th>{_e(c.a)} &rarr; {_e(c.b)}</th><td>{c.pairs}</td>'
            f"<td>{c.a_passed / max(1, c.pairs):.1%} &rarr; {c.b_passed / max(1, c.pairs):.1%}</td>"
            f"<td>{c.worse}: {worse or '-'}</td><td>{c.better}: {better or '-'}</td>"
            f"<td>{c.p_value:.3g}</td><td>{_e(c.verdict())}</td></tr>"
        )
    return (
        '<h2>Comparison</h2><table class="summary compare"><thead><tr><th>baseline &rarr; candidate</th>'
        "<th>pairs</th><th>pass rate</th><th>regressions</th><th>improvements</th>"
        f"<th>McNemar p</th><th>verdict</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


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


@cache
def _asset(name: str) -> str:
    """The report's stylesheet or script, inlined into every report."""
    return resources.files("producer.evals").joinpath(name).read_text(encoding="utf-8")


def render_report(
    meta: EvalMeta, cases: dict[int, Case], results: Sequence[CaseResult], *, extra_html: str = ""
) -> str:
    """The report as one HTML string (write it to a ``.html`` file)."""
    spec = meta.spec
    summaries = summarise(results, [v.name for v in spec.variants], spec.repeats)
    data = _script_json(_data(meta, cases, results))
    title = f"Eval {meta.eval_id}"
    return _PAGE.format(
        title=_e(title),
        eval_id=_e(meta.eval_id),
        status=_e(meta.status),
        dataset=_e(meta.dataset),
        counts=_e(f"{meta.cases} cases x {len(spec.variants)} variants x {spec.repeats} repeats"),
        threshold=f"{spec.pass_threshold:.0%}",
        summary=_summary(summaries, spec.pass_threshold),
        charts=_charts(summaries),
        failures=_failures(summaries, results),
        extra=comparison_html(variant_comparisons(meta, results)) + extra_html,
        data=data,
        style=_asset("report.css"),
        script=_asset("report.js"),
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title><style>{style}</style></head>
<body>
<h1>{title}</h1>
<p class="meta">status <b id="eval-status">{status}</b> &middot; dataset {dataset} &middot; {counts}
 &middot; CI pass threshold {threshold}</p>
<h2>Summary</h2>
<section id="summary">{summary}</section>
<h2>Distributions</h2>
{charts}
<h2>Failures by kind</h2>
{failures}
{extra}
<h2>Cases</h2>
<div class="controls">
<input id="case-filter" type="search" placeholder="filter by id, input, expected or answer">
<select id="case-which"><option value="all">all cases</option><option value="failing">failing</option>
<option value="passing">passing</option><option value="differ">variants differ</option>
<option value="errors">errors</option></select><span id="case-count"></span></div>
<table id="cases"><thead><tr id="case-head"></tr></thead><tbody id="case-rows"></tbody></table>
<script type="application/json" id="eval-data">{data}</script>
<script>{script}</script>
</body></html>
"""
