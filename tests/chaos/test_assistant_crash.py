"""SIGKILL a whole worker in the middle of a run of an assistant, while the assistant is updated:
the run was pinned to version 1 when it was created, so the worker that takes it over builds the
agent from version 1 too (read by the version the run records, never "the current one"). Every
model call of the run, before and after the kill, received version 1's model, prompt and tool subset; the run
finishes with version 1's answer, while a run started after the update gets version 2."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_assistants import HOLD_PIDS_KEY, RELEASE_KEY, SEEN_KEY
from tests.broker import Settings
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, note_recovery
from tests.harness import RedisServer, wait_until

AGENTS = "tests.agents_assistants"
V1 = {"model": "scripted:concierge-a", "template_values": {"hotel": "the Ritz"}, "tools": ["lookup", "hold"]}
V2 = {
    "model": "scripted:concierge-b",
    "system_prompt": "You are the night porter.",
    "tools": ["lookup", "book"],
}


@pytest.fixture
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _seen(client: Client, text: str) -> list[dict[str, Any]]:
    return [json.loads(s) for s in client.store.redis.lrange(SEEN_KEY.format(text), 0, -1)]


def test_a_worker_killed_mid_run_while_the_assistant_changes(cluster: Cluster, client: Client) -> None:
    workers = cluster.start(2, agents=AGENTS)
    r = client.store.redis
    client.assistants.create("ritz", "concierge", V1, tenant="acme")
    handle = client.submit("concierge", "hold the suite", tenant="acme", assistant="ritz")
    pid = int(
        wait_until(lambda: r.hget(HOLD_PIDS_KEY, handle.run_id), RUN_TIMEOUT_S, what="the held tool call")
    )
    victim = cluster.owner(pid)
    (survivor,) = [w for w in workers if w is not victim]

    assert client.assistants.update("ritz", V2, tenant="acme").version == 2
    killed_at = time.time()
    victim.kill()
    r.set(RELEASE_KEY.format(handle.run_id), 1)  # the call handed on to the survivor may finish

    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.COMPLETED, head.error
    assert (head.assistant, head.assistant_version, head.model) == ("ritz", 1, "scripted:concierge-a")
    assert head.answer == "done by concierge-a"
    assert head.epoch >= 1  # the acting phase was handed on by the sweeper
    assert r.hget(HOLD_PIDS_KEY, handle.run_id) != str(pid)  # the call ran again, on the survivor

    calls = _seen(client, "hold the suite")
    assert len(calls) == 2
    for call in calls:
        assert (call["model"], call["system"], call["tools"]) == (
            "concierge-a",
            "You help the guests of the Ritz.",
            ["lookup", "hold"],
        )
    assert calls[-1]["pid"] in survivor.pids()  # the step after the kill, built on the survivor

    # A run created after the update is pinned to version 2, on the same survivor.
    later = client.submit("concierge", "after the change", tenant="acme", assistant="ritz").wait(
        RUN_TIMEOUT_S
    )
    assert (later.phase, later.assistant_version, later.answer) == (Phase.COMPLETED, 2, "done by concierge-b")
    assert {c["model"] for c in _seen(client, "after the change")} == {"concierge-b"}
    events = list(handle.events(follow=False))
    completed = [e for e in events if e.kind == "Completed"]
    assert len(completed) == 1
    note_recovery("whole worker killed mid-run of an assistant being updated", completed[0].ts - killed_at)
