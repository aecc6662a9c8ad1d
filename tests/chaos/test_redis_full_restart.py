"""Redis SIGKILLed and started again (AOF, fsync always) while it is full and tool results wait
for room.

Non-retry-safe tools end while Redis is at ``maxmemory``: their results cannot be recorded and
wait in their workers, under their claims (``worker.full.until_room``). Redis is then killed with
no chance to flush and started again on the same port; the ``maxmemory`` it was held at was set at
run time, so it comes back with room. The workers reconnect, every held result is recorded once,
no tool runs a second time, and every run completes as it would have without the fault.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from producer.client import Client, NoLiveWorker, RunHandle
from shared.events import ToolCompleted
from shared.state import Phase
from tests.agents_fixture import GATE_DIR_ENV, gated_count
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    STATE_LOST,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    events_of,
    fill_redis,
    idem,
    kinds,
    refuses_writes,
)
from tests.harness import RedisServer, wait_until
from tests.invariants import ONE_HOP

pytestmark = pytest.mark.standalone_redis  # fills, kills and restarts the one Redis


def test_results_waiting_for_room_survive_a_redis_restart(
    aof_cluster: Cluster, aof_server: RedisServer, aof_client: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    workers = aof_cluster.start(2, concurrency=2, env={GATE_DIR_ENV: str(gate)})
    pids = {w.name: w.pid for w in workers}
    r = aof_client.store.redis
    handles = [aof_client.submit("charge_gated", "go") for _ in range(3)]
    keys = [idem(h.run_id) for h in handles]
    wait_until(
        lambda: all(gated_count(gate, f"{k}.starts") == 1 for k in keys), 30, what="every charge to start"
    )
    offsets = {w.name: len(w.log()) for w in workers}

    ballast = fill_redis(r)
    assert ballast > 0 and refuses_writes(r)
    (gate / "open").touch()
    wait_until(
        lambda: all(gated_count(gate, f"{k}.effects") == 1 for k in keys), 30, what="every charge to end"
    )
    # Each charge's result is refused and waits in its worker for room.
    waiting = [f"of run {h.run_id} waits for memory" for h in handles]

    def all_waiting() -> bool:
        logs = "".join(w.log()[offsets[w.name] :] for w in workers)
        return all(line in logs for line in waiting)

    wait_until(all_waiting, 30, what="every result to wait for room")

    offsets = {w.name: len(w.log()) for w in workers}
    aof_server.stop(signal.SIGKILL)
    # Down for longer than a command's reconnect retries: until every worker's registry heartbeat,
    # which retries as the held writes do, has failed.
    wait_until(
        lambda: all(STATE_LOST in w.log()[offsets[w.name] :] or not w.alive for w in workers),
        60,
        what="every worker's heartbeat to fail while Redis is gone",
    )
    aof_server.start()
    assert not refuses_writes(r)  # the ballast is back, the run-time maxmemory is not

    for h, key in zip(handles, keys, strict=True):
        head = h.wait(RUN_TIMEOUT_S)
        events = events_of(h)
        assert head.phase is Phase.COMPLETED, f"{h.run_id}: {head.phase} {head.error}"
        assert kinds(events) == ONE_HOP
        assert_event_invariants(events)
        assert_terminal_matches_events(head, events)
        (done,) = [e for e in events if isinstance(e, ToolCompleted)]
        assert done.ok and done.attempt == 1, done
        assert (gated_count(gate, f"{key}.starts"), gated_count(gate, f"{key}.effects")) == (1, 1)
    # The workers reconnected rather than exited, and serve new runs.
    assert {w.name: w.pid for w in workers} == pids and all(w.alive for w in workers)

    # Until they consume again the client refuses a submit ("retry shortly"), and a caller retries.
    def submitted() -> RunHandle | None:
        try:
            return aof_client.submit("one_hop", "go")
        except NoLiveWorker:
            return None

    for _ in range(3):
        handle: RunHandle = wait_until(submitted, RUN_TIMEOUT_S, what="a worker to consume again")
        assert handle.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
