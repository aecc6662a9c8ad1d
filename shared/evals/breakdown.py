"""An eval's figures grouped by a field of its dataset: any column or metadata key whose values
are short scalars (e.g. the bundled dataset's ``category``) splits the cases into groups, and each
group gets, per variant, what the summary gives the whole eval (pass rate with its Wilson
interval, mean scores, cost, latency).

A field with more distinct values than :data:`MAX_GROUPS` (an id, a free text) groups nothing
usefully and is not offered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult
from shared.evals.store import Item
from shared.evals.summary import VariantSummary, percentile, summarise

__all__ = ["MAX_FIELDS", "MAX_GROUPS", "breakdown", "case_fields", "variant_figures"]

#: Distinct values a field may have to group by it.
MAX_GROUPS = 30
#: Fields offered for grouping (in the dataset's order).
MAX_FIELDS = 20
_MAX_VALUE_CHARS = 80


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        text = str(value)
        return text if len(text) <= _MAX_VALUE_CHARS else None
    return None


def case_fields(cases: Mapping[int, Case]) -> dict[str, dict[int, str]]:
    """Field -> case index -> its value, for each groupable column (``metadata.KEY`` for metadata)."""
    fields: dict[str, dict[int, str]] = defaultdict(dict)
    unusable: set[str] = set()
    for index, case in cases.items():
        named = [*case.columns.items(), *((f"metadata.{k}", v) for k, v in case.metadata.items())]
        for name, raw in named:
            if name in unusable:
                continue
            value = _scalar(raw)
            if value is None:
                unusable.add(name)
                continue
            fields[name][index] = value
    usable = {
        name: values
        for name, values in fields.items()
        if name not in unusable and 1 < len(set(values.values())) <= MAX_GROUPS
    }
    return dict(list(usable.items())[:MAX_FIELDS])


def variant_figures(s: VariantSummary) -> dict[str, Any]:
    """One variant's figures as JSON."""
    low, high = s.interval
    return {
        "name": s.name,
        "runs": s.runs,
        "passed": s.passed,
        "failed_runs": s.failed_runs,
        "rate": s.pass_rate,
        "low": low,
        "high": high,
        "scores": s.mean_scores(),
        "tokens": s.tokens,
        "cost_usd": round(s.cost_usd, 8),
        "p50_s": percentile(s.latencies, 50),
        "p95_s": percentile(s.latencies, 95),
    }


def breakdown(
    cases: Mapping[int, Case], results: Sequence[CaseResult], variants: Sequence[str], repeats: int
) -> dict[str, list[dict[str, Any]]]:
    """Field -> its groups (by value), each with every variant's figures over the group's cases."""
    by_case: dict[int, list[CaseResult]] = defaultdict(list)
    for r in results:
        by_case[Item.parse(r.item).case].append(r)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, values in case_fields(cases).items():
        groups: dict[str, list[CaseResult]] = defaultdict(list)
        for index, value in values.items():
            groups[value].extend(by_case.get(index, []))
        out[name] = [
            {
                "value": value,
                "cases": sum(1 for v in values.values() if v == value),
                "variants": [variant_figures(s) for s in summarise(rows, variants, repeats)],
            }
            for value, rows in sorted(groups.items())
        ]
    return out
