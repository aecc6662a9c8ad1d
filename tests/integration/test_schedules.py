"""Schedules on a real redis-server, real workers and real ``wesichain scheduler`` processes:
one run per tick however many schedulers race (asserted by the ticks' deterministic run ids),
the overlap policies, pause and resume, and another tenant attacking through the HTTP API."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.client import Client
from shared.keys import Keys
from shared.schedules import Schedule, redis_now
from shared.state import Phase
from shared.tenants import TenantLimits, Tenants
from tests.agents_fixture import RELEASE_KEY
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings
from tests.conftest import own_store
from tests.harness import RedisServer, WorkerProcess, start_all, stop_all, wait_until
from tests.redis_cluster import RedisCluster
from tests.schedule_support import SchedulerProcess, tick_run_id

TIMEOUT = 60
#: A loaded machine may stall a scheduler past a tick: fired late then, never recorded as missed.
LATE_NOT_MISSED: dict[str, Any] = {"missed": "catch_up", "catch_up": 100}
ENDED = {"completed", "failed", "interrupted"}


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    yield c
    c.close()


def _all_runs(client: Client, tenant: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = client.list_runs(tenant=tenant, cursor=cursor, limit=200)
        seen += [head.run_id for head in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            return seen


def _ended(client: Client, run_id: str) -> bool:
    head = client.store.load(run_id)
    return head is not None and head.phase.terminal


def _history(client: Client, tenant: str, schedule_id: str) -> list[dict[str, Any]]:
    return [t.model_dump() for t in client.schedules.store.history(tenant, schedule_id)]


@pytest.mark.parametrize(
    "ticks",
    [
        12,
        pytest.param(
            60,
            marks=[
                pytest.mark.long,
                pytest.mark.skipif(not os.environ.get("WESICHAIN_LONG"), reason="60 ticks: WESICHAIN_LONG=1"),
            ],
        ),
    ],
)
def test_two_schedulers_and_three_workers_start_one_run_per_tick(
    server: RedisServer, client: Client, tmp_path_factory: pytest.TempPathFactory, ticks: int
) -> None:
    logs = str(tmp_path_factory.mktemp("pool"))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    workers = start_all([WorkerProcess(f"sched{i}", server.url, log_dir=logs) for i in range(3)])
    schedulers = [SchedulerProcess(f"scheduler{i}", server.url, log_dir=logs).start() for i in range(2)]
    try:
        anchor = int(redis_now(client.store.redis)) + 2
        schedule = client.schedules.create(
            "direct",
            "tick",
            {"every_s": 1, "anchor": anchor},
            tenant=tenant,
            missed="catch_up",
            catch_up=1000,  # a loaded machine may stall a scheduler past a tick: fired late, not missed
            overlap="allow",
        )
        sid = schedule.schedule_id

        wait_until(
            lambda: client.schedules.get(sid, tenant=tenant).started >= ticks,
            timeout=ticks + TIMEOUT,
            interval=0.2,
            what=f"{ticks} ticks",
        )
        client.schedules.pause(sid, tenant=tenant)
        for s in schedulers:  # a pass in flight when paused ends before the process does
            s.stop()
        final = client.schedules.get(sid, tenant=tenant)
        fired = final.started
        assert fired >= ticks
        assert (final.skipped, final.missed_ticks, final.failed) == (0, 0, 0), _history(client, tenant, sid)
        expected = {tick_run_id(tenant, sid, anchor + i) for i in range(fired)}
        runs = _all_runs(client, tenant)
        assert len(runs) == fired
        assert set(runs) == expected  # each of the consecutive ticks once, none twice, none other
        history = client.schedules.store.history(tenant, sid)
        assert [t.tick for t in reversed(history)] == list(
            range(anchor + fired - len(history), anchor + fired)
        )
        for run_id in runs:
            wait_until(
                functools.partial(_ended, client, run_id),
                timeout=TIMEOUT,
                interval=0.1,
                what=f"run {run_id} to end",
            )
            head = client.store.load(run_id)
            assert head is not None and head.status == "completed" and head.tenant == tenant
    finally:
        for s in schedulers:
            s.kill()
        stop_all(workers)


@pytest.fixture(scope="module")
def pool(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    logs = str(tmp_path_factory.mktemp("pool"))
    worker = WorkerProcess("overlap", server.url, pool="threads", concurrency=6, log_dir=logs).start()
    scheduler = SchedulerProcess("overlap-scheduler", server.url, log_dir=logs).start()
    yield
    scheduler.kill()
    worker.stop()


def _wait_ticks(client: Client, tenant: str, sid: str, n: int) -> list[dict[str, Any]]:
    """The schedule's first ``n`` ticks (oldest first), once recorded."""

    def recorded() -> list[dict[str, Any]] | None:
        history = list(reversed(_history(client, tenant, sid)))
        return history[:n] if len(history) >= n else None

    result: list[dict[str, Any]] = wait_until(recorded, TIMEOUT, interval=0.1, what=f"{n} ticks of {sid}")
    return result


