"""A publish the broker refuses after its commit: the task stays in the run's outbox, marked unsent,
and the workers' sweeper sends it at its next look (not after its allowance for a backlog), without
counting it as a lost message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.protocol import QUEUED_CHECKS, QUEUED_UNSENT
from shared.state import Phase, RunHead
from shared.store import Due
from shared.tasks import start_task
from tests.broker import Settings, on_rabbitmq
from tests.chaos.support import fill_redis
from tests.harness import RedisServer, WorkerProcess, free_port
from tests.invariants import ONE_HOP, kinds

#: The shared workers' sweeper asks the broker about an unclaimed task after 30 s (the default
#: queued lease): a start the broker never had must be sent well before that.
SENT_WITHIN_S = 20.0


@pytest.fixture
def refusing(redis_server: RedisServer) -> Iterator[Client]:
    """A client whose broker refuses every connection (nothing listens on its port)."""
    port = free_port()
    broker = f"amqp://guest:guest@127.0.0.1:{port}//" if on_rabbitmq() else f"redis://127.0.0.1:{port}/0"
    c = Client(Settings(redis_url=redis_server.url, agents_module="tests.agents_fixture", broker_url=broker))
    yield c
    c.close()


def test_a_run_whose_start_the_broker_refused_is_accepted_and_started_once(
    workers: list[WorkerProcess], client: Client, refusing: Client
) -> None:
    submitted = time.time()
    handle = refusing.submit("one_hop", "go")  # no error: the run is created, its start kept

    head = handle.wait(60)
    assert head.phase is Phase.COMPLETED, f"{head.phase} {head.error}"
    events = list(handle.events(follow=False))
    assert kinds(events) == ONE_HOP
    started = next(e.ts for e in events if e.kind == "RunStarted")
    assert started - submitted < SENT_WITHIN_S, f"started {started - submitted:.1f} s after the submit"
    # Sent again by a sweeper under a new epoch, and not counted as a lost message.
    r = client.store.redis
    assert head.epoch == 1
    assert r.hget(client.store.keys.attempts(handle.run_id), "lost:v1") is None


def test_an_unsent_outbox_is_handed_on_without_counting_a_loss(client: Client) -> None:
    store = client.store
    run_id = uuid.uuid4().hex
    assert store.create(RunHead.new_idle(run_id, "one_hop", "go"), [start_task(run_id)])
    assert not store.mark_unsent(run_id, 1, 1, 0), "another epoch: the run moved on"
    assert not store.mark_unsent(run_id, 2, 0, 0), "another version: the run moved on"
    assert not store.mark_unsent(uuid.uuid4().hex, 1, 0, 0), "no such run"

    for attempt in range(1, 4):
        assert store.mark_unsent(run_id, 1, attempt - 1, 0)
        assert store.redis.hget(store.keys.run(run_id), QUEUED_CHECKS) == str(QUEUED_UNSENT)
        seen = store.inspect(run_id)
        assert isinstance(seen, Due) and seen.queued_checks == QUEUED_UNSENT
        assert seen.unclaimed == [""]
        handed = store.hand_on(seen, [""], "its publish failed")
        assert handed is not None
        assert (handed.epoch, handed.lost, handed.tasks) == (attempt, 0, [""])
    # Handed on, the outbox waits its queued time again, as any freshly published one does.
    assert store.redis.hget(store.keys.run(run_id), QUEUED_CHECKS) == "0"


def test_a_submit_whose_start_a_full_broker_refuses_is_accepted_with_its_start_unsent(
    redis_server: RedisServer,
) -> None:
    """A standalone Redis broker at ``maxmemory`` refuses the start's message: the run is created all
    the same and its start kept in its outbox, marked unsent for a sweeper to send, as for a broker
    that cannot be reached (not an error the submit raises)."""
    if on_rabbitmq():
        pytest.skip("about a Redis broker of its own")
    broker = RedisServer().start()
    full = broker.client()
    c = Client(
        Settings(redis_url=redis_server.url, agents_module="tests.agents_fixture", broker_url=broker.url)
    )
    try:
        fill_redis(full)
        handle = c.submit("one_hop", "go", check_agent=False)
        store = c.store
        assert store.redis.hget(store.keys.run(handle.run_id), QUEUED_CHECKS) == str(QUEUED_UNSENT)
        assert handle.status().phase is Phase.IDLE
        assert full.llen("wesichain.model") == 0
    finally:
        c.close()
        broker.cleanup()
