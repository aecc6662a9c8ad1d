"""What a worker process imports: the code of features its pool does not use stays out of its
memory (every prefork child carries what the main process imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Loaded only when used: the HTTP client (and the terminal renderer it loads with it), the
#: model providers, the client and the producer's commands, evals, pipelines, bulk jobs and the
#: archive.
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
