"""Searching runs, forking one and bulk jobs, through a real ``wesichain api``, real workers and a
real redis-server (and the archive: SQLite and PostgreSQL), attacked across tenants as well.

The workers and the API are given the same declared search attributes (``customer``, ``region``),
as every process that creates runs must be.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.client import Client
from shared.archiver import Archiver
from shared.bulk import MAX_JOBS_PER_TENANT, MAX_RUNNING_PER_TENANT, BulkStore
from shared.keys import Keys
from shared.search import SearchQuery
from shared.tenants import TenantLimits, Tenants
from tests.api_support import ApiProcess, bearer, wait_status
from tests.archive_support import BACKENDS, archive_url
from tests.broker import Settings, broker_env
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster
from worker.bulk import BulkPool

TIMEOUT = 60
ENDED = {"completed", "failed", "interrupted"}
SEARCH_ENV = {"WESICHAIN_SEARCH_ATTRIBUTES": "customer,region"}


@dataclass
class Tenant:
    name: str
    http: httpx.Client

    def submit(self, agent: str, input: str, **fields: Any) -> str:
        response = self.http.post("/v1/runs", json={"agent": agent, "input": input, **fields})
        assert response.status_code == 202, response.text
        run_id: str = response.json()["run_id"]
        return run_id

    def ended(self, run_id: str) -> dict[str, Any]:
        return wait_status(self.http, run_id, ENDED, TIMEOUT)

    def search(self, **query: Any) -> list[str]:
        """Every run id of the search, page by page (pages of 2, to cross page boundaries)."""
        seen: list[str] = []
        cursor = None
        while True:
            body: dict[str, Any] = {"query": query, "limit": 2}
            if cursor is not None:
                body["cursor"] = cursor
            response = self.http.post("/v1/runs/search", json=body)
            assert response.status_code == 200, response.text
            page = response.json()
            seen += [run["run_id"] for run in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    def bulk_ended(self, job_id: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            response = self.http.get(f"/v1/bulk/{job_id}")
            assert response.status_code == 200, response.text
            job: dict[str, Any] = response.json()
            return job if job["status"] != "running" else None

        job: dict[str, Any] = wait_until(ended, TIMEOUT, interval=0.1, what=f"bulk job {job_id} to end")
        return job

    def outcomes(self, job_id: str) -> dict[str, dict[str, Any]]:
        response = self.http.get(f"/v1/bulk/{job_id}/runs")
        assert response.status_code == 200, response.text
        return {o["run_id"]: o for o in response.json()["outcomes"]}


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    worker = WorkerProcess(
        "search1", server.url, concurrency=4, log_dir=str(tmp_path_factory.mktemp("w")), env=SEARCH_ENV
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": "tests.agents_fixture", **SEARCH_ENV}).start()
    yield process
    process.stop()
    worker.stop()


def _tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(server.client(), Keys()).create_key(name, "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield Tenant(name, http)


@pytest.fixture
def tenant(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[Tenant]:
    yield from _tenant(api, server)


def _newest_first(views: list[dict[str, Any]]) -> list[str]:
    return [v["run_id"] for v in sorted(views, key=lambda v: (v["created_at"], v["run_id"]), reverse=True)]


def test_search_by_each_filter(tenant: Tenant) -> None:
    acme = [
        tenant.submit("direct", f"acme {i}", metadata={"customer": "acme", "region": "eu"}) for i in range(3)
    ]
    globex = tenant.submit("direct", "globex", metadata={"customer": "globex", "note": "not declared"})
    numeric = tenant.submit("direct", "numeric", metadata={"customer": 7})  # not a string: not indexed
    threaded = [tenant.submit("echo", f"thread {i}", thread_id="th-search") for i in range(2)]
    model_failed = tenant.submit("model_fail", "fails in the model")
    tool_failed = tenant.submit("tool_error_fail", "fails in a tool")
    views = {
        run_id: tenant.ended(run_id)
        for run_id in [*acme, globex, numeric, *threaded, model_failed, tool_failed]
    }
    statuses = {run_id: view["status"] for run_id, view in views.items()}
    assert [r for r, s in statuses.items() if s == "failed"] == [model_failed, tool_failed], [
        (v["agent"], v["input"], v["error"]) for v in views.values() if v["status"] == "failed"
    ]
    model_kind, tool_kind = views[model_failed]["error"]["kind"], views[tool_failed]["error"]["kind"]
    assert model_kind != tool_kind

    everything = tenant.search()
    assert everything == _newest_first(list(views.values()))
    assert tenant.search(metadata={"customer": "acme"}) == _newest_first([views[r] for r in acme])
    assert tenant.search(metadata={"customer": "acme", "region": "eu"}) == _newest_first(
        [views[r] for r in acme]
    )
    assert tenant.search(metadata={"customer": "acme", "region": "us"}) == []
    assert tenant.search(metadata={"customer": "7"}) == []
    assert tenant.search(metadata={"customer": "globex"}) == [globex]
    assert tenant.search(agent="model_fail") == [model_failed]
    assert tenant.search(status="failed") == _newest_first([views[model_failed], views[tool_failed]])
    assert tenant.search(error_kind=model_kind) == [model_failed]
    assert tenant.search(error_kind=tool_kind, status="failed") == [tool_failed]
    assert tenant.search(thread_id="th-search") == _newest_first([views[r] for r in threaded])
    version = views[globex]["agent_version"]
    assert version
    direct = [v for v in views.values() if v["agent"] == "direct"]
    assert tenant.search(agent="direct", version=version) == _newest_first(direct)
    assert tenant.search(version=f"{version}-other") == []
    # A time range: from the first acme run's creation to just before the globex run's.
    since, until = views[acme[0]]["created_at"], views[globex]["created_at"]
    in_range = [v for v in views.values() if since <= v["created_at"] < until]
    assert tenant.search(since=since, until=until) == _newest_first(in_range)
    assert set(tenant.search(since=since, until=until)) == set(acme)


def test_undeclared_metadata_keys_are_refused_naming_them(tenant: Tenant) -> None:
    response = tenant.http.post(
        "/v1/runs/search", json={"query": {"metadata": {"note": "x", "customer": "a"}}}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["kind"] == "invalid_request"
    assert error["details"] == {"undeclared": ["note"], "declared": ["customer", "region"]}
    assert "note" in error["message"]
    bulk = tenant.http.post("/v1/bulk", json={"action": "cancel", "query": {"metadata": {"note": "x"}}})
    assert bulk.status_code == 422 and bulk.json()["error"]["details"]["undeclared"] == ["note"]
    bad = tenant.http.post("/v1/runs/search", json={"query": {"status": "sleeping"}})
    assert bad.status_code == 422 and bad.json()["error"]["kind"] == "invalid_request"
    extra = tenant.http.post("/v1/runs/search", json={"query": {"tenant": "someone-else"}})
    assert extra.status_code == 422


def test_paging_is_stable_while_new_runs_arrive(tenant: Tenant) -> None:
    first = [tenant.submit("direct", f"first {i}", metadata={"region": "paging"}) for i in range(7)]
    views = [tenant.ended(r) for r in first]
    expected = _newest_first(views)
    seen: list[str] = []
    cursor = None
    while True:
        body: dict[str, Any] = {"query": {"metadata": {"region": "paging"}}, "limit": 3}
        if cursor is not None:
            body["cursor"] = cursor
        page = tenant.http.post("/v1/runs/search", json=body).json()
        seen += [run["run_id"] for run in page["runs"]]
        # Newer runs matching the same search arrive between pages: the cursor stays below them.
        tenant.ended(tenant.submit("direct", "late", metadata={"region": "paging"}))
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected


def test_fork_over_http(tenant: Tenant, attacker: Tenant) -> None:
    source = tenant.submit("one_hop", "add two numbers", metadata={"customer": "fork"})
    view = tenant.ended(source)
    assert view["status"] == "completed"
    checkpoints = tenant.http.get(f"/v1/runs/{source}/checkpoints").json()["checkpoints"]
    last_good = max(c["version"] for c in checkpoints if c["status"] not in ENDED)

    forked = tenant.http.post(f"/v1/runs/{source}/fork", json={})
    assert forked.status_code == 202, forked.text
    fork = tenant.ended(forked.json()["run_id"])
    assert fork["status"] == "completed"
    assert fork["fork"] == {
        "run_id": source,
        "version": last_good,
        "edited_input": False,
        "model_named": False,
    }
    assert fork["metadata"] == {"customer": "fork"}

    edited = tenant.http.post(f"/v1/runs/{source}/fork", json={"version": 1, "input": "another question"})
    assert edited.status_code == 202, edited.text
    assert edited.json()["input"] == "another question"
    assert tenant.ended(edited.json()["run_id"])["fork"]["version"] == 1

    missing = tenant.http.post(f"/v1/runs/{source}/fork", json={"version": 999})
    assert missing.status_code == 422 and missing.json()["error"]["kind"] == "invalid_request"
    # Another tenant's run is no run at all to the attacker.
    stolen = attacker.http.post(f"/v1/runs/{source}/fork", json={})
    assert stolen.status_code == 404 and stolen.json()["error"]["kind"] == "not_found"
    assert attacker.http.post(f"/v1/runs/{source}/fork", json={"input": "x"}).status_code == 404
    assert attacker.search() == []


def test_bulk_retry_fork_and_cancel(tenant: Tenant) -> None:
    failed = [tenant.submit("model_fail", f"fail {i}", metadata={"customer": "bulk"}) for i in range(3)]
    fine = tenant.submit("direct", "fine", metadata={"customer": "bulk"})
    for run_id in [*failed, fine]:
        tenant.ended(run_id)

    started = tenant.http.post(
        "/v1/bulk",
        json={
            "action": "retry",
            "query": {"status": "failed", "metadata": {"customer": "bulk"}},
            "rate_per_s": 50,
        },
    )
    assert started.status_code == 202, started.text
    job = started.json()
    assert job["status"] == "running" and job["query"]["until"] is not None
    done = tenant.bulk_ended(job["job_id"])
    assert (done["status"], done["acted"], done["skipped"], done["failed"]) == ("done", 3, 0, 0)
    outcomes = tenant.outcomes(job["job_id"])
    assert set(outcomes) == set(failed)
    for source, outcome in outcomes.items():
        retry = tenant.ended(outcome["new_run_id"])
        original = tenant.http.get(f"/v1/runs/{source}").json()
        assert (retry["agent"], retry["input"], retry["metadata"]) == (
            original["agent"],
            original["input"],
            original["metadata"],
        )
        assert retry["fork"] is None
    # The retries failed too, but were created after the job: a second look finds only the first three.
    assert len(tenant.search(status="failed", metadata={"customer": "bulk"})) == 6

    fork_job = tenant.http.post(
        "/v1/bulk", json={"action": "fork", "query": {"metadata": {"customer": "bulk"}, "agent": "direct"}}
    ).json()
    forked = tenant.bulk_ended(fork_job["job_id"])
    assert (forked["acted"], forked["skipped"], forked["failed"]) == (1, 0, 0)
    outcome = tenant.outcomes(fork_job["job_id"])[fine]
    fork = tenant.ended(outcome["new_run_id"])
    checkpoints = tenant.http.get(f"/v1/runs/{fine}/checkpoints").json()["checkpoints"]
    assert fork["fork"]["version"] == max(c["version"] for c in checkpoints if c["status"] not in ENDED)

    long = [tenant.submit("long_tool", f"stop {i}", metadata={"customer": "cancel"}) for i in range(2)]
    ended = tenant.submit("direct", "already done", metadata={"customer": "cancel"})
    tenant.ended(ended)
    cancel = tenant.http.post(
        "/v1/bulk", json={"action": "cancel", "query": {"metadata": {"customer": "cancel"}}}
    )
    job_id = cancel.json()["job_id"]
    cancelled = tenant.bulk_ended(job_id)
    assert (cancelled["acted"], cancelled["skipped"]) == (2, 1)
    assert tenant.outcomes(job_id)[ended]["reason"] == "already ended (completed)"
    for run_id in long:
        assert tenant.ended(run_id)["status"] == "interrupted"
    listed = tenant.http.get("/v1/bulk").json()["jobs"]
    assert [j["job_id"] for j in listed] == [job_id, fork_job["job_id"], job["job_id"]]
    again = tenant.http.post(f"/v1/bulk/{job_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["kind"] == "wrong_state"


def test_a_slow_bulk_job_holds_no_worker_between_its_runs(tenant: Tenant, server: RedisServer) -> None:
    runs = [tenant.submit("direct", f"slow {i}", metadata={"customer": "slow"}) for i in range(3)]
    for run_id in runs:
        tenant.ended(run_id)
    # One run every 5 s: the job once slept those seconds in its task, holding a worker's slot (ten
    # such jobs, the most a tenant may run, held ten).
    job = tenant.http.post(
        "/v1/bulk", json={"action": "cancel", "query": {"metadata": {"customer": "slow"}}, "rate_per_s": 0.2}
    )
    job_id = job.json()["job_id"]
    jobs = BulkStore(server.client(), Keys())

    def between_runs() -> bool:
        view = tenant.http.get(f"/v1/bulk/{job_id}").json()
        return bool(
            view["status"] == "running" and view["skipped"] == 1 and not jobs.held(tenant.name, job_id)
        )

    # After its first run no task holds the job: the next is sent with the wait as its countdown.
    wait_until(between_runs, TIMEOUT, interval=0.05, what="the job to wait between runs, holding nothing")
    done = tenant.bulk_ended(job_id)
    assert (done["status"], done["skipped"], done["acted"]) == ("done", 3, 0)
    assert set(tenant.outcomes(job_id)) == set(runs)


def test_a_tenants_running_jobs_are_capped_however_many_it_made(tenant: Tenant, server: RedisServer) -> None:
    # At its in-flight limit (one parked run) a retry job waits, running, until it is cancelled.
    tenant.ended(tenant.submit("direct", "retry me", metadata={"customer": "capped"}))
    Tenants(server.client(), Keys()).set_limits(tenant.name, TenantLimits(max_inflight=1))
    parked = tenant.submit("needs_approval", "hold the place")
    wait_status(tenant.http, parked, {"awaiting_approval"}, TIMEOUT)
    waiting = {"action": "retry", "query": {"metadata": {"customer": "capped"}}}

    def make() -> httpx.Response:
        return tenant.http.post("/v1/bulk", json=waiting)

    running = [make().json()["job_id"] for _ in range(MAX_RUNNING_PER_TENANT - 1)]
    # Jobs made and cancelled push the running ones out of the tenant's listing of its newest jobs,
    # which the cap was once counted in.
    for _ in range(MAX_JOBS_PER_TENANT):
        filler = make()
        assert filler.status_code == 202, filler.text
        assert tenant.http.post(f"/v1/bulk/{filler.json()['job_id']}/cancel").status_code == 202
    running.append(make().json()["job_id"])
    refused = make()
    assert refused.status_code == 422 and "bulk jobs are running already" in refused.text, refused.text
    for job_id in running:
        assert tenant.http.post(f"/v1/bulk/{job_id}/cancel").status_code == 202
    assert tenant.http.post(f"/v1/runs/{parked}/cancel").status_code == 202


def test_another_tenants_runs_and_jobs_are_out_of_reach(tenant: Tenant, attacker: Tenant) -> None:
    victims = [tenant.submit("long_tool", f"victim {i}", metadata={"customer": "victim"}) for i in range(2)]
    done = tenant.submit("model_fail", "victim failed", metadata={"customer": "victim"})
    tenant.ended(done)
    job = tenant.http.post(
        "/v1/bulk", json={"action": "retry", "query": {"metadata": {"customer": "victim"}}, "rate_per_s": 0.2}
    ).json()

    assert attacker.search(metadata={"customer": "victim"}) == []
    assert attacker.search(agent="long_tool") == []
    # Bulk jobs act on the caller's runs only: the same searches find nothing of the victim's.
    for action, query in (("cancel", {"metadata": {"customer": "victim"}}), ("retry", {"status": "failed"})):
        started = attacker.http.post("/v1/bulk", json={"action": action, "query": query, "rate_per_s": 50})
        assert started.status_code == 202
        ended = attacker.bulk_ended(started.json()["job_id"])
        assert (ended["acted"], ended["skipped"], ended["failed"]) == (0, 0, 0)
    assert attacker.http.get(f"/v1/bulk/{job['job_id']}").status_code == 404
    assert attacker.http.get(f"/v1/bulk/{job['job_id']}/runs").status_code == 404
    stolen = attacker.http.post(f"/v1/bulk/{job['job_id']}/cancel")
    assert stolen.status_code == 404 and stolen.json()["error"]["kind"] == "not_found"
    assert job["job_id"] not in [j["job_id"] for j in attacker.http.get("/v1/bulk").json()["jobs"]]
    for run_id in victims:
        assert tenant.http.get(f"/v1/runs/{run_id}").json()["status"] in ("queued", "running")
    assert tenant.http.post(f"/v1/bulk/{job['job_id']}/cancel").json()["status"] == "cancelled"
    for run_id in victims:
        tenant.http.post(f"/v1/runs/{run_id}/cancel")
    assert tenant.http.get("/v1/bulk/not-hex").status_code == 422


# -- live and archived runs together -----------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def archived_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Client]:
    """A redis-server, an archive and a worker that archives to it; a client of both."""
    directory: Path = tmp_path_factory.mktemp("archive")
    with archive_url(request.param, directory) as url:
        server = RedisServer().start()
        worker = WorkerProcess(
            "search-archive",
            server.url,
            concurrency=2,
            log_dir=str(directory),
            env={"WESICHAIN_ARCHIVE_URL": url, "WESICHAIN_ARCHIVE_AFTER_S": "0", **SEARCH_ENV},
        ).start()
        client = Client(
            Settings(
                redis_url=server.url,
                agents_module="tests.agents_fixture",
                archive_url=url,
                search_attributes=("customer", "region"),
            )
        )
        yield client
        client.close()
        worker.stop()
        server.cleanup()


def test_search_pages_through_live_and_archived_runs(archived_pool: Client) -> None:
    client = archived_pool
    tenant = f"arch-{uuid.uuid4().hex[:8]}"

    def ended(agent: str, input: str, customer: str) -> str:
        handle = client.submit(agent, input, tenant=tenant, metadata={"customer": customer})
        handle.wait(TIMEOUT)
        return handle.run_id

    old = [ended("direct", f"old {i}", "acme" if i % 2 else "globex") for i in range(4)]
    old.append(ended("model_fail", "old failure", "acme"))
    assert Archiver(client.store).run_once(after_s=0).archived == len(old)
    new = [ended("direct", f"new {i}", "acme" if i % 2 else "globex") for i in range(3)]
    new.append(ended("model_fail", "new failure", "acme"))
    heads = {run_id: client.store.load(run_id) for run_id in [*old, *new]}
    created = {
        run_id: int(client.store.redis.hget(client.store.keys.run(run_id), "created") or 0) for run_id in new
    }
    assert all(client.store.redis.exists(client.store.keys.run(r)) == 0 for r in old)

    def everything(**filters: Any) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            page = client.search(SearchQuery(**filters), tenant=tenant, cursor=cursor, limit=2)
            seen += [h.run_id for h in page.runs]
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    acme = everything(metadata={"customer": "acme"})
    expected = [r for r in [*old, *new] if heads[r] is not None and heads[r].metadata["customer"] == "acme"]  # type: ignore[union-attr]
    assert set(acme) == set(expected) and len(acme) == len(expected)
    assert acme[: len([r for r in new if r in expected])] == sorted(
        [r for r in new if r in expected], key=lambda r: (created[r], r), reverse=True
    )
    failures = everything(error_kind="ModelTransport", metadata={"customer": "acme"})
    assert set(failures) == {old[-1], new[-1]}
    version = heads[new[0]].agent_version  # type: ignore[union-attr]
    assert set(everything(agent="direct", version=version)) == {*old[:4], *new[:3]}
    assert everything(version="no-such-version") == []
    assert everything(metadata={"customer": "initech"}) == []
    start = time.time()
    assert everything(since=start) == []


def test_the_cli_searches_and_runs_bulk_jobs(
    tenant: Tenant, server: RedisServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from producer.cli import main

    monkeypatch.setenv("WESICHAIN_SEARCH_ATTRIBUTES", SEARCH_ENV["WESICHAIN_SEARCH_ATTRIBUTES"])
    for name, value in broker_env(server.url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)
    runs = [tenant.submit("long_tool", f"cli {i}", metadata={"customer": "cli"}) for i in range(2)]
    base = ["--redis", server.url, "--tenant", tenant.name]
    assert main(["runs", "search", *base, "--meta", "customer=cli", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["run_id"] for line in lines[:-1]] == list(reversed(runs))
    assert lines[-1] == {"next_cursor": None}
    assert main(["runs", "search", *base, "--meta", "note=x"]) != 0
    assert "not declared searchable: note" in capsys.readouterr().err
    assert main(["bulk", "cancel", *base, "--meta", "customer=cli", "--rate", "50", "--wait", "--json"]) == 0
    job = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (job["status"], job["acted"]) == ("done", 2)
    assert main(["bulk", "status", job["job_id"], "--redis", server.url, "--tenant", "someone-else"]) != 0
    for run_id in runs:
        assert tenant.ended(run_id)["status"] == "interrupted"


def test_a_bulk_run_redone_after_a_crash_counts_its_submit_once(tenant: Tenant, server: RedisServer) -> None:
    """A job's worker that dies after creating a retry, before recording it, has the run redone:
    the redo finds the retry made the first time, and neither makes another nor counts another
    submit against the tenant's submits per minute."""
    original = tenant.submit("direct", "redo me")
    tenant.ended(original)
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    try:
        pool = BulkPool(client, send=lambda _: None, lease_s=10)
        # Acted on directly, run by run: its query matches nothing, should the sweeper send its task.
        job = pool.jobs.create(tenant.name, "retry", SearchQuery(agent="no-such-agent"))
        head = client.store.load(original)
        assert head is not None
        settings = pool.tenants.settings(tenant.name)
        window = client.store.keys.submits(tenant.name)
        before = client.store.redis.zcard(window)
        first = pool._act(job, head, settings)
        assert first.result == "acted" and first.new_run_id is not None
        assert client.store.redis.zcard(window) == before + 1
        redone = pool._act(job, head, settings)  # the crash's redo of the same run
        assert (redone.result, redone.new_run_id) == ("acted", first.new_run_id)
        assert client.store.redis.zcard(window) == before + 1
        tenant.ended(first.new_run_id)
        pool.jobs.end(tenant.name, job.job_id, "cancelled")
    finally:
        client.close()
