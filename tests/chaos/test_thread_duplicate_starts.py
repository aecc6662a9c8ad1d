"""Duplicate start messages of runs parked for their thread, while the thread's busy run loses its
worker.

Runs waiting for their thread hold no worker and no message: each is parked (``thread_park.lua``)
until the run before it ends and wakes it. Here every waiting run's start message is sent again and
again, while it is parked, while the busy run's pool process is SIGKILLed in its tool, and all
through the wakes that follow (a sweeper's re-send or a broker's duplicate racing the wake), until
every run has ended. Each duplicate that finds its run parked parks it again; one that arrives
after the wake races the woken start for the claim, and one of them starts it. So every run starts
exactly once, the runs keep their order, and the busy run's non-retry-safe charge runs once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from producer.client import Client
from shared.state import Phase
from shared.tasks import start_task
from tests.broker import Settings
from tests.chaos.faults import fired_key
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    effects,
    events_of,
    idem,
    kill_child,
    note_recovery,
    starts,
    wait_delivered,
    wait_paused,
)
from tests.harness import RedisServer, wait_thread_free, wait_until

AGENTS = "tests.agents_threads"
WAITING = 6
#: Duplicates of each parked run's start sent before the kill.
DUPLICATES = 3
#: Bounds the stream of duplicates sent through the wakes (one per still-waiting run per round).
ROUNDS = 2000


@pytest.fixture
def threads_client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


def _wait_parked(client: Client, run_id: str) -> None:
    wait_until(lambda: client.store.thread_wait(run_id), RUN_TIMEOUT_S, what=f"run {run_id} to park")


def _run_started(client: Client, run_id: str) -> int:
    return sum(e.kind == "RunStarted" for e in events_of(client.handle(run_id)))


def test_duplicate_starts_of_parked_runs_start_each_once_through_a_kill(
    cluster: Cluster, threads_client: Client
) -> None:
    fault = "pause:acting"
    cluster.start(2, concurrency=2, agents=AGENTS, env={"WESICHAIN_FAULT": fault})
    client = threads_client
    r = client.store.redis
    thread = f"dups-{uuid.uuid4().hex}"
    waiting = [f"w-{i}-{uuid.uuid4().hex[:8]}" for i in range(WAITING)]
    for run_id in waiting:  # the pause hits only the busy run
        r.set(fired_key(fault, run_id), "spared", ex=3600)
    busy = client.submit("thread_steps", "go", thread_id=thread)
    pid = wait_paused(r, "acting", busy.run_id)
    for run_id in waiting:
        client.submit("echo", f"message {run_id}", thread_id=thread, run_id=run_id, thread_policy="enqueue")
    for run_id in waiting:
        _wait_parked(client, run_id)

    # Duplicates while they are parked: each one parks its run again, none starts it.
    for _ in range(DUPLICATES):
        for run_id in waiting:
            client.send_run_task(start_task(run_id))
    wait_delivered(r, {start_task(run_id).task_id for run_id in waiting}, RUN_TIMEOUT_S)
    assert [client.store.load(run_id).phase for run_id in waiting] == [Phase.IDLE] * WAITING  # type: ignore[union-attr]
    assert all(client.store.thread_wait(run_id) is not None for run_id in waiting)
    assert [_run_started(client, run_id) for run_id in waiting] == [0] * WAITING

    # Then through the kill and every wake: duplicates keep coming for each run not started yet.
    done = threading.Event()

    def keep_duplicating() -> None:
        for _ in range(ROUNDS):
            if done.is_set():
                return
            for run_id in waiting:
                head = client.store.load(run_id)
                if head is not None and head.phase is Phase.IDLE:
                    client.send_run_task(start_task(run_id))
            time.sleep(0.02)

    sender = threading.Thread(target=keep_duplicating, daemon=True)
    sender.start()
    try:
        killed = time.monotonic()
        kill_child(pid, cluster.owner(pid))
        busy_head = busy.wait(RUN_TIMEOUT_S)
        note_recovery(
            "thread with duplicated parked starts: busy run's worker killed", time.monotonic() - killed
        )
        heads = [client.handle(run_id).wait(RUN_TIMEOUT_S) for run_id in waiting]
    finally:
        done.set()
        sender.join(timeout=RUN_TIMEOUT_S)

    assert busy_head.phase is Phase.COMPLETED, busy_head.error
    pay = idem(busy.run_id, 2)
    assert (starts(r, pay), effects(r, pay)) == (1, 1)
    assert [h.phase for h in heads] == [Phase.COMPLETED] * WAITING, [h.error for h in heads]
    # Started once each, in the order they were submitted: each saw the one before it.
    assert [_run_started(client, run_id) for run_id in waiting] == [1] * WAITING
    order = [str(x) for x in r.lrange(client.store.keys.thread(None, thread), 0, -1)]
    assert order == [busy.run_id, *waiting]
    previous = "go"
    for head in heads:
        users = [m.content for m in client.store.load_messages(head.run_id) if m.role == "user"]
        assert users[-2:] == [previous, head.input]
        previous = head.input
    # The duplicates were taken, not lost on the way: one that found its run parked (and no other
    # delivery holding it: then it is dropped as busy) parked it again, beyond each run's own park.
    parks = "".join(w.log() for w in cluster.workers).count(" of its thread to end")
    assert parks > WAITING
    wait_thread_free(client.store, thread, RUN_TIMEOUT_S)
    assert [r_id for r_id in waiting if client.store.thread_wait(r_id) is not None] == []
