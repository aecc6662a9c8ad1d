"""Search queries (parsing, the index they read, matching), the declared metadata indexes, the
search cursor, and the bulk job store's once-only records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from shared.bulk import BulkOutcome, BulkStore
from shared.errors import ConfigError, InvalidRequest, RunErrorInfo
from shared.search import SearchQuery, UndeclaredSearchKey
from shared.search_index import MAX_SEARCH_VALUE_CHARS, index_dimensions
from shared.settings import Settings
from shared.state import Phase, RunHead
from shared.store import RunStore
from shared.tasks import start_task
from shared.timetravel import last_good_checkpoint
from tests.harness import RedisServer


def head(**fields: object) -> RunHead:
    run = RunHead.new_idle(uuid.uuid4().hex, "triage", "q", tenant="acme")
    return run.model_copy(update=fields)


def test_a_query_refuses_unknown_fields_bad_keys_and_unbounded_values() -> None:
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"tenant": "other"})
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"metadata": {"bad key": "x"}})
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"metadata": {"k": "x" * (MAX_SEARCH_VALUE_CHARS + 1)}})
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"metadata": {f"k{i}": "x" for i in range(9)}})
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"status": "sleeping"})
    with pytest.raises(ValidationError):
        SearchQuery.model_validate({"since": -1})
    assert SearchQuery.model_validate({"metadata": {"customer": "acme"}}).metadata == {"customer": "acme"}


def test_undeclared_keys_are_named() -> None:
    query = SearchQuery(metadata={"customer": "a", "note": "b", "zone": "c"})
    with pytest.raises(UndeclaredSearchKey) as refused:
        query.check_declared(["customer"])
    assert refused.value.keys == ["note", "zone"]
    assert isinstance(refused.value, InvalidRequest)
    assert "note, zone" in refused.value.message
    query.check_declared(["customer", "note", "zone"])


def test_a_query_reads_its_narrowest_index() -> None:
    assert SearchQuery().primary_index() == ("all", "")
    assert SearchQuery(status="failed").primary_index() == ("status", "failed")
    assert SearchQuery(status="failed", agent="a").primary_index() == ("agent", "a")
    assert SearchQuery(agent="a", metadata={"z": "1", "b": "2"}).primary_index() == ("meta", "b=2")
    assert SearchQuery(thread_id="t", metadata={"b": "2"}).primary_index() == ("thread", "t")


def test_matching_applies_every_filter() -> None:
    failed = head(
        phase=Phase.FAILED,
        agent_version="v2",
        metadata={"customer": "acme", "n": 7},
        error=RunErrorInfo(kind="ToolDispatch", message="m"),
    )
    assert SearchQuery(status="failed", version="v2", error_kind="ToolDispatch").matches(failed)
    assert SearchQuery(metadata={"customer": "acme"}).matches(failed)
    assert not SearchQuery(metadata={"n": "7"}).matches(failed)  # not a string: not searchable
    assert not SearchQuery(version="v1").matches(failed)
    assert not SearchQuery(error_kind="ModelTransport").matches(failed)
    assert not SearchQuery(error_kind="ToolDispatch").matches(head())
    assert not SearchQuery(agent="other").matches(failed)


def test_a_frozen_query_ends_at_its_job_creation() -> None:
    assert SearchQuery().frozen_at(100.0).until == 100.0
    assert SearchQuery(until=50.0).frozen_at(100.0).until == 50.0
    assert SearchQuery(until=500.0).frozen_at(100.0).until == 100.0


def test_declared_keys_with_string_values_are_indexed() -> None:
    run = head(thread_id="t1", metadata={"customer": "acme", "n": 3, "long": "x" * 300, "free": "y"})
    dims = index_dimensions(run, ["customer", "n", "long", "absent"])
    assert dims == [
        ("all", ""),
        ("agent", "triage"),
        ("status", "queued"),
        ("thread", "t1"),
        ("meta", "customer=acme"),
    ]


def test_the_setting_parses_and_bounds_the_declared_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_SEARCH_ATTRIBUTES", " customer, region ,customer")
    assert Settings.from_env().search_attributes == ("customer", "region")
    monkeypatch.setenv("WESICHAIN_SEARCH_ATTRIBUTES", "customer,bad key")
    with pytest.raises(ConfigError, match="bad key"):
        Settings.from_env()
    monkeypatch.setenv("WESICHAIN_SEARCH_ATTRIBUTES", ",".join(f"k{i}" for i in range(21)))
    with pytest.raises(ConfigError, match="at most 20"):
        Settings.from_env()


def test_the_last_good_checkpoint_is_the_last_before_the_end() -> None:
    heads = [head(version=1), head(version=2, phase=Phase.THINKING), head(version=3, phase=Phase.FAILED)]
    good = last_good_checkpoint(heads)
    assert good is not None and good.version == 2
    assert last_good_checkpoint(heads[:2]) is heads[1]
    assert last_good_checkpoint([head(version=1, phase=Phase.FAILED)]) is None


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RunStore]:
    client = redis_server.client()
    settings = Settings(prefix=f"se-{uuid.uuid4().hex[:8]}:", shards=4, search_attributes=("customer",))
    yield RunStore(client, settings)
    client.close()


def test_search_reads_the_metadata_index_within_the_time_range(store: RunStore) -> None:
    runs = []
    for i in range(6):
        run = RunHead.new_idle(
            f"r{i}", "triage", "q", tenant="acme", metadata={"customer": "a" if i % 2 else "b"}
        )
        assert store.create(run, [start_task(run.run_id)])
        runs.append(run)
        time.sleep(0.002)  # distinct creation milliseconds, so the expected order is known
    other = RunHead.new_idle("x1", "triage", "q", tenant="other", metadata={"customer": "a"})
    assert store.create(other, [start_task(other.run_id)])
    created = {r.run_id: int(store.redis.hget(store.keys.run(r.run_id), "created") or 0) for r in runs}

    def pages(query: SearchQuery, tenant: str = "acme") -> list[str]:
        seen, cursor = [], None
        while True:
            page = store.search_runs(tenant, query, cursor=cursor, limit=1)
            seen += [h.run_id for h in page.runs]
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    assert pages(SearchQuery(metadata={"customer": "a"})) == ["r5", "r3", "r1"]
    assert pages(SearchQuery(metadata={"customer": "a"}), tenant="other") == ["x1"]
    until = created["r3"] / 1000
    assert pages(SearchQuery(metadata={"customer": "a"}, until=until)) == ["r1"]
    assert pages(SearchQuery(since=created["r2"] / 1000, until=created["r4"] / 1000)) == ["r3", "r2"]
    # An index entry with the exact until millisecond is outside ("before until").
    assert pages(SearchQuery(since=created["r4"] / 1000, until=created["r4"] / 1000)) == []


def test_a_bulk_job_records_each_run_once_and_is_its_tenants_only(store: RunStore) -> None:
    jobs = BulkStore(store.redis, store.keys)
    job = jobs.create("acme", "cancel", SearchQuery(status="running"), 10)
    assert job.query.until is not None and job.query.until <= time.time()
    assert jobs.load("other", job.job_id) is None
    assert [j.job_id for j in jobs.list_jobs("other")] == []
    outcome = BulkOutcome(run_id="r1", result="acted")
    assert jobs.record("acme", job.job_id, outcome)
    assert not jobs.record("acme", job.job_id, outcome.model_copy(update={"result": "failed"}))
    assert jobs.record("acme", job.job_id, BulkOutcome(run_id="r2", result="skipped", reason="ended"))
    loaded = jobs.load("acme", job.job_id)
    assert loaded is not None and (loaded.acted, loaded.skipped, loaded.failed) == (1, 1, 0)
    assert jobs.outcomes("acme", job.job_id)["r1"].result == "acted"
    assert jobs.hold("acme", job.job_id, "a", 5) and not jobs.hold("acme", job.job_id, "b", 5)
    jobs.release("acme", job.job_id, "b")
    assert jobs.held("acme", job.job_id)
    jobs.release("acme", job.job_id, "a")
    assert not jobs.held("acme", job.job_id)
    assert jobs.active() == [("acme", job.job_id)]
    assert jobs.end("acme", job.job_id, "cancelled") and not jobs.end("acme", job.job_id, "done")
    assert jobs.active() == []
    with pytest.raises(InvalidRequest):
        jobs.create("acme", "delete", SearchQuery())
    with pytest.raises(InvalidRequest):
        jobs.create("acme", "retry", SearchQuery(), 1000)
