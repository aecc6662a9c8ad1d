"""A scheduler SIGKILLed at the one point that matters most: right after a tick's run (or pipeline
run) was submitted and before the schedule was advanced past the tick (the ``crash_after_tick_submit``
fault of ``worker.testing.faults``). The tick's run exists once, the schedule advances once, and
the history has one entry for the tick, naming that run; every later tick is started once too."""

from __future__ import annotations

import uuid

import pytest

from producer.client import Client
from shared.pipeline.store import PipelineStore, stored_pipeline_id
from shared.schedules import redis_now, tick_pipeline_id
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.schedule_support import SchedulerProcess, tick_run_id
from worker.testing.faults import fired_key

TIMEOUT = 60
TICKS = 4
FAULT = {"WESICHAIN_HOOKS": "worker.testing.faults:ChaosHooks", "WESICHAIN_FAULT": "crash_after_tick_submit"}


@pytest.mark.parametrize("kind", ["run", "pipeline"])
def test_a_scheduler_killed_between_the_submit_and_the_advance_starts_the_tick_once(
    server: RedisServer, tmp_path: object, kind: str
) -> None:
    logs = str(tmp_path)
    agents = "tests.agents_pipelines"
    worker = WorkerProcess(
        "submit-crash", server.url, agents=agents, pool="threads", concurrency=4, log_dir=logs
    )
    worker.start()
    client = Client(Settings(redis_url=server.url, agents_module=agents))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    victim = SchedulerProcess("victim", server.url, log_dir=logs, env=FAULT)
    healthy = SchedulerProcess("healthy", server.url, log_dir=logs)
    try:
        anchor = int(redis_now(client.store.redis)) + 2
        schedule = client.schedules.create(
            "worker" if kind == "run" else None,
            "tick",
            {"every_s": 1, "anchor": anchor},
            pipeline="chain" if kind == "pipeline" else None,
            tenant=tenant,
            missed="catch_up",
            catch_up=100,
            overlap="allow",
        )
        sid = schedule.schedule_id
        store = client.schedules.store

        def started_of(tick: int) -> str:
            if kind == "run":
                return tick_run_id(tenant, sid, tick)
            return tick_pipeline_id(sid, tick)

        def exists(tick: int) -> bool:
            if kind == "run":
                return client.store.load(tick_run_id(tenant, sid, tick)) is not None
            pipelines = PipelineStore(client.store.redis, client.store.keys)
            return pipelines.meta(stored_pipeline_id(tenant, tick_pipeline_id(sid, tick))) is not None

        # 1. The only scheduler dies at the fault: the first tick submitted, not advanced.
        victim.start()
        wait_until(lambda: not victim.alive, TIMEOUT, interval=0.05, what="the victim's SIGKILL")
        fired = client.store.redis.get(fired_key("crash_after_tick_submit", sid))
        assert fired is not None and int(str(fired).split(":")[1]) == anchor
        assert store.next_tick(tenant, sid) == anchor
        assert store.decision(tenant, sid, anchor) == "run"
        assert store.history(tenant, sid) == []
        assert exists(anchor)
        assert client.schedules.get(sid, tenant=tenant).started == 0

        # 2. Another scheduler fires it again: the same run, advanced once, and on to later ticks.
        healthy.start()
        wait_until(
            lambda: client.schedules.get(sid, tenant=tenant).started >= TICKS,
            TIMEOUT,
            interval=0.1,
            what=f"{TICKS} ticks",
        )
        client.schedules.pause(sid, tenant=tenant)
        healthy.stop()

        final = client.schedules.get(sid, tenant=tenant)
        fired_ticks = final.started
        history = list(reversed(store.history(tenant, sid)))
        assert (final.skipped, final.missed_ticks, final.failed) == (0, 0, 0)
        assert [(t.tick, t.outcome) for t in history] == [(anchor + i, "started") for i in range(fired_ticks)]
        assert [t.run_id or t.pipeline_id for t in history] == [
            started_of(anchor + i) for i in range(fired_ticks)
        ]
        if kind == "run":
            page = client.list_runs(tenant=tenant, limit=200)
            assert sorted(h.run_id for h in page.runs) == sorted(
                started_of(anchor + i) for i in range(fired_ticks)
            )
            head = client.handle(started_of(anchor)).wait(TIMEOUT)
            assert head.status == "completed", head.error
        else:
            listed = client.list_pipelines(tenant=tenant, limit=200)
            assert sorted(p.public_id for p in listed.pipelines) == sorted(
                started_of(anchor + i) for i in range(fired_ticks)
            )
            assert client.pipeline(started_of(anchor), tenant=tenant).wait(TIMEOUT).status == "completed"
    finally:
        victim.kill()
        healthy.kill()
        worker.stop()
        client.close()
