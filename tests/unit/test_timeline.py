"""The timeline built from checkpoints and events: bars, waits, takeovers, lost and live streams."""

from __future__ import annotations

from shared import events as ev
from shared.events import WorkerId
from shared.state import Phase, PhaseRun, RunHead
from shared.timeline import build_timeline

T0 = 1_000.0


def head(version: int, phase: Phase, step: int, at: float, ran: PhaseRun | None = None) -> RunHead:
    return RunHead(
        run_id="r1", agent="a", phase=phase, step=step, version=version, input="hi",
        created_at=T0, updated_at=at, ran=ran,
    )  # fmt: skip


def ran(phase: Phase, host: str, pid: int, at: float, attempt: int = 1) -> PhaseRun:
    return PhaseRun(phase=phase, host=host, pid=pid, claimed_at=at, attempt=attempt)


def delta(step: int, host: str, pid: int, at: float) -> ev.TokenDelta:
    return ev.TokenDelta(run_id="r1", step=step, ts=at, worker=WorkerId(host=host, pid=pid), text="x")


def test_a_taken_over_think_shows_the_lost_stream_and_the_second_claim() -> None:
    checkpoints = [
        head(1, Phase.IDLE, 0, T0),
        head(2, Phase.THINKING, 1, T0 + 0.2, ran(Phase.IDLE, "a", 1, T0 + 0.1)),
        head(3, Phase.COMPLETED, 1, T0 + 9.0, ran(Phase.THINKING, "b", 2, T0 + 8.0, attempt=2)),
    ]
    stream = [delta(1, "a", 1, T0 + 0.5), delta(1, "a", 1, T0 + 0.9), delta(1, "b", 2, T0 + 8.5)]
    timeline = build_timeline(checkpoints[-1], checkpoints, stream)

    assert [(b.kind, b.name, b.lane, b.start, b.end, b.attempt) for b in timeline.bars] == [
        ("phase", "start", "a:1", T0 + 0.1, T0 + 0.2, 1),
        ("lost", "think", "a:1", T0 + 0.5, T0 + 0.9, 1),
        ("phase", "think", "b:2", T0 + 8.0, T0 + 9.0, 2),
    ]
    assert [(w.name, w.start, w.end, w.lost) for w in timeline.waits] == [
        ("start", T0, T0 + 0.1, 0),
        ("think", T0 + 0.2, T0 + 8.0, 1),
    ]
    assert [(m.kind, m.lane) for m in timeline.markers] == [("takeover", "b:2"), ("end", None)]
    assert timeline.lanes == ["a:1", "b:2"] and timeline.status == "completed"


def test_the_latest_stream_of_the_current_think_is_running() -> None:
    checkpoints = [
        head(1, Phase.IDLE, 0, T0),
        head(2, Phase.THINKING, 1, T0 + 0.2, ran(Phase.IDLE, "a", 1, T0 + 0.1)),
    ]
    stream = [delta(1, "a", 1, T0 + 0.5), delta(1, "b", 2, T0 + 3.0), delta(1, "b", 2, T0 + 3.5)]
    timeline = build_timeline(checkpoints[-1], checkpoints, stream)
    streams = {b.lane: b.kind for b in timeline.bars if b.name == "think"}
    assert streams == {"a:1": "lost", "b:2": "running"}
    assert timeline.status == "running" and timeline.end == T0 + 3.5


def test_tool_bars_and_their_queue_waits() -> None:
    checkpoints = [head(1, Phase.IDLE, 0, T0)]
    sent = ev.ToolDispatched(run_id="r1", step=1, ts=T0 + 1, call_id="c0", tool="add", arguments={})
    done = ev.ToolCompleted(
        run_id="r1", step=1, ts=T0 + 4, worker=WorkerId(host="t", pid=9), call_id="c0", tool="add",
        ok=False, output="boom", duration_s=2.0,
    )  # fmt: skip
    timeline = build_timeline(checkpoints[-1], checkpoints, [sent, done])
    (bar,) = timeline.bars
    assert (bar.kind, bar.lane, bar.start, bar.end, bar.ok, bar.ref) == (
        "tool",
        "t:9",
        T0 + 2,
        T0 + 4,
        False,
        "c0",
    )
    assert [(w.name, w.start, w.end) for w in timeline.waits] == [("add", T0 + 1, T0 + 2)]


def test_a_tool_call_taken_over_after_its_first_delivery_died() -> None:
    checkpoints = [head(1, Phase.IDLE, 0, T0)]
    sent = ev.ToolDispatched(run_id="r1", step=1, ts=T0 + 1, call_id="c0", tool="add", arguments={})
    done = ev.ToolCompleted(
        run_id="r1", step=1, ts=T0 + 9, worker=WorkerId(host="u", pid=7), call_id="c0", tool="add",
        ok=True, output="3", duration_s=0.5, attempt=2,
    )  # fmt: skip
    timeline = build_timeline(checkpoints[-1], checkpoints, [sent, done])
    (bar,) = timeline.bars
    assert (bar.lane, bar.attempt) == ("u:7", 2)
    assert [(w.name, w.start, w.end, w.lost) for w in timeline.waits] == [("add", T0 + 1, T0 + 8.5, 1)]
    (marker,) = timeline.markers
    assert (marker.kind, marker.lane, marker.at) == ("takeover", "u:7", T0 + 8.5)
    assert "attempt 2" in marker.text
