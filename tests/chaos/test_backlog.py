"""A queue backlog is not a crash: phases that wait in the broker far longer than the queued lease
are neither re-published nor failed as poison.

One tool slot serves many runs, so tool calls wait in the queue many times ``queued_lease_s``.
Every run must complete, and every task must be delivered exactly once: no duplicate publishes,
no sweeper re-publishes (their task ids carry an epoch suffix).

Short by default; ``WESICHAIN_BACKLOG_RUNS`` sets how many runs (the full-length check, about ten
minutes of backlog, is ``WESICHAIN_BACKLOG_RUNS=6000 pytest -m soak tests/chaos/test_backlog.py``).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import pytest

from producer.client import Client
from shared.state import Phase
from tests.chaos.support import Cluster, pending_task_ids, queue_key
from tests.delivery_probe import DELIVERIES_KEY
from tests.harness import wait_until

pytestmark = pytest.mark.chaos

RUNS = int(os.environ.get("WESICHAIN_BACKLOG_RUNS", "240"))
#: A queued phase is checked after this; the backlog makes tool calls wait many times longer.
QUEUED_LEASE = {"WESICHAIN_QUEUED_LEASE_S": "2"}


@pytest.mark.timeout(max(300, RUNS // 5))
def test_a_backlog_on_one_tool_slot_finishes_without_failures_or_duplicates(
    cluster: Cluster, client: Client
) -> None:
    probe = ("tests.delivery_probe",)
    cluster.start(1, pool="threads", concurrency=8, env=QUEUED_LEASE, include=probe, queues="wesichain.model")
    cluster.start(1, pool="solo", env=QUEUED_LEASE, include=probe, queues="wesichain.tools")
    r = client.store.redis
    started = time.monotonic()
    handles = [client.submit("backlog", "go") for _ in range(RUNS)]
    # The tool queue really backs up: at some point many calls wait at once.
    deepest = 0

    def all_done() -> bool:
        nonlocal deepest
        deepest = max(deepest, int(r.llen(queue_key("wesichain.tools")) or 0))
        return all(h.status().terminal for h in handles)

    wait_until(all_done, timeout=max(240, RUNS // 5), interval=0.5, what="every run of the backlog to end")
    waited = time.monotonic() - started
    heads = [h.status() for h in handles]
    outcomes = Counter(h.phase.value + (f":{h.error.kind}" if h.error is not None else "") for h in heads)
    assert outcomes == Counter({Phase.COMPLETED.value: RUNS}), outcomes
    assert deepest >= 20, f"the tool queue never backed up (deepest {deepest})"
    assert waited > 3 * 2, "the backlog did not outlast the queued lease"

    wait_until(lambda: not pending_task_ids(r), 60, what="the broker to drain")
    deliveries = {str(k): int(v) for k, v in r.hgetall(DELIVERIES_KEY).items()}
    republished = sorted(t for t in deliveries if re.search(r":e\d+$", t))
    twice = sorted(t for t, n in deliveries.items() if n > 1)
    # start, think, tool, observe, think: five tasks per run, each delivered once.
    assert republished == [], f"{len(republished)} phases were re-published by the sweeper: {republished[:5]}"
    assert twice == [], f"{len(twice)} tasks were delivered more than once: {twice[:5]}"
    assert len(deliveries) == 5 * RUNS
    for h in handles:
        assert h.status().epoch == 0
