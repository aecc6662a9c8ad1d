"""The typestate proof: mypy rejects illegal phase transitions at type-check time.

Each snippet is its own file; all of them go through a single ``mypy --strict`` run (with the
repository's configuration and pydantic plugin) and the output is attributed per file and line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """\
from shared.errors import RunErrorInfo
from shared.fsm import (
    Acting, Parked, CompletedRun, FailedRun, Idle, InterruptedRun, Observing, Thinking, Transition, view,
)
from shared.llm.base import Usage
from shared.messages import ToolCall, UserMessage
from shared.state import HandoffRecord, Phase, RunHead, Summary, ToolResult

HEAD = RunHead.new_idle("r", "agent", "question")
HANDOFF = HandoffRecord(from_agent="a", to_agent="b", to_version="1", step=1, call_id="c", at=1)
ERR = RunErrorInfo(kind="InternalInvariant", message="x")
CALL = ToolCall(id="c", name="t", arguments={})
"""

# Name -> (the offending line, the mypy message it must produce). Each is appended after PRELUDE.
ILLEGAL: dict[str, tuple[str, str]] = {
    "acting_act": ("Acting(HEAD).act(None, [CALL], Usage())", '"Acting" has no attribute "act"'),
    "acting_complete": ('Acting(HEAD).complete("x", Usage())', '"Acting" has no attribute "complete"'),
    "acting_next_step": ("Acting(HEAD).next_step([])", '"Acting" has no attribute "next_step"'),
    "idle_complete": ('Idle(HEAD).complete("x", Usage())', '"Idle" has no attribute "complete"'),
    "idle_act": ("Idle(HEAD).act(None, [CALL], Usage())", '"Idle" has no attribute "act"'),
    "idle_observe": ("Idle(HEAD).observe()", '"Idle" has no attribute "observe"'),
    "thinking_next_step": ("Thinking(HEAD).next_step([])", '"Thinking" has no attribute "next_step"'),
    "thinking_observe": ("Thinking(HEAD).observe()", '"Thinking" has no attribute "observe"'),
    "thinking_start": (
        'Thinking(HEAD).start([], agent_version="1", model="m:x", max_steps=1)',
        '"Thinking" has no attribute "start"',
    ),
    "observing_complete": (
        'Observing(HEAD).complete("x", Usage())',
        '"Observing" has no attribute "complete"',
    ),
    "observing_act": ("Observing(HEAD).act(None, [CALL], Usage())", '"Observing" has no attribute "act"'),
    "awaiting_act": (
        "Parked(HEAD).act(None, [CALL], Usage())",
        '"Parked" has no attribute "act"',
    ),
    # The phase travels through the transition's type: what ``start`` returns cannot observe.
    "thinking_approve": ("Thinking(HEAD).approve()", '"Thinking" has no attribute "approve"'),
    # Only a thinking run hands off: an acting one has its calls out already.
    "acting_hand_off": (
        'Acting(HEAD).hand_off(None, [CALL], Usage(), [], HANDOFF, [], model="m:x", max_steps=1)',
        '"Acting" has no attribute "hand_off"',
    ),
    "observing_refuse_handoff": (
        "Observing(HEAD).refuse_handoff(None, [CALL], Usage(), [], ERR)",
        '"Observing" has no attribute "refuse_handoff"',
    ),
    "acting_park": (
        "Acting(HEAD).park(None, [CALL], Usage(), [])",
        '"Acting" has no attribute "park"',
    ),
    "idle_resume": ("Idle(HEAD).resume([])", '"Idle" has no attribute "resume"'),
    "observing_deny": ('Observing(HEAD).deny("no")', '"Observing" has no attribute "deny"'),
    "thinking_park_unknown": (
        "Thinking(HEAD).park_unknown([])",
        '"Thinking" has no attribute "park_unknown"',
    ),
    "awaiting_complete": (
        'Parked(HEAD).complete("x", Usage())',
        '"Parked" has no attribute "complete"',
    ),
    "awaiting_observe": ("Parked(HEAD).observe()", '"Parked" has no attribute "observe"'),
    "chained_park_observe": (
        "Thinking(HEAD).park(None, [CALL], Usage(), []).to.observe()",
        '"Parked" has no attribute "observe"',
    ),
    "chained_start_observe": (
        'Idle(HEAD).start([], agent_version="1", model="m:x", max_steps=1).to.observe()',
        '"Thinking" has no attribute "observe"',
    ),
    "chained_complete_act": (
        'Thinking(HEAD).complete("x", Usage()).to.act(None, [CALL], Usage())',
        '"CompletedRun" has no attribute "act"',
    ),
    "chained_fail_interrupt": (
        'Thinking(HEAD).fail(ERR).to.interrupt("x")',
        '"FailedRun" has no attribute "interrupt"',
    ),
}

TERMINAL_CALLS = {
    "fail": "fail(ERR)",
    "interrupt": 'interrupt("x")',
    "start": 'start([], agent_version="1", model="m:x", max_steps=1)',
    "act": "act(None, [CALL], Usage())",
    "complete": 'complete("x", Usage())',
    "reprompt": 'reprompt(ERR, None, "fix", Usage(), True)',
    "retry": "retry(ERR, False)",
    "summarised": 'summarised(Summary(upto=1, text="s"), Usage())',
    "absorb": "absorb([], None, 1, [])",
    "observe": "observe()",
    "next_step": "next_step([])",
    "next_wave": "next_wave(None)",
    "park": "park(None, [CALL], Usage(), [])",
    "delegate": "delegate(None, [CALL], Usage(), [])",
    "hand_off": 'hand_off(None, [CALL], Usage(), [], HANDOFF, [], model="m:x", max_steps=1)',
    "refuse_handoff": "refuse_handoff(None, [CALL], Usage(), [], ERR)",
    "park_unknown": "park_unknown([])",
    "finish": 'finish([], "x")',
    "approve": "approve()",
    "deny": 'deny("no")',
    "resume": "resume([])",
}
for _cls in ("CompletedRun", "FailedRun", "InterruptedRun"):
    for _method, _call in TERMINAL_CALLS.items():
        ILLEGAL[f"terminal_{_cls.lower()}_{_method}"] = (
            f"{_cls}(HEAD).{_call}",
            f'"{_cls}" has no attribute "{_method}"',
        )

LEGAL = """\
def run() -> Transition[CompletedRun]:
    t1 = Idle(HEAD).start([UserMessage(content="q")], agent_version="1", model="m:x", max_steps=3)
    t2 = t1.to.act(None, [CALL], Usage())
    t3 = t2.to.observe()
    t4 = t3.to.next_step([ToolResult(call_id="c", name="t", ok=True, output="1")])
    t5 = t4.to.reprompt(ERR, None, "fix", Usage(), consume_budget=False)
    t6 = t5.to.retry(ERR, consume_budget=True)
    return t6.to.complete("done", Usage())


