"""Every Redis connection of a busy worker is reset (``CLIENT KILL``), as a proxy restart or a
failover does: the worker must consume again within seconds, and the blip must cost no run.

The tools in flight keep running (a reset is not a crash): their claims stay live, the copies of
their messages that the broker hands out again after the reset find the claims held and are
dropped, and every tool runs exactly once, the non-retry-safe one included.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from producer.cli import main
from producer.client import Client
from shared.settings import ENV_BROKER_HEARTBEAT, ENV_BROKER_URL
from shared.state import Phase
from tests.broker import Settings, broker_for, on_rabbitmq, rabbitmq_available, vhost
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_completed_with_one_tool_run,
    events_of,
    idem,
    kinds,
    note_recovery,
    wait_tool_started,
)
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.invariants import ONE_HOP
from tests.redis_cluster import ClusterStore
from tests.tcp_proxy import TcpProxy


def reset_every_connection(server: RedisServer) -> int:
    """CLIENT KILL every connection but the caller's, normal and pub/sub, on every Redis the worker
    talks to: the run state's server, or every node of its cluster and the standalone broker.
    Returns how many were killed."""
    if isinstance(server, ClusterStore):
        clients = [node.client() for node in server.cluster.live_nodes()] + [server.broker.client()]
    else:
        clients = [server.client()]
    killed = 0
    for r in clients:
        try:
            killed += int(r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            killed += int(r.execute_command("CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes"))
        finally:
            r.close()
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

    killed = reset_every_connection(cluster.server)
    reset_at = time.time()
    assert killed >= 3, f"only {killed} connections were reset"
    after = [client.submit("one_hop", "go") for _ in range(3)]

    for handle in after:
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
        events = events_of(handle)
        assert kinds(events) == ONE_HOP
    first = min(e.ts for h in after for e in events_of(h) if e.kind == "RunStarted")
    note_recovery(f"every connection of a busy {pool} worker reset -> consuming again", first - reset_at)

    # The reset interrupted nothing: each tool ran once, to its end, and the run completed.
    assert_completed_with_one_tool_run(r, busy, ONE_HOP)
    assert worker.alive
    # Its liveness says so too: its record is fresh and it consumes.
    wait_until(lambda: consuming(client, worker), 30, what="the worker's record to say it consumes")


def consuming(client: Client, worker: WorkerProcess) -> bool:
    records = {w.record.id: w.record for w in client.workers.live()}
    record = records.get(f"{worker.name}@test")
    return record is not None and record.consuming


@pytest.mark.redis_broker  # deaf through redis-py's reconnect under kombu's BRPOP
def test_a_deaf_worker_does_not_look_healthy(cluster: Cluster, client: Client) -> None:
    """Configured as before the fix (redis-py's retry_on_timeout on the broker connection), a busy
    worker goes deaf after the reset: it stays up and never takes a message again. Its liveness
    must say so, so that a deployment's probe (``wesichain health``) restarts it."""
    old_options = {"WESICHAIN_BROKER_TRANSPORT_OPTIONS": json.dumps({"retry_on_timeout": True})}
    (worker,) = cluster.start(1, concurrency=2, env=old_options)
    r = client.store.redis
    for handle in [client.submit("slow_step", "go") for _ in range(2)]:
        wait_tool_started(r, idem(handle.run_id))
    assert consuming(client, worker)
    reset_every_connection(cluster.server)

    def deaf() -> str | None:
        records = {w.record.id: w.record for w in client.workers.live()}
        record = records.get(f"{worker.name}@test")
        return record.consumer_state if record is not None and not record.consuming else None

    state = wait_until(deaf, 60, interval=0.5, what="the worker's record to say it cannot consume")
    assert state.startswith("deaf: "), state
    assert worker.alive, "the worker is up: only its liveness can tell it is deaf"
    assert main(["health", "--worker", f"{worker.name}@test", "--redis", cluster.server.url]) == 1


@pytest.fixture
def rabbitmq(server: RedisServer) -> Iterator[str]:
    """The RabbitMQ virtual host of the test: the session's for its Redis, or one of its own."""
    if on_rabbitmq():
        yield broker_for(server.url)
        return
    if not rabbitmq_available():
        pytest.skip("no RabbitMQ reachable with rabbitmqctl")
    with vhost() as url:
        yield url


def test_a_deaf_rabbitmq_consumer_does_not_look_healthy(cluster: Cluster, rabbitmq: str) -> None:
    """The way between RabbitMQ and a worker stalls (a stalled NAT or proxy, a half-open
    connection): connected, channel open, consumers registered, and nothing passes. Its record must
    say it is deaf, so that a deployment's probe restarts it: the broker has been silent for a
    heartbeat, or (what comes first) the event loop is stuck in a round trip to the broker (Celery
    publishes its worker heartbeat event with a confirm, retrying without end). Once the way is
    back, it consumes again by itself."""
    broker = urlsplit(rabbitmq)
    proxy = TcpProxy((broker.hostname or "127.0.0.1", broker.port or 5672))
    proxied = broker._replace(netloc=f"{broker.username}:{broker.password}@127.0.0.1:{proxy.port}").geturl()
    env = {ENV_BROKER_URL: proxied, ENV_BROKER_HEARTBEAT: "10"}
    client = Client(
        Settings(redis_url=cluster.server.url, agents_module="tests.agents_fixture", broker_url=rabbitmq)
    )
    try:
        (worker,) = cluster.start(1, concurrency=2, env=env)
        assert client.submit("one_hop", "go").wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
        wait_until(lambda: consuming(client, worker), 30, what="the worker's record to say it consumes")

        proxy.freeze()
        state = wait_until(lambda: not_consuming(client, worker), 60, interval=0.5, what="a deaf record")
        assert state.startswith("deaf: "), state
        assert worker.alive, "the worker is up: only its liveness can tell it is deaf"
        assert main(["health", "--worker", f"{worker.name}@test", "--redis", cluster.server.url]) == 1

        proxy.thaw()
        wait_until(lambda: consuming(client, worker), 90, what="the worker to consume again")
        assert client.submit("one_hop", "go").wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
        assert worker.alive
    finally:
        proxy.close()
        client.close()


def close_vhost_connections(broker_url: str) -> None:
    """RabbitMQ closes every client connection of ``broker_url``'s virtual host, as a node restart,
    a forced close from the management UI or a load balancer's reset does."""
    name = urlsplit(broker_url).path.lstrip("/")
    subprocess.run(
        ["rabbitmqctl", "-q", "close_all_connections", "--vhost", name, "closed by a chaos test"],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_rabbitmq_closing_every_connection_of_a_busy_worker_costs_no_run(
    cluster: Cluster, rabbitmq: str, pool: str
) -> None:
    """RabbitMQ drops every connection of the worker while its tools are mid-call. The deliveries
    it held go back to the queue and come again once it reconnects: they must find their claims
    held and be dropped, every tool must run once (the non-retry-safe one included), and the
    worker must consume new runs within seconds."""
    env = {ENV_BROKER_URL: rabbitmq}
    client = Client(
        Settings(redis_url=cluster.server.url, agents_module="tests.agents_fixture", broker_url=rabbitmq)
    )
    try:
        (worker,) = cluster.start(1, concurrency=3, pool=pool, env=env)
        r = client.store.redis
        busy = [
            client.submit("slower_step", "go"),
            client.submit("slower_step", "go"),
            client.submit("charge_once", "go"),
        ]
        for handle in busy:
            wait_tool_started(r, idem(handle.run_id))

        close_vhost_connections(rabbitmq)
        closed_at = time.time()
        # Submitted while the worker reconnects: its record may say for a moment that it does not
        # consume, and the client's check would refuse the runs (NoLiveWorker, as it should). The
        # runs wait in the queue instead, which is what this test times: how soon they are taken.
        after = [client.submit("one_hop", "go", check_agent=False) for _ in range(3)]

        for handle in after:
            head = handle.wait(RUN_TIMEOUT_S)
            assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
            assert kinds(events_of(handle)) == ONE_HOP
        first = min(e.ts for h in after for e in events_of(h) if e.kind == "RunStarted")
        note_recovery(
            f"RabbitMQ closed every connection of a busy {pool} worker -> consuming again",
            first - closed_at,
        )

        assert_completed_with_one_tool_run(r, busy, ONE_HOP)
        assert worker.alive
        wait_until(lambda: consuming(client, worker), 30, what="the worker's record to say it consumes")
        # The fault reached the worker and the deliveries in flight: RabbitMQ handed each slow
        # tool's out again (the charge may have ended, and been acknowledged, before the close).
        log = worker.log()
        assert "CONNECTION_FORCED - closed by a chaos test" in log
        for handle in busy[:2]:
            received = len(re.findall(rf"Task wesichain\.tool\[{handle.run_id}:[^\]]*\] received", log))
            assert received >= 2, f"{handle.run_id}: its tool was delivered {received} time(s)"
    finally:
        client.close()


def not_consuming(client: Client, worker: WorkerProcess) -> str | None:
    records = {w.record.id: w.record for w in client.workers.live()}
    record = records.get(f"{worker.name}@test")
    return record.consumer_state if record is not None and not record.consuming else None
