"""RabbitMQ as the broker, run state in Redis: the default suite's share of ``--broker rabbitmq``.

Real RabbitMQ (127.0.0.1:5672), a virtual host per test created and deleted with ``rabbitmqctl``,
real workers. The whole integration and chaos suites run against RabbitMQ with
``pytest --broker rabbitmq``; these cases run in every session: runs end on quorum queues, a
countdown travels through RabbitMQ's delayed delivery, and a worker killed between its commit and
its publish (which cannot be one step on RabbitMQ) loses nothing: RabbitMQ hands the committing task
back at once, and its redelivery publishes the outbox.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from producer.client import Client
from shared.queues import namespace_queues
from shared.settings import ENV_BROKER_URL, QUEUE_MODEL, QUEUE_TOOLS
from shared.state import Phase
from tests.broker import Settings, rabbitmq_available, ready_on_rabbitmq, vhost
from tests.chaos.faults import fired_key
from tests.chaos.support import CHAOS_ENV, RECOVERY_PROPERTY, Cluster, committed, events_of, kinds
from tests.conftest import _need_redis
from tests.harness import RedisServer, wait_until
from tests.invariants import ONE_HOP


@pytest.fixture
def broker() -> Iterator[str]:
    if not rabbitmq_available():
        pytest.skip("no RabbitMQ reachable with rabbitmqctl")
    with vhost() as url:
        yield url


@pytest.fixture
def cluster(broker: str, tmp_path: Path) -> Iterator[Cluster]:
    _need_redis()
    server = RedisServer().start()
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    cluster = Cluster(server, log_dir)
    try:
        yield cluster
    finally:
        cluster.stop()
        server.cleanup()


@pytest.fixture
def client(cluster: Cluster, broker: str) -> Iterator[Client]:
    c = Client(
        Settings(redis_url=cluster.server.url, agents_module="tests.agents_fixture", broker_url=broker)
    )
    yield c
    c.close()


def _queues(url: str) -> dict[str, tuple[str, int]]:
    name = url.rsplit("/", 1)[1]
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "-p", name, "name", "type", "messages"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    rows = [line.split("\t") for line in out.splitlines()[1:] if line.strip()]
    return {row[0]: (row[1], int(row[2])) for row in rows}


def _drained(url: str, names: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """The queues once ``names`` hold no message: a run's last task is acknowledged after its
    terminal commit, which the test may see first (RabbitMQ counts unacknowledged messages)."""
    seen: dict[str, tuple[str, int]] = {}

    def empty() -> bool:
        seen.update(_queues(url))
        return all(seen.get(name, ("", 0))[1] == 0 for name in names)

    wait_until(empty, 60, what=f"{', '.join(names)} to hold no message")
    return seen


def test_runs_end_on_quorum_queues(cluster: Cluster, client: Client, broker: str) -> None:
    cluster.start(2, concurrency=2, env={ENV_BROKER_URL: broker})
    handles = [client.submit("one_hop", "go"), client.submit("direct", "hi")]
    heads = [h.wait(30) for h in handles]
    assert [(h.phase, h.answer) for h in heads] == [
        (Phase.COMPLETED, "1 + 2 = 3"),
        (Phase.COMPLETED, "The answer is 42."),
    ]
    assert kinds(committed(events_of(handles[0]))) == ONE_HOP
    queues = _drained(broker, (QUEUE_MODEL, QUEUE_TOOLS))
    assert queues[QUEUE_MODEL] == ("quorum", 0) and queues[QUEUE_TOOLS] == ("quorum", 0)
    # Nothing went through the run state's Redis as a broker.
    r = client.store.redis
    assert not r.exists(QUEUE_MODEL) and not r.exists(QUEUE_TOOLS) and not r.exists("unacked")


def test_a_countdown_travels_through_delayed_delivery(cluster: Cluster, client: Client, broker: str) -> None:
    # The model fails with a transport error and the policy retries twice, after 1 s and 2 s: the
    # think is published again with a countdown each time, which RabbitMQ holds in its delayed
    # delivery queues (quorum queues cannot let a worker hold a message until its ETA).
    cluster.start(1, env={ENV_BROKER_URL: broker})
    handle = client.submit("model_retry_fail", "go")
    head = handle.wait(60)
    assert head.phase is Phase.FAILED and head.error is not None and head.error.kind == "ModelTransport"
    failed = [e for e in committed(events_of(handle)) if e.kind == "StepFailed"]
    assert [e.decision for e in failed] == ["retry", "retry", "fail"]
    assert failed[1].ts - failed[0].ts >= 0.9 and failed[2].ts - failed[1].ts >= 1.9


def test_a_worker_killed_between_commit_and_publish_loses_nothing(
    cluster: Cluster, client: Client, broker: str, record_property: Callable[[str, object], None]
) -> None:
    fault = {"WESICHAIN_FAULT": "crash_after_commit:thinking", "WESICHAIN_QUEUED_LEASE_S": "60"}
    workers = cluster.start(2, pool="solo", env={**CHAOS_ENV, **fault, ENV_BROKER_URL: broker})
    handle = client.submit("one_hop", "go")
    head = handle.wait(30)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    crashed = client.store.redis.get(fired_key("crash_after_commit:thinking", handle.run_id))
    assert crashed is not None and int(crashed) in {w.main_pids[0] for w in workers}
    events = committed(events_of(handle))
    assert kinds(events) == ONE_HOP
    # RabbitMQ requeued the committing task when its worker's connection died; the redelivery
    # found the run moved on with its outbox unclaimed and published it: no hand-on, no wait for
    # the queued lease (60 s).
    assert head.epoch == 0
    # The redelivery's delay is reported in the session's summary of recovery times, not bounded.
    case = "crash between commit and publish, RabbitMQ broker -> redelivery publishes"
    record_property(RECOVERY_PROPERTY, [case, round(events[4].ts - events[3].ts, 3)])


def test_a_run_in_a_queue_namespace_goes_through_that_namespace_s_quorum_queues(
    cluster: Cluster, client: Client, broker: str
) -> None:
    # The only worker consumes the namespace's queues (declared as every queue is: quorum).
    namespace = "rmq-ns"
    cluster.start(
        1, concurrency=2, env={ENV_BROKER_URL: broker}, queues=",".join(namespace_queues(namespace))
    )
    head = client.submit("one_hop", "go", namespace=namespace).wait(60)
    assert (head.phase, head.answer, head.namespace) == (Phase.COMPLETED, "1 + 2 = 3", namespace)
    declared = _drained(broker, (f"{namespace}.model", f"{namespace}.tools"))
    assert declared[f"{namespace}.model"] == ("quorum", 0) and declared[f"{namespace}.tools"] == ("quorum", 0)
    assert [declared.get(q, ("", 0))[1] for q in (QUEUE_MODEL, QUEUE_TOOLS)] == [0, 0]  # none went there


def test_a_version_queue_no_worker_declared_keeps_the_phase_published_to_it(
    cluster: Cluster, broker: str
) -> None:
    # v1's only worker consumes its model phases: nothing has declared v1's tools queue when the
    # run's tool call is published to it. The publish declares it (quorum), the message waits there,
    # and a v1 tools worker started later runs it: nothing lost.
    settings = Settings(
        redis_url=cluster.server.url, agents_module="tests.agents_versions", broker_url=broker
    )
    client = Client(settings)
    env = {ENV_BROKER_URL: broker, "WESICHAIN_AGENTS": "tests.agents_versions", "AGENT_VERSION": "1"}
    try:
        cluster.start(1, env=env, queues=QUEUE_MODEL, agents="tests.agents_versions")
        handle = client.submit("deploy", "old")
        tools_v1 = "wesichain.tools.deploy-v1"
        # Polled over AMQP (rabbitmqctl boots an Erlang VM, and its counts of a quorum queue lag).
        wait_until(lambda: ready_on_rabbitmq(broker, tools_v1) == 1, 60, what="the v1 tool call queued")
        assert _queues(broker)[tools_v1][0] == "quorum"
        assert handle.status().phase is Phase.ACTING
        cluster.start(1, env=env, queues=QUEUE_TOOLS, agents="tests.agents_versions")
        head = handle.wait(60)
        assert (head.phase, head.agent_version, head.answer) == (Phase.COMPLETED, "1", "answered by v1")
    finally:
        client.close()
