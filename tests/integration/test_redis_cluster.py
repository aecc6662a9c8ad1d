"""The run state on a real Redis Cluster (three primaries on loopback ports), the broker a
standalone redis-server.

Runs placed on every primary complete on real workers, every key of a run in one hash slot;
listings, tenants' keys and ``wesichain gc`` see every primary; a worker is refused a cluster
node without ``WESICHAIN_REDIS_CLUSTER=1``, and that switch on a standalone Redis, with errors
that say what to change.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster as ClusterClient
from redis.crc import key_slot

from producer.client import Client
from shared.errors import ConfigError
from shared.keys import Keys
from shared.liveness import Lives
from shared.redis_client import preflight
from shared.retention import GarbageCollector, MemoryGuard
from shared.settings import Settings as RuntimeSettings
from shared.state import Phase
from shared.tenants import Tenants
from tests.broker import Settings
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess
from tests.invariants import ONE_HOP, assert_event_invariants, committed, kinds
from tests.redis_cluster import ClusterStore, RedisCluster
from worker.testing.runs import HOLDER, claim, started

#: Runs placed on each primary.
PER_PRIMARY = 2


@pytest.fixture(scope="module")
def store() -> Iterator[ClusterStore]:
    """Three primaries without replicas (failover is the chaos suite's), and a broker of their own."""
    _need_redis()
    cluster = RedisCluster(masters=3, replicas=0).start()
    s = ClusterStore(cluster).start()
    yield s
    s.cleanup()
    cluster.cleanup()


@pytest.fixture(scope="module")
def worker(store: ClusterStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = WorkerProcess("c1", store.url, concurrency=2, log_dir=str(tmp_path_factory.mktemp("workers")))
    try:
        w.start(wait=False)
        w.wait_ready(timeout=120)  # a loaded machine starts a worker slowly
        yield w
    finally:
        w.stop()


@pytest.fixture
def client(store: ClusterStore) -> Iterator[Client]:
    c = Client(Settings(redis_url=store.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_runs_on_every_primary_complete_with_each_runs_keys_in_one_slot(
    store: ClusterStore, worker: WorkerProcess, client: Client
) -> None:
    cluster = store.cluster
    keys = client.store.keys
    primaries = cluster.primaries()
    assert len(primaries) == 3
    placed: dict[int, list[str]] = {p.port: [] for p in primaries}
    while any(len(ids) < PER_PRIMARY for ids in placed.values()):
        run_id = uuid.uuid4().hex
        port = cluster.owner(keys.run(run_id)).port
        if len(placed[port]) < PER_PRIMARY:
            placed[port].append(run_id)
    handles = [client.submit("one_hop", "add", run_id=i) for ids in placed.values() for i in ids]
    for handle in handles:
        head = handle.wait(60)
        assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
        events = list(handle.events(follow=False))
        assert_event_invariants(events)
        assert kinds(committed(events)) == ONE_HOP
    r = client.store.redis
    for port, ids in placed.items():
        node = next(p for p in primaries if p.port == port).client()
        for run_id in ids:
            run_key = keys.run(run_id)
            escaped = run_key.replace("{", "\\{").replace("}", "\\}")
            parts = [run_key, *(str(k) for k in node.scan_iter(match=escaped + ":*", count=500))]
            assert {_slot(k) for k in parts} == {_slot(run_key)}, parts  # one slot: one script each
            assert len(parts) >= 4  # head, messages, checkpoints, events (on this primary)
        node.close()
    listed = {h.run_id for h in client.list_runs(limit=100).runs}
    assert {h.run_id for h in handles} <= listed  # merged across the shards, on every primary
    assert int(r.exists(*(keys.run(h.run_id) for h in handles))) == len(handles)


def test_gc_walks_every_primary(store: ClusterStore, worker: WorkerProcess, client: Client) -> None:
    handles = [client.submit("direct", "hi") for _ in range(6)]
    for handle in handles:
        assert handle.wait(60).phase is Phase.COMPLETED
    keys = client.store.keys
    on_primaries = 0
    for node in store.cluster.primaries():
        c = node.client()
        on_primaries += sum(1 for _ in c.scan_iter(match=f"{keys.prefix}*:run:*", count=500))
        c.close()
    report = GarbageCollector(client.store.redis, client.settings).collect(dry_run=True)
    assert report.keys_scanned == on_primaries and report.live_runs == 0
    memory = MemoryGuard(client.store.redis, client.settings).state()
    assert memory.used > 0 and memory.maximum == 0  # the fullest primary's figures


def test_a_tenants_keys_span_slots_without_a_transaction(store: ClusterStore) -> None:
    r = store.client()
    tenants = Tenants(r, Keys())
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    made = [tenants.create_key(tenant, name=f"k{i}") for i in range(3)]
    assert [rec.name for rec in tenants.keys_of(tenant)] == ["k0", "k1", "k2"]
    assert tenants.authenticate(made[1][0]) == made[1][1]
    assert tenant in tenants.names()
    r.close()


def test_a_worker_is_refused_the_wrong_topology(store: ClusterStore, tmp_path: Path) -> None:
    standalone = RedisServer().start()
    try:
        with pytest.raises(ConfigError, match="is a Redis Cluster node: set WESICHAIN_REDIS_CLUSTER=1"):
            preflight(RuntimeSettings(redis_url=store.url))
        with pytest.raises(ConfigError, match="is not a Redis Cluster node"):
            preflight(
                RuntimeSettings(redis_url=standalone.url, redis_cluster=True, broker_url=standalone.url)
            )
        preflight(RuntimeSettings(redis_url=store.url, redis_cluster=True, broker_url=store.broker.url))
        # Nothing listens: an outage, which a worker waits out, not a configuration error.
        preflight(
            RuntimeSettings(
                redis_url="redis://127.0.0.1:1/0", redis_cluster=True, broker_url=store.broker.url
            )
        )
    finally:
        standalone.cleanup()


def test_the_cluster_client_is_redis_pys(store: ClusterStore) -> None:
    from shared.redis_client import connect

    client = connect(RuntimeSettings(redis_url=store.url, redis_cluster=True, broker_url=store.broker.url))
    assert isinstance(client, ClusterClient)
    assert client.ping() is True
    client.close()
    with pytest.raises(ConfigError, match="only database 0"):
        RuntimeSettings(
            redis_url=store.url.removesuffix("/0") + "/1", redis_cluster=True, broker_url=store.broker.url
        ).validate()


def test_a_replication_wait_without_replicas_gives_up_in_time(store: ClusterStore) -> None:
    client = Client(Settings(redis_url=store.url, agents_module="tests.agents_fixture"))
    try:
        assert client.store.replicate(uuid.uuid4().hex, 50) == 0  # no replica: WAIT times out
    finally:
        client.close()


def test_the_sweepers_reads_reach_every_shard(store: ClusterStore) -> None:
    """What one sweep reads (every shard's due runs) works across the primaries, as every batched
    read of the store must: a cluster's pipeline refuses scripts."""
    client = Client(Settings(redis_url=store.url, agents_module="tests.agents_fixture"))
    try:
        assert client.store.due_everywhere(10) == [[] for _ in range(client.store.keys.shards)]
        assert client.store.renew([(uuid.uuid4().hex, "running", "token", True)]) == [(False, False)]
    finally:
        client.close()


def test_a_dead_start_s_last_claims_are_read_from_every_shard(store: ClusterStore) -> None:
    """The claim writes its last-claim key in the run's slot; the sweeper reads those of a dead
    start's processes from every shard, over the primaries, in one batched read."""
    client = Client(Settings(redis_url=store.url, agents_module="tests.agents_fixture"))
    try:
        runs = [started(client.store) for _ in range(3)]
        for thinking in runs:
            claim(client.store, thinking.head)
        shards = {client.store.keys.shard(t.head.run_id) for t in runs}
        lives = Lives(client.store.redis, client.store.keys, client.store.settings.lease_s)
        found = lives.last_claims([HOLDER, "another-host:1"])
        # One process holds one claim at a time: each shard keeps the last it took there.
        assert {c.run_id for c in found} <= {t.head.run_id for t in runs}
        assert len(found) == len(shards) and all(c.holder == HOLDER for c in found)
    finally:
        client.close()
