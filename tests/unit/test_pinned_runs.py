"""Counting the runs pinned to an agent version for one tenant reads that tenant's runs only."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from shared.state import RunHead
from shared.tasks import start_task
from shared.versions import PinnedRuns
from tests.harness import RedisServer
from tests.store_support import make_store


def test_a_tenants_pinned_count_reads_its_own_runs_only(redis_server: RedisServer) -> None:
    store = make_store(redis_server.client())
    pinned = PinnedRuns(store)
    agent = f"a-{uuid.uuid4().hex[:6]}"

    def live(tenant: str) -> str:
        head = RunHead.new_idle(uuid.uuid4().hex, agent, "q", tenant=tenant)
        assert store.create(head, [start_task(head.run_id)])
        pinned.pin(head.run_id, agent, "1", tenant)
        return head.run_id

    mine = [live("acme")]
    # Another tenant's runs, however many (and whose name extends this one's), are not read.
    theirs = [live("acme:eu") for _ in range(3)]
    asked: list[str] = []
    load_many = store.load_many

    def recorded(run_ids: Sequence[str]) -> list[RunHead | None]:
        asked.extend(run_ids)
        return load_many(run_ids)

    store.load_many = recorded  # type: ignore[method-assign]
    count = pinned.count(agent, "1", "acme")
    assert (count.active, count.parked, asked) == (1, 0, mine)
    # The operator's count is every tenant's.
    assert pinned.count(agent, "1").active == 1 + len(theirs)
