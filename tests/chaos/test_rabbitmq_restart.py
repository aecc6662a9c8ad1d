"""The RabbitMQ node crashes (SIGKILL) while runs are mid-flight, and comes back with its data.

A node of the test's own (``tests/rabbitmq_node.py``), so it can be killed freely. While it is
down, tools finish and commit, but their next phase cannot be published, and the deliveries the
workers held cannot be acknowledged: RabbitMQ hands those out again once it is back. The outbox
must publish what the commits could not, the redelivered copies must find their phase done and be
dropped, every tool must run once (the non-retry-safe charge included), and a run submitted while
the broker is down must neither be lost nor started twice.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.settings import ENV_BROKER_URL
from shared.state import Phase
from tests.broker import Settings
from tests.chaos.support import (
    Cluster,
    assert_completed_with_one_tool_run,
    events_of,
    idem,
    kinds,
    note_recovery,
    wait_tool_started,
)
from tests.harness import wait_until
from tests.invariants import ONE_HOP
from tests.rabbitmq_node import RabbitMQNode, server_script

#: Long enough for a broker restart (an Erlang VM boots in 5-15 s here) and the reconnects after it.
RUN_TIMEOUT_S = 180.0


@pytest.fixture
def node() -> Iterator[RabbitMQNode]:
    if server_script() is None or shutil.which("erl") is None:
        pytest.skip("rabbitmq-server is not installed")
    node = RabbitMQNode().start()
    yield node
    node.cleanup()


def test_rabbitmq_node_killed_mid_run_costs_no_run(cluster: Cluster, node: RabbitMQNode) -> None:
    env = {ENV_BROKER_URL: node.url}
    client = Client(
        Settings(redis_url=cluster.server.url, agents_module="tests.agents_fixture", broker_url=node.url)
    )
    try:
        cluster.start(2, concurrency=2, env=env)
        r = client.store.redis
        busy = [
            client.submit("slower_step", "go"),
            client.submit("slower_step", "go"),
            client.submit("charge_once", "go"),
        ]
        for handle in busy:
            wait_tool_started(r, idem(handle.run_id))

        node.kill()
        # Runs submitted while the broker is down are accepted: created, their start in their
        # outbox, marked unsent when the publish fails, and sent by a sweeper once it is back.
        during = [client.submit("one_hop", "go", check_agent=False) for _ in range(2)]
        node.start()
        back_at = time.time()
        # Celery's consumers reconnect on their own backoff (2, 4, 6 ... s); until then the
        # registry says they cannot consume, and a submit that checks the agent is refused.
        wait_until(lambda: consuming(client) == len(cluster.workers), 60, what="every worker to consume")
        note_recovery("RabbitMQ node back after a SIGKILL -> every worker consumes", time.time() - back_at)

        after = [client.submit("one_hop", "go") for _ in range(2)]
        for handle in after:
            head = handle.wait(RUN_TIMEOUT_S)
            assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
            assert kinds(events_of(handle)) == ONE_HOP

        assert_completed_with_one_tool_run(r, busy, ONE_HOP)
        for handle in during:
            head = handle.wait(RUN_TIMEOUT_S)
            events = events_of(handle)
            assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
            assert kinds(events) == ONE_HOP, "started once, ran once"
            # Reported, not bounded: the workers' reconnect backoff plus a few sweeps, where the
            # sweeper's allowance for a broker it cannot search is minutes.
            started = next(e.ts for e in events if e.kind == "RunStarted")
            note_recovery("run submitted while RabbitMQ was down -> started", started - back_at)
        assert all(w.alive for w in cluster.workers)
    finally:
        client.close()


def consuming(client: Client) -> int:
    return sum(1 for w in client.workers.live() if w.record.consuming)
