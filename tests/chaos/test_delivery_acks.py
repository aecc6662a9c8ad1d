"""The acknowledgement a commit makes of its own delivery, against duplicate, late and forged messages.

A commit that publishes the next phase on the store's Redis also removes the committing delivery's
message from kombu's unacked hash (``worker/acks.py``). Here the very envelope of a phase is
delivered again while the first delivery runs, and again after the phase committed (as a
visibility-timeout restore hands a message back), and a forged envelope of another run's phase
names the tag of a delivery still running. Nothing may happen twice, the running delivery's
message stays in the unacked hash until its own work ends, and nothing is left there at the end.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from producer.client import Client
from shared.state import Phase
from tests.agents_fixture import RELEASE_KEY
from tests.broker import DELIVERIES_KEY
from tests.chaos.support import (
    UNACKED_INDEX,
    Cluster,
    check_clean_run,
    idem,
    snapshot,
    starts,
    unacked,
    unacked_drained,
    wait_tool_started,
)
from tests.harness import wait_until

pytestmark = pytest.mark.redis_broker  # reads and writes the Redis transport's keys

#: Leases long enough that no sweeper takeover mixes into what the deliveries do.
CALM_ENV = {"WESICHAIN_LEASE_S": "10", "WESICHAIN_QUEUED_LEASE_S": "30"}
PROBE = ("tests.delivery_probe",)


def _held_delivery(r: redis.Redis, task_id_prefix: str) -> tuple[str, dict[str, Any], str]:
    """The tag, envelope and queue of the one in-flight delivery whose task id starts so."""

    def find() -> tuple[str, dict[str, Any], str] | None:
        found = [
            (tag, envelope, routing_key)
            for tag, (envelope, _, routing_key) in unacked(r).items()
            if str(envelope["headers"]["id"]).startswith(task_id_prefix)
        ]
        return found[0] if len(found) == 1 else None

    return wait_until(find, 30, what=f"the delivery of {task_id_prefix} to be held")  # type: ignore[no-any-return]


def _deliveries(r: redis.Redis, task_id: str) -> int:
    return int(r.hget(DELIVERIES_KEY, task_id) or 0)


def _dropped_as_busy(cluster: Cluster, run_id: str) -> bool:
    """Whether a worker logged dropping a delivery of the run because another one holds its phase."""
    return any(
        f"run {run_id}: " in line and "already being worked on" in line
        for w in cluster.workers
        for line in w.log().splitlines()
    )


def test_a_phase_delivered_twice_and_again_after_its_commit(cluster: Cluster, client: Client) -> None:
    cluster.start(2, concurrency=2, env=CALM_ENV, include=PROBE)
    r = client.store.redis
    handle = client.submit("late_delivery", "go")
    run_id = handle.run_id
    wait_tool_started(r, idem(run_id, 2))
    head = handle.status()
    assert head.phase is Phase.ACTING and head.step == 2
    tag, envelope, queue = _held_delivery(r, f"{run_id}:v{head.version}:tool:")
    task_id = str(envelope["headers"]["id"])
    raw = json.dumps(envelope)

    # The same envelope (the same tag) a second time while the first delivery runs the call.
    r.lpush(queue, raw)
    wait_until(lambda: _deliveries(r, task_id) == 2, 30, what="the duplicate to be delivered")
    wait_until(lambda: _dropped_as_busy(cluster, run_id), 30, what="the duplicate to be dropped")
    assert starts(r, idem(run_id, 2)) == 1, "the duplicate started the running call again"
    # The running delivery's message is still held: the duplicate's ack did not take it away.
    entries = unacked(r)
    assert tag in entries and entries[tag][0] == envelope, "the duplicate acked the running message"
    during = handle.status()
    assert (during.phase, during.version, during.epoch) == (Phase.ACTING, head.version, head.epoch)

    r.set(RELEASE_KEY + run_id, 1)
    check_clean_run(client, run_id, "late_delivery")
    wait_until(lambda: unacked_drained(r), 30, what="the unacked hash to empty")
    before = snapshot(client, run_id)

    # The committed phase's message handed back late, as a visibility-timeout restore would.
    r.lpush(queue, raw)
    wait_until(lambda: _deliveries(r, task_id) == 3, 30, what="the late redelivery to arrive")
    wait_until(lambda: unacked_drained(r) and r.llen(queue) == 0, 30, what="the late redelivery to be acked")
    assert snapshot(client, run_id) == before
    assert starts(r, idem(run_id, 2)) == 1
    assert all(w.alive for w in cluster.workers)


def test_a_forged_tag_never_acknowledges_another_delivery(cluster: Cluster, client: Client) -> None:
    """A forged envelope of one run's start carries the tag of another run's running delivery: the
    forged start commits, and the running delivery's message stays unacked until its own commit."""
    (model,) = cluster.start(1, env=CALM_ENV, include=PROBE, queues="wesichain.model")
    cluster.start(1, concurrency=2, env=CALM_ENV, include=PROBE, queues="wesichain.tools")
    r = client.store.redis
    held = client.submit("late_delivery", "go")
    wait_tool_started(r, idem(held.run_id, 2))
    version = held.status().version
    victim_tag, victim, _ = _held_delivery(r, f"{held.run_id}:v{version}:tool:")

    # No worker takes starts while the other run's start is forged.
    model.kill()
    wait_until(lambda: not model.alive, 10, what="the model worker to die")
    forged_run = client.submit("one_hop", "go")
    start_queue = "wesichain.model"
    raw = wait_until(lambda: r.rpop(start_queue), 10, what="the start to be queued")
    envelope = json.loads(raw)
    assert envelope["headers"]["id"].startswith(forged_run.run_id)
    envelope["properties"]["delivery_tag"] = victim_tag
    r.rpush(start_queue, json.dumps(envelope))
    cluster.revive(wait=True)

    check_clean_run(client, forged_run.run_id, "one_hop")
    # The running call's message is still the one kombu holds under its tag.
    entries = unacked(r)
    assert victim_tag in entries and entries[victim_tag][0] == victim, "the forged start acked it"
    assert r.zscore(UNACKED_INDEX, victim_tag) is not None

    r.set(RELEASE_KEY + held.run_id, 1)
    check_clean_run(client, held.run_id, "late_delivery")
    assert starts(r, idem(held.run_id, 2)) == 1
    wait_until(lambda: unacked_drained(r), 30, what="the unacked hash to empty")
    assert all(w.alive for w in cluster.workers)