def approvals() -> tuple[Transition[Acting], Transition[Thinking], Transition[Thinking]]:
    parked = Thinking(HEAD).park("may I?", [CALL], Usage(), ["t"]).to
    unknown = Observing(HEAD).park_unknown([]).to
    return parked.approve(), parked.deny("no"), unknown.resume([])


def fail_anywhere() -> list[Transition[FailedRun]]:
    return [Idle(HEAD).fail(ERR), Acting(HEAD).fail(ERR), Parked(HEAD).fail(ERR)]


def interrupt_anywhere() -> Transition[InterruptedRun]:
    return Thinking(HEAD).interrupt("cancelled", ERR)


def dispatch(head: RunHead) -> str:
    v = view(head)
    if isinstance(v, Thinking):
        return v.complete("x", Usage()).to.phase.value
    if isinstance(v, CompletedRun | FailedRun | InterruptedRun):
        return v.head.phase.value
    return v.fail(ERR).to.phase.value


reveal_type(run())
"""

ERROR_LINE = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): (?P<sev>error|note): (?P<msg>.*)$")


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, list[tuple[int, str, str]]]]:
    """Write every snippet, type-check them all at once, and index the output by snippet name."""
    base = tmp_path_factory.mktemp("typestate")
    src = base / "snippets"
    src.mkdir()
    for name, (line, _) in ILLEGAL.items():
        (src / f"{name}.py").write_text(PRELUDE + line + "\n")
    (src / "legal.py").write_text(PRELUDE + "\n\n" + LEGAL)
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(base / "cache"),
            "--follow-imports",
            "silent",
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            "--no-color-output",
            str(src),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    by_file: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for raw in proc.stdout.splitlines():
        m = ERROR_LINE.match(raw)
        if m is None:
            continue
        by_file[Path(m["file"]).stem].append((int(m["line"]), m["sev"], m["msg"]))
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        pytest.fail(f"mypy did not run cleanly (rc={proc.returncode}):\n{proc.stderr}\n{proc.stdout}")
    return proc.returncode, by_file


def errors(found: list[tuple[int, str, str]]) -> list[tuple[int, str]]:
    return [(line, msg) for line, sev, msg in found if sev == "error"]


@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_illegal_transition_is_a_type_error(
    name: str, mypy_run: tuple[int, dict[str, list[tuple[int, str, str]]]]
) -> None:
    rc, by_file = mypy_run
    assert rc == 1
    expected_line = PRELUDE.count("\n") + 1
    found = errors(by_file.get(name, []))
    assert found, f"mypy accepted the illegal snippet {name}: {ILLEGAL[name][0]}"
    assert (expected_line, f"{ILLEGAL[name][1]}  [attr-defined]") in found, found
    # Nothing else in the snippet is wrong: the only complaint is the illegal move.
    assert all(line == expected_line for line, _ in found), found


def test_legal_sequence_type_checks(mypy_run: tuple[int, dict[str, list[tuple[int, str, str]]]]) -> None:
    _, by_file = mypy_run
    found = by_file.get("legal", [])
    assert errors(found) == []
    # The file really was analysed against shared.fsm: the phase is carried through the chain.
    notes = [msg for _, sev, msg in found if sev == "note"]
    assert notes == ['Revealed type is "shared.fsm.Transition[shared.fsm.CompletedRun]"'], found


def test_terminal_table_covers_every_transition_method() -> None:
    from shared import fsm

    methods = {
        name
        for cls in (fsm.Idle, fsm.Thinking, fsm.Acting, fsm.Observing, fsm.Parked)
        for name in vars(cls) | vars(fsm._Live)
        if not name.startswith("_") and callable(getattr(cls, name, None))
    }
    assert methods == set(TERMINAL_CALLS)
