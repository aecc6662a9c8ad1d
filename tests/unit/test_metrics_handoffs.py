"""Run metrics and handoffs: a start counts under the agent the run was submitted for, a handoff
under both agents, an end under the agent in charge when the run ended."""

from __future__ import annotations

from shared.state import HandoffRecord, Phase, RunHead
from worker.metrics import metrics


def _sample(metric: object, labels: dict[str, str]) -> float:
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return float(sample.value)
    return 0.0


HANDOFF = HandoffRecord(
    from_agent="m-triage", to_agent="m-billing", to_version="7", step=1, call_id="call_0", at=4
)


def test_a_handed_off_run_ends_under_its_target_and_its_handoff_is_counted() -> None:
    m = metrics()
    idle = RunHead.new_idle("r1", "m-triage", "refund")
    thinking = idle.model_copy(update={"phase": Phase.THINKING, "version": 2, "step": 1})
    handed = thinking.model_copy(update={"version": 3, "step": 2, "handoffs": [HANDOFF]})
    done = handed.model_copy(update={"phase": Phase.COMPLETED, "version": 4, "answer": "refunded"})
    started = {"agent": "m-triage"}
    moved = {"from_agent": "m-triage", "to_agent": "m-billing"}
    ended = {"agent": "m-billing", "status": "completed", "error_kind": "none"}
    before = (_sample(m.runs_started, started), _sample(m.handoffs, moved), _sample(m.runs_ended, ended))
    for old, new in ((idle, thinking), (thinking, handed), (handed, done)):
        m.committed(old, new)
    after = (_sample(m.runs_started, started), _sample(m.handoffs, moved), _sample(m.runs_ended, ended))
    assert after == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert _sample(m.runs_ended, {**ended, "agent": "m-triage"}) == 0


def test_a_fork_that_starts_with_its_handoffs_counts_no_new_handoff() -> None:
    m = metrics()
    idle = RunHead.new_idle("r2", "m-triage", "refund")
    started = idle.model_copy(
        update={"phase": Phase.THINKING, "version": 2, "step": 1, "handoffs": [HANDOFF]}
    )
    moved = {"from_agent": "m-triage", "to_agent": "m-billing"}
    before = _sample(m.handoffs, moved)
    m.committed(idle, started)
    assert _sample(m.handoffs, moved) == before
