"""Redis at ``maxmemory`` (``noeviction``) while runs are mid-tool: the workers wait it out.

Redis refuses every write that adds data while it is full: the result of a tool that ends then, the
ack of a task, kombu's record of a message it hands to a worker. None of that may stop a worker for
good. The tool's result waits in its worker (its claim renewed meanwhile) and is recorded once
memory is freed; a consumer that Redis refused is restarted in the same process; nothing is handed
on or published again while Redis is full, so no run's epoch moves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from producer.client import Client
from producer.publishing import MessageBuilder
from shared import protocol
from shared.state import Phase
from shared.tasks import task_for
from shared.workers import WorkerDirectory
from tests.agents_fixture import GATE_DIR_ENV, gated_count
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    events_of,
    fill_redis,
    first_event_after,
    free_redis,
    idem,
    kinds,
    note_recovery,
    refuses_writes,
)
from tests.harness import RedisServer, wait_until
from tests.invariants import ONE_HOP

pytestmark = pytest.mark.standalone_redis  # sets the one Redis's maxmemory

#: How long Redis is kept full.
FULL_FOR_S = 25.0
#: What kombu logs when its consumer connection fails and Celery restarts the consumer.
RESTARTED = "Connection to broker lost"

#: Pushes a message although Redis is full: a script whose first write cannot add data (DEL) may go
#: on writing at maxmemory. It stands for a message that reached the broker just before it filled.
PUSH_WHILE_FULL = "redis.call('DEL', KEYS[2]) return redis.call('LPUSH', KEYS[1], ARGV[1])"


def test_a_full_redis_stalls_runs_and_workers_resume_when_memory_is_freed(
    cluster: Cluster, server: RedisServer, client: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    workers = cluster.start(2, concurrency=2, env={GATE_DIR_ENV: str(gate)})
    main_pids = {w.name: w.pid for w in workers}
    r = client.store.redis
    handles = [client.submit("charge_gated", "go") for _ in range(3)]
    keys = [idem(h.run_id) for h in handles]
    wait_until(
        lambda: all(gated_count(gate, f"{k}.starts") == 1 for k in keys), 30, what="every charge to start"
    )
    # A copy of a running call's message, to reach a worker while Redis is full (see below).
    head = client.handle(handles[0].run_id).status()
    ((queue_key, (payload,)),) = [
        (args[0], args[1:])
        for name, args in MessageBuilder(client.app).build(task_for(head))
        if name == "lpush"
    ]
    offsets = {w.name: len(w.log()) for w in workers}

    ballast = fill_redis(r)
    assert ballast > 0 and refuses_writes(r)
    full_until = time.monotonic() + FULL_FOR_S
    # Every charge ends while Redis is full: its result cannot be written, nor its task acked.
    (gate / "open").touch()
    wait_until(
        lambda: all(gated_count(gate, f"{k}.effects") == 1 for k in keys), 30, what="every charge to end"
    )
    # A worker with a free slot takes this message from the broker; kombu cannot record it as
    # unacked (Redis is full), which used to end that worker's consumer for good.
    r.eval(PUSH_WHILE_FULL, 2, queue_key, "test:nothing", payload)
    wait_until(
        lambda: any(RESTARTED in w.log()[offsets[w.name] :] for w in workers),
        30,
        what="a worker's consumer to be refused by the full Redis and restarted",
    )
    wait_until(lambda: time.monotonic() >= full_until, FULL_FOR_S + 5, what="Redis to stay full")
    assert refuses_writes(r)
    assert all(w.alive for w in workers)
    # Nothing moved while Redis was full: no run handed on (its epoch would have risen).
    for h in handles:
        assert r.hget(client.store.keys.run(h.run_id), protocol.EPOCH) in (None, b"0", "0")
        assert client.handle(h.run_id).status().phase is Phase.ACTING

    free_redis(r, ballast)
    freed_at = time.time()

    for h in handles:
        ended = h.wait(RUN_TIMEOUT_S)
        events = events_of(h)
        key = idem(h.run_id)
        assert ended.phase is Phase.COMPLETED, f"{h.run_id}: {ended.phase} {ended.error}"
        assert kinds(events) == ONE_HOP
        assert_event_invariants(events)
        assert_terminal_matches_events(ended, events)
        assert (gated_count(gate, f"{key}.starts"), gated_count(gate, f"{key}.effects")) == (1, 1)
        assert r.hget(client.store.keys.run(h.run_id), protocol.EPOCH) in (None, b"0", "0")
    # ToolCompleted carries the time its result was made (while Redis was full): a run resumed with
    # the first event written after memory was freed; the last run to resume is the figure.
    resumed = max(first_event_after(events_of(h), freed_at).ts for h in handles)
    note_recovery("redis full for 25 s under non-retry-safe tools, then freed", resumed - freed_at)

    # The workers that were there at the start are the ones that finished, and they consume.
    assert {w.name: w.pid for w in workers} == main_pids and all(w.alive for w in workers)
    directory = WorkerDirectory(r, client.store.keys, client.settings.registry_interval_s)
    names = set(main_pids)

    def consuming() -> bool:
        records = {lw.record.id.split("@")[0]: lw.record for lw in directory.live()}
        return all(n in records and records[n].consuming for n in names)

    wait_until(consuming, 30, what="every worker's record to say it consumes")
    after = [client.submit("one_hop", "go") for _ in range(4)]
    for h in after:
        assert h.wait(RUN_TIMEOUT_S).phase is Phase.COMPLETED
    assert os.path.exists(gate / "open")
