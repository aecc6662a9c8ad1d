"""A retry-safe tool puts a memory item, then its worker is SIGKILLed before the call's result is
recorded. The call runs again on the other worker, which puts again: exactly one write is applied
(the item's version is 1, its value the live delivery's), because a tool's writes travel in its
recorded result and each write id is applied once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_memory import HELD_PIDS_KEY, PUTS_KEY
from tests.broker import Settings
from tests.chaos.support import RUN_TIMEOUT_S, Cluster, idem, note_recovery
from tests.harness import RedisServer, wait_until

AGENTS = "tests.agents_memory"


@pytest.fixture
def memory_client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def test_a_tool_killed_after_writing_memory_writes_once(cluster: Cluster, memory_client: Client) -> None:
    cluster.start(2, agents=AGENTS)
    client = memory_client
    r = client.store.redis
    handle = client.submit("keeper", "held notes colour the sky is blue")
    key = idem(handle.run_id)
    pid = int(wait_until(lambda: r.hget(HELD_PIDS_KEY, key), RUN_TIMEOUT_S, what="the put, then the hold"))
    # The held delivery called put; nothing of it is in the store: it waits for the result.
    assert r.hget(PUTS_KEY, key) == "1"
    assert client.memory.get(["user", "notes"], "colour") is None
    victim = cluster.owner(pid)
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "remembered colour"
    # Both deliveries put; one write was applied, the live one's.
    assert r.hget(PUTS_KEY, key) == "2"
    item = client.memory.get(["user", "notes"], "colour")
    assert item is not None
    assert item.version == 1
    assert item.value["text"] == "the sky is blue" and item.value["pid"] != pid
    applied = r.zrange(client.store.keys.memory(None, "applied"), 0, -1)
    assert applied == [f"{key}:0"]
    note_recovery("whole worker killed after a tool wrote memory", head.updated_at - killed_at)
