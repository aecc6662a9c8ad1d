"""Workers on other hosts: each in a network namespace of its own, reaching a Redis Cluster and a
broker over a bridge, not over loopback.

This is the setup of ``benchmarks/scale.py``; here it must simply work: the cluster's nodes
announce the bridge address (so a client on another host follows MOVED redirections to a node it
can reach), runs submitted on this host are served by workers on the others, and each run's
phases ran on those hosts' processes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.settings import ENV_BROKER_URL, ENV_REDIS_CLUSTER, Settings
from shared.state import Phase
from tests.harness import RedisServer, WorkerProcess, start_all, stop_all
from tests.redis_cluster import RedisCluster
from worker.testing.hosts import HostNetwork, available

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=f"no simulated hosts here: {available()}"),
]

TIMEOUT = 60


@pytest.fixture(scope="module")
def network() -> Iterator[HostNetwork]:
    with HostNetwork(name="wst") as net:
        net.add_host()
        net.add_host()
        yield net


def test_workers_on_two_hosts_serve_runs_from_a_cluster_on_the_bridge(
    network: HostNetwork, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = RedisCluster(masters=2, replicas=0, host=network.server_ip).start()
    broker = RedisServer(bind=network.server_ip).start()
    env = {ENV_REDIS_CLUSTER: "1", ENV_BROKER_URL: broker.url}
    log_dir = str(tmp_path_factory.mktemp("host-workers"))
    workers = [
        host.place(WorkerProcess(f"host{i}", cluster.url, env=env, log_dir=log_dir))
        for i, host in enumerate(network.hosts, 1)
    ]
    client = Client(
        Settings(
            redis_url=cluster.url,
            redis_cluster=True,
            broker_url=broker.url,
            agents_module="tests.agents_fixture",
        )
    )
    try:
        start_all(workers, timeout=90)
        heads = [h.wait(TIMEOUT) for h in [client.submit("one_hop", "1+2") for _ in range(12)]]
        assert [h.phase for h in heads] == [Phase.COMPLETED] * 12
        # Every commit was made by a process of one of the two hosts' workers.
        pids = {pid for w in workers for pid in w.pids()}
        ran = {c.ran.pid for h in heads for c in client.store.checkpoints(h.run_id) if c.ran is not None}
        assert ran and ran <= pids
    finally:
        client.close()
        stop_all(workers)
        broker.cleanup()
        cluster.cleanup()
