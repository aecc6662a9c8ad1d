"""A metric's children are looked up once per label values and count where prometheus-client does."""

from __future__ import annotations

from shared.state import Phase
from worker.metrics import metrics


def _sample(metric: object, suffix: str, labels: dict[str, str]) -> float:
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name.endswith(suffix) and sample.labels == labels:
                return float(sample.value)
    return 0.0


def test_a_child_is_prometheus_clients_own_and_is_reused() -> None:
    m = metrics()
    child = m._of(m.phase_seconds, "thinking")
    assert child is m.phase_seconds.labels("thinking")
    assert m._of(m.phase_seconds, "thinking") is child
    assert m._of(m.phase_seconds, "observing") is not child


def test_what_a_method_records_lands_in_the_labelled_series() -> None:
    m = metrics()
    before = _sample(m.phase_seconds, "_count", {"phase": "acting"})
    m.phase_done(Phase.ACTING, 0.02)
    m.phase_done(Phase.ACTING, 0.03)
    assert _sample(m.phase_seconds, "_count", {"phase": "acting"}) == before + 2
    calls = _sample(m.tool_calls, "_total", {"tool": "child-test-tool", "outcome": "error"})
    m.tool_call("child-test-tool", 0.01, "ToolTimeout")
    assert _sample(m.tool_calls, "_total", {"tool": "child-test-tool", "outcome": "error"}) == calls + 1
    assert _sample(m.tool_errors, "_total", {"tool": "child-test-tool", "kind": "ToolTimeout"}) >= 1
