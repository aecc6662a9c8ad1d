"""The live runs pinned to an agent version are counted a page at a time, on a real redis-server:
each page of the version's set is read with one pipelined round trip (never a read per run), runs
that ended are dropped from the set, and a tenant counts only its own."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from shared.llm.base import Usage
from shared.settings import Settings
from shared.state import RunHead
from shared.store import RunStore
from shared.versions import PinnedRuns
from tests.conftest import _need_redis
from tests.harness import RedisServer
from worker.testing.runs import CALLS, commit, ended_run, started

LIVE = 1100  # three pages of PinnedRuns.CHUNK


@pytest.fixture
def store() -> Iterator[RunStore]:
    _need_redis()
    server = RedisServer().start()
    try:
        yield RunStore(server.client(), Settings(redis_url=server.url))
    finally:
        server.cleanup()


def test_pinned_runs_are_counted_a_page_per_round_trip(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = PinnedRuns(store)
    for _ in range(LIVE):
        head = started(store).head
        pinned.pin(head.run_id, "agent", "1")
    thinking = started(store)
    park = thinking.park("asking", CALLS, Usage(), ["add"])
    commit(store, thinking, park)
    pinned.pin(thinking.head.run_id, "agent", "1")
    ended = [ended_run(store) for _ in range(3)]
    for run_id in ended:
        pinned.pin(run_id, "agent", "1")

    def no_single_reads(run_id: str) -> RunHead | None:
        raise AssertionError("a pinned run was read on its own")

    pages: list[int] = []
    batched = store.load_many

    def counted(run_ids: Sequence[str]) -> list[RunHead | None]:
        pages.append(len(run_ids))
        return batched(run_ids)

    monkeypatch.setattr(store, "load", no_single_reads)
    monkeypatch.setattr(store, "load_many", counted)
    count = pinned.count("agent", "1")
    assert (count.active, count.parked) == (LIVE, 1)
    assert sum(pages) == LIVE + 1 + len(ended) and len(pages) >= 3
    assert max(pages) <= 2 * PinnedRuns.CHUNK  # SSCAN's count is a hint: a page stays near it
    # The ended runs left the version's set; a second count reads only the live ones.
    members = {
        m.decode() if isinstance(m, bytes) else str(m)
        for m in store.redis.smembers(store.keys.pinned("agent", "1"))
    }
    assert not members & set(ended) and len(members) == LIVE + 1
    # Runs without a tenant are no tenant's.
    assert pinned.count("agent", "1", tenant="acme").active == 0


def test_load_many_answers_in_order_and_none_for_runs_not_in_redis(store: RunStore) -> None:
    first, second = started(store).head, started(store).head
    heads = store.load_many([first.run_id, "no-such-run", second.run_id])
    assert [h.run_id if h is not None else None for h in heads] == [first.run_id, None, second.run_id]
    assert store.load_many([]) == []
