"""Pipeline schedules, changing a schedule (timing, end date), ticks in flight across a pause or a
backlog, sweepers firing the schedules, and the HTTP clients and CLI over the API: on a real
redis-server, real workers, real ``wesichain scheduler`` and ``wesichain sweeper`` processes and a
real ``wesichain api``.

Runs and pipeline runs are asserted by their deterministic ids (one per tick). Tests that must
control exactly who fires a schedule use a key prefix of their own, which the module's scheduler
does not read."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.api_client import ApiClient, AsyncClient
from producer.client import Client
from producer.schedules import ScheduleNotFound
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.pipeline.store import PipelineStore, stored_pipeline_id
from shared.schedules import Schedule, redis_now, tick_pipeline_id
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.conftest import own_store
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster
from tests.schedule_support import SchedulerProcess, tick_run_id

TIMEOUT = 60
AGENTS = "tests.agents_pipelines"
#: A loaded machine may stall a scheduler past a tick: fired late then, never recorded as missed.
LATE_NOT_MISSED: dict[str, Any] = {"missed": "catch_up", "catch_up": 100}


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    yield c
    c.close()


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    logs = str(tmp_path_factory.mktemp("pool"))
    worker = WorkerProcess(
        "changes",
        server.url,
        agents=AGENTS,
        pool="threads",
        concurrency=6,
        log_dir=logs,
        env={"PIPE_SLOW_S": "2"},
    ).start()
    scheduler = SchedulerProcess("changes-scheduler", server.url, log_dir=logs).start()
    yield
    scheduler.stop()
    worker.stop()


@pytest.fixture
def isolated(server: RedisServer) -> Iterator[Client]:
    """A client on a key prefix of its own: no scheduler fires its schedules unless a test starts one."""
    c = Client(Settings(redis_url=server.url, agents_module=AGENTS, prefix=f"iso{uuid.uuid4().hex[:8]}:"))
    yield c
    c.close()


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _now(client: Client) -> int:
    return int(redis_now(client.store.redis))


def _pipelines(client: Client) -> PipelineStore:
    return PipelineStore(client.store.redis, client.store.keys)


# -- pipeline schedules ------------------------------------------------------------------------------


def test_a_pipeline_schedule_starts_one_pipeline_run_per_tick_until_its_end_date(
    client: Client, pool: None
) -> None:
    tenant = _tenant()
    anchor = _now(client) + 2
    schedule = client.schedules.create(
        None,
        "alpha",
        {"every_s": 1, "anchor": anchor},
        pipeline="chain",
        tenant=tenant,
        overlap="allow",
        until=anchor + 2,
        **LATE_NOT_MISSED,
    )
    sid = schedule.schedule_id
    assert (schedule.pipeline, schedule.agent, schedule.until) == ("chain", None, anchor + 2)
    assert client.schedules.next_fire_times(sid, 10, tenant=tenant) == [anchor, anchor + 1, anchor + 2]

    wait_until(
        lambda: client.schedules.get(sid, tenant=tenant).ended, TIMEOUT, interval=0.1, what="the end date"
    )
    final = client.schedules.get(sid, tenant=tenant)
    assert (final.started, final.skipped, final.missed_ticks, final.failed) == (3, 0, 0, 0)
    assert final.next_fire is None and client.schedules.next_fire_times(sid, tenant=tenant) == []
    history = client.schedules.runs(sid, tenant=tenant)
    expected = [tick_pipeline_id(sid, anchor + i) for i in range(3)]
    assert [(t.tick, t.outcome, t.pipeline_id, t.run_id) for t in reversed(history)] == [
        (anchor + i, "started", expected[i], None) for i in range(3)
    ]
    assert final.last_pipeline_id == expected[-1] and final.last_run_id is None
    page = client.list_pipelines(tenant=tenant, limit=50)
    assert sorted(p.public_id for p in page.pipelines) == expected
    for pipeline_id in expected:
        status = client.pipeline(pipeline_id, tenant=tenant).wait(TIMEOUT)
        assert status.status == "completed", status
    assert {t.status for t in client.schedules.runs(sid, tenant=tenant)} == {"completed"}


def test_a_pipeline_schedules_overlap_skip_starts_none_while_the_previous_goes_on(
    client: Client, pool: None
) -> None:
    tenant = _tenant()
    anchor = _now(client) + 1
    # "slow ..." holds its first step 2 s (PIPE_SLOW_S) while ticks come every second.
    schedule = client.schedules.create(
        None, "slow one", {"every_s": 1, "anchor": anchor}, pipeline="chain", tenant=tenant, **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    wait_until(
        lambda: client.schedules.get(sid, tenant=tenant).started >= 3,
        3 * TIMEOUT,
        interval=0.2,
        what="3 ticks",
    )
    client.schedules.pause(sid, tenant=tenant)
    history = list(reversed(client.schedules.runs(sid, tenant=tenant)))
    started = [t for t in history if t.outcome == "started"]
    skipped = [t for t in history if t.outcome == "skipped"]
    assert skipped, history
    assert {t.outcome for t in history} <= {"started", "skipped"}
    for t in started:
        client.pipeline(t.pipeline_id or "", tenant=tenant).wait(TIMEOUT)
    metas = [_pipelines(client).meta(stored_pipeline_id(tenant, t.pipeline_id or "")) for t in started]
    # Never two at once: each started after the one before had ended.
    for before, after in zip(metas, metas[1:], strict=False):
        assert before is not None and after is not None
        assert before.finished_at is not None and after.created_at >= before.finished_at
    # Every skipped tick names the pipeline run still going then, the latest started before it.
    for tick in skipped:
        previous = max((t for t in started if t.tick < tick.tick), key=lambda t: t.tick)
        assert previous.pipeline_id is not None and previous.pipeline_id in tick.reason


def test_a_pipeline_schedule_is_its_tenants_alone_through_the_api(
    server: RedisServer, client: Client, pool: None, api: ApiProcess
) -> None:
    owner_key, attacker_key = _key(server), _key(server)
    with (
        httpx.Client(base_url=api.url, headers=bearer(owner_key), timeout=30) as http,
        httpx.Client(base_url=api.url, headers=bearer(attacker_key), timeout=30) as evil,
    ):
        created = http.post(
            "/v1/schedules",
            json={"pipeline": "chain", "input": "mine", "timing": {"every_s": 1}, "overlap": "allow"},
        )
        assert created.status_code == 201, created.text
        sid = created.json()["schedule_id"]
        tick = wait_until(
            lambda: next(
                (t for t in http.get(f"/v1/schedules/{sid}/runs").json()["runs"] if t["pipeline_id"]), None
            ),
            TIMEOUT,
            interval=0.1,
            what="a started tick",
        )
        pipeline_id = tick["pipeline_id"]
        assert http.get(f"/v1/pipelines/{pipeline_id}").status_code == 200
        for method, path, body in (
            ("GET", f"/v1/pipelines/{pipeline_id}", None),
            ("GET", f"/v1/schedules/{sid}", None),
            ("GET", f"/v1/schedules/{sid}/runs", None),
            ("PATCH", f"/v1/schedules/{sid}", {"input": "hijacked"}),
            ("PATCH", f"/v1/schedules/{sid}", {"timing": {"every_s": 3600}}),
            ("DELETE", f"/v1/schedules/{sid}", None),
        ):
            response = evil.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["kind"] == "not_found"
        mine = http.get(f"/v1/schedules/{sid}").json()
        assert (mine["input"], mine["timing"]["every_s"], mine["paused"]) == ("mine", 1, False)
        # What a pipeline schedule cannot be.
        refusals: list[tuple[dict[str, Any], str]] = [
            ({"pipeline": "no-such-pipeline"}, "unknown_pipeline"),
            ({"pipeline": "chain", "metadata": {"a": 1}}, "invalid_request"),
            ({"pipeline": "chain", "agent": "worker"}, "invalid_request"),
            ({"pipeline": "chain", "thread_id": "th"}, "invalid_request"),
        ]
        for body, kind in refusals:
            refused = http.post("/v1/schedules", json={"input": "x", "timing": {"every_s": 5}, **body})
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["kind"] == kind
        assert [s["schedule_id"] for s in http.get("/v1/schedules").json()["schedules"]] == [sid]
        assert http.delete(f"/v1/schedules/{sid}").status_code == 204


# -- changing a schedule -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(server: RedisServer, pool: None) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()


def _key(server: RedisServer) -> str:
    key, _ = Tenants(server.client(), Keys()).create_key(_tenant(), "test")
    return key


def test_an_update_recomputes_the_next_tick_and_an_end_date_ends_it_over_the_api_client(
    server: RedisServer, client: Client, api: ApiProcess
) -> None:
    key = _key(server)
    with ApiClient(api.url, key) as remote, ApiClient(api.url, _key(server)) as attacker:
        schedule = remote.schedules.create(
            "worker", "hourly", {"every_s": 3600}, overlap="allow", **LATE_NOT_MISSED
        )
        sid = schedule.schedule_id
        assert schedule.next_fire is not None and schedule.next_fire >= _now(client) + 3000
        anchor = _now(client) + 2
        changed = remote.schedules.update(sid, timing={"every_s": 1, "anchor": anchor}, input="every second")
        assert (changed.next_fire, changed.input, changed.timing.every_s) == (anchor, "every second", 1)
        assert remote.schedules.next_fire_times(sid, 3) == [anchor, anchor + 1, anchor + 2]
        ended = remote.schedules.update(sid, until=anchor + 1)
        assert ended.until == anchor + 1
        wait_until(lambda: remote.schedules.get(sid).ended, TIMEOUT, interval=0.1, what="the end date")
        history = list(reversed(remote.schedules.runs(sid)))
        tenant = remote.schedules.get(sid).tenant
        assert [(t.tick, t.outcome, t.run_id) for t in history] == [
            (anchor + i, "started", tick_run_id(tenant, sid, anchor + i)) for i in range(2)
        ]
        for t in history:  # every run took the changed input
            head = client.handle(t.run_id or "").wait(TIMEOUT)
            assert head.status == "completed" and head.input == "every second"
        # A bad change is refused whole: nothing of it is written.
        with pytest.raises(InvalidRequest):
            remote.schedules.update(sid, input="ok", timing={"every_s": 0})
        with pytest.raises(InvalidRequest):
            remote.schedules.update(sid, until=_now(client) - 10)
        assert remote.schedules.get(sid).input == "every second"
        # Removing the end date brings it back, from the next tick after now.
        back = remote.schedules.update(sid, clear_until=True, timing={"every_s": 3600})
        assert not back.ended and back.until is None and back.next_fire is not None
        assert back.next_fire > _now(client)
        # Another tenant's client sees and changes nothing.
        for call in (
            lambda: attacker.schedules.get(sid),
            lambda: attacker.schedules.update(sid, input="hijacked"),
            lambda: attacker.schedules.pause(sid),
            lambda: attacker.schedules.delete(sid),
            lambda: attacker.schedules.runs(sid),
        ):
            with pytest.raises(ScheduleNotFound):
                call()
        assert attacker.schedules.list() == []
        assert remote.schedules.pause(sid).paused
        assert remote.schedules.resume(sid).paused is False

        async def through_async() -> list[Schedule]:
            async with AsyncClient(api.url, key) as aclient:
                await aclient.schedules.update(sid, input="async")
                return await aclient.schedules.list()

        assert [s.input for s in asyncio.run(through_async())] == ["async"]
        # The CLI over the API, as the key's tenant.
        shown = _cli(api.url, key, "show", sid, "--json")
        assert shown["schedule"]["input"] == "async" and len(shown["runs"]) == 2
        updated = _cli(api.url, key, "update", sid, "--input", "from the cli", "--json")
        assert updated["input"] == "from the cli"
        remote.schedules.delete(sid)
        with pytest.raises(ScheduleNotFound):
            remote.schedules.get(sid)


def _cli(url: str, key: str, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "producer.cli", "schedules", *args, "--api", url, "--key", key],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- ticks in flight ---------------------------------------------------------------------------------


def _in_flight(isolated: Client, **policies: Any) -> tuple[str, str, int]:
    """A schedule of every second with its due tick decided ``run`` and nothing more: what a
    scheduler leaves that dies (or is overtaken) between the decision and the advance."""
    tenant = _tenant()
    schedule = isolated.schedules.create(
        "worker",
        "flight",
        {"every_s": 1, "anchor": _now(isolated) - 100},
        tenant=tenant,
        overlap="allow",
        check_agent=False,
        **policies,
    )
    sid = schedule.schedule_id
    assert schedule.next_fire is not None
    tick = schedule.next_fire
    wait_until(lambda: _now(isolated) >= tick, TIMEOUT, interval=0.05, what="the tick due")
    assert isolated.schedules.store.decide(tenant, sid, tick, "run") == "run"
    return tenant, sid, tick


def test_a_tick_decided_before_a_pause_ends_with_its_entry_after_the_resume(isolated: Client) -> None:
    tenant, sid, tick = _in_flight(isolated)
    isolated.schedules.pause(sid, tenant=tenant)
    wait_until(lambda: _now(isolated) >= tick + 3, TIMEOUT, interval=0.05, what="ticks passing while paused")
    resumed_at = _now(isolated)
    resumed = isolated.schedules.resume(sid, tenant=tenant)
    assert resumed.next_fire == tick  # the tick in flight stays the next one
    isolated.schedules.fire_due(tenant, sid)
    history = list(reversed(isolated.schedules.store.history(tenant, sid)))
    assert (history[0].tick, history[0].outcome, history[0].run_id) == (
        tick,
        "started",
        tick_run_id(tenant, sid, tick),
    )
    assert isolated.store.load(tick_run_id(tenant, sid, tick)) is not None
    # Then on from the resume's next tick: the paused ticks are neither started nor missed.
    assert all(t.outcome == "started" and t.tick > resumed_at for t in history[1:]), history
    assert (isolated.schedules.store.next_tick(tenant, sid) or 0) > resumed_at


def test_a_backlog_never_passes_over_a_decided_tick(isolated: Client) -> None:
    tenant, sid, tick = _in_flight(isolated)  # missed: skip, so a backlog is passed over
    wait_until(lambda: _now(isolated) >= tick + 3, TIMEOUT, interval=0.05, what="a backlog")
    store = isolated.schedules.store
    from shared.schedules import ScheduleTick

    passed_over = ScheduleTick(tick=tick, outcome="missed", missed=3, at=float(_now(isolated)))
    assert store.advance(tenant, sid, tick, tick + 3, passed_over) is False  # fenced by the decision
    isolated.schedules.fire_due(tenant, sid)
    history = list(reversed(store.history(tenant, sid)))
    assert [(t.tick, t.outcome) for t in history[:2]] == [(tick, "started"), (tick + 1, "missed")]
    assert history[1].missed >= 2 and history[2].outcome == "started"
    assert history[0].run_id == tick_run_id(tenant, sid, tick)


def test_a_tick_decided_before_its_timing_changed_ends_and_the_new_timing_follows(isolated: Client) -> None:
    tenant, sid, tick = _in_flight(isolated)
    anchor = _now(isolated) + 600
    changed = isolated.schedules.update(sid, tenant=tenant, timing={"every_s": 60, "anchor": anchor})
    assert changed.next_fire == tick  # in flight: it ends first
    isolated.schedules.fire_due(tenant, sid)
    history = isolated.schedules.store.history(tenant, sid)
    assert [(t.tick, t.outcome) for t in history] == [(tick, "started")]
    assert isolated.schedules.get(sid, tenant=tenant).next_fire == anchor


# -- the scheduler inside the sweeper ----------------------------------------------------------------


def test_sweepers_firing_the_schedules_start_one_run_per_tick(
    server: RedisServer, isolated: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    logs = str(tmp_path_factory.mktemp("sweepers"))
    env = {"WESICHAIN_PREFIX": isolated.settings.prefix, "WESICHAIN_AGENTS": AGENTS}
    sweepers = [
        SchedulerProcess(
            "sweeper-flag", server.url, log_dir=logs, env=env, command=("sweeper", "--schedules")
        ),
        SchedulerProcess(
            "sweeper-setting",
            server.url,
            log_dir=logs,
            env={**env, "WESICHAIN_SWEEPER_SCHEDULES": "1"},
            command=("sweeper",),
        ),
    ]
    tenant = _tenant()
    anchor = _now(isolated) + 3
    schedule = isolated.schedules.create(
        "worker",
        "swept",
        {"every_s": 1, "anchor": anchor},
        tenant=tenant,
        overlap="allow",
        until=anchor + 4,
        check_agent=False,
        **LATE_NOT_MISSED,
    )
    sid = schedule.schedule_id
    for s in sweepers:
        s.start()
    try:
        wait_until(
            lambda: isolated.schedules.get(sid, tenant=tenant).ended, TIMEOUT, interval=0.1, what="5 ticks"
        )
        final = isolated.schedules.get(sid, tenant=tenant)
        assert (final.started, final.skipped, final.missed_ticks, final.failed) == (5, 0, 0, 0)
        expected = {tick_run_id(tenant, sid, anchor + i) for i in range(5)}
        page = isolated.list_runs(tenant=tenant, limit=50)
        assert {h.run_id for h in page.runs} == expected and len(page.runs) == 5
        assert all(s.alive for s in sweepers), [s.log() for s in sweepers]
    finally:
        for s in sweepers:
            s.kill()
