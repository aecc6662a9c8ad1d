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

import httpx
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.state import Phase
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
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


def _nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` levels deep (a few hundred bytes: the size checks pass it)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


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
        ({"agent": "direct", "input": "hi", "metadata": _nested(200)}, "InvalidRequest", "nests deeper"),
        ({"agent": "direct", "input": "hi", "state": _nested(200)}, "InvalidRequest", "nests deeper"),
    ],
    ids=[
        "huge-input",
        "huge-metadata",
        "input-not-text",
        "no-agent",
        "empty-input",
        "unknown-field",
        "unknown-agent",
        "deep-metadata",
        "deep-state",
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


def test_the_client_the_api_and_a_bare_message_create_the_same_run(
    redis_server: RedisServer, workers: list[WorkerProcess], client: Client
) -> None:
    """Run creation exists once (``shared.request.new_run``): the same request sent through the
    Python client, the HTTP API and a bare ``wesichain.start`` message becomes the same run, every
    field the producer set kept (tenant, thread, metadata, model, Celery callback)."""
    tenant = f"same-{uuid.uuid4().hex[:6]}"
    tenants = Tenants(redis_server.client(), Keys())
    key, _ = tenants.create_key(tenant)
    tenants.set_celery_callbacks(tenant, ["billing.done"], ["billing-same"])
    tenants.set_models(tenant, ["scripted:direct"])
    request: dict[str, Any] = {
        "agent": "direct",
        "input": "the same request",
        "thread_id": f"thread-{uuid.uuid4().hex[:6]}",
        "metadata": {"order": 7, "tags": ["a", "b"]},
        "model": "scripted:direct",
        "callback": {"task": "billing.done", "queue": "billing-same"},
    }
    by_client = client.submit(**request, tenant=tenant, check_agent=False).run_id
    api = ApiProcess(redis_server.url).start()
    try:
        answer = httpx.post(f"{api.url}/v1/runs", json=request, headers=bearer(key), timeout=30)
        assert answer.status_code == 202, answer.text
        by_api = answer.json()["run_id"]
    finally:
        api.stop()
    by_message = uuid.uuid4().hex
    send_from_another_process(redis_server.url, start(by_message, **request, tenant=tenant))
    wait_until(lambda: client.store.load(by_message) is not None, TIMEOUT, what="the bare run to be created")

    def as_created(run_id: str) -> dict[str, Any]:
        first = client.store.checkpoints(run_id, 0, 0)[0]  # version 1: the run as it was created
        created: dict[str, Any] = json.loads(first.dump_request(exclude_time=True))
        return {**created, "model": first.model, "state": first.state, "phase": first.phase.value}

    runs = [as_created(run_id) for run_id in (by_client, by_api, by_message)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0]["tenant"] == tenant and runs[0]["callback"] == {**request["callback"], "url": None}
    assert (runs[0]["thread_id"], runs[0]["metadata"], runs[0]["model"]) == (
        request["thread_id"],
        request["metadata"],
        "scripted:direct",
    )


DEEP_SENDER = """
import json, sys
from celery import Celery
from kombu.serialization import register
url, depth, messages = sys.argv[1], int(sys.argv[2]), json.loads(sys.stdin.read())
deep = "[" * depth + "]" * depth
# A hostile producer writes its JSON by hand: nested deeper than any JSON library would decode.
register(
    "json",
    lambda obj: json.dumps(obj).replace('"@deep@"', deep),
    json.loads,
    content_type="application/json",
    content_encoding="utf-8",
)
app = Celery(broker=url)
for kwargs in messages:
    app.send_task("wesichain.start", kwargs=kwargs, queue="wesichain.model")
"""


def logged(workers: list[WorkerProcess], words: str) -> str:
    """The workers' logs, once one of them has logged ``words``."""

    def found() -> str | None:
        text = "".join(w.log() for w in workers)
        return text if words in text else None

    text: str = wait_until(found, TIMEOUT, what=f"a worker to log {words!r}")
    return text


def test_a_message_nested_past_any_decoder_is_dropped_and_the_worker_serves_on(
    redis_server: RedisServer, workers: list[WorkerProcess], client: Client
) -> None:
    """A body no JSON decoder can read (nested 100,000 levels) cannot become a run: it is dropped,
    no worker dies of it, and the runs sent after it are served."""
    hostile = uuid.uuid4().hex
    after = uuid.uuid4().hex
    messages = [
        start(hostile, agent="direct", input="a private conversation", metadata={"deep": "@deep@"}),
        start(after, agent="one_hop", input="after the hostile one"),
    ]
    proc = subprocess.run(
        [sys.executable, "-I", "-c", DEEP_SENDER, redis_server.url, "100000"],
        input=json.dumps(messages),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    wait_until(lambda: client.store.load(after) is not None, TIMEOUT, what="the run sent after it")
    head = client.handle(after).wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    assert client.store.load(hostile) is None
    assert all(w.alive for w in workers)
    # Logged by what it is, not by what it carries (Celery would log a kilobyte of its body).
    logs = logged(workers, "dropped a message that cannot be decoded (RecursionError)")
    assert "a private conversation" not in logs


def test_a_message_for_a_task_no_worker_has_logs_no_arguments(
    redis_server: RedisServer, workers: list[WorkerProcess], client: Client
) -> None:
    """A start message sent under a mistyped task name is refused (Celery's NotRegistered) without
    its arguments, the run's input among them, written to the worker's log."""
    run_id = uuid.uuid4().hex
    sender = SENDER.replace('"wesichain.start"', '"wesichain.strat"')
    proc = subprocess.run(
        [sys.executable, "-I", "-c", sender, redis_server.url],
        input=json.dumps([start(run_id, agent="direct", input="another private conversation")]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    logs = logged(workers, "wesichain.strat")
    assert "another private conversation" not in logs and run_id not in logs
    assert "bytes, not shown" in logs
    assert client.store.load(run_id) is None
    assert all(w.alive for w in workers)


def test_entries_on_a_queue_that_are_no_message_are_dropped_and_every_worker_serves_on(
    redis_server: RedisServer, workers: list[WorkerProcess], client: Client
) -> None:
    """Anyone who can reach the broker can push anything onto a queue's list. kombu pops it and
    parsed it outside every handler Celery has: an entry that was not JSON, or whose headers were
    not an object, made the worker that popped it exit. Each is dropped with one log line now."""
    r = redis_server.client()
    properties = {"delivery_tag": "t", "body_encoding": "base64", "delivery_info": {}}
    entries = [
        b"not json at all",
        json.dumps({"body": "", "headers": "x", "properties": properties}).encode(),
        json.dumps({"body": ""}).encode(),
        json.dumps([1, 2]).encode(),
        b"[" * 100_000 + b"]" * 100_000,
    ]
    for entry in entries:
        r.lpush("wesichain.model", entry)
    wait_until(lambda: r.llen("wesichain.model") == 0, TIMEOUT, what="the entries to be taken")
    after = uuid.uuid4().hex
    send_from_another_process(redis_server.url, start(after, agent="one_hop", input="after the entries"))
    wait_until(lambda: client.store.load(after) is not None, TIMEOUT, what="the run sent after them")
    assert client.handle(after).wait(TIMEOUT).phase is Phase.COMPLETED
    logs = logged(workers, "whose envelope is not kombu's")

    def dropped() -> int:
        return sum(w.log().count("whose envelope is not kombu's") for w in workers)

    wait_until(lambda: dropped() == len(entries), TIMEOUT, what="every entry to be dropped")
    assert "Unrecoverable error" not in logs
    assert all(w.alive for w in workers)
