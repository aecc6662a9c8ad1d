"""A whole worker SIGKILLed, with the shipped lease (10 s): its work is handed on once its main
process stops saying it is alive, not once each claim's lease runs out.

Each test kills every process of the worker mid-phase and checks what recovered it: the attempt's
last error names the dead worker (``shared/liveness.py``), not an expired lease; the phase was
handed on exactly once (epoch 1); a non-retry-safe call never started twice. The time from the
kill to the recovered phase's commit is reported (``note_recovery``), not asserted.
"""

from __future__ import annotations

import time

from producer.client import Client
from shared import protocol
from shared.liveness import POOL_MARK
from shared.state import Phase
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    effects,
    events_of,
    first_event_after,
    idem,
    kinds,
    note_recovery,
    starts,
    wait_paused,
    wait_tool_started,
)
from tests.harness import wait_until
from tests.invariants import ONE_HOP

#: The shipped leases: only the fault hooks of the chaos suite are kept.
DEFAULTS = {"WESICHAIN_LEASE_S": "10", "WESICHAIN_QUEUED_LEASE_S": "30"}
#: The last error a claim of a dead worker is handed on with (``worker/liveness.py``).
DEAD_WORKER = "stopped saying it is alive"
TOOL_UNKNOWN = ["RunStarted", "StepStarted", "ModelResponded", "ToolDispatched", "ToolCompleted", "Failed"]


def _last_error(client: Client, run_id: str, version: int, field: str) -> str:
    raw = client.store.redis.hget(
        client.store.keys.attempts(run_id), protocol.last_error_field(version, field)
    )
    return str(raw or "")


def test_a_dead_worker_s_think_is_handed_on_before_its_lease_runs_out(
    cluster: Cluster, client: Client
) -> None:
    cluster.start(2, env={**DEFAULTS, "WESICHAIN_FAULT": "pause:thinking"})
    r = client.store.redis
    handle = client.submit("one_hop", "go")
    victim = cluster.owner(wait_paused(r, Phase.THINKING, handle.run_id))
    held = handle.status()
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3", f"{head.phase} {head.error}"
    assert head.epoch == 1, f"handed on {head.epoch} times"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    recovered = first_event_after(events, killed_at)
    assert recovered.kind == "ModelResponded" and recovered.worker.host != victim.name
    error = _last_error(client, handle.run_id, held.version, protocol.RUNNING)
    assert DEAD_WORKER in error and f"{victim.name}:" in error, error
    note_recovery("whole worker killed in thinking, lease 10 s", recovered.ts - killed_at)


def _life_listing(client: Client, pid: int) -> str | None:
    """The worker start whose liveness record lists pool process ``pid``, once it does."""
    r, keys = client.store.redis, client.store.keys
    for member in r.zrange(keys.lives(), 0, -1):
        life = str(member)
        listed = str(r.get(keys.held(life)) or "").split("\n")
        if any(line.startswith(POOL_MARK) and line.endswith(f":{pid}") for line in listed):
            return life
    return None


def test_a_claim_the_dead_worker_never_listed_is_handed_on_from_the_claim_itself(
    cluster: Cluster, client: Client
) -> None:
    # A worker lease of 4 s leaves the test seconds, not milliseconds, between the kill and the
    # moment a sweeper may judge the start dead: time to strip the record below.
    cluster.start(2, env={**DEFAULTS, "WESICHAIN_FAULT": "pause:thinking", "WESICHAIN_WORKER_LEASE_S": "4"})
    r, keys = client.store.redis, client.store.keys
    handle = client.submit("one_hop", "go")
    pid = wait_paused(r, Phase.THINKING, handle.run_id)
    victim = cluster.owner(pid)
    life = str(wait_until(lambda: _life_listing(client, pid), 30, what=f"a liveness record listing {pid}"))
    held = handle.status()
    killed_at = time.time()
    victim.kill()
    # The worker is dead; its record names its pool processes but, as if the claim had been taken
    # after its last beat, none of their claims: only the claim's own last-claim key tells.
    listed = r.get(keys.held(life))
    assert listed is not None, "the dead start was buried before the test could strip its record"
    pool_only = [line for line in str(listed).split("\n") if line.startswith(POOL_MARK)]
    r.set(keys.held(life), "\n".join(pool_only))

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3", f"{head.phase} {head.error}"
    assert head.epoch == 1, f"handed on {head.epoch} times"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    error = _last_error(client, handle.run_id, held.version, protocol.RUNNING)
    assert DEAD_WORKER in error and f":{pid}" in error, error
    recovered = first_event_after(events, killed_at)
    assert recovered.kind == "ModelResponded" and recovered.worker.host != victim.name
    note_recovery(
        "whole worker killed right after a claim it never listed, lease 10 s", recovered.ts - killed_at
    )


def test_a_dead_worker_s_non_retry_safe_call_never_runs_twice(cluster: Cluster, client: Client) -> None:
    cluster.start(2, env=DEFAULTS)
    r = client.store.redis
    handle = client.submit("charge_once", "go")  # a 3 s non-retry-safe call
    key = idem(handle.run_id)
    victim = cluster.owner(wait_tool_started(r, key))
    held = handle.status()
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.FAILED and head.error is not None, head.phase
    assert head.error.kind == "ToolOutcomeUnknown" and head.error.tool == "charge"
    assert head.epoch == 1, f"handed on {head.epoch} times"
    assert kinds(events) == TOOL_UNKNOWN
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    assert starts(r, key) == 1 and effects(r, key) == 0, "the killed charge ran again"
    error = _last_error(client, handle.run_id, held.version, protocol.call_claim(1, "call_0"))
    assert DEAD_WORKER in error and f"{victim.name}:" in error, error
    completed = next(e for e in events if e.kind == "ToolCompleted")
    note_recovery("whole worker killed inside a non-retry-safe tool, lease 10 s", completed.ts - killed_at)


def test_a_dead_worker_s_retry_safe_call_runs_again_once(cluster: Cluster, client: Client) -> None:
    cluster.start(2, env=DEFAULTS)
    r = client.store.redis
    handle = client.submit("slow_step", "go")  # a 3 s retry-safe call
    key = idem(handle.run_id)
    victim = cluster.owner(wait_tool_started(r, key))
    held = handle.status()
    killed_at = time.time()
    victim.kill()

    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == "slow step done", f"{head.phase} {head.error}"
    assert head.epoch == 1, f"handed on {head.epoch} times"
    assert kinds(events) == ONE_HOP
    assert_event_invariants(events)
    assert starts(r, key) == 2 and effects(r, key) == 1
    error = _last_error(client, handle.run_id, held.version, protocol.call_claim(1, "call_0"))
    assert DEAD_WORKER in error and f"{victim.name}:" in error, error
    completed = next(e for e in events if e.kind == "ToolCompleted")
    assert completed.ok and completed.worker.host != victim.name
    # Recovery here includes running the 3 s tool again.
    note_recovery("whole worker killed inside a 3 s retry-safe tool, lease 10 s", completed.ts - killed_at)
