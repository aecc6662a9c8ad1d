"""Listing runs from the indexes the scripts keep: per tenant, filtered, newest first, paged across
every shard, with statuses that follow the runs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from shared import fsm
from shared.llm.base import Usage
from shared.messages import SystemMessage, UserMessage
from shared.settings import Settings
from shared.state import Phase, RunHead
from shared.store import Claim, PhaseClaim, RunStore
from shared.tasks import start_task, task_for
from tests.harness import RedisServer


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RunStore]:
    client = redis_server.client()
    yield RunStore(client, Settings(prefix=f"ls-{uuid.uuid4().hex[:8]}:", retention_s=3600, shards=8))
    client.close()


def create(store: RunStore, agent: str, tenant: str | None, thread: str | None = None) -> RunHead:
    head = RunHead.new_idle(uuid.uuid4().hex, agent, "q", tenant=tenant, thread_id=thread)
    assert store.create(head, [start_task(head.run_id)])
    return head


def advance(store: RunStore, head: RunHead, to: str) -> None:
    """Move a created run to ``to``: running (thinking) or completed."""
    claim = store.claim_phase(PhaseClaim(head.run_id, 1, Phase.IDLE, 0, 0), "h:1")
    assert isinstance(claim, Claim)
    idle = fsm.Idle(head)
    t = idle.start(
        [SystemMessage(content="s"), UserMessage(content="q")], agent_version="1", model="m:x", max_steps=5
    )
    assert store.commit(head, t.head, claim.ref, t.messages, t.events, task_for(t.head)).status == "committed"
    if to == "completed":
        claim2 = store.claim_phase(PhaseClaim(head.run_id, 2, Phase.THINKING, 0, 1), "h:1")
        assert isinstance(claim2, Claim)
        done = t.to.complete("ok", Usage())
        assert store.commit(t.head, done.head, claim2.ref, done.messages, done.events).status == "committed"


def all_pages(store: RunStore, tenant: str | None, limit: int, **filters: str) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        page = store.list_runs(tenant, cursor=cursor, limit=limit, **filters)  # type: ignore[arg-type]
        pages.append([h.run_id for h in page.runs])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor


def test_every_run_of_a_tenant_once_newest_first_across_pages(store: RunStore) -> None:
    made = [create(store, "a" if i % 3 else "b", "acme") for i in range(130)]
    create(store, "a", "other")
    create(store, "a", None)
    pages = all_pages(store, "acme", limit=25)
    assert [len(p) for p in pages[:-1]] == [25] * (len(pages) - 1)
    listed = [run_id for page in pages for run_id in page]
    assert sorted(listed) == sorted(h.run_id for h in made), "a run was missed or listed twice"
    created = {h.run_id: store.redis.hget(store.keys.run(h.run_id), "created") for h in made}
    scores = [int(created[r] or 0) for r in listed]
    assert scores == sorted(scores, reverse=True), "not newest first"


def test_filters_by_agent_status_and_thread(store: RunStore) -> None:
    a = [create(store, "alpha", "acme", thread="t1") for _ in range(6)]
    b = [create(store, "beta", "acme", thread="t2") for _ in range(4)]
    for head in a[:2]:
        advance(store, head, "completed")
    advance(store, a[2], "running")
    ids = lambda heads: sorted(h.run_id for h in heads)  # noqa: E731
    flat = lambda pages: sorted(r for p in pages for r in p)  # noqa: E731
    assert flat(all_pages(store, "acme", 3, agent="beta")) == ids(b)
    assert flat(all_pages(store, "acme", 3, thread_id="t1")) == ids(a)
    assert flat(all_pages(store, "acme", 3, status="completed")) == ids(a[:2])
    assert flat(all_pages(store, "acme", 3, status="running")) == ids(a[2:3])
    assert flat(all_pages(store, "acme", 3, status="queued")) == ids(a[3:] + b)
    assert flat(all_pages(store, "acme", 3, agent="alpha", status="queued")) == ids(a[3:])
    assert flat(all_pages(store, "acme", 3, agent="nobody")) == []


def test_tenants_see_only_their_own(store: RunStore) -> None:
    mine = [create(store, "a", "acme") for _ in range(5)]
    theirs = [create(store, "a", "globex") for _ in range(5)]
    assert sorted(h.run_id for h in store.list_runs("acme", limit=50).runs) == sorted(h.run_id for h in mine)
    assert sorted(h.run_id for h in store.list_runs("globex", limit=50).runs) == sorted(
        h.run_id for h in theirs
    )
    assert store.list_runs("initech", limit=50).runs == []


def test_in_flight_counts_follow_the_runs(store: RunStore) -> None:
    heads = [create(store, "a", "acme") for _ in range(4)]
    assert store.inflight("acme") == 4
    advance(store, heads[0], "completed")
    advance(store, heads[1], "running")
    assert store.inflight("acme") == 3
    assert store.inflight("globex") == 0


def test_since_and_a_bad_cursor(store: RunStore) -> None:
    from shared.errors import InvalidRequest

    create(store, "a", "acme")
    assert store.list_runs("acme", since=4_000_000_000).runs == []  # the year 2096
    with pytest.raises(InvalidRequest, match="bad listing cursor"):
        store.list_runs("acme", cursor="not-a-cursor")


def test_index_entries_older_than_the_retention_are_trimmed(store: RunStore) -> None:
    heads = [create(store, "a", "acme") for _ in range(3)]
    removed = sum(
        store.trim_indexes(shard, cutoff_ms=10_000_000_000_000) for shard in range(store.keys.shards)
    )
    assert removed >= 3 * 3  # all, agent and status indexes of each run
    assert store.list_runs("acme").runs == []
    assert all(store.redis.scard(store.keys.indexes(s)) == 0 for s in range(store.keys.shards))
    assert store.load(heads[0].run_id) is not None  # only the indexes, not the runs


def test_paging_merges_shards_with_more_entries_than_one_round_reads(redis_server: RedisServer) -> None:
    """Two shards of about 150 runs each: every round reads 64 per shard, and the merge must still
    give each run once, in order, whatever the page size."""
    client = redis_server.client()
    store = RunStore(client, Settings(prefix=f"ls2-{uuid.uuid4().hex[:8]}:", shards=2))
    try:
        made = {create(store, "a", "acme").run_id for _ in range(300)}
        for limit in (1, 37, 64, 200):
            listed = [r for page in all_pages(store, "acme", limit) for r in page]
            assert len(listed) == 300 and set(listed) == made, limit
            scores = [int(client.hget(store.keys.run(r), "created") or 0) for r in listed]
            assert scores == sorted(scores, reverse=True), limit
    finally:
        client.close()


@pytest.mark.parametrize("per_ms", [3, 100])
def test_paging_is_exact_when_many_runs_share_a_millisecond(redis_server: RedisServer, per_ms: int) -> None:
    """Runs created in the same millisecond on every shard (a burst, or more than one read batch of
    them): each is listed once, ordered by (time, id), whatever the page size."""
    client = redis_server.client()
    store = RunStore(client, Settings(prefix=f"ls3-{uuid.uuid4().hex[:8]}:", shards=3))
    try:
        made = [create(store, "a", "acme").run_id for _ in range(300)]
        # Give groups of ``per_ms`` runs one shared creation millisecond, as a burst would.
        for i, run_id in enumerate(made):
            client.zadd(store.keys.index_of(run_id, "acme"), {run_id: 1_000_000 + i // per_ms}, xx=True)
        expected = sorted(((1_000_000 + i // per_ms, r) for i, r in enumerate(made)), reverse=True)
        for limit in (1, 7, 64, 200, 500):
            listed = [r for page in all_pages(store, "acme", limit) for r in page]
            assert listed == [r for _, r in expected], limit
    finally:
        client.close()
