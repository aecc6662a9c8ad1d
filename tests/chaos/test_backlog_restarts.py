"""A backlog of thousands of phases of several tenants, drained by workers that restart under it.

Every start is queued before any worker runs; while the backlog drains one worker shuts down warm
and comes back, and another is SIGKILLed with its prefetched messages and claims and is started
again. Every run must complete once, in its own tenant, with its tool's effect once and the event
invariants kept, and the broker must end with nothing queued or unacknowledged.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from producer.client import Client
from shared.state import TERMINAL_PHASES, Phase
from tests.chaos.support import Cluster, effects, events_of, hop_kinds, idem, pending_task_ids, queued_phases
from tests.harness import wait_until
from tests.invariants import assert_event_invariants, kinds

pytestmark = [pytest.mark.redis_broker, pytest.mark.timeout(240)]

TENANTS = ("acme", "globex", "initech")
RUNS = 1200
TERMINAL = {p.value for p in TERMINAL_PHASES}
#: As the backlog test: a phase waiting in the queue is not taken for lost.
QUEUED_LEASE = {"WESICHAIN_QUEUED_LEASE_S": "10"}


def test_a_backlog_across_tenants_survives_worker_restarts(cluster: Cluster, client: Client) -> None:
    r = client.store.redis
    # Submitted before any worker lives: the agent is not checked against live workers.
    handles = [
        client.submit("one_hop", "go", tenant=TENANTS[i % len(TENANTS)], check_agent=False)
        for i in range(RUNS)
    ]
    assert queued_phases(r, ["wesichain.model"]) == RUNS
    pending = [h.run_id for h in handles]

    def ended() -> int:
        nonlocal pending
        with r.pipeline(transaction=False) as pipe:
            for run_id in pending:
                pipe.hget(client.store.keys.run(run_id), "phase")
            phases = pipe.execute()
        pending = [run_id for run_id, phase in zip(pending, phases, strict=True) if phase not in TERMINAL]
        return RUNS - len(pending)

    warm, killed = cluster.start(2, pool="threads", concurrency=8, env=QUEUED_LEASE)
    wait_until(lambda: ended() >= RUNS // 4, 120, interval=0.2, what="a quarter of the backlog to end")
    warm.stop()  # a warm shutdown: its running tasks finish, its prefetched messages go back
    warm.start()
    wait_until(lambda: ended() >= RUNS // 2, 120, interval=0.2, what="half of the backlog to end")
    killed.kill()  # its claims expire and are handed on; its prefetched messages are re-published
    wait_until(lambda: not killed.alive, 10, what="the killed worker to die")
    cluster.revive(wait=True)
    assert pending, "the backlog ended before the kill"
    wait_until(lambda: ended() == RUNS, 180, interval=0.5, what="every run of the backlog to end")

    heads = [h.status() for h in handles]
    assert Counter(h.phase for h in heads) == Counter({Phase.COMPLETED: RUNS})
    assert Counter(h.tenant for h in heads) == Counter({t: RUNS // len(TENANTS) for t in TENANTS})
    assert [h.tenant for h in heads] == [TENANTS[i % len(TENANTS)] for i in range(RUNS)]
    doubled = [h.run_id for h in handles if effects(r, idem(h.run_id)) != 1]
    assert doubled == [], f"{len(doubled)} runs had their tool's effect other than once: {doubled[:5]}"
    for handle in handles:
        events = events_of(handle)
        assert kinds(events) == hop_kinds([1]), handle.run_id
        assert_event_invariants(events)
    wait_until(lambda: queued_phases(r) == 0, 60, interval=0.2, what="the queues to drain")

    # The killed worker's prefetched messages stay unacknowledged until the visibility timeout
    # hands them back (the sweeper re-published their phases): hand them back now, as it would.
    # Each finds its run ended and is dropped: nothing changes, and the broker drains.
    def written() -> tuple[int, int]:
        with r.pipeline(transaction=False) as pipe:
            for run_id in (h.run_id for h in handles):
                pipe.xlen(client.store.keys.events(run_id))
            lengths = pipe.execute()
        return sum(lengths), sum(effects(r, idem(h.run_id)) for h in handles)

    before = written()
    restore_unacked(r)
    wait_until(lambda: not pending_task_ids(r), 60, interval=0.2, what="the broker to drain")
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
    assert written() == before
    assert all(w.alive for w in cluster.workers)


def restore_unacked(r: redis.Redis) -> int:
    """Put every unacknowledged message back on its queue, as kombu's visibility-timeout restore
    does; returns how many."""
    entries = r.hgetall("unacked")
    for tag, raw in entries.items():
        envelope, _, routing_key = json.loads(raw)
        with r.pipeline() as pipe:
            pipe.hdel("unacked", tag)
            pipe.zrem("unacked_index", tag)
            pipe.lpush(routing_key, json.dumps(envelope))
            pipe.execute()
    return len(entries)
