"""The demo's tour: ``wesichain demo --tour`` (embedded: no servers) shows, on one thread of the
research example, a handoff, a message sent into a running run, a second question queued under
``enqueue`` and a fourth displacing the third under ``rollback``: the exact events and statuses."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from producer.cli import main
from shared.examples.research_tour import TOUR_FOLLOW_UP, TOUR_NOTE, TOUR_QUESTION, holds
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL

# Imported before the tour's output is redirected, as it is when another test of the same process
# imported it first: the tour must print to the standard output of when it runs, not of its import.
from worker import demo_tour  # noqa: F401

#: ``  run 2  [step 1] HandedOff ...``: which run, its step and the event's kind.
EVENT_LINE = re.compile(r"^  (run \d) +\[step (\d+)\] (\w+)\s")
#: ``  run 2  is idle: ...`` and ``  run 3  answers: ...``.
STATUS_LINE = re.compile(r"^  (run \d) +(is \w+|answers:)")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tour() -> str:
    """The tour's output, run once for the module's tests."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(out):
        for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
            env.delenv(name, raising=False)
        assert main(["demo", "--tour"]) == 0
    return out.getvalue()


def _events(out: str) -> list[tuple[str, int, str]]:
    return [(m[1], int(m[2]), m[3]) for line in out.splitlines() if (m := EVENT_LINE.match(line))]


def test_the_tour_prints_each_runs_events_in_order(tour: str) -> None:
    assert _events(tour) == [
        # 1. the front desk hands off; the research assistant's search reports its hits, held open
        ("run 1", 1, "HandedOff"),
        ("run 1", 2, "CustomEvent"),
        ("run 1", 2, "CustomEvent"),
        # 2. a message sent into run 1 while its search works
        ("run 1", 0, "SignalReceived"),
        # 3. released: the search's result, then the message applied before the answer
        ("run 1", 2, "ToolCompleted"),
        ("run 1", 3, "SignalApplied"),
        ("run 1", 3, "Completed"),
        # the queued second question runs after run 1 ended
        ("run 2", 1, "HandedOff"),
        ("run 2", 2, "CustomEvent"),
        ("run 2", 2, "ToolCompleted"),
        ("run 2", 3, "Completed"),
        # 4. run 3's search is held while run 4 is submitted under rollback
        ("run 3", 1, "HandedOff"),
        ("run 3", 2, "CustomEvent"),
        ("run 3", 2, "ToolCompleted"),
        ("run 3", 2, "Interrupted"),
        ("run 4", 1, "HandedOff"),
        ("run 4", 2, "CustomEvent"),
        ("run 4", 2, "CustomEvent"),
        ("run 4", 2, "ToolCompleted"),
        ("run 4", 3, "Completed"),
    ]
    handed = [line for line in tour.splitlines() if "HandedOff" in line]
    assert all("research-tour-desk -> research-tour v1" in line for line in handed)
    hits = [line for line in tour.splitlines() if "CustomEvent" in line]
    assert all(" kb_search hit {" in line for line in hits)
    assert '"id": "durable-runs"' in hits[0] and '"id": "leases"' in hits[2]


def test_the_tour_shows_the_signal_and_the_policies_at_work(tour: str) -> None:
    statuses = [m[0] for line in tour.splitlines() if (m := STATUS_LINE.match(line))]
    assert statuses == [
        "  run 2  is idle",  # enqueue: parked behind run 1
        "  run 1  answers:",
        "  run 2  answers:",
        "  run 3  is acting",  # rollback asked it to stop; its tool call still finishes
        "  run 4  is idle",  # parked behind run 3
        "  run 3  is interrupted",
        "  run 4  answers:",
    ]
    lines = tour.splitlines()
    assert "  run 2  is idle: waiting for run 1 of its thread to end (parked, no worker held)" in lines
    assert "  run 4  is idle: waiting for run 3 of its thread to end (parked, no worker held)" in lines
    assert "  signal #1 is pending: the run's next think takes it" in lines
    assert "  signal #1 is accepted" in lines
    assert any(line.startswith("  run 3  is acting, asked to stop") for line in lines)
    rolled_back = (
        "  run 3  is interrupted, rolled back: kept for audit, but no later run of the thread sees it"
    )
    assert rolled_back in lines
    answers = {line[2:7]: line.split("answers: ", 1)[1] for line in lines if " answers: " in line}
    # The message sent while the search worked is heeded by the run's next think.
    heeded = f'You added "{TOUR_NOTE}", so the best match only: Durable agent runs:'
    assert answers["run 1"].startswith(heeded)
    # enqueue: run 2 continues the whole conversation (once each, though run 1 was handed off).
    assert answers["run 2"].startswith("Leases: A lease is a time-bounded claim on work.")
    assert answers["run 2"].endswith(f'(Earlier in this thread: "{TOUR_QUESTION}"; "{TOUR_NOTE}".)')
    # rollback: run 4's conversation has run 2's question, not the rolled-back run 3's.
    assert answers["run 4"].startswith("Idempotency keys: ")
    assert answers["run 4"].endswith(
        f'(Earlier in this thread: "{TOUR_QUESTION}"; "{TOUR_NOTE}"; "{TOUR_FOLLOW_UP}".)'
    )
    assert lines[-4:] == [
        "  run 1  completed    research-tour-desk -> research-tour",
        "  run 2  completed    research-tour-desk -> research-tour",
        "  run 3  interrupted  research-tour-desk -> research-tour",
        "  run 4  completed    research-tour-desk -> research-tour",
    ]
    assert holds.held() == set()  # every hold let go


def test_the_tour_takes_no_other_option(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["What is a lease?"], ["--agent", "research-desk"], ["--json"], ["--model", "scripted:x"]):
        with pytest.raises(SystemExit, match="the tour asks its own questions"):
            main(["demo", "--tour", *extra])


def test_the_plain_demo_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "CustomEvent" not in out and "kb_search" not in out
    answer = next(line for line in out.splitlines() if line.startswith("answer "))
    assert "3.5 days is 302,400 seconds." in answer
