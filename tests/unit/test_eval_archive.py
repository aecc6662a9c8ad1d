"""Completed evals moved to the archive (SQLite here; the same queries run on PostgreSQL): written
once and verified before Redis lets go of them, then read back through the eval store as if they
were still in Redis; cancelled and running evals stay."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from shared.archive import Archive, open_archive
from shared.evals.annotations import AnnotationInput, AnnotationStore
from shared.evals.archiving import EvalArchiver
from shared.evals.dataset import Case
from shared.evals.errors import EvalNotFound
from shared.evals.outcome import CaseResult, Score
from shared.evals.spec import parse_spec
from shared.evals.store import EvalStore, Item, run_id_of
from shared.keys import Keys
from tests.archive_support import eval_keys

SPEC = parse_spec(
    {
        "name": "s",
        "dataset": "d.jsonl",
        "variants": [{"name": "a", "agent": "x"}],
        "scorers": [{"kind": "exact"}],
        "repeats": 2,
    }
)
CASES = [Case(id=f"c{i}", input=f"q{i}", expected=str(i)) for i in range(3)]


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Archive]:
    opened = open_archive(f"sqlite:///{tmp_path / 'archive.db'}")
    yield opened
    opened.close()


def stores(archive: Archive) -> tuple[EvalStore, EvalStore]:
    """The store without an archive (what the pool uses) and one reading through to it."""
    client = fakeredis.FakeRedis(decode_responses=True)
    return EvalStore(client, Keys(), 3600), EvalStore(client, Keys(), 3600, archive=archive)


def complete(store: EvalStore, eval_id: str, tenant: str | None = None) -> list[CaseResult]:
    assert store.create(eval_id, SPEC, CASES, "d.jsonl", tenant=tenant)
    results = []
    for item in store.acquire(eval_id, SPEC, 100, lease_s=10).items:
        score = Score(name="exact", value=1.0, passed=True, explanation="equal")
        row = CaseResult(
            item=str(item),
            variant="a",
            case_id=f"c{item.case}",
            repeat=item.repeat,
            run_id=run_id_of(eval_id, item),
            status="completed",
            passed=True,
            answer=str(item.case),
            input_tokens=5,
            scores=[score],
        )
        assert store.record(eval_id, item, row)
        results.append(row)
    assert store.meta(eval_id).status == "completed"
    return results


def test_a_completed_eval_moves_to_the_archive_and_reads_the_same(archive: Archive) -> None:
    redis_only, store = stores(archive)
    rows = complete(redis_only, "e1")
    assert eval_keys(redis_only, "e1") == 4  # meta, cases, results, counts (the rest are empty)
    before = (store.meta("e1"), store.counts("e1", 1), store.cases("e1"), store.recorded("e1"))
    # Not yet: it completed after the cutoff.
    assert EvalArchiver(redis_only, archive).run_once(time.time() - 3600) == (0, 0)
    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (1, 0)
    assert eval_keys(redis_only, "e1") == 0 and redis_only.list_evals() == []
    assert redis_only.active() == []
    with pytest.raises(EvalNotFound):
        redis_only.meta("e1")  # without the archive it is gone
    assert (store.meta("e1"), store.counts("e1", 1), store.cases("e1"), store.recorded("e1")) == before
    assert sorted(store.results("e1"), key=lambda r: r.item) == sorted(rows, key=lambda r: r.item)
    assert store.result("e1", Item(0, 1, 1)) == next(r for r in rows if r.item == "0:1:1")
    assert store.case("e1", 2) == CASES[2]
    assert store.list_evals() == ["e1"]
    # The same id is not created again: it exists, archived.
    assert not store.create("e1", SPEC, CASES, "d.jsonl")
    # A second pass finds nothing to do.
    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (0, 0)


def test_a_pass_that_died_after_writing_is_finished_by_the_next(archive: Archive) -> None:
    redis_only, store = stores(archive)
    complete(redis_only, "e2")
    archiver = EvalArchiver(redis_only, archive)
    record = archiver._read("e2")
    assert record is not None and archive.put_eval(record) and not archive.put_eval(record)
    assert redis_only.list_evals() == ["e2"]  # still in Redis: the pass died before deleting
    assert store.list_evals() == ["e2"]  # listed once
    assert archiver.run_once(time.time() + 1) == (0, 1)
    assert redis_only.list_evals() == [] and store.meta("e2").status == "completed"


def test_running_and_cancelled_evals_stay_in_redis(archive: Archive) -> None:
    redis_only, store = stores(archive)
    assert redis_only.create("running", SPEC, CASES, "d.jsonl")
    assert redis_only.create("cancelled", SPEC, CASES, "d.jsonl")
    redis_only.set_status("cancelled", "cancelled", ("running",))
    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (0, 0)
    assert sorted(redis_only.list_evals()) == ["cancelled", "running"]
    assert archive.list_evals(10) == []


def test_an_archived_eval_keeps_its_reviews(archive: Archive) -> None:
    redis_only, store = stores(archive)
    complete(redis_only, "e4", tenant="acme")
    pool = AnnotationStore(redis_only.redis, Keys(), 3600)  # no archive: Redis only
    reader = AnnotationStore(redis_only.redis, Keys(), 3600, archive=archive)
    pool.put("acme", "e4", "0:0:0", AnnotationInput(label="fail", note="first look"), "key-1")
    pool.put("acme", "e4", "0:0:0", AnnotationInput(label="pass", scores={"exact": 0.5}), "key-2")
    pool.put("acme", "e4", "0:2:1", AnnotationInput(label="fail", note="<b>wrong</b>"), "key-1")
    labels, history = pool.latest("acme", "e4"), pool.history("acme", "e4")
    assert [(a.item, a.label) for a in history] == [("0:0:0", "fail"), ("0:0:0", "pass"), ("0:2:1", "fail")]

    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (1, 0)
    # Moved with the eval: Redis holds none of it, the archive answers the same.
    assert pool.latest("acme", "e4") == {} and pool.history("acme", "e4") == []
    assert reader.latest("acme", "e4") == labels and reader.history("acme", "e4") == history
    # A review after the archive took the eval: the newer label wins, the log goes on.
    later = reader.put("acme", "e4", "0:2:1", AnnotationInput(label="pass"), "key-3")
    assert reader.latest("acme", "e4") == {**labels, "0:2:1": later}
    assert reader.history("acme", "e4") == [*history, later]
    assert reader.history("acme", "e4", limit=2) == [history[-1], later]


def test_reviews_left_in_redis_by_a_dead_archiver_are_not_read_twice(archive: Archive) -> None:
    redis_only, _ = stores(archive)
    complete(redis_only, "e5")
    reviews = AnnotationStore(redis_only.redis, Keys(), 3600, archive=archive)
    said = reviews.put(None, "e5", "0:1:0", AnnotationInput(label="fail"), "key-1")
    record = EvalArchiver(redis_only, archive)._read("e5")
    assert record is not None and archive.put_eval(record)  # died before deleting anything
    assert reviews.latest(None, "e5") == {"0:1:0": said} and reviews.history(None, "e5") == [said]
    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (0, 1)
    assert reviews.history(None, "e5") == [said]


def test_a_tenants_archived_evals_are_listed_however_many_others_have(archive: Archive) -> None:
    """The archive's listing of a tenant's evals reads its own: it once merged in the newest of
    every tenant's, so a tenant whose evals were older than others' newest saw none of its own."""
    redis_only, store = stores(archive)
    complete(redis_only, "acme-1", tenant="acme")
    complete(redis_only, "mine", tenant=None)  # the operator's
    for n in range(12):
        complete(redis_only, f"rival-{n}", tenant="rival")
    assert EvalArchiver(redis_only, archive).run_once(time.time() + 1) == (14, 0)
    assert redis_only.tenant_evals("acme") == [] and redis_only.list_evals() == []  # all archived
    assert store.tenant_evals("acme", 1) == ["acme-1"]
    assert store.tenant_evals(None, 1) == ["mine"]
    assert store.tenant_evals("rival", 2) == ["rival-11", "rival-10"]
    assert store.tenant_evals("nobody") == []
    assert len(store.list_evals(100)) == 14  # the operator's listing of every tenant's
