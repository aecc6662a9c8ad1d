"""A Redis Cluster primary dies (SIGKILL) under runs in flight, and its replica takes over.

The runs' state lives on a real cluster (3 primaries, a replica each); the broker is a standalone
redis-server. Every run is placed on one primary's slots, its tool mid-call when that primary is
killed: the workers' commands for those slots fail until the cluster promotes the replica, then
go on against it. Every run ends, as its events say; a retry-safe tool may have run again, a
non-retry-safe one never twice (it may end as ToolOutcomeUnknown). The tools' counters live on
the doomed primary too: it is killed once its replica has caught up with what the tools recorded
so far, so the test's own record of what ran survives the kill (a write acknowledged and lost on a
failover is the class of a lost fsync, see docs/guarantees.md; this test is about the runs).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.client import Client, RunHandle
from shared.keys import Keys
from shared.state import Phase
from tests.agents_fixture import STARTS_KEY
from tests.broker import Settings
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    starts,
)
from tests.conftest import _need_redis
from tests.harness import wait_until
from tests.redis_cluster import ClusterStore, RedisCluster

#: Runs of each kind placed on the doomed primary.
RUNS = 2


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """A cluster of this test's own: it loses a primary, so it cannot be one the suite shares."""
    _need_redis()
    cluster = RedisCluster(masters=3, replicas=1).start()
    yield cluster
    cluster.cleanup()


@pytest.fixture
def store(own_cluster: RedisCluster) -> Iterator[ClusterStore]:
    s = ClusterStore(own_cluster).start()
    yield s
    s.cleanup()


def _run_ids_on(cluster: RedisCluster, keys: Keys, primary_port: int, n: int) -> list[str]:
    """``n`` fresh run ids whose keys live on the primary at ``primary_port``."""
    found: list[str] = []
    while len(found) < n:
        run_id = uuid.uuid4().hex
        if cluster.owner(keys.run(run_id)).port == primary_port:
            found.append(run_id)
    return found


def test_runs_survive_the_sigkill_of_their_primary(store: ClusterStore, tmp_path: Path) -> None:
    cluster = store.cluster
    # The primary of the tools' start counter: what it recorded before the kill is on its replica
    # (the kill waits for the replica to catch up), and the effects are recorded after the kill.
    victim = cluster.owner(STARTS_KEY)
    keys = Keys()
    charge_ids = _run_ids_on(cluster, keys, victim.port, RUNS)
    slow_ids = _run_ids_on(cluster, keys, victim.port, RUNS)

    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    workers = Cluster(store, log_dir)
    client = Client(Settings(redis_url=store.url, agents_module="tests.agents_fixture"))
    try:
        workers.start(2, concurrency=2)
        r = client.store.redis
        handles: list[RunHandle] = [client.submit("charge_once", "pay", run_id=i) for i in charge_ids]
        handles += [client.submit("slow_step", "wait", run_id=i) for i in slow_ids]
        started = lambda: all(starts(r, idem(h.run_id)) >= 1 for h in handles)  # noqa: E731
        wait_until(started, 60, what="every run's tool to start")

        assert client.store.replicate(charge_ids[0], 5000) == 1  # what the tools' claims got
        killed, heir = cluster.kill_primary_of(keys.run(charge_ids[0]))
        assert killed.port == victim.port and heir.alive

        for h in handles:
            head = h.wait(RUN_TIMEOUT_S)
            events = events_of(h)
            assert_event_invariants(events)
            assert_terminal_matches_events(head, events)
            key = idem(h.run_id)
            if h.run_id in charge_ids:
                # Never twice: it completed once, or ended as an unknown outcome without a retry.
                assert (starts(r, key), effects(r, key)) in ((1, 1), (1, 0)), h.run_id
                if head.phase is Phase.COMPLETED:
                    assert head.answer == "charged" and effects(r, key) == 1
                else:
                    assert head.phase is Phase.FAILED and head.error is not None
                    assert head.error.kind == "ToolOutcomeUnknown", head.error
            else:
                assert head.phase is Phase.COMPLETED and head.answer == "slow step done"
                assert effects(r, key) >= 1
    except BaseException:
        print(workers.log_tails())
        raise
    finally:
        client.close()
        workers.stop()
