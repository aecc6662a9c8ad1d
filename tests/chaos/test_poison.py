"""A poison tool that SIGKILLs whatever process runs it, every time.

Each claim of the call counts an attempt; past ``max_phase_attempts`` the next claim fails the run
with ``PoisonPhase`` instead of running the tool again. The tool is retry-safe, so every claim up to
the limit runs it (its outcome is never "unknown": it is re-run until the limit). Runs submitted at
the same time on the same workers complete untouched.
"""

from __future__ import annotations

import time

import pytest

from producer.client import Client, RunHandle
from shared.settings import Settings
from shared.state import Phase
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    assert_event_invariants,
    assert_terminal_matches_events,
    events_of,
    idem,
    kinds,
    starts,
)
from tests.chaos.test_duplicates import SHAPES, check_clean_run
from tests.harness import wait_until

pytestmark = pytest.mark.chaos

BYSTANDERS = ["one_hop", "chain", "parallel", "one_hop", "chain", "one_hop"]
POISONED = ["RunStarted", "StepStarted", "ModelResponded", "ToolDispatched"]


def _submit(client: Client) -> tuple[RunHandle, list[tuple[str, str]]]:
    poison = client.submit("poison", "go")
    others = [(client.submit(agent, "go").run_id, agent) for agent in BYSTANDERS]
    return poison, others


def _check_poisoned(client: Client, poison: RunHandle, limit: int) -> None:
    r = client.store.redis
    head = poison.status()
    events = events_of(poison)
    assert head.phase is Phase.FAILED, f"{head.phase} {head.error}"
    assert head.error is not None and head.error.kind == "PoisonPhase", head.error
    assert head.error.step == 1
    key = idem(poison.run_id)
    # Every claim up to the limit ran the tool (and died in it); the claim past the limit did not.
    assert starts(r, key) == limit
    assert int(r.hget(client.store.keys.attempts(poison.run_id), "1:tool:call_0") or 0) == limit + 1
    assert kinds(events)[: len(POISONED)] == POISONED and kinds(events)[-1] == "Failed"
    assert_terminal_matches_events(head, events)
    # Last, so everything above is known to hold when this fails: the dispatched call must be closed.
    assert_event_invariants(events)


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

    def lost() -> int:
        return sum(w.log().count("exited with 'signal 9 (SIGKILL)'") for w in workers)

    # The pool notices a dead child up to seconds later (the run may have ended meanwhile).
    wait_until(lambda: lost() >= limit, 20, what=f"{limit} dead pool children to be noticed")
    assert lost() == limit, f"{lost()} pool children were killed, expected one per attempt ({limit})"
    _check_poisoned(client, poison, limit)


def test_poison_tool_kills_whole_workers(cluster: Cluster, client: Client) -> None:
    """With the solo pool the poison takes the whole worker down each time; the test restarts dead
    workers, as a process supervisor would, until the run ends."""
    limit = 3
    workers = cluster.start(2, pool="solo", env={"WESICHAIN_MAX_PHASE_ATTEMPTS": str(limit)})
    poison, others = _submit(client)
    deaths = 0
    deadline = time.monotonic() + 2 * RUN_TIMEOUT_S
    handles = [poison] + [client.handle(run_id) for run_id, _ in others]
    while not all(h.status().terminal for h in handles):
        assert time.monotonic() < deadline, [(h.run_id, h.status().phase) for h in handles]
        deaths += len(cluster.revive())
        time.sleep(0.1)
    deaths += sum(not w.alive for w in workers)
    for run_id, agent in others:
        check_clean_run(client, run_id, agent)
    assert deaths == limit, f"{deaths} workers died, expected one per attempt ({limit})"
    _check_poisoned(client, poison, limit)


assert "poison" not in SHAPES  # the bystanders' expectations do not cover the poison agent
