"""A run's timeline: where its time went, on which worker.

Built from what a run already keeps, with no extra writes: every committed version names the
delivery that committed it (``RunHead.ran``: worker, claim time, attempt), so each version is one
bar from its claim to its commit on the lane of that worker, and the gap since the previous commit
is the time the phase waited in its queue. Tool calls come from their events: ``ToolCompleted``
(the tool's worker, when it ended and how long it ran) against ``ToolDispatched`` (when it was
sent). Text a model streamed on a worker that never committed that step is work a crash lost, or
the phase running now. A version claimed more than once was taken over after a delivery died.

Times are the clocks of the workers that wrote them: across hosts, bars are as aligned as the
hosts' clocks are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from shared.events import Event, WorkerId
from shared.state import Phase, RunHead, status_of

__all__ = ["Bar", "BarKind", "Marker", "TASK_OF_PHASE", "Timeline", "Wait", "build_timeline", "lane_of"]

BarKind = Literal["phase", "tool", "lost", "running"]

#: A phase delivery named as its task is (``wesichain.think``...).
TASK_OF_PHASE = {
    Phase.IDLE: "start",
    Phase.THINKING: "think",
    Phase.ACTING: "act",
    Phase.OBSERVING: "observe",
    Phase.AWAITING_APPROVAL: "decide",
}


class Bar(BaseModel):
    """Work done on one worker: a phase delivery, a tool call, or streamed text never committed."""

    lane: str
    kind: BarKind
    #: The phase's task (``think``, ``observe``...: ``TASK_OF_PHASE``) or the tool's name.
    name: str
    step: int
    start: float
    end: float
    ok: bool = True
    #: Claims of this work, this one included (above 1: an earlier delivery died).
    attempt: int = 1
    #: The version the bar committed (phases), or the tool call's id (tools).
    ref: str = ""
    detail: str = ""


class Wait(BaseModel):
    """Time a phase or a tool call spent queued: from being sent to being claimed."""

    name: str
    step: int
    start: float
    end: float
    #: Deliveries of this work that died during the wait (claimed, then never committed).
    lost: int = 0


class Marker(BaseModel):
    """A moment worth a flag: a takeover, a park for approval, a handoff to another agent, the end,
    a worker that died holding a claim of the run (``shared/pool.py``: ``death_markers``)."""

    at: float
    kind: Literal["takeover", "parked", "handoff", "end", "worker_died"]
    text: str
    lane: str | None = None


class Timeline(BaseModel):
    """Everything needed to draw a run: one lane per worker process, bars, waits and markers."""

    run_id: str
    agent: str
    status: str
    start: float
    end: float
    lanes: list[str]
    bars: list[Bar]
    waits: list[Wait]
    markers: list[Marker]


def lane_of(worker: WorkerId) -> str:
    return f"{worker.host}:{worker.pid}"


def build_timeline(head: RunHead, checkpoints: Sequence[RunHead], events: Sequence[Event]) -> Timeline:
    """The timeline of ``head``'s run from its checkpoints (version order) and its events."""
    bars: list[Bar] = []
    waits: list[Wait] = []
    markers: list[Marker] = []
    committed_thinks: set[tuple[int, str]] = set()

    previous_commit = head.created_at
    handoffs = 0
    for version in checkpoints:
        ran = version.ran
        if len(version.handoffs) > handoffs:
            # The commit that handed the conversation over (one per version at most).
            h = version.handoffs[-1]
            lane_of_commit = f"{ran.host}:{ran.pid}" if ran is not None else None
            text = f"handed off from {h.from_agent} to {h.to_agent} v{h.to_version} (step {h.step})"
            markers.append(Marker(at=version.updated_at, kind="handoff", text=text, lane=lane_of_commit))
        handoffs = len(version.handoffs)
        if ran is not None:
            lane = f"{ran.host}:{ran.pid}"
            name, step = TASK_OF_PHASE.get(ran.phase, ran.phase.value), _step_of_phase(version, ran.phase)
            if ran.claimed_at >= previous_commit:
                lost = ran.attempt - 1
                waits.append(Wait(name=name, step=step, start=previous_commit, end=ran.claimed_at, lost=lost))
            bars.append(
                Bar(
                    lane=lane,
                    kind="phase",
                    name=name,
                    step=step,
                    start=ran.claimed_at,
                    end=max(version.updated_at, ran.claimed_at),
                    ok=version.error is None,
                    attempt=ran.attempt,
                    ref=f"v{version.version}",
                    detail=f"-> {version.phase.value}",
                )
            )
            if ran.phase is Phase.THINKING:
                committed_thinks.add((version.step, lane))
            if ran.attempt > 1:
                markers.append(
                    Marker(
                        at=ran.claimed_at,
                        kind="takeover",
                        text=f"{name} claimed again (attempt {ran.attempt}): an earlier delivery died",
                        lane=lane,
                    )
                )
        if version.phase is Phase.AWAITING_APPROVAL:
            markers.append(Marker(at=version.updated_at, kind="parked", text="parked for approval"))
        if version.terminal:
            markers.append(Marker(at=version.updated_at, kind="end", text=version.phase.value))
        previous_commit = version.updated_at

    _tool_bars(events, bars, waits, markers)
    _streamed_bars(head, events, committed_thinks, bars)

    times = [head.created_at, head.updated_at, *(b.end for b in bars), *(w.end for w in waits)]
    lanes = sorted({b.lane for b in bars}, key=lambda lane: min(b.start for b in bars if b.lane == lane))
    return Timeline(
        run_id=head.run_id,
        agent=head.agent,
        status=status_of(head.phase),
        start=head.created_at,
        end=max(times),
        lanes=lanes,
        bars=sorted(bars, key=lambda b: (b.start, b.lane)),
        waits=waits,
        markers=sorted(markers, key=lambda m: m.at),
    )


