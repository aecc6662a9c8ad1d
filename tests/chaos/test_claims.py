"""A live claim cannot be stolen, and a claim names exactly the work it covers.

* A message that says it is a worker-lost redelivery (Celery's ``retries`` and ``redelivered``
  marks) while the original still runs and heartbeats takes nothing over: only an expired lease,
  by Redis's clock, lets a delivery take a claim over.
* A tool message for the right version and epoch but another step is refused: claims name
  (run, step, call), and the script checks the message against the run.
* Time comes from Redis: a worker whose clock runs 20 s ahead or behind the others neither takes
  live phases over nor makes its own look expired.
* Two recoveries of one expired lease bump the epoch once.
* A tool that holds the GIL starves its process's heartbeat thread, not its worker's main
  process, which vouches for it: it is not handed on while it runs, so it runs once.
* A whole worker stopped (SIGSTOP) is taken over, and its late work is fenced off: a
  non-retry-safe call it was making ends as ToolOutcomeUnknown, never a second run.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest

from producer.client import Client
from shared.state import Phase
from shared.store import Due
from tests.agents_fixture import MODEL_CALLS_KEY
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    idem,
    kinds,
    pending_task_ids,
    starts,
    wait_delivered,
    wait_tool_started,
)
from tests.harness import wait_until
from tests.invariants import ONE_HOP


def test_a_forged_worker_lost_redelivery_cannot_steal_a_live_claim(cluster: Cluster, client: Client) -> None:
    cluster.start(2, concurrency=2)
    r = client.store.redis
    handle = client.submit("charge_once", "go")  # a 3 s non-retry-safe call
    key = idem(handle.run_id)
    wait_tool_started(r, key)
    head = handle.status()
    assert head.phase is Phase.ACTING
    kwargs = {
        "run_id": handle.run_id,
        "step": 1,
        "version": head.version,
        "epoch": head.epoch,
        "call_id": "call_0",
    }
    # Exactly what Celery sends when a worker is lost: same arguments, retries + 1.
    forged = [f"forged-{i}" for i in range(2)]
    for task_id in forged:
        client.app.send_task("wesichain.tool", kwargs=kwargs, task_id=task_id, retries=1)
    wait_delivered(r, forged)

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED, f"{head.phase} {head.error}"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert starts(r, key) == 1 and effects(r, key) == 1


def test_a_tool_message_naming_another_step_is_refused(cluster: Cluster, client: Client) -> None:
    cluster.start(2, concurrency=2)
    r = client.store.redis
    handle = client.submit("charge_beside_slow", "go")
    charge, slow = idem(handle.run_id, 1, "call_0"), idem(handle.run_id, 1, "call_1")
    wait_until(lambda: effects(r, charge) == 1, 30, what="the charge to happen")
    wait_tool_started(r, slow)
    head = handle.status()
    assert head.phase is Phase.ACTING and head.step == 1, "the slow call should still be running"
    sent = []
    for step in (0, 2, 7):
        task_id = f"wrong-step-{step}"
        kwargs = {"run_id": handle.run_id, "step": step, "version": head.version, "epoch": head.epoch}
        client.app.send_task("wesichain.tool", kwargs={**kwargs, "call_id": "call_0"}, task_id=task_id)
        sent.append(task_id)
    wait_delivered(r, sent)

    head = handle.wait(RUN_TIMEOUT_S)
    assert head.phase is Phase.COMPLETED, f"{head.phase} {head.error}"
    assert starts(r, charge) == 1 and effects(r, charge) == 1, "the non-retry-safe charge ran again"
    assert_event_invariants(events_of(handle))


@pytest.mark.parametrize("skew_s", [20.0, -20.0], ids=["ahead", "behind"])
def test_a_worker_with_a_skewed_clock_takes_nothing_over(
    cluster: Cluster, client: Client, skew_s: float
) -> None:
    """Ahead, the skewed worker sweeps (it would see everyone's leases expired); behind, a sound
    worker sweeps (it would see the skewed worker's leases expired): either way nothing is."""
    skew = {"env": {"WESICHAIN_TEST_CLOCK_SKEW_S": str(skew_s)}, "include": ("tests.clock_skew",)}
    first, second = (skew, {}) if skew_s > 0 else ({}, skew)
    # The worker started first takes the sweeper lock and keeps it.
    (sweeping,) = cluster.start(1, concurrency=2, **first)  # type: ignore[arg-type]
    lock = client.store.keys.sweeper_lock()
    wait_until(lambda: client.store.redis.get(lock), 30, what="a sweeper to hold the lock")
    cluster.start(1, concurrency=2, **second)  # type: ignore[arg-type]
    tag = uuid.uuid4().hex
    inputs = [f"{tag}-{i}" for i in range(8)]
    handles = [client.submit("counted", text) for text in inputs]
    handles += [client.submit("slow_step", "go") for _ in range(2)]  # 3 s tools: several lease renewals
    r = client.store.redis
    for handle in handles:
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.COMPLETED, f"{handle.run_id}: {head.phase} {head.error}"
        assert head.epoch == 0, f"{handle.run_id} was taken over while it was alive"
        assert_terminal_matches_events(head, events_of(handle))
    calls = {str(k): int(v) for k, v in r.hgetall(MODEL_CALLS_KEY).items() if str(k).startswith(tag)}
    assert calls == {f"{text}:{turn}": 1 for text in inputs for turn in (0, 1)}, "a model call ran twice"
    assert all(w.alive for w in cluster.workers)


def test_two_recoveries_of_one_expired_lease_bump_the_epoch_once(cluster: Cluster, client: Client) -> None:
    """The sweeper's hand-on is atomic on its own: racing sweepers (a worker's and celery beat's)
    cannot both take the same run over."""
    handle = client.submit("one_hop", "go", check_agent=False)  # no worker: the start phase stays queued
    store = client.store
    r = store.redis
    # Make its queued time run out now, as if the start message had been lost.
    r.hset(store.keys.run(handle.run_id), "queued_until", 0)
    r.zadd(store.keys.leases_of(handle.run_id), {handle.run_id: 0})
    due = store.inspect(handle.run_id)
    assert isinstance(due, Due) and due.unclaimed == [""], due
    results: list[object] = []
    barrier = threading.Barrier(4)

    def hand_on() -> None:
        barrier.wait()
        results.append(store.hand_on(due, [""], "its message was missing from the broker"))

    threads = [threading.Thread(target=hand_on) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert handle.status().epoch == 1, f"the epoch was bumped {handle.status().epoch} times"
    assert sum(1 for x in results if x is not None) == 1


@pytest.mark.parametrize("agent", ["gil_sleep", "gil_spin"])
def test_a_retry_safe_tool_holding_the_gil_runs_once(cluster: Cluster, client: Client, agent: str) -> None:
    """Its heartbeat thread cannot run for four leases, so its claim expires; the worker's main
    process still lists its pool process as running the call, so the sweeper keeps the claim
    instead of handing the call on to run again beside it (which, every lease, filled the pool
    with copies)."""
    cluster.start(2, concurrency=2, agents="tests.chaos.gil_agents")
    r = client.store.redis
    handle = client.submit(agent, "go")
    key = idem(handle.run_id)
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "held it", f"{head.phase} {head.error}"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    wait_until(lambda: not pending_task_ids(r), 30, what="every task of the run to be delivered")
    ran = starts(r, key)
    print(f"{agent}: the GIL-holding retry-safe tool ran {ran} time(s)")
    assert ran == 1 and effects(r, key) == 1, f"the tool ran {ran} times"
    assert head.epoch == 0, "the call was handed on while its process still ran it"


def test_a_gil_holding_non_retry_safe_tool_runs_once_and_its_run_goes_on(
    cluster: Cluster, client: Client
) -> None:
    """Its heartbeat thread cannot run, its claim expires: the claim is kept for its live process,
    so the call is not handed on (which would end it as ToolOutcomeUnknown) and the run goes on."""
    cluster.start(2, concurrency=2)
    r = client.store.redis
    handle = client.submit("gil_charge", "go")  # holds the GIL for 6 s; the chaos lease is 2 s
    key = idem(handle.run_id)
    wait_tool_started(r, key)
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "unreachable", f"{head.phase} {head.error}"
    assert head.epoch == 0
    assert_event_invariants(events)
    wait_until(lambda: not pending_task_ids(r), 30, what="every task of the run to be delivered")
    assert starts(r, key) == 1 and effects(r, key) == 1


def test_a_stopped_worker_is_taken_over_and_its_late_call_fenced(cluster: Cluster, client: Client) -> None:
    """SIGSTOP of a whole worker (all its processes) mid non-retry-safe call: its main process
    stops saying it is alive, the sweeper hands the call on, and the delivery that gets it reports
    the outcome unknown. Resumed, the stopped call ends and its late result is dropped: the charge
    never starts twice."""
    cluster.start(2, concurrency=2)
    r = client.store.redis
    handle = client.submit("charge_once", "go")  # a 3 s non-retry-safe call
    key = idem(handle.run_id)
    victim = cluster.owner(wait_tool_started(r, key))
    os.killpg(victim.pid, signal.SIGSTOP)
    try:
        head = handle.wait(RUN_TIMEOUT_S)
        assert head.phase is Phase.FAILED and head.error is not None, head.phase
        assert head.error.kind == "ToolOutcomeUnknown" and head.error.tool == "charge"
        assert head.epoch == 1
    finally:
        os.killpg(victim.pid, signal.SIGCONT)
    wait_until(lambda: effects(r, key) == 1, 30, what="the stopped call to finish once resumed")
    wait_until(lambda: not pending_task_ids(r), 30, what="every task of the run to be delivered")
    assert starts(r, key) == 1
    after = handle.status()
    assert after.phase is Phase.FAILED and after.version == head.version, "the late result was committed"
    assert_event_invariants(events_of(handle))
