"""Another service starts runs with nothing but a plain Celery app and the broker URL.

The sender here is a separate Python process that imports nothing from this project: only
``celery``, the broker URL and the message documented in ``docs/start-message.md``. The same
limits apply on that path as through the client, and a malformed request ends as a failed run
whose error the sender can read, never as a silent missing run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from producer.client import Client
from shared.state import Phase
from tests.harness import RedisServer, WorkerProcess, wait_until

pytestmark = pytest.mark.redis_broker

TIMEOUT = 30

SENDER = """
import json, sys
from celery import Celery
url, messages = sys.argv[1], json.loads(sys.stdin.read())
app = Celery(broker=url)
for kwargs in messages:
    app.send_task("wesichain.start", kwargs=kwargs, queue="wesichain.model")
"""


def send_from_another_process(url: str, *messages: dict[str, Any]) -> None:
    """Send ``wesichain.start`` messages from a plain Celery app in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", SENDER, url],  # -I: nothing from this checkout is importable
        input=json.dumps(list(messages)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def start(run_id: str, **create: Any) -> dict[str, Any]:
    return {"run_id": run_id, "create": create}


def test_a_plain_celery_app_starts_a_run(
    redis_server: RedisServer, workers: list[WorkerProcess], client: Client
) -> None:
    run_id = uuid.uuid4().hex
    send_from_another_process(redis_server.url, start(run_id, agent="one_hop", input="from another service"))
    handle = client.handle(run_id)
    wait_until(lambda: client.store.load(run_id) is not None, TIMEOUT, what="the run to be created")
    head = handle.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert head.input == "from another service"


@pytest.mark.parametrize(
    ("create", "kind", "words"),
    [
        ({"agent": "direct", "input": "x" * 10_000_000}, "InvalidRequest", "input is 10000000 chars"),
        (
            {"agent": "direct", "input": "hi", "metadata": {"blob": "y" * 5_000_000}},
            "InvalidRequest",
            "metadata",
        ),
        ({"agent": "direct", "input": ["not", "text"]}, "InvalidRequest", "input"),
        ({"input": "no agent"}, "InvalidRequest", "agent"),
        ({"agent": "direct", "input": "   "}, "InvalidRequest", "empty"),
        ({"agent": "direct", "input": "hi", "surprise": 1}, "InvalidRequest", "surprise"),
        ({"agent": "nosuchagent", "input": "hi"}, "Config", "unknown agent 'nosuchagent'"),
    ],
    ids=[
        "huge-input",
        "huge-metadata",
        "input-not-text",
        "no-agent",
        "empty-input",
        "unknown-field",
        "unknown-agent",
    ],
)
def test_a_bad_request_fails_visibly(
    redis_server: RedisServer,
    workers: list[WorkerProcess],
    client: Client,
    create: dict[str, Any],
    kind: str,
    words: str,
) -> None:
    run_id = uuid.uuid4().hex
    send_from_another_process(redis_server.url, start(run_id, **create))
    wait_until(lambda: client.store.load(run_id) is not None, TIMEOUT, what="the failed run to be recorded")
    head = client.handle(run_id).wait(TIMEOUT)
    assert head.phase is Phase.FAILED and head.error is not None, head.phase
    assert head.error.kind == kind, head.error
    assert words in head.error.message, head.error.message
    # Nothing oversized was stored on the way to saying so.
    assert len(head.input) <= client.settings.limits.max_input_chars
    assert len(json.dumps(head.metadata)) <= client.settings.limits.max_metadata_chars
