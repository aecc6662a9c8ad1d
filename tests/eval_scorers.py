"""Custom scorers the eval tests name by import path."""

from __future__ import annotations

from shared.evals.dataset import Case
from shared.evals.outcome import RunOutcome


def even_answer(case: Case, outcome: RunOutcome) -> tuple[float, str]:
    """1 when the answer is an even number."""
    value = int(outcome.answer or "1")
    return float(value % 2 == 0), f"{value} is {'even' if value % 2 == 0 else 'odd'}"


def raises_on_seven(case: Case, outcome: RunOutcome) -> bool:
    """Raises for case 7 (a broken scorer on one case), passes the others."""
    if case.id == "c7":
        raise RuntimeError("this scorer breaks on c7")
    return True


NOT_CALLABLE = 42


SCORED_KEY = "test:eval_scored"


def counted(case: Case, outcome: RunOutcome) -> bool:
    """Passes; counts its calls per case in the test's Redis (``test:eval_scored``)."""
    from tests.agents_evals import _redis

    _redis().hincrby(SCORED_KEY, case.id, 1)
    return True
