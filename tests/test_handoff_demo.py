"""The demo's handoff: ``wesichain demo --agent research-desk`` hands the question to ``research``
(embedded: no servers), which answers it with its tools."""

from __future__ import annotations

import re

import pytest

from producer.cli import main
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL

EVENT_LINE = re.compile(r"^\[step (\d+)\] (\w+)\s")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)


def test_the_demo_hands_off_to_the_research_assistant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--agent", "research-desk"]) == 0
    out = capsys.readouterr().out
    events = [(int(m[1]), m[2]) for line in out.splitlines() if (m := EVENT_LINE.match(line))]
    assert events[:4] == [(0, "RunStarted"), (1, "StepStarted"), (1, "ModelResponded"), (1, "HandedOff")]
    assert [kind for _, kind in events].count("HandedOff") == 1
    assert "research-desk -> research v1 id=call_0 (filtered history)" in out
    assert {line.split()[3] for line in out.splitlines() if "ToolCompleted" in line} == {
        "search",
        "calculator",
        "current_time",
    }
    assert "now      research v1 (handed off 1 time(s))" in out
    answer = next(line for line in out.splitlines() if line.startswith("answer "))
    assert "3.5 days is 302,400 seconds." in answer
