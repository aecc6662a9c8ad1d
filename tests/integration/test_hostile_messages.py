"""Messages no producer of ours sends, put on the runtime's queues by anyone who can reach the broker.

A pickled body, a body that is not JSON, an unregistered task name, a phase task with arguments
of the wrong type or missing, naming a run that does not exist, or with an oversized call id:
each is refused or dropped by the worker that receives it, which logs why and keeps serving.
No run state is written for any of them, and a run submitted right after completes as usual.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from kombu.connection import Connection
from kombu.messaging import Producer

from producer.client import Client
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS
from shared.state import Phase
from tests.broker import broker_for, on_rabbitmq, queued
from tests.harness import RedisServer, WorkerProcess, wait_until

TIMEOUT = 60


@pytest.fixture
def outsider(redis_server: RedisServer) -> Iterator[Celery]:
    """A plain Celery app on the runtime's broker, importing nothing of the runtime."""
    app = Celery("outsider", broker=broker_for(redis_server.url) or redis_server.url)
    app.conf.update(accept_content=["json", "pickle"], task_serializer="json")
    if on_rabbitmq():  # the runtime's exchanges and queues, declared as they are (else: refused)
        app.conf.update(
            task_create_missing_queue_exchange_type="topic",
            task_create_missing_queue_type="quorum",
        )
    yield app
    app.close()


def _raw(redis_server: RedisServer, queue: str, task: str, body: bytes, content_type: str) -> str:
    """Publish a protocol-2 message whose body is exactly ``body`` (for bodies Celery would not make)."""
    task_id = f"hostile-{uuid.uuid4().hex[:8]}"
    with Connection(broker_for(redis_server.url) or redis_server.url) as conn:
        Producer(conn).publish(
            body,
            routing_key=queue,
            exchange="",
            content_type=content_type,
            content_encoding="utf-8",
            headers={"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0},
            declare=[],
        )
    return task_id


def test_hostile_messages_are_dropped_and_the_workers_keep_serving(
    workers: list[WorkerProcess], client: Client, outsider: Celery, redis_server: RedisServer
) -> None:
    pids = {w.name: w.pids() for w in workers}
    offsets = {w.name: len(w.log()) for w in workers}
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    sent = [
        # Pickle: the workers accept JSON only.
        outsider.send_task("wesichain.think", kwargs={"run_id": ghost, "step": 1, "version": 2},
                           queue=QUEUE_MODEL, serializer="pickle").id,
        outsider.send_task("wesichain.no_such_task", kwargs={"run_id": ghost}, queue=QUEUE_MODEL).id,
        outsider.send_task("wesichain.think", kwargs={"run_id": 12, "step": "one", "version": None},
                           queue=QUEUE_MODEL).id,
        outsider.send_task("wesichain.think", kwargs={"step": 1}, queue=QUEUE_MODEL).id,
        outsider.send_task("wesichain.think", kwargs={"run_id": ghost, "step": 1, "version": 2},
                           queue=QUEUE_MODEL).id,
        outsider.send_task("wesichain.tool", kwargs={"run_id": ghost, "step": 1, "version": 3,
                           "call_id": "c" * 100_000}, queue=QUEUE_TOOLS).id,
        _raw(redis_server, QUEUE_MODEL, "wesichain.observe", b"{not json", "application/json"),
    ]  # fmt: skip
    redis = client.store.redis

    def handled() -> bool:
        logs = "".join(w.log()[offsets[w.name] :] for w in workers)
        refused = "untrusted content" in logs and f"{sent[2]}] has malformed arguments: run_id=" in logs
        return refused and all(task_id in logs for task_id in sent[1:])

    # Every message reached a worker and was dealt with (logged by its id; the pickled one is
    # refused before its id is read), and none is left on the queues.
    wait_until(handled, TIMEOUT, what="the workers to deal with every hostile message")
    url = redis_server.url
    wait_until(lambda: not queued(url, QUEUE_MODEL) and not queued(url, QUEUE_TOOLS), TIMEOUT,
               what="the queues to be empty")  # fmt: skip

    # The same processes serve the next run, and nothing was written for the run that never was.
    assert {w.name: w.pids() for w in workers} == pids
    head = client.submit("one_hop", "after the noise").wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    assert list(redis.scan_iter(match=f"*{ghost}*")) == []
    assert client.store.load(ghost) is None
