"""The bundled pipeline, ``research-split``, runs embedded right after install (no servers)."""

from __future__ import annotations

import json

import pytest

from producer.cli import main
from shared.examples.research_pipeline import SubQuestions
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL
from worker.embedded import embedded

QUESTION = "What makes an agent run durable, and how many seconds are there in 3.5 days?"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_REDIS_URL, ENV_AGENTS, ENV_PREFIX):
        monkeypatch.delenv(name, raising=False)


def test_research_split_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "run", "research-split", QUESTION, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["status"] == "completed"
    split, research, write = status["steps"]
    assert [split["kind"], research["kind"], write["kind"]] == ["then", "map", "reduce"]
    assert (research["total"], research["done"]) == (2, 2)
    assert status["output"] == (
        "In short: What makes an agent run durable? Durable agent runs: A durable agent run survives"
        " the crash of any process that executes it. How many seconds are there in 3.5 days?"
        " 302,400 seconds."
    )


def test_the_splitters_typed_output_feeds_the_map() -> None:
    with embedded() as client:
        status = client.submit_pipeline("research-split", QUESTION, pipeline_id="split-1").wait(60)
        split_run = client.handle(status.steps[0].children[0].run_id or "").status()
        assert split_run.output_as(SubQuestions) == SubQuestions(
            questions=["What makes an agent run durable?", "How many seconds are there in 3.5 days?"]
        )
        inputs = [client.handle(c.run_id or "").status().input for c in status.steps[1].children]
        assert inputs == split_run.output["questions"]
