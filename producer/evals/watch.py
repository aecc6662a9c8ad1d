"""``wesichain eval watch ID``: a live terminal view of an eval, built with ``rich``.

One progress bar per variant (done of its case runs, failed and in flight beside it), the pass
rate so far, tokens and cost so far, and the eval's rate and ETA from the last half minute.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from producer.evals.client import EvalClient, EvalTimeout, Progress

__all__ = ["RATE_WINDOW_S", "Rate", "view", "watch"]

#: The rate (and so the ETA) is measured over this many seconds.
RATE_WINDOW_S = 30.0


@dataclass
class Rate:
    """Case runs recorded per second over a sliding window."""

    window_s: float = RATE_WINDOW_S

    def __post_init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, recorded: int) -> float:
        self._samples.append((now, recorded))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        (t0, r0), (t1, r1) = self._samples[0], self._samples[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0


def _eta(left: int, per_s: float) -> str:
    if left == 0:
        return "done"
    if per_s <= 0:
        return "-"
    seconds = int(left / per_s)
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
        if seconds >= 3600
        else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def view(p: Progress, in_flight: Counter[int], per_s: float) -> Group:
    """The watch's screen for one moment of the eval."""
    spec = p.meta.spec
    per_variant = p.meta.cases * spec.repeats
    table = Table(expand=False, box=None, padding=(0, 1))
    for column in ("variant", "progress", "done", "failed", "in flight", "pass rate", "tokens", "cost"):
        table.add_column(column, justify="left" if column in ("variant", "progress") else "right")
    for i, (variant, c) in enumerate(zip(spec.variants, p.counts, strict=True)):
        rate = f"{c.passed / c.done:.1%}" if c.done else "-"
        colour = "green" if c.done and c.passed / c.done >= spec.pass_threshold else "red"
        table.add_row(
            variant.name,
            ProgressBar(total=per_variant, completed=c.done, width=30),
            f"{c.done}/{per_variant}",
            str(c.failed),
            str(in_flight.get(i, 0)),
            Text(rate, style=colour if c.done else ""),
            str(c.tokens),
            f"${c.cost_usd:.4f}",
        )
    left = p.meta.items - p.recorded
    header = Text.assemble(
        (f"eval {p.meta.eval_id}", "bold"),
        f"  {p.meta.status}  {p.recorded}/{p.meta.items} recorded, {p.in_flight} in flight,"
        f" {p.pending} not started  |  {per_s * 60:.1f} runs/min, ETA {_eta(left, per_s)}",
    )
    return Group(header, table)


def watch(
    evals: EvalClient,
    eval_id: str,
    timeout: float,
    *,
    console: Console | None = None,
    refresh_s: float = 1.0,
) -> Progress:
    """Show the eval live until it completes (or stops and drains); raises :class:`EvalTimeout`."""
    rate = Rate()
    deadline = time.monotonic() + timeout
    with Live(console=console or Console(stderr=True), auto_refresh=False, transient=False) as live:
        while True:
            p = evals.progress(eval_id)
            flying = Counter(item.variant for item, _ in evals.store.slots(eval_id))
            live.update(view(p, flying, rate.add(time.monotonic(), p.recorded)), refresh=True)
            if p.drained:
                return p
            if time.monotonic() >= deadline:
                raise EvalTimeout(f"eval {eval_id} still {p.meta.status} after {timeout:g}s")
            time.sleep(refresh_s)
