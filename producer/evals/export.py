"""Results as files: JSON lines, CSV, or JUnit XML (one test case per case run, for CI)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape, quoteattr

from shared.evals.annotations import Annotation, annotation_columns
from shared.evals.outcome import CaseResult

__all__ = ["FORMATS", "export"]

FORMATS = ("jsonl", "csv", "junit")
_CSV_FIELDS = (
    "variant",
    "case_id",
    "repeat",
    "passed",
    "status",
    "answer",
    "error",
    "steps",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "latency_s",
    "run_id",
)
#: The columns of a case run's human review, beside its automatic scores.
_HUMAN_FIELDS = ("human_label", "human_scores", "human_note", "human_by", "human_at")


def _row(r: CaseResult, label: Annotation | None = None) -> dict[str, object]:
    return {
        "variant": r.variant,
        "case_id": r.case_id,
        "repeat": r.repeat,
        "passed": r.passed,
        "status": r.status,
        "answer": r.answer,
        "error": r.error,
        "steps": r.steps,
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "cost_usd": round(r.cost_usd, 8),
        "latency_s": r.latency_s,
        "run_id": r.run_id,
        "scores": {s.name: s.value for s in r.scores},
        "explanations": {s.name: s.explanation for s in r.scores},
        "human": label.model_dump(mode="json", exclude={"item"}) if label is not None else None,
    }


def export(
    results: Sequence[CaseResult],
    fmt: str,
    eval_id: str = "eval",
    labels: Mapping[str, Annotation] | None = None,
) -> str:
    """The results as a file; ``labels`` (item -> latest annotation) adds each case run's human
    review: ``human`` in JSON lines, the ``human_*`` columns in CSV (JUnit has no place for it)."""
    labels = labels or {}
    if fmt == "jsonl":
        return "".join(json.dumps(_row(r, labels.get(r.item)), ensure_ascii=False) + "\n" for r in results)
    if fmt == "csv":
        names = sorted({s.name for r in results for s in r.scores})
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow([*_CSV_FIELDS, *(f"score:{n}" for n in names), *_HUMAN_FIELDS])
        for r in results:
            row = _row(r)
            scores = {s.name: s.value for s in r.scores}
            error = json.dumps(r.error) if r.error else ""
            writer.writerow(
                [
                    *(error if f == "error" else row[f] for f in _CSV_FIELDS),
                    *(scores.get(n, "") for n in names),
                    *annotation_columns(labels.get(r.item)).values(),
                ]
            )
        return out.getvalue()
    if fmt == "junit":
        return _junit(results, eval_id)
    raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")


def _junit(results: Sequence[CaseResult], eval_id: str) -> str:
    failures = sum(1 for r in results if not r.passed and not r.failed)
    errors = sum(1 for r in results if r.failed)
    time_s = sum(r.latency_s for r in results)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name={quoteattr(eval_id)} tests="{len(results)}" failures="{failures}"'
        f' errors="{errors}" time="{time_s:.3f}">',
    ]
    for r in results:
        name = quoteattr(f"{r.case_id}#{r.repeat}")
        lines.append(f'  <testcase classname={quoteattr(r.variant)} name={name} time="{r.latency_s:.3f}">')
        if r.failed:
            message = (r.error or {}).get("message", r.status)
            lines.append(f"    <error message={quoteattr(str(message)[:500])}>{escape(r.run_id)}</error>")
        elif not r.passed:
            why = "; ".join(f"{s.name}: {s.explanation}" for s in r.scores if not s.passed)
            lines.append(f"    <failure message={quoteattr(why[:500])}>{escape(r.answer or '')}</failure>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"
