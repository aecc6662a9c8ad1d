"""The operator view's own records (``shared/pool_records.py``): runs ended per minute, counted per tenant
and for the pool; dead worker starts, bounded, and the timeline markers they make."""

from __future__ import annotations

import fakeredis

from shared.keys import Keys
from shared.liveness import DeadStart, HeldClaim
from shared.pool import death_markers, known_queues
from shared.pool_records import MAX_DEATHS, Obituaries, Throughput
from shared.state import Phase, RunHead
from shared.timeline import Timeline


def _ended(run_id: str, tenant: str | None, phase: Phase, at: float) -> RunHead:
    return RunHead(
        run_id=run_id, agent="a", input="x", tenant=tenant, phase=phase, created_at=at - 5, updated_at=at
    )


def test_ends_are_counted_per_minute_per_tenant_and_for_the_pool() -> None:
    r = fakeredis.FakeRedis(decode_responses=True)
    counts = Throughput(r, Keys())
    minute = 1_700_000_040.0  # a minute's start
    counts.record(_ended("r1", "shop", Phase.COMPLETED, minute + 1))
    counts.record(_ended("r2", "shop", Phase.FAILED, minute + 59))
    counts.record(_ended("r3", "other", Phase.COMPLETED, minute + 61))
    counts.record(_ended("r4", "shop", Phase.THINKING, minute + 2))  # not an end: not counted
    shop = counts.series("shop", 3, minute + 70)
    assert [(m.minute, m.completed, m.failed, m.interrupted) for m in shop] == [
        (minute - 60, 0, 0, 0),
        (minute, 1, 1, 0),
        (minute + 60, 0, 0, 0),
    ]
    pool = counts.series("*", 2, minute + 70)
    assert [(m.completed, m.failed) for m in pool] == [(1, 1), (1, 0)]
    assert counts.series("nobody", 2, minute + 70)[1].completed == 0
    assert len(counts.series("*", 10**6, minute)) == 24 * 60  # bounded by what is kept


def test_a_dead_start_is_remembered_bounded_and_marks_the_runs_it_held() -> None:
    r = fakeredis.FakeRedis(decode_responses=True)
    book = Obituaries(r, Keys())
    held = [HeldClaim("run-a", "running", "h1:11", 3), HeldClaim("run-b", "running", "h1:11,h1:12", 1)]
    dead = DeadStart("h1:10:abcd", 1_700_000_000_000, held)
    book.record(dead)
    book.record(dead)  # a sweep retried: still one death
    (death,) = book.recent()
    assert death.at == 1_700_000_000.0 and death.claims == [("run-a", "h1:11"), ("run-b", "h1:11,h1:12")]
    (marker,) = death_markers("run-a", book.between(1_699_999_999, 1_700_000_001))
    assert (marker.kind, marker.lane, marker.at) == ("worker_died", "h1:11", 1_700_000_000.0)
    (unsure,) = death_markers("run-b", [death])
    assert unsure.lane is None  # which process held it was not known yet
    assert death_markers("run-c", [death]) == []
    assert book.between(1_700_000_001, 1_700_000_100) == []
    for i in range(MAX_DEATHS + 5):
        book.record(DeadStart(f"h2:{i}:x", 1_700_000_000_000 + i, []))
    assert r.zcard(Keys().worker_deaths()) == MAX_DEATHS


def test_a_timeline_is_given_the_deaths_within_its_span() -> None:
    from shared.pool import with_deaths

    r = fakeredis.FakeRedis(decode_responses=True)
    book = Obituaries(r, Keys())
    book.record(DeadStart("h1:10:abcd", 1_700_000_005_000, [HeldClaim("run-a", "running", "h1:11", 1)]))
    book.record(DeadStart("h1:20:ef01", 1_700_009_000_000, [HeldClaim("run-a", "running", "h1:21", 1)]))
    timeline = Timeline(
        run_id="run-a", agent="a", status="completed", start=1_700_000_000, end=1_700_000_010,
        lanes=[], bars=[], waits=[], markers=[],
    )  # fmt: skip
    marked = with_deaths(timeline, book, now_s=1_700_010_000)
    assert [m.kind for m in marked.markers] == ["worker_died"]  # the later death is past its end


def test_known_queues_add_tenants_namespaces_to_the_default_ones() -> None:
    defaults = ["wesichain.model", "wesichain.tools", "wesichain.callbacks"]
    assert known_queues([], ["blue"]) == [*defaults, "blue.callbacks", "blue.model", "blue.tools"]
