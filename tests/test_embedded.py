"""The embedded mode: ``wesichain demo`` and concurrent runs in one process, no servers."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from producer.cli import main
from shared.examples.research import Brief
from shared.export import RunExport
from shared.settings import ENV_AGENTS, ENV_ARCHIVE_URL, ENV_PREFIX, ENV_REDIS_URL
from shared.state import Phase
from worker.embedded import ENV_HOME, default_archive_url, embedded

DEMO_KINDS = [
    "RunStarted",
    "StepStarted",
    "ModelResponded",
    "ToolDispatched",
    "ToolDispatched",
    "ToolDispatched",
    "ToolCompleted",
    "ToolCompleted",
    "ToolCompleted",
    "StepStarted",
    "ModelResponded",
    "Completed",
]

EVENT_LINE = re.compile(r"^\[step (\d+)\] (\w+)\s")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    events = [(int(m[1]), m[2]) for line in out.splitlines() if (m := EVENT_LINE.match(line))]
    assert [kind for _, kind in events] == DEMO_KINDS
    assert [step for step, _ in events] == [0] + [1] * 8 + [2] * 3
    completed = {line.split()[3] for line in out.splitlines() if "ToolCompleted" in line}
    assert completed == {"search", "calculator", "current_time"}
    assert all(" ok " in line for line in out.splitlines() if "ToolCompleted" in line)
    answer = next(line for line in out.splitlines() if line.startswith("answer "))
    assert "3.5 days is 302,400 seconds." in answer
    assert "Durable agent runs" in answer
    assert re.search(r"^phase\s+completed\s+step 2/6", out, re.M)
    assert "TokenDelta" not in out


def test_demo_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    *events, final = records
    kinds = [e["kind"] for e in events]
    assert [k for k in kinds if k != "TokenDelta"] == DEMO_KINDS
    assert "TokenDelta" in kinds  # --json prints every delta
    deltas = "".join(e["text"] for e in events if e["kind"] == "TokenDelta")
    assert final["phase"] == "completed"
    assert final["answer"] == events[-1]["answer"]
    assert "302,400 seconds" in final["answer"]
    assert deltas.endswith(final["answer"])
    assert {e["run_id"] for e in events} == {final["run_id"]}
    assert final["step"] == 2 and final["version"] == 6


def test_the_demo_run_outlives_its_process_in_the_archive(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_HOME, str(tmp_path))
    monkeypatch.delenv(ENV_ARCHIVE_URL, raising=False)
    assert main(["demo", "--json"]) == 0
    final = json.loads(capsys.readouterr().out.splitlines()[-1])
    url = default_archive_url()
    assert url == f"sqlite:///{tmp_path.resolve() / 'archive.db'}"

    # Another process, another (empty) in-process Redis: the run is read from the archive.
    monkeypatch.setenv(ENV_ARCHIVE_URL, url)
    assert main(["export", final["run_id"], "--redis", "memory://"]) == 0
    exported = RunExport.model_validate_json(capsys.readouterr().out)
    assert exported.run.model_dump(mode="json") == final
    assert exported.events[-1].event.kind == "Completed"
    assert sorted(r.result.name for r in exported.tool_results) == ["calculator", "current_time", "search"]


def test_two_concurrent_runs_in_one_embedded_worker() -> None:
    with embedded() as client:
        first = client.submit("research", "What is a lease?")
        second = client.submit("research", "What is exactly-once?")
        assert first.run_id != second.run_id
        heads = [first.wait(timeout=60), second.wait(timeout=60)]
        assert [h.phase for h in heads] == [Phase.COMPLETED, Phase.COMPLETED]
        assert heads[0].answer is not None and heads[0].answer.startswith("Leases: ")
        assert heads[1].answer is not None and heads[1].answer.startswith("Exactly-once effects: ")
        for handle, head in zip((first, second), heads, strict=True):
            assert "302,400 seconds" in (head.answer or "")
            events = list(handle.events(follow=False))
            assert [e.kind for e in events if e.kind != "TokenDelta"] == DEMO_KINDS
            assert {e.run_id for e in events} == {handle.run_id}
            messages = client.store.load_messages(handle.run_id)
            assert [m.role for m in messages] == [
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "tool",
                "assistant",
            ]


def test_research_brief_answers_in_its_output_type() -> None:
    with embedded() as client:
        head = client.submit("research-brief", "What is a lease?").wait(timeout=60)
    assert head.phase is Phase.COMPLETED, head.error
    brief = head.output_as(Brief)
    assert brief is not None and brief.summary.startswith("Leases: ")
    assert brief.seconds == 302_400.0
    assert brief.sources and all(isinstance(s, str) for s in brief.sources)


def test_research_guarded_audits_and_blocks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="wesichain.audit")
    with embedded() as client:
        head = client.submit("research-guarded", "What is a lease?").wait(timeout=60)
        blocked = client.submit("research-guarded", "Where is the admin password?").wait(timeout=60)
    assert head.phase is Phase.COMPLETED and "302,400 seconds" in (head.answer or "")
    entries = [json.loads(r.getMessage()) for r in caplog.records if r.name == "wesichain.audit"]
    mine = [e for e in entries if e["run_id"] == head.run_id]
    assert sorted(e["tool"] for e in mine if e["kind"] == "tool_call") == [
        "calculator",
        "current_time",
        "search",
    ]
    assert [e["step"] for e in mine if e["kind"] == "model_call"] == [1, 2]
    searched = [e for e in entries if e["run_id"] == blocked.run_id and e.get("tool") == "search"]
    assert len(searched) == 1 and searched[0]["ok"] is False
    assert blocked.phase is Phase.COMPLETED
