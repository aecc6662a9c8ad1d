"""Listing a tenant's pipeline runs, on the in-process Redis stand-in: newest first, paged by a
cursor (ties at one millisecond included), filtered, tenant-scoped, expired ones dropped."""

from __future__ import annotations

import time

import fakeredis
import pytest

from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.pipeline.store import PipelineStore

BASE = int(time.time() * 1000) - 60_000


def store() -> PipelineStore:
    return PipelineStore(fakeredis.FakeRedis(decode_responses=True), Keys(), retention_s=3600)


def create(
    s: PipelineStore, pipeline_id: str, tenant: str | None, created_ms: int, name: str = "chain"
) -> None:
    assert s.create(pipeline_id, name, "in", tenant)
    # Pin the creation time (ms after BASE, within the retention), so that the order and the ties
    # are the test's own.
    s.redis.zadd(s.keys.pipes_index_of(tenant), {pipeline_id: BASE + created_ms})


def ids(page: object) -> list[str]:
    return [m.pipeline_id for m in page.pipelines]  # type: ignore[attr-defined]


def test_pages_go_newest_first_through_ties_and_end_with_no_cursor() -> None:
    s = store()
    # Three share one millisecond: the cursor must go through them, not skip or repeat one.
    for i, ms in enumerate([1000, 2000, 2000, 2000, 3000]):
        create(s, f"p{i}", "acme", ms)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = s.list_pipelines("acme", cursor=cursor, limit=2)
        seen += ids(page)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ["p4", "p3", "p2", "p1", "p0"] and pages == 3


def test_a_tenant_sees_only_its_own_and_filters_combine() -> None:
    s = store()
    create(s, "a1", "acme", 1000, name="chain")
    create(s, "a2", "acme", 2000, name="fanout")
    create(s, "b1", "globex", 3000, name="chain")
    create(s, "n1", None, 4000, name="chain")
    s.redis.hset(s.keys.pipe_meta("a1"), "status", "completed")
    assert ids(s.list_pipelines("acme")) == ["a2", "a1"]
    assert ids(s.list_pipelines("globex")) == ["b1"]
    assert ids(s.list_pipelines(None)) == ["n1"]
    assert ids(s.list_pipelines("acme", name="chain")) == ["a1"]
    assert ids(s.list_pipelines("acme", status="running")) == ["a2"]
    assert ids(s.list_pipelines("acme", name="chain", status="running")) == []
    assert ids(s.list_pipelines("acme", since=(BASE + 1500) / 1000)) == ["a2"]
    summary = s.list_pipelines("acme").pipelines[1]
    assert (summary.name, summary.status, summary.tenant, summary.seq) == ("chain", "completed", "acme", -1)


def test_an_expired_pipeline_run_leaves_the_index_when_met() -> None:
    s = store()
    create(s, "gone", "acme", 1000)
    create(s, "kept", "acme", 2000)
    s.redis.delete(s.keys.pipe_meta("gone"))
    assert ids(s.list_pipelines("acme")) == ["kept"]
    assert s.redis.zrange(s.keys.pipes_index_of("acme"), 0, -1) == ["kept"]


def test_a_page_reads_a_bounded_part_of_the_index() -> None:
    s = store()
    for i in range(10):
        create(s, f"p{i}", "acme", 1000 + i, name="chain" if i == 0 else "other")
    # Only the oldest is a "chain": a scan bound of 4 entries ends the page early, with a cursor.
    first = s.list_pipelines("acme", name="chain", max_scan=4)
    assert first.pipelines == [] and first.next_cursor == f"{BASE + 1006}.p6"
    rest = s.list_pipelines("acme", name="chain", cursor=first.next_cursor, max_scan=100)
    assert ids(rest) == ["p0"] and rest.next_cursor is None


def test_a_bad_cursor_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="bad listing cursor"):
        store().list_pipelines("acme", cursor="x.y")


def test_a_tenant_index_loses_entries_past_the_retention_as_new_ones_come_in() -> None:
    s = store()
    create(s, "old", "acme", -2 * 3600 * 1000)  # created two hours ago; the retention is one
    create(s, "new", "acme", 0)
    assert s.redis.zrange(s.keys.pipes_index_of("acme"), 0, -1) == ["new"]
    assert 0 < s.redis.pttl(s.keys.pipes_index_of("acme")) <= 2 * 3600 * 1000
