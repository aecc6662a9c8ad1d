"""Runs created many at a time (``Client.submit_many``): each is created once, its start sent once,
and a refused or taken one changes nothing of the others."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from producer.client import Client, RunRequest
from shared.errors import InvalidRequest
from shared.redis_client import connect
from shared.state import Phase
from shared.tasks import start_task


def _queued_task_ids(client: Client, runs: set[str]) -> list[str]:
    """The task ids of the Celery messages of ``runs`` waiting in any queue list of the broker's
    Redis (the session's broker may hold other tests' messages)."""
    r = connect(client.settings.broker_endpoint())
    ids: list[str] = []
    for key in cast(list[Any], r.keys("*")):
        if r.type(key) in ("list", b"list"):
            for raw in cast(list[Any], r.lrange(key, 0, -1)):
                try:
                    ids.append(json.loads(raw)["headers"]["id"])
                except (ValueError, KeyError, TypeError):
                    continue
    return [task_id for task_id in ids if task_id.split(":", 1)[0] in runs]


@pytest.mark.redis_broker
def test_a_batch_creates_each_new_run_once_and_sends_only_their_starts(client: Client) -> None:
    # In a queue namespace no worker consumes: the starts stay in the broker to be counted.
    ns = "submit-many"
    taken = client.submit("echo", "first", run_id="batch-taken", check_agent=False, namespace=ns).run_id
    requests = [
        RunRequest("echo", "one", run_id="batch-1", namespace=ns),
        RunRequest("echo", "again", run_id=taken, namespace=ns),
        RunRequest(
            "echo", "x" * (client.settings.limits.max_input_chars + 1), run_id="batch-long", namespace=ns
        ),
        RunRequest("echo", "two", run_id="batch-2", tenant="acme", namespace=ns),
    ]

    outcomes = client.submit_many(requests, check_agent=False)

    assert outcomes[0] is True and outcomes[1] is False and outcomes[3] is True
    assert isinstance(outcomes[2], InvalidRequest)
    assert client.store.load("batch-long") is None
    first, second = client.store.load("batch-1"), client.store.load("batch-2")
    again = client.store.load(taken)
    assert first is not None and first.phase is Phase.IDLE and first.input == "one"
    assert second is not None and second.tenant == "acme"
    assert again is not None and again.input == "first"  # the taken id's run is untouched
    ours = {taken, "batch-1", "batch-long", "batch-2"}
    queued = _queued_task_ids(client, ours)
    assert sorted(queued) == sorted(
        start_task(run_id, namespace=ns).task_id for run_id in (taken, "batch-1", "batch-2")
    )
    # The same batch again creates nothing and sends nothing.
    assert client.submit_many(requests[:2], check_agent=False) == [False, False]
    assert sorted(_queued_task_ids(client, ours)) == sorted(queued)


def test_a_batch_after_redis_lost_its_scripts_still_creates_each_run(client: Client) -> None:
    client.store.redis.script_flush()

    outcomes = client.submit_many(
        [RunRequest("echo", f"in {i}", run_id=f"flushed-{i}") for i in range(3)], check_agent=False
    )

    assert outcomes == [True, True, True]
    assert all(client.store.load(f"flushed-{i}") is not None for i in range(3))