def test_overlap_skip_starts_no_run_while_the_previous_goes_on(client: Client, pool: None) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    schedule = client.schedules.create(
        "inbox_stateless", "hold", {"every_s": 1}, tenant=tenant, overlap="skip", **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    first = _wait_ticks(client, tenant, sid, 1)[0]
    assert first["outcome"] == "started"
    # The held run goes on: the next ticks are skipped, naming it.
    skipped = _wait_ticks(client, tenant, sid, 3)[1:]
    assert [t["outcome"] for t in skipped] == ["skipped", "skipped"]
    assert all(first["run_id"] in t["reason"] for t in skipped)
    client.store.redis.set(RELEASE_KEY + first["run_id"], "1")
    wait_until(
        lambda: client.handle(first["run_id"]).status().status == "completed", TIMEOUT, what="first run"
    )

    def started_again() -> dict[str, Any] | None:
        later = [t for t in reversed(_history(client, tenant, sid)) if t["outcome"] == "started"]
        return later[1] if len(later) > 1 else None

    second = wait_until(started_again, TIMEOUT, interval=0.1, what="a run after the first ended")
    client.schedules.delete(sid, tenant=tenant)
    client.store.redis.set(RELEASE_KEY + second["run_id"], "1")
    assert set(_all_runs(client, tenant)) == {first["run_id"], second["run_id"]}


def test_overlap_enqueue_runs_wait_their_turn_in_the_schedules_thread(client: Client, pool: None) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    # Each run takes a 3 s tool step: three ticks a second apart overlap unless they queue.
    schedule = client.schedules.create(
        "slow_step", "go", {"every_s": 1}, tenant=tenant, overlap="enqueue", **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    ticks = _wait_ticks(client, tenant, sid, 3)
    client.schedules.pause(sid, tenant=tenant)
    assert [t["outcome"] for t in ticks] == ["started"] * 3
    runs = [t["run_id"] for t in ticks]
    # While the first is in its tool step, the two after it wait their turn without starting.
    wait_until(lambda: client.handle(runs[0]).status().phase is Phase.ACTING, TIMEOUT, what="first acting")
    assert [client.handle(r).status().status for r in runs[1:]] == ["queued", "queued"]
    for run_id in runs:
        # (Their outcome is the scripted agent's, which sees the thread's earlier runs: not asserted.)
        wait_until(
            functools.partial(_ended, client, run_id),
            TIMEOUT,
            what=f"{run_id} to end",
        )
    assert {client.handle(r).status().thread_id for r in runs} == {f"schedule-{sid}"}
    # Each started thinking only after the one before it had ended: one at a time, in tick order.
    spans = []
    for run_id in runs:
        checkpoints = client.checkpoints(run_id)
        began = next(c.at for c in checkpoints if c.phase is not Phase.IDLE)
        spans.append((began, checkpoints[-1].at))
    for (_, ended), (began, _) in zip(spans, spans[1:], strict=False):
        assert began >= ended, spans
    client.schedules.delete(sid, tenant=tenant)


def test_overlap_allow_runs_side_by_side(client: Client, pool: None) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    schedule = client.schedules.create(
        "inbox_stateless", "hold", {"every_s": 1}, tenant=tenant, overlap="allow", **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    ticks = _wait_ticks(client, tenant, sid, 2)
    client.schedules.pause(sid, tenant=tenant)
    runs = [t["run_id"] for t in ticks]
    # Both hold at once: the second started while the first was still going.
    for run_id in runs:
        wait_until(
            functools.partial(client.store.redis.exists, "test:holding:" + run_id), TIMEOUT, what="holds"
        )
    for run_id in _all_runs(client, tenant):
        client.store.redis.set(RELEASE_KEY + run_id, "1")
    client.schedules.delete(sid, tenant=tenant)


def test_pause_stops_ticks_and_resume_fires_from_the_next_one(client: Client, pool: None) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    schedule = client.schedules.create(
        "direct", "hi", {"every_s": 1}, tenant=tenant, overlap="allow", **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    _wait_ticks(client, tenant, sid, 1)
    paused = client.schedules.pause(sid, tenant=tenant)
    assert paused.paused and paused.next_fire is None
    assert client.schedules.next_fire_times(sid, 3, tenant=tenant) == []
    stored_next = client.schedules.store.next_tick(tenant, sid)
    assert stored_next is not None
    count = len(_history(client, tenant, sid))
    # Three ticks' worth of Redis time passes: none of them fires.
    wait_until(lambda: redis_now(client.store.redis) > stored_next + 3, TIMEOUT, interval=0.1, what="time")
    assert len(_history(client, tenant, sid)) == count
    assert len(_all_runs(client, tenant)) == count
    resumed = client.schedules.resume(sid, tenant=tenant)
    assert not resumed.paused and resumed.next_fire is not None
    assert resumed.next_fire > redis_now(client.store.redis) - 1
    assert client.schedules.next_fire_times(sid, 3, tenant=tenant) == [
        resumed.next_fire,
        resumed.next_fire + 1,
        resumed.next_fire + 2,
    ]
    after = _wait_ticks(client, tenant, sid, count + 1)[count]
    assert after["tick"] >= resumed.next_fire and after["outcome"] == "started"
    client.schedules.delete(sid, tenant=tenant)


# -- through the HTTP API, as tenants and attackers -----------------------------------------------


@pytest.fixture(scope="module")
def api(server: RedisServer, pool: None) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": "tests.agents_fixture"}).start()
    yield process
    process.stop()


def _http(api: ApiProcess, server: RedisServer) -> Iterator[tuple[str, httpx.Client]]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(server.client(), Keys()).create_key(name, "test")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield name, http


@pytest.fixture
def owner(api: ApiProcess, server: RedisServer) -> Iterator[tuple[str, httpx.Client]]:
    yield from _http(api, server)


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[tuple[str, httpx.Client]]:
    yield from _http(api, server)


def test_a_tenants_schedules_are_invisible_and_immutable_to_another(
    owner: tuple[str, httpx.Client], attacker: tuple[str, httpx.Client], client: Client
) -> None:
    name, http = owner
    _, evil = attacker
    created = http.post(
        "/v1/schedules",
        json={"agent": "direct", "input": "mine", "timing": {"every_s": 1}, "overlap": "allow"},
    )
    assert created.status_code == 201, created.text
    view = Schedule.model_validate(created.json())
    sid = view.schedule_id
    assert view.tenant == name
    started = wait_until(
        lambda: next((t for t in http.get(f"/v1/schedules/{sid}/runs").json()["runs"] if t["run_id"]), None),
        TIMEOUT,
        interval=0.1,
        what="a started tick",
    )
    run_id = started["run_id"]
    assert wait_status(http, run_id, ENDED)["status"] == "completed"

    for method, path in (
        ("GET", f"/v1/schedules/{sid}"),
        ("GET", f"/v1/schedules/{sid}/next"),
        ("GET", f"/v1/schedules/{sid}/runs"),
        ("POST", f"/v1/schedules/{sid}/pause"),
        ("POST", f"/v1/schedules/{sid}/resume"),
        ("DELETE", f"/v1/schedules/{sid}"),
        ("GET", f"/v1/runs/{run_id}"),
    ):
        response = evil.request(method, path)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["kind"] == "not_found"
    assert evil.get("/v1/schedules").json() == {"schedules": []}
    # Nothing the attacker did changed it: still firing, still the owner's.
    mine = http.get(f"/v1/schedules/{sid}").json()
    assert mine["paused"] is False and mine["tenant"] == name
    # A schedule cannot name another tenant for its runs: the field does not exist.
    smuggled = evil.post(
        "/v1/schedules",
        json={"agent": "direct", "input": "x", "timing": {"every_s": 1}, "tenant": name},
    )
    assert smuggled.status_code == 422 and smuggled.json()["error"]["kind"] == "invalid_request"
    assert http.delete(f"/v1/schedules/{sid}").status_code == 204
    assert http.get(f"/v1/schedules/{sid}").status_code == 404
    # Every run the schedule started is the owner's.
    assert all(client.store.load(r).tenant == name for r in _all_runs(client, name))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"timing": {"cron": "61 * * * *"}}, "cron"),
        ({"timing": {"cron": "* * * * *", "timezone": "Nowhere/Else"}}, "time zone"),
        ({"timing": {"every_s": 0}}, "every_s"),
        ({"timing": {"every_s": 5}, "agent": "no_such_agent"}, "no_such_agent"),
        ({"timing": {"every_s": 5}, "input": "x" * 200_000}, "input"),
        ({"timing": {"every_s": 5}, "missed": "sometimes"}, "missed"),
        ({"timing": {"every_s": 5}, "catch_up": 0}, "catch_up"),
        ({"timing": {"every_s": 5}, "overlap": "allow", "thread_id": "t1"}, "thread"),
        ({"timing": {"cron": "0 0 31 2 *"}}, "never fires"),
    ],
)
def test_bad_schedules_are_refused_with_a_structured_error(
    owner: tuple[str, httpx.Client], body: dict[str, Any], needle: str
) -> None:
    _, http = owner
    response = http.post("/v1/schedules", json={"agent": "direct", "input": "hi", **body})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["kind"] in {"invalid_request", "unknown_agent"}
    assert needle in response.text
    assert http.get("/v1/schedules").json() == {"schedules": []}


def test_a_tenants_run_limits_hold_for_its_schedules_ticks(client: Client, pool: None) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    Tenants(client.store.redis, client.store.keys).set_limits(tenant, TenantLimits(max_inflight=1))
    schedule = client.schedules.create(
        "inbox_stateless", "hold", {"every_s": 1}, tenant=tenant, overlap="allow", **LATE_NOT_MISSED
    )
    sid = schedule.schedule_id
    ticks = _wait_ticks(client, tenant, sid, 3)
    client.schedules.pause(sid, tenant=tenant)
    # The first tick's run holds the tenant's only place; the next ticks start nothing, and say why.
    assert ticks[0]["outcome"] == "started", ticks
    for later in ticks[1:]:
        assert later["outcome"] == "failed" and later["reason"].startswith("too_many_in_flight: "), ticks
    assert _all_runs(client, tenant) == [ticks[0]["run_id"]]
    client.store.redis.set(RELEASE_KEY + ticks[0]["run_id"], "1")
    client.schedules.delete(sid, tenant=tenant)
