"""Every Redis connection of a busy worker is reset (``CLIENT KILL``), as a proxy restart or a
failover does: the worker must consume again within seconds, and the blip must cost no run.

The tools in flight keep running (a reset is not a crash): their claims stay live, the copies of
their messages that the broker hands out again after the reset find the claims held and are
dropped, and every tool runs exactly once, the non-retry-safe one included.
"""

from __future__ import annotations

import time

import pytest
import redis

from producer.client import Client
from shared.state import Phase
from tests.chaos.support import (
    RECOVERY_BOUND_S,
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    kinds,
    note_recovery,
    starts,
    wait_tool_started,
)
from tests.invariants import ONE_HOP

pytestmark = pytest.mark.chaos


def reset_every_connection(r: redis.Redis) -> int:
    """CLIENT KILL every connection but this one, normal and pub/sub; returns how many were killed."""
    killed = int(r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
    killed += int(r.execute_command("CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes"))
    return killed


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_busy_worker_consumes_again_after_every_connection_is_reset(
    cluster: Cluster, client: Client, pool: str
) -> None:
    (worker,) = cluster.start(1, concurrency=3, pool=pool)
    r = client.store.redis
    busy = [
        client.submit("slow_step", "go"),
        client.submit("slow_step", "go"),
        client.submit("charge_once", "go"),
    ]
    for handle in busy:
        wait_tool_started(r, idem(handle.run_id))

    killed = reset_every_connection(r)
    reset_at = time.time()
    assert killed >= 3, f"only {killed} connections were reset"
    after = [client.submit("one_hop", "go") for _ in range(3)]

    for handle in after:
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
        events = events_of(handle)
        assert kinds(events) == ONE_HOP
    first = min(e.ts for h in after for e in events_of(h) if e.kind == "RunStarted")
    seconds = note_recovery(
        f"every connection of a busy {pool} worker reset -> consuming again", first - reset_at
    )
    assert seconds < RECOVERY_BOUND_S

    for handle in busy:
        head = handle.wait(RUN_TIMEOUT_S)
        events = events_of(handle)
        key = idem(handle.run_id)
        # The reset interrupted nothing: each tool ran once, to its end, and the run completed.
        assert head.phase is Phase.COMPLETED, f"{head.agent} {handle.run_id}: {head.phase} {head.error}"
        assert kinds(events) == ONE_HOP
        assert_event_invariants(events)
        assert_terminal_matches_events(head, events)
        assert starts(r, key) == 1, f"{head.agent}: the tool started {starts(r, key)} times"
        assert effects(r, key) == 1
    assert worker.alive
