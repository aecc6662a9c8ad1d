"""Two sets of results side by side: per-case regressions and improvements, and a paired test.

The runs are paired by (case, repeat). McNemar's exact test looks only at the discordant pairs
(passed in one, failed in the other): under "no change" each is equally likely to go either
way, so the two-sided p-value is a binomial tail. A significant regression is a change for the
worse with p below ``alpha``: noise stays quiet, a real change does not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.evals.outcome import CaseResult

__all__ = ["ALPHA", "Comparison", "compare", "mcnemar_exact"]

#: The significance level of the paired test.
ALPHA = 0.05


def mcnemar_exact(worse: int, better: int) -> float:
    """Two-sided exact McNemar p-value for ``worse`` and ``better`` discordant pairs."""
    n = worse + better
    if n == 0:
        return 1.0
    k = min(worse, better)
    # log-space terms keep large n exact enough without overflow.
    tail = sum(
        math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2))
        for i in range(k + 1)
    )
    return min(1.0, 2 * tail)


@dataclass
class Comparison:
    """Baseline ``a`` against candidate ``b`` over the (case, repeat) pairs both have."""

    a: str
    b: str
    pairs: int = 0
    a_passed: int = 0
    b_passed: int = 0
    #: Case ids that passed in ``a`` and failed in ``b`` (at least one repeat), and the reverse.
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    worse: int = 0
    better: int = 0
    alpha: float = ALPHA

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.worse, self.better)

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    @property
    def significant_regression(self) -> bool:
        return self.significant and self.worse > self.better

    @property
    def delta(self) -> float:
        return (self.b_passed - self.a_passed) / self.pairs if self.pairs else 0.0

    def verdict(self) -> str:
        if not self.significant:
            return f"no significant change (p = {self.p_value:.3g})"
        word = "regression" if self.worse > self.better else "improvement"
        return f"significant {word} (p = {self.p_value:.3g})"


def compare(a: Iterable[CaseResult], b: Iterable[CaseResult], a_name: str, b_name: str) -> Comparison:
    base = {(r.case_id, r.repeat): r.passed for r in a}
    result = Comparison(a_name, b_name)
    regressed: set[str] = set()
    improved: set[str] = set()
    for r in b:
        was = base.get((r.case_id, r.repeat))
        if was is None:
            continue
        result.pairs += 1
        result.a_passed += was
        result.b_passed += r.passed
        if was and not r.passed:
            result.worse += 1
            regressed.add(r.case_id)
        elif r.passed and not was:
            result.better += 1
            improved.add(r.case_id)
    result.regressions = sorted(regressed)
    result.improvements = sorted(improved)
    return result
