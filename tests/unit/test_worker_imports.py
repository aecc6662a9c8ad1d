"""What a worker process imports: the code of features its pool does not use stays out of its
memory (every prefork child carries what the main process imported)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Loaded only when used: the HTTP client (and the terminal renderer it loads with it), the
#: model providers, the client and the producer's commands, evals, pipelines, bulk jobs and the
#: archive, and the long-term memory store (with its embedding), opened by a phase's first memory
#: operation, and the fork code, loaded by the first fork; the pool's operator view (with the
#: timeline), which only the API and the client read (the workers write its records); the
#: webhooks' signing and the tenants' records, loaded by a run's first callback; the assistants'
#: store and configurations (what every run needs of assistants is in shared.configurable), loaded
#: by the first run that names an assistant; the check of a pipeline's steps, loaded by the first
#: pipeline an agents module registers (tests.agents_fixture registers none); the search query,
#: loaded by the first listing (a worker creates runs: the indexes are in shared.search_index).
NOT_IMPORTED = (
    "httpx",
    "rich",
    "shared.llm.providers",
    "producer.client",
    "producer.commands",
    "producer.evals",
    "producer.pipelines",
    "shared.evals.store",
    "shared.pipeline.store",
    "shared.archive",
    "shared.archiver",
    "worker.evals",
    "worker.pipelines",
    "worker.archiving",
    "shared.bulk",
    "worker.bulk",
    "shared.memory",
    "shared.embedding",
    "shared.timetravel",
    "shared.pool",
    "shared.timeline",
    "shared.webhooks",
    "shared.tenants",
    "shared.assistant_store",
    "shared.assistants",
    "shared.pipeline.check",
    "shared.pipeline.types",
    "shared.search",
)

PROGRAM = """
import json, sys
from producer.cli import _parser
_parser("worker")  # what `wesichain worker` builds before it starts the worker
import worker.app
from shared.agents import load_registry
load_registry("tests.agents_fixture")
print(json.dumps(sorted(sys.modules)))
"""


def test_a_worker_imports_no_code_of_features_it_does_not_use() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WESICHAIN_AGENTS": "tests.agents_fixture"}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    loaded = set(json.loads(out))
    assert "worker.app" in loaded
    assert sorted(m for m in NOT_IMPORTED if m in loaded) == []


def test_a_command_runs_without_the_parser_tree_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker or API runs for days inside its command's handler: the parser tree must be
    garbage by then, not held by the frame that parsed the arguments."""
    from producer import cli

    built: list[weakref.ref[argparse.ArgumentParser]] = []
    alive_during_handler: list[bool] = []

    def handler(args: argparse.Namespace) -> int:
        gc.collect()
        alive_during_handler.append(built[0]() is not None)
        return 0

    def parser(command: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, cli.Handler]]:
        p = argparse.ArgumentParser(prog="wesichain")
        p.add_subparsers(dest="command", required=True).add_parser("probe")
        built.append(weakref.ref(p))
        return p, {"probe": handler}

    monkeypatch.setattr(cli, "_parser", parser)
    monkeypatch.setattr(cli, "_apply_env", lambda args: None)
    assert cli.main(["probe"]) == 0
    assert alive_during_handler == [False]
