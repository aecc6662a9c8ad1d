"""From a case run's end to its result row: the outcome scorers read, the scores, the cost."""

from __future__ import annotations

import time
from typing import Any

from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult, RunOutcome, Step
from shared.evals.scorers import Judge, run_scorers
from shared.evals.spec import EvalSpec
from shared.evals.store import Item

__all__ = ["cost_of", "result_of", "run_outcome"]


def run_outcome(ended: dict[str, Any], trajectory: list[Step]) -> RunOutcome:
    """The outcome scorers see, from a run's end (``shared.webhooks.outcome``) and its trajectory."""
    usage = ended.get("usage") or {}
    created, finished = ended.get("created_at"), ended.get("ended_at")
    latency = max(0.0, float(finished) - float(created)) if created and finished else 0.0
    return RunOutcome(
        run_id=str(ended["run_id"]),
        status=str(ended.get("status")),
        answer=ended.get("answer"),
        error=ended.get("error"),
        steps=int(ended.get("steps") or 0),
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        latency_s=round(latency, 4),
        trajectory=trajectory,
    )


def cost_of(spec: EvalSpec, model: str, input_tokens: int, output_tokens: int) -> float:
    """US dollars of a model's tokens, by the spec's pricing (0 when the model is not priced)."""
    price = spec.pricing.get(model)
    if price is None:
        return 0.0
    return (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1e6


def result_of(
    spec: EvalSpec, item: Item, case: Case, outcome: RunOutcome, model: str, judge: Judge | None = None
) -> CaseResult:
    """Score a case run. A run that did not complete fails its case with its own error, unscored."""
    completed = outcome.status == "completed"
    scores = run_scorers(spec.scorers, case, outcome, judge) if completed else []
    judged = [s for s in scores if s.model is not None]
    cost = cost_of(spec, model, outcome.input_tokens, outcome.output_tokens)
    cost += sum(cost_of(spec, s.model or "", s.input_tokens, s.output_tokens) for s in judged)
    return CaseResult(
        item=str(item),
        variant=spec.variants[item.variant].name,
        case_id=case.id,
        repeat=item.repeat,
        run_id=outcome.run_id,
        status=outcome.status,
        passed=completed and all(s.passed for s in scores),
        answer=outcome.answer,
        error=outcome.error,
        steps=outcome.steps,
        input_tokens=outcome.input_tokens,
        output_tokens=outcome.output_tokens,
        cost_usd=cost,
        judge_tokens=sum(s.input_tokens + s.output_tokens for s in judged),
        latency_s=outcome.latency_s,
        scores=scores,
        trajectory=outcome.trajectory,
        scored_at=time.time(),
    )
