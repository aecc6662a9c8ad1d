"""A run's timeline in the terminal (``wesichain timeline RUN_ID``): one lane per worker process,
the run's queue waits on a lane of their own, then every bar and marker as a table."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from shared.timeline import Bar, Timeline

__all__ = ["render_timeline"]

_PHASE_STYLE = {"start": "blue", "think": "cyan", "act": "white", "observe": "green", "decide": "magenta"}
_GLYPH = {"phase": "█", "tool": "▆", "lost": "░", "running": "▒"}
_QUEUE_LANE = "(queued)"


def _style(bar: Bar) -> str:
    if bar.kind == "tool":
        return "yellow" if bar.ok else "red"
    if bar.kind == "lost":
        return "red"
    if bar.kind == "running":
        return "bold cyan"
    return _PHASE_STYLE.get(bar.name, "white") if bar.ok else "red"


def render_timeline(timeline: Timeline, width: int = 72) -> RenderableType:
    """The picture (lanes scaled to ``width`` columns) and the table of what happened when."""
    t0 = timeline.start
    span = max(timeline.end - t0, 1e-6)

    def column(at: float) -> int:
        return min(width - 1, max(0, int((at - t0) / span * width)))

    label_width = max([len(_QUEUE_LANE), *(len(lane) for lane in timeline.lanes)])
    rows: list[Text] = []
    queue = [" "] * width
    for wait in timeline.waits:
        for c in range(column(wait.start), column(wait.end) + 1):
            queue[c] = "·"
    rows.append(Text(f"{_QUEUE_LANE:<{label_width}} │{''.join(queue)}│", style="dim"))
    for lane in timeline.lanes:
        cells: list[tuple[str, str]] = [(" ", "")] * width
        for bar in (b for b in timeline.bars if b.lane == lane):
            for c in range(column(bar.start), column(bar.end) + 1):
                cells[c] = (_GLYPH[bar.kind], _style(bar))
        for marker in (m for m in timeline.markers if m.lane == lane and m.kind == "takeover"):
            cells[column(marker.at)] = ("▲", "bold red")
        row = Text(f"{lane:<{label_width}} │")
        for glyph, style in cells:
            row.append(glyph, style=style)
        row.append("│")
        rows.append(row)
    axis = f"{'':<{label_width}}  0 s{f'{span:.3f} s':>{width - 3}}"
    title = Text(
        f"run {timeline.run_id}  agent {timeline.agent}  {timeline.status}  {span:.3f} s on "
        f"{len(timeline.lanes)} worker process(es)",
        style="bold",
    )
    legend = Text("█ phase  ▆ tool  ░ lost to a crash  ▒ running  ▲ takeover  · queued", style="dim")
    return Group(title, *rows, Text(axis, style="dim"), legend, _table(timeline))


def _offset(timeline: Timeline, at: float) -> str:
    return f"{at - timeline.start:.3f}"


def _ms(start: float, end: float) -> str:
    return f"{(end - start) * 1000:.1f}"


def _table(timeline: Timeline) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in ("at s", "took ms", "step"):
        table.add_column(name, justify="right")
    for name in ("what", "worker", ""):
        table.add_column(name)
    entries: list[tuple[float, tuple[str, ...], str]] = []
    for bar in timeline.bars:
        what = bar.name if bar.kind == "phase" else f"{bar.kind} {bar.name}"
        attempt = f"attempt {bar.attempt}" if bar.attempt > 1 else ""
        note = " ".join(part for part in (bar.ref, bar.detail, attempt) if part)
        row = (_offset(timeline, bar.start), _ms(bar.start, bar.end), str(bar.step), what, bar.lane, note)
        entries.append((bar.start, row, _style(bar)))
    for wait in timeline.waits:
        row = (
            _offset(timeline, wait.start),
            _ms(wait.start, wait.end),
            str(wait.step),
            f"queued {wait.name}",
            "",
            "",
        )
        entries.append((wait.start, row, "dim"))
    for marker in timeline.markers:
        row = (_offset(timeline, marker.at), "", "", marker.kind, marker.lane or "", marker.text)
        entries.append((marker.at, row, "bold red" if marker.kind == "takeover" else "bold"))
    for _, cells, style in sorted(entries, key=lambda e: e[0]):
        table.add_row(*cells, style=style)
    return table
