"""The eval's Redis scripts on the in-process Redis stand-in: the cap, results once, completion."""

from __future__ import annotations

import fakeredis
import pytest

from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult
from shared.evals.spec import parse_spec
from shared.evals.store import EvalStore, Item, Recorded, run_id_of
from shared.keys import Keys


@pytest.fixture
def store() -> EvalStore:
    return EvalStore(fakeredis.FakeRedis(decode_responses=True), Keys(prefix="t:"), retention_s=3600)


SPEC = parse_spec(
    {
        "name": "s",
        "dataset": "d.jsonl",
        "variants": [{"name": "a", "agent": "x"}, {"name": "b", "agent": "x"}],
        "scorers": [{"kind": "exact"}],
        "repeats": 2,
        "concurrency": 3,
        "budget": {"tokens": 100},
    }
)
CASES = [Case(id=f"c{i}", input=f"q{i}") for i in range(3)]


def result(item: Item, passed: bool = True, tokens: int = 10) -> CaseResult:
    return CaseResult(
        item=str(item),
        variant="ab"[item.variant],
        case_id=f"c{item.case}",
        repeat=item.repeat,
        run_id=run_id_of("e", item),
        status="completed",
        passed=passed,
        input_tokens=tokens,
    )


def test_an_eval_is_created_once_with_its_work_in_run_order(store: EvalStore) -> None:
    assert store.create("e", SPEC, CASES, "d.jsonl")
    assert not store.create("e", SPEC, CASES, "d.jsonl")
    meta = store.meta("e")
    assert (meta.status, meta.items, meta.cases, meta.spec) == ("running", 12, 3, SPEC)
    assert store.pending("e") == 12 and store.active() == ["e"] and store.list_evals() == ["e"]
    # Variants interleave, then cases, then repeats: every variant progresses alike.
    got = store.acquire("e", SPEC, 3, lease_s=10)
    assert (got.status, got.items) == ("ok", [Item(0, 0, 0), Item(1, 0, 0), Item(0, 1, 0)])


def test_the_cap_holds_and_a_result_is_recorded_once(store: EvalStore) -> None:
    store.create("e", SPEC, CASES, "d.jsonl")
    first = store.acquire("e", SPEC, 50, lease_s=10)
    assert len(first.items) == 3 and store.acquire("e", SPEC, 50, lease_s=10).status == "full"
    store.bind("e", first.items[0])
    assert store.record("e", first.items[0], result(first.items[0]))
    assert not store.record("e", first.items[0], result(first.items[0], passed=False))
    assert store.result("e", first.items[0]) == result(first.items[0]).model_copy(
        update={"scored_at": store.result("e", first.items[0]).scored_at}  # type: ignore[union-attr]
    )
    (a, b) = store.counts("e", 2)
    assert (a.done, a.passed, a.tokens, b.done) == (1, 1, 10, 0)
    assert {i for i, _ in store.slots("e")} == set(first.items[1:])
    assert store.acquire("e", SPEC, 50, lease_s=10).items == [Item(1, 1, 0)]  # one slot came back


def test_a_recorded_result_says_whether_items_wait_to_start(store: EvalStore) -> None:
    # A scorer pumps after recording only when items wait: with every item taken there is none.
    spec = parse_spec(
        {"name": "s", "dataset": "d.jsonl", "variants": [{"agent": "x"}], "scorers": [{"kind": "exact"}]}
    ).model_copy(update={"concurrency": 2})
    store.create("e", spec, CASES, "d.jsonl")
    first, second = store.acquire("e", spec, 50, lease_s=10).items
    assert store.record("e", first, result(first)) is Recorded.ITEMS_PENDING  # the third waits
    (third,) = store.acquire("e", spec, 50, lease_s=10).items
    assert store.record("e", second, result(second)) is Recorded.NONE_PENDING
    assert store.record("e", second, result(second)) is Recorded.DUPLICATE
    assert store.record("e", third, result(third)) is Recorded.NONE_PENDING
    assert store.meta("e").status == "completed"


def test_claims_of_scoring_are_exclusive_until_they_expire(store: EvalStore) -> None:
    store.create("e", SPEC, CASES, "d.jsonl")
    item = Item(0, 0, 0)
    status, case = store.claim_scoring("e", item, lease_s=10)
    assert status == "ok" and case == store.case("e", item.case)
    assert store.claim_scoring("e", item, lease_s=10) == ("busy", None)
    store.record("e", item, result(item))
    assert store.claim_scoring("e", item, lease_s=10) == ("done", None)


def test_a_budget_stops_new_runs_and_cancel_resume_move_the_status(store: EvalStore) -> None:
    store.create("e", SPEC, CASES, "d.jsonl")
    (item,) = store.acquire("e", SPEC, 1, lease_s=10).items
    store.record("e", item, result(item, tokens=100))
    assert store.acquire("e", SPEC, 1, lease_s=10).status == "budget"
    assert store.meta("e").status == "budget_exhausted" and store.active() == []
    assert store.set_status("e", "running", ("cancelled", "budget_exhausted")) == "budget_exhausted"
    assert store.active() == ["e"]
    assert store.set_status("e", "cancelled", ("running",)) == "running"
    assert store.acquire("e", SPEC, 1, lease_s=10).status == "stopped"


def test_a_completed_eval_expires_after_the_retention(store: EvalStore) -> None:
    spec = SPEC.model_copy(update={"budget": None, "concurrency": 100})
    store.create("e", spec, CASES, "d.jsonl")
    items = store.acquire("e", spec, 100, lease_s=10).items
    assert len(items) == 12
    for item in items:
        store.record("e", item, result(item))
    meta = store.meta("e")
    assert meta.status == "completed" and meta.finished_at is not None and store.active() == []
    ttl = store.redis.pttl(store.keys.eval_results("e"))
    assert 3_500_000 < ttl <= 3_600_000 and 0 < store.redis.pttl(store.keys.eval_meta("e")) <= 3_600_000
