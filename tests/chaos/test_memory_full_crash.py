"""A worker SIGKILLed while a tool call's memory write waits for room at a full Redis.

The call's result is recorded (its writes with it), then Redis fills before the delivery that
recorded it applies the writes: the memory script is refused and the delivery waits for room
(``worker.full.until_room``). It is killed there, as a whole worker or as the pool process alone.
Once memory is freed the observe phase, on the other worker, applies the writes the result holds:
the item is written exactly once (version 1, its one write id applied), the tool is not run again
(its result was recorded), and the run completes with the event invariants.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import GATE_DIR_ENV
from tests.agents_memory import EMBED_CALLS, EMBED_OPEN, PUTS_KEY, TOOL_PIDS_KEY
from tests.broker import Settings
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    events_of,
    fill_redis,
    free_redis,
    idem,
    kill_child,
    kinds,
    refuses_writes,
)
from tests.harness import RedisServer, wait_until
from tests.invariants import ONE_HOP

pytestmark = pytest.mark.standalone_redis  # sets the one Redis's maxmemory

AGENTS = "tests.agents_memory"
NS = ["user", "notes"]


@pytest.fixture
def memory_client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _embedded_by(gate: Path) -> list[int]:
    path = gate / EMBED_CALLS
    return [int(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("victim_is", ["worker", "pool process"])
def test_a_delivery_killed_while_its_memory_write_waits_for_room_writes_once(
    cluster: Cluster, memory_client: Client, tmp_path: Path, victim_is: str
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {GATE_DIR_ENV: str(gate), "WESICHAIN_MEMORY_EMBEDDING": "tests.agents_memory:gated_letters"}
    cluster.start(2, agents=AGENTS, env=env)
    client = memory_client
    r = client.store.redis
    handle = client.submit("keeper", "remember notes colour the sky is blue")
    key = idem(handle.run_id)
    # The delivery that ran the tool recorded its result and is embedding the put, to apply it.
    tool_pid = int(wait_until(lambda: r.hget(TOOL_PIDS_KEY, key), RUN_TIMEOUT_S, what="the tool to run"))
    wait_until(lambda: tool_pid in _embedded_by(gate), RUN_TIMEOUT_S, what="the recorded put to be embedded")
    assert [e.kind for e in events_of(handle)].count("ToolCompleted") == 1
    assert client.memory.get(NS, "colour") is None
    victim = cluster.owner(tool_pid)
    offset = len(victim.log())

    ballast = fill_redis(r)
    assert ballast > 0 and refuses_writes(r)
    (gate / EMBED_OPEN).touch()
    waiting = f"memory writes {key}:0 waits for memory"
    wait_until(lambda: waiting in victim.log()[offset:], 30, what="the memory write to wait for room")
    if victim_is == "worker":
        victim.kill()
    else:
        kill_child(tool_pid, victim)
    assert refuses_writes(r)
    assert client.memory.get(NS, "colour") is None
    free_redis(r, ballast)

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == "remembered colour"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    # The tool ran once (its result was recorded before the kill); its one write applied once.
    assert r.hget(PUTS_KEY, key) == "1"
    item = client.memory.get(NS, "colour")
    assert item is not None
    assert item.version == 1
    assert item.value == {"text": "the sky is blue", "pid": tool_pid}
    applied = r.zrange(client.store.keys.memory(None, "applied"), 0, -1)
    assert applied == [f"{key}:0"]