def _step_of_phase(version: RunHead, phase: Phase) -> int:
    """The step a phase delivery worked on: an observe (or a decision) that moved the run to its
    next think belongs to the step whose results it read."""
    if phase is not Phase.THINKING and version.phase is Phase.THINKING:
        return version.step - 1
    return version.step


def _tool_bars(events: Sequence[Event], bars: list[Bar], waits: list[Wait], markers: list[Marker]) -> None:
    dispatched: dict[tuple[int, str], float] = {}
    for event in events:
        if event.kind == "ToolDispatched":
            dispatched[(event.step, event.call_id)] = event.ts
        elif event.kind == "ToolCompleted":
            start = event.ts - event.duration_s
            sent = dispatched.get((event.step, event.call_id))
            lost = event.attempt - 1
            if sent is not None and start >= sent:
                waits.append(Wait(name=event.tool, step=event.step, start=sent, end=start, lost=lost))
            lane = lane_of(event.worker)
            if lost:
                what = f"tool {event.tool} ({event.call_id})"
                text = f"{what} claimed again (attempt {event.attempt}): an earlier delivery died"
                markers.append(Marker(at=start, kind="takeover", text=text, lane=lane))
            bars.append(
                Bar(
                    lane=lane,
                    kind="tool",
                    name=event.tool,
                    step=event.step,
                    start=start,
                    end=event.ts,
                    ok=event.ok,
                    attempt=event.attempt,
                    ref=event.call_id,
                    detail=event.error.kind if event.error else "",
                )
            )


def _streamed_bars(
    head: RunHead, events: Sequence[Event], committed_thinks: set[tuple[int, str]], bars: list[Bar]
) -> None:
    """Streamed text on a worker that did not commit that step's think: lost to a crash, or live."""
    spans: dict[tuple[int, str], tuple[float, float]] = {}
    for event in events:
        if event.kind != "TokenDelta":
            continue
        key = (event.step, lane_of(event.worker))
        if key in committed_thinks:
            continue
        first, last = spans.get(key, (event.ts, event.ts))
        spans[key] = (min(first, event.ts), max(last, event.ts))
    thinking_now = head.phase is Phase.THINKING
    # Of several uncommitted streams of the current think, only the latest can still be running.
    latest = max((end for (step, _), (_, end) in spans.items() if step == head.step), default=None)
    for (step, lane), (start, end) in spans.items():
        live = thinking_now and step == head.step and end == latest
        bars.append(
            Bar(
                lane=lane,
                kind="running" if live else "lost",
                name="think",
                step=step,
                start=start,
                end=end,
                ok=live,
                detail="streaming now" if live else "streamed, never committed: the delivery died",
            )
        )
