"""``wesichain demo --tour``: one conversation on the research example that shows a handoff, a
message sent into a running run, and a thread's policies deciding what a second and a third
question do while the run before them has not ended.

Embedded, on scripted models: no server, no key. Every step waits on a condition, never on time:
the tour holds a run's knowledge-base search open (``shared.examples.research_tour.holds``; the
embedded pool runs in this process) until it has done what it shows "while the tool works".
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import TextIO

from producer.client import Client, RunHandle, RunTimeout
from producer.render import render_event
from shared.examples.research_tour import (
    TOUR_DESK,
    TOUR_DETOUR,
    TOUR_FOLLOW_UP,
    TOUR_NOTE,
    TOUR_QUESTION,
    TOUR_SWITCH,
    holds,
)
from shared.state import Phase, RunHead, ThreadPolicy

__all__ = ["SHOWN_EVENTS", "TourError", "run_tour"]

#: The events the tour prints (the rest, token deltas and step starts, only make it longer).
SHOWN_EVENTS = frozenset(
    {
        "HandedOff",
        "CustomEvent",
        "ToolCompleted",
        "SignalReceived",
        "SignalApplied",
        "StepFailed",
        "Completed",
        "Failed",
        "Interrupted",
    }
)


class TourError(RuntimeError):
    """The tour did not go as it shows (a run stuck or ended otherwise): it stops, saying where."""


class _Tour:
    """The tour's runs on one thread, each labelled ``run N``, and what of them was printed."""

    def __init__(self, client: Client, out: TextIO, timeout_s: float) -> None:
        self.client = client
        self.out = out
        self.timeout_s = timeout_s
        self.thread_id = f"tour-{uuid.uuid4().hex[:8]}"
        self.labels: dict[str, str] = {}
        self._printed_to: dict[str, str] = {}

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def named(self, text: str) -> str:
        """``text`` with the tour's run ids told as their labels."""
        for run_id, label in self.labels.items():
            text = text.replace(f"run {run_id}", label).replace(run_id, label)
        return text

    def submit(self, text: str, policy: ThreadPolicy, *, held: bool) -> RunHandle:
        """Ask the front desk ``text`` on the tour's thread under ``policy``; with ``held``, the
        run's knowledge-base search waits for the tour."""
        run_id = uuid.uuid4().hex
        self.labels[run_id] = f"run {len(self.labels) + 1}"
        if held:
            holds.hold(run_id)
        return self.client.submit(
            TOUR_DESK,
            text,
            run_id=run_id,
            thread_id=self.thread_id,
            thread_policy=policy,
        )

    def show_events(self, handle: RunHandle) -> None:
        """Print the run's events since the last ones printed (those it has so far)."""
        after = self._printed_to.get(handle.run_id, "0-0")
        for event in handle.events(follow=False, after=after):
            self._printed_to[handle.run_id] = event.stream_id or after
            if event.kind in SHOWN_EVENTS:
                self.say(f"  {self.labels[handle.run_id]}  {self.named(render_event(event, worker=False))}")

    def show_status(self, handle: RunHandle) -> None:
        head = handle.status()
        line = f"  {self.labels[handle.run_id]}  is {head.phase.value}"
        if not head.terminal and self.client.store.cancel_requested(head.run_id):
            line += ", asked to stop: it ends at its next safe boundary (a running tool call finishes)"
        self.say(line)

    def until_parked(self, handle: RunHandle) -> None:
        """Wait until the run is parked behind the run before it in the thread, and say so."""
        deadline = time.monotonic() + self.timeout_s
        # Parked by its start phase, on the worker: the submit only queued it.
        while self.client.store.thread_wait(handle.run_id) is None:
            if time.monotonic() >= deadline or handle.status().phase is not Phase.IDLE:
                raise TourError(f"{self.labels[handle.run_id]} is not waiting for its thread")
            time.sleep(0.01)
        why = handle.why_waiting() or "waiting for its thread"
        self.say(f"  {self.labels[handle.run_id]}  is {Phase.IDLE.value}: {self.named(why)}")

    def hold_reached(self, handle: RunHandle) -> None:
        """Wait until the run's search has reported its hits and waits for the tour."""
        if not holds.hold(handle.run_id).wait_reached(self.timeout_s):
            raise TourError(f"{self.labels[handle.run_id]} did not reach its search in {self.timeout_s:g}s")
        self.show_events(handle)
        self.say(f"  ({self.labels[handle.run_id]}'s kb_search is held open: the tour acts while it works)")

    def release(self, handle: RunHandle) -> None:
        self.say(f"  (the tour releases {self.labels[handle.run_id]}'s kb_search)")
        holds.forget(handle.run_id)

    def until_ended(self, handle: RunHandle, expected: Phase) -> RunHead:
        try:
            head = handle.wait(timeout=self.timeout_s)
        except RunTimeout:
            raise TourError(f"{self.labels[handle.run_id]} did not end in {self.timeout_s:g}s") from None
        self.show_events(handle)
        if head.phase is not expected:
            raise TourError(f"{self.labels[handle.run_id]} ended {head.phase.value}, not {expected.value}")
        return head

    def answer(self, head: RunHead) -> None:
        self.say(f"  {self.labels[head.run_id]}  answers: {head.answer}")


