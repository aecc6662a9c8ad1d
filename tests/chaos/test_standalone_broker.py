"""A standalone Redis broker beside the run state's Redis, attacked on its own.

Beside a Redis Cluster run state, Celery's broker is a standalone Redis of its own: no commit script
reaches it, so the pool process that committed publishes the next phase afterwards, in one
transaction (MULTI/EXEC) with the removal of its own delivery from kombu's unacked hash
(``worker/acks.py``). Here the run state is one redis-server and the broker another, which takes
the same path. The run state stays up throughout: commits go on while the broker is away or full.

- The broker is SIGKILLed with runs in flight and started again on its port, without persistence
  (it comes back empty) and with an AOF fsynced on every write (it comes back with its queues and
  its unacked hash).
- The broker is full (``maxmemory``): it refuses the publish after a commit, for longer than a run
  may lose its messages before it counts as poison.
- The pool process is SIGKILLed right after a commit, before and after the publish that carries its
  acknowledgement.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest

from producer.client import Client, RunHandle
from shared.settings import ENV_BROKER_URL
from shared.state import Phase
from tests.broker import Settings
from tests.chaos.faults import fired_key
from tests.chaos.support import (
    LOST,
    RUN_TIMEOUT_S,
    UNACKED,
    UNACKED_INDEX,
    Cluster,
    RunSnapshot,
    assert_event_invariants,
    assert_terminal_matches_events,
    check_clean_run,
    effects,
    events_of,
    fill_redis,
    free_redis,
    idem,
    is_running,
    kinds,
    snapshot,
    starts,
    unacked,
    unacked_drained,
    wait_tool_started,
)
from tests.harness import RedisServer, wait_until
from tests.invariants import ONE_HOP

# Reads and writes the broker's unacked hash, and stops and restarts a standalone Redis.
pytestmark = [pytest.mark.redis_broker, pytest.mark.standalone_redis]

#: A queued lease far beyond any wait of these tests: a sweeper that asks the broker for a missing
#: message cannot be what brings a run back, only a redelivery or an outbox marked unsent.
NO_PROBE = {"WESICHAIN_QUEUED_LEASE_S": "300"}
#: The agents whose tool records its start (``one_hop``'s records its effect only).
RECORDS_STARTS = ("charge_once", "slow_step")


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """The broker's own redis-server; with ``appendonly`` (indirect parameter) an AOF fsynced on
    every write, so that a restart keeps its queues and its unacked hash."""
    server = RedisServer(appendonly=getattr(request, "param", False)).start()
    yield server
    server.cleanup()


@pytest.fixture
def beside(server: RedisServer, broker: RedisServer) -> Iterator[Client]:
    """A client of the run state, publishing on the broker of its own."""
    c = Client(Settings(redis_url=server.url, broker_url=broker.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()


def _env(broker: RedisServer, **more: str) -> dict[str, str]:
    return {ENV_BROKER_URL: broker.url, **more}


def _check_one_hop(client: Client, handle: RunHandle) -> None:
    """Completed as without faults, its tool started once and its effect recorded once."""
    r = client.store.redis
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED, f"{head.agent} {handle.run_id}: {head.phase} {head.error}"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    key = idem(handle.run_id)
    if head.agent in RECORDS_STARTS:
        assert starts(r, key) == 1, f"{head.agent}: the tool started {starts(r, key)} times"
    assert effects(r, key) == 1


@pytest.mark.parametrize("broker", [False, True], ids=["volatile", "aof"], indirect=True)
def test_runs_end_correctly_across_a_sigkill_of_the_broker(
    cluster: Cluster, broker: RedisServer, beside: Client
) -> None:
    """Every run ends as without the kill: the tools in flight (one not retry-safe) ran once, the
    messages the kill lost were handed on, and the workers serve new runs. Nothing is left in the
    unacked hash that a worker still holds or that would change anything."""
    client = beside
    r = client.store.redis
    workers = cluster.start(2, concurrency=2, env=_env(broker))
    in_flight = [*(client.submit("charge_once", "go") for _ in range(2)), client.submit("slow_step", "go")]
    others = {agent: client.submit(agent, "go") for agent in ("chain", "parallel", "one_hop")}
    for handle in in_flight:
        wait_tool_started(r, idem(handle.run_id))
    offsets = {w.name: len(w.log()) for w in workers}
    broker.stop(signal.SIGKILL)
    wait_until(
        lambda: all(LOST in w.log()[offsets[w.name] :] for w in workers),
        60,
        what="every worker to lose the broker",
    )
    broker.start()

    for handle in in_flight:
        _check_one_hop(client, handle)
    for agent, handle in others.items():
        check_clean_run(client, handle.run_id, agent)
    assert all(w.alive for w in workers)
    after = [client.submit("one_hop", "go") for _ in range(3)]
    for handle in after:
        check_clean_run(client, handle.run_id, "one_hop")

    b = broker.client()
    runs = [*in_flight, *others.values(), *after]
    if not broker.appendonly:
        # The restart emptied the broker; every delivery since was acknowledged, by the transaction
        # of its publish or by the worker.
        wait_until(lambda: unacked_drained(b), 30, what="nothing left in the broker's unacked hash")
        return
    # With an AOF the broker keeps what it recorded before the kill and no worker will acknowledge:
    # a delivery kombu recorded as the kill swallowed its reply (no worker received it), or one
    # whose acknowledgement could not reach the broker while it was down. Each is of a phase that
    # its run has moved past (the sweeper handed on what they were for), and comes back only after
    # the visibility timeout: handed back now, as that restore would, each changes nothing.
    before: dict[str, RunSnapshot] = {h.run_id: snapshot(client, h.run_id) for h in runs}
    for tag, (envelope, _, queue) in unacked(b).items():
        # As kombu's restore puts it back (its routing key names its queue).
        envelope["headers"]["redelivered"] = True
        envelope["properties"]["delivery_info"]["redelivered"] = True
        with b.pipeline() as pipe:
            pipe.zrem(UNACKED_INDEX, tag)
            pipe.hdel(UNACKED, tag)
            pipe.rpush(queue, json.dumps(envelope))
            pipe.execute()
    wait_until(
        lambda: (
            unacked_drained(b) and not any(b.llen(q) for q in b.keys("wesichain.*") if b.type(q) == "list")
        ),
        30,
        what="the handed-back deliveries to be taken and acknowledged",
    )
    assert {h.run_id: snapshot(client, h.run_id) for h in runs} == before
    assert all(w.alive for w in workers)


def test_a_full_broker_refusing_the_publish_after_a_commit_does_not_make_the_run_poison(
    cluster: Cluster, broker: RedisServer, beside: Client
) -> None:
    """A broker at ``maxmemory`` refuses the transaction that publishes what a tool's result leads
    to: the delivery is not acknowledged by it, and the outbox is marked unsent, so that a sweeper
    sends it again and again without counting a lost message, for as long as the broker stays full,
    instead of handing the phase on as lost until the run fails as poison. The worker's own
    acknowledgement of that delivery is taken by the full broker, so the worker (the only one)
    goes on consuming, and the run completes once memory is freed."""
    client = beside
    r = client.store.redis
    b = broker.client()
    workers = cluster.start(1, env=_env(broker, WESICHAIN_MAX_PHASE_ATTEMPTS="2"))
    handle = client.submit("charge_once", "go")
    key = idem(handle.run_id)
    wait_tool_started(r, key)
    ballast = fill_redis(b)
    # The charge ends while the broker refuses every message: its result is recorded (the run
    # state has room) and its observe phase cannot be published. Kept so until the run was
    # published again more often than a phase may lose its messages, or it ended.
    wait_until(lambda: effects(r, key) == 1, 30, what="the charge to end")

    def waited_past_poison_or_ended() -> bool:
        head = handle.status()
        return head.terminal or head.epoch > 2

    wait_until(waited_past_poison_or_ended, RUN_TIMEOUT_S, what="the run to be published again past poison")
    free_redis(b, ballast)

    _check_one_hop(client, handle)
    assert all(w.alive for w in workers)
    wait_until(lambda: unacked_drained(b), 30, what="nothing left in the broker's unacked hash")


PHASES = [Phase.IDLE, Phase.THINKING, Phase.OBSERVING]


@pytest.mark.parametrize("fault", ["crash_after_commit", "crash_after_publish"])
@pytest.mark.parametrize("phase", PHASES, ids=str)
def test_a_pool_process_killed_around_the_publish_after_its_commit(
    cluster: Cluster, broker: RedisServer, beside: Client, phase: Phase, fault: str
) -> None:
    """Killed before the publish (and its acknowledgement), the delivery's message is still in the
    unacked hash: Celery's worker-lost retry delivers it again, and that delivery finds the run
    moved on with its next phase unclaimed and publishes it. Killed after, the next phase is on the
    broker and the message acknowledged: the retry finds the run moved on and does nothing more. In
    both, every piece of work is claimed once, no sweeper hands anything on, and nothing is left in
    the unacked hash."""
    client = beside
    r = client.store.redis
    b = broker.client()
    (worker,) = cluster.start(
        1,
        env=_env(
            broker,
            WESICHAIN_HOOKS="tests.chaos.publish_faults:PublishFaults",
            WESICHAIN_FAULT=f"{fault}:{phase.value}",
            **NO_PROBE,
        ),
    )
    handle = client.submit("one_hop", "go")
    _check_one_hop(client, handle)
    crashed = int(wait_until(lambda: r.get(fired_key(f"{fault}:{phase.value}", handle.run_id)), 10))
    assert crashed != worker.pid and not is_running(crashed), "the fault should kill a pool process"
    assert worker.alive
    head = handle.status()
    assert head.epoch == 0, "nothing should have been handed on"
    attempts = client.store.attempts(handle.run_id)
    claims = {k: v for k, v in attempts.items() if k.startswith("v")}
    assert claims and set(claims.values()) == {"1"}, attempts
    wait_until(lambda: unacked_drained(b), 30, what="nothing left in the broker's unacked hash")


def test_a_worker_killed_whole_after_the_publish_after_its_commit(
    cluster: Cluster, broker: RedisServer, beside: Client
) -> None:
    """The solo pool commits and publishes in the worker's main process: killed right after the
    transaction, the worker gives nothing back, and needs to: the next phase is on the broker, its
    own message acknowledged with it, and the other worker goes on at once."""
    client = beside
    r = client.store.redis
    b = broker.client()
    fault = f"crash_after_publish:{Phase.THINKING.value}"
    workers = cluster.start(
        2,
        pool="solo",
        env=_env(
            broker,
            WESICHAIN_HOOKS="tests.chaos.publish_faults:PublishFaults",
            WESICHAIN_FAULT=fault,
            **NO_PROBE,
        ),
    )
    handle = client.submit("one_hop", "go")
    _check_one_hop(client, handle)
    crashed = int(wait_until(lambda: r.get(fired_key(fault, handle.run_id)), 10))
    wait_until(lambda: sum(not w.alive for w in workers) == 1, 30, what="the publishing worker to die")
    (dead,) = [w for w in workers if not w.alive]
    assert crashed == dead.pid
    assert handle.status().epoch == 0, "nothing should have been handed on"
    attempts = client.store.attempts(handle.run_id)
    claims = {k: v for k, v in attempts.items() if k.startswith("v")}
    assert claims and set(claims.values()) == {"1"}, attempts
    wait_until(lambda: unacked_drained(b), 10, what="nothing left in the broker's unacked hash")
