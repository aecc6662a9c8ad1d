"""Schedules under a catch-up missed policy lose no tick and start none twice when their
schedulers are SIGKILLed at random points of their passes (between a tick's decision, its submit
and its advance), when no scheduler runs for a while, and across a Redis outage (AOF, fsync
always) long enough for the schedulers' retries to reach their longest wait. Asserted by the
ticks' deterministic run ids: the runs of the tenant are exactly those of the consecutive ticks
fired."""

from __future__ import annotations

import functools
import random
import time
import uuid

import pytest

from producer.client import Client
from producer.scheduler import STARTED
from shared.schedules import redis_now
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.schedule_support import SchedulerProcess, tick_run_id

pytestmark = pytest.mark.standalone_redis  # stops and restarts the one Redis

TIMEOUT = 120
#: The schedulers' retry wait doubles from their 0.1 s interval to its 2 s cap after 3 s; in 6 s
#: they try at the cap at least once, and six ticks fall due while Redis is down.
#: Longer proves nothing more (catch-up fires up to 200 ticks) and only adds to the suite's time.
OUTAGE_S = 6
#: SIGKILLs of a scheduler in its passes (0.1 s apart: each kill falls 0.5 to 6 passes in, at a
#: random point of one: deciding a tick, submitting its run or advancing the schedule).
KILLS = 8


def _has_started(scheduler: SchedulerProcess, times: int) -> bool:
    """Whether ``scheduler`` has begun running its passes ``times`` times (each start logs it)."""
    return scheduler.log().count(STARTED) >= times


def _runs_of(client: Client, tenant: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = client.list_runs(tenant=tenant, cursor=cursor, limit=200)
        seen += [head.run_id for head in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            return seen


def test_killed_schedulers_and_a_redis_outage_lose_no_tick_and_start_none_twice(
    aof_server: RedisServer, tmp_path: object
) -> None:
    logs = str(tmp_path)
    server = aof_server
    worker = WorkerProcess("sched-chaos", server.url, pool="threads", concurrency=4, log_dir=logs).start()
    steady = SchedulerProcess("steady", server.url, log_dir=logs).start()
    victim = SchedulerProcess("victim", server.url, log_dir=logs).start()
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    rng = random.Random(7)
    try:
        anchor = int(redis_now(client.store.redis)) + 1
        schedule = client.schedules.create(
            "direct",
            "tick",
            {"every_s": 1, "anchor": anchor},
            tenant=tenant,
            missed="catch_up",
            catch_up=200,
            overlap="allow",
        )
        sid = schedule.schedule_id

        def started() -> int:
            return client.schedules.get(sid, tenant=tenant).started

        # 1. The victim is SIGKILLed again and again wherever it is in its passes, racing the steady
        # one: each time only once it runs them (its start-up alone outlasts the random delay, and
        # a kill during its imports would prove nothing about a pass).
        wait_until(lambda: started() >= 2, TIMEOUT, interval=0.1, what="the first ticks")
        for round_ in range(1, KILLS + 1):
            wait_until(
                functools.partial(_has_started, victim, round_),
                TIMEOUT,
                interval=0.05,
                what="the victim's passes",
            )
            time.sleep(rng.uniform(0.05, 0.6))  # a random point of its passes: the fault's timing
            victim.kill()
            victim.start()
        # 2. No scheduler at all for a few ticks: they fall due with nobody to fire them.
        steady.kill()
        victim.kill()
        before = started()
        quiet_until = redis_now(client.store.redis) + 4
        wait_until(lambda: redis_now(client.store.redis) > quiet_until, TIMEOUT, interval=0.1, what="4 s")
        assert started() == before
        steady.start()
        victim.start()
        # 3. Redis down for OUTAGE_S (the schedulers keep trying), then back with its AOF.
        wait_until(lambda: started() >= before + 5, TIMEOUT, interval=0.1, what="the quiet ticks caught up")
        server.stop()
        down_at = time.monotonic()
        time.sleep(OUTAGE_S)  # the outage's length is the scenario, not a wait for a condition
        server.start()
        assert time.monotonic() - down_at >= OUTAGE_S
        back_at = int(redis_now(client.store.redis))
        wait_until(
            lambda: (client.schedules.store.next_tick(tenant, sid) or 0) > back_at + 2,
            TIMEOUT,
            interval=0.2,
            what="the outage's ticks caught up",
        )
        client.schedules.pause(sid, tenant=tenant)
        steady.stop()
        victim.stop()

        final = client.schedules.get(sid, tenant=tenant)
        fired = final.started
        assert (final.missed_ticks, final.skipped, final.failed) == (0, 0, 0)
        assert fired >= back_at - anchor  # every tick up to Redis's return, the outage's included
        runs = _runs_of(client, tenant)
        assert len(runs) == fired
        assert set(runs) == {tick_run_id(tenant, sid, anchor + i) for i in range(fired)}
        for run_id in runs:
            head = client.handle(run_id).wait(TIMEOUT)
            assert head.status == "completed", (run_id, head.error)
    finally:
        steady.kill()
        victim.kill()
        worker.stop()
        client.close()