def run_tour(client: Client, out: TextIO | None = None, timeout_s: float = 60.0) -> int:
    """Run the tour on ``client`` (an embedded one: the holds work in this process only), printing
    it to ``out`` (by default the standard output of when it is called, looked up then: a caller
    that redirected it gets the tour); 0 when every run ended as the tour shows."""
    tour = _Tour(client, sys.stdout if out is None else out, timeout_s)
    try:
        _steps(tour)
    except TourError as exc:
        print(f"wesichain demo --tour: the tour stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for run_id in tour.labels:
            holds.forget(run_id)
    return 0


def _steps(tour: _Tour) -> None:
    say = tour.say
    say(f"A tour of one conversation (thread {tour.thread_id}) with the research example's front desk.")
    say()
    say(f"1. A question to the front desk ({TOUR_DESK}), handed off to the research assistant:")
    say(f"   > {TOUR_QUESTION}")
    first = tour.submit(TOUR_QUESTION, "enqueue", held=True)
    tour.hold_reached(first)

    say()
    say("2. While its kb_search works, a message into the run (RunHandle.send_message):")
    say(f"   > {TOUR_NOTE}")
    note = first.send_message(TOUR_NOTE, key="tour-note")
    say(f"  signal #{note.id} is {note.status}: the run's next think takes it")
    tour.show_events(first)

    say()
    say("3. A second question on the thread while run 1 is still going, thread_policy=enqueue:")
    say(f"   > {TOUR_FOLLOW_UP}")
    second = tour.submit(TOUR_FOLLOW_UP, "enqueue", held=False)
    tour.until_parked(second)
    tour.release(first)
    tour.answer(tour.until_ended(first, Phase.COMPLETED))
    say(f"  signal #{note.id} is {first.signal(note.id).status}")
    say("  run 2 starts now, on the whole conversation so far:")
    tour.answer(tour.until_ended(second, Phase.COMPLETED))

    say()
    say("4. A third question, and while its search works a fourth, thread_policy=rollback:")
    say(f"   > {TOUR_DETOUR}")
    third = tour.submit(TOUR_DETOUR, "enqueue", held=True)
    tour.hold_reached(third)
    say(f"   > {TOUR_SWITCH}")
    fourth = tour.submit(TOUR_SWITCH, "rollback", held=False)
    tour.show_status(third)
    tour.until_parked(fourth)
    tour.release(third)
    displaced = tour.until_ended(third, Phase.INTERRUPTED)
    rolled_back = displaced.run_id in tour.client.store.rolled_back(displaced.tenant, tour.thread_id)
    say(
        f"  run 3  is {displaced.phase.value}"
        + (", rolled back: kept for audit, but no later run of the thread sees it" if rolled_back else "")
    )
    say("  run 4 starts now, on the conversation without run 3:")
    tour.answer(tour.until_ended(fourth, Phase.COMPLETED))

    say()
    say("The runs of the thread:")
    for handle in (first, second, third, fourth):
        head = handle.status()
        moved = " -> ".join([head.agent, *(h.to_agent for h in head.handoffs)])
        say(f"  {tour.labels[head.run_id]}  {head.phase.value:<11}  {moved}")
