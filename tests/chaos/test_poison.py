"""A poison tool that SIGKILLs whatever process runs it, every time.

Each claim of the call counts an attempt; past ``max_phase_attempts`` the next claim fails the run
with ``PoisonPhase`` instead of running the tool again. The tool is retry-safe, so every claim up to
the limit runs it (its outcome is never "unknown": it is re-run until the limit). Runs submitted at
the same time on the same workers complete untouched.

The tool appends its pid to a list before it kills itself, so the tests count the tool's own
attempts and check which process each one killed; they never count process deaths from logs,
where Celery's own kills (a replacement child that did not start in time) look the same.
"""

from __future__ import annotations

import time

import redis

from producer.client import Client, RunHandle
from shared.protocol import attempts_field, call_claim
from shared.state import Phase
from tests.agents_fixture import ATTEMPT_PIDS_KEY
from tests.broker import Settings
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    SHAPES,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    check_clean_run,
    events_of,
    idem,
    is_running,
    kinds,
    starts,
)

BYSTANDERS = ["one_hop", "chain", "parallel", "one_hop", "chain", "one_hop"]
POISONED = ["RunStarted", "StepStarted", "ModelResponded", "ToolDispatched"]


def _submit(client: Client) -> tuple[RunHandle, list[tuple[str, str]]]:
    poison = client.submit("poison", "go")
    others = [(client.submit(agent, "go").run_id, agent) for agent in BYSTANDERS]
    return poison, others


def _attempt_pids(r: redis.Redis, poison: RunHandle) -> list[int]:
    return [int(p) for p in r.lrange(ATTEMPT_PIDS_KEY + idem(poison.run_id), 0, -1)]


def _check_poisoned(client: Client, poison: RunHandle, limit: int) -> list[int]:
    """The run failed as poison after exactly ``limit`` attempts, each in its own process."""
    r = client.store.redis
    head = poison.status()
    events = events_of(poison)
    assert head.phase is Phase.FAILED, f"{head.phase} {head.error}"
    assert head.error is not None and head.error.kind == "PoisonPhase", head.error
    assert head.error.step == 1
    key = idem(poison.run_id)
    # Every claim up to the limit ran the tool (and died in it); the claim past the limit did not.
    assert starts(r, key) == limit
    # Acting at version 3: start (1), think (2), then the call.
    field = attempts_field(3, call_claim(1, "call_0"))
    assert int(client.store.attempts(poison.run_id).get(field, 0)) == limit + 1
    pids = _attempt_pids(r, poison)
    assert len(pids) == limit and len(set(pids)) == limit, f"attempt pids {pids}"
    assert not any(is_running(pid) for pid in pids), f"an attempt's process survived its kill: {pids}"
    assert kinds(events)[: len(POISONED)] == POISONED and kinds(events)[-1] == "Failed"
    assert_terminal_matches_events(head, events)
    # Last, so everything above is known to hold when this fails: the dispatched call must be closed.
    assert_event_invariants(events)
    return pids


def test_poison_tool_in_prefork_children(cluster: Cluster, client: Client) -> None:
    """The poison kills a pool child each time; Celery replaces the child and redelivers the task
    (up to its retry limit), then the sweeper re-publishes it, until the attempt limit ends the run."""
    workers = cluster.start(2, concurrency=2)
    limit = Settings().max_phase_attempts
    poison, others = _submit(client)
    poison.wait(RUN_TIMEOUT_S)
    for run_id, agent in others:
        check_clean_run(client, run_id, agent)
    assert all(w.alive for w in workers), "a child's death must not take its worker down"
    pids = _check_poisoned(client, poison, limit)
    # Each attempt ran in a pool child, never in a worker's main process.
    mains = {pid for w in workers for pid in w.main_pids}
    assert not set(pids) & mains, f"an attempt ran in a worker's main process: {pids} {mains}"


def test_poison_tool_kills_whole_workers(cluster: Cluster, client: Client) -> None:
    """With the solo pool the poison takes the whole worker down each time; the test restarts dead
    workers, as a process supervisor would, until the run ends."""
    limit = 3
    workers = cluster.start(2, pool="solo", env={"WESICHAIN_MAX_PHASE_ATTEMPTS": str(limit)})
    poison, others = _submit(client)
    deadline = time.monotonic() + 2 * RUN_TIMEOUT_S
    handles = [poison] + [client.handle(run_id) for run_id, _ in others]
    while not all(h.status().terminal for h in handles):
        assert time.monotonic() < deadline, [(h.run_id, h.status().phase) for h in handles]
        cluster.revive()
        time.sleep(0.1)
    for run_id, agent in others:
        check_clean_run(client, run_id, agent)
    pids = _check_poisoned(client, poison, limit)
    # The solo pool runs the tool in the worker's main process: each attempt took a worker down.
    mains = {pid for w in workers for pid in w.main_pids}
    assert set(pids) <= mains, f"an attempt ran outside a worker's main process: {pids} {mains}"


assert "poison" not in SHAPES  # the bystanders' expectations do not cover the poison agent
