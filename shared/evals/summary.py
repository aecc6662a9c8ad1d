"""Figures of an eval's results: per variant pass rate (with a Wilson interval), scores, latency,
tokens, cost, pass@k over repeats, and failures grouped by error kind."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.evals.outcome import CaseResult

__all__ = ["VariantSummary", "pass_at_k", "percentile", "summarise", "wilson"]


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate (95% by default); (0, 1) with no data."""
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` attempts of which ``c`` passed."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


@dataclass
class VariantSummary:
    """What one variant did over every case and repeat."""

    name: str
    runs: int = 0
    passed: int = 0
    failed_runs: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    latencies: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    scores: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    #: pass@k for k = 1..repeats (mean over cases).
    pass_at: dict[int, float] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed, self.runs)

    def mean_scores(self) -> dict[str, float]:
        return {name: sum(v) / len(v) for name, v in self.scores.items() if v}


def summarise(results: Iterable[CaseResult], variants: Sequence[str], repeats: int) -> list[VariantSummary]:
    by_name = {name: VariantSummary(name) for name in variants}
    per_case: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in results:
        s = by_name.setdefault(r.variant, VariantSummary(r.variant))
        s.runs += 1
        s.passed += r.passed
        s.failed_runs += r.failed
        tokens = r.input_tokens + r.output_tokens
        s.tokens += tokens
        s.cost_usd += r.cost_usd
        s.latencies.append(r.latency_s)
        s.token_counts.append(tokens)
        for score in r.scores:
            s.scores[score.name].append(score.value)
        if (kind := r.error_kind) is not None:
            s.errors[kind] += 1
        per_case[(r.variant, r.case_id)].append(r.passed)
    for s in by_name.values():
        attempts = [v for (name, _), v in per_case.items() if name == s.name]
        for k in range(1, repeats + 1):
            usable = [a for a in attempts if len(a) >= k]
            if usable:
                s.pass_at[k] = sum(pass_at_k(len(a), sum(a), k) for a in usable) / len(usable)
    return list(by_name.values())
