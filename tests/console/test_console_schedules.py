"""The console's Schedules page in a real headless browser (Debian's chromium), against a real API,
a real worker and a real ``wesichain scheduler``: the tenant's schedules with their next fire times,
their last runs (and pipeline runs) linking to their pages, pause and resume; text from the store
renders as text; nothing is asked of another origin."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import Browser, Page

from shared.keys import Keys
from shared.schedules import ScheduleTick
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.console.support import signed_in
from tests.harness import RedisServer, WorkerProcess
from tests.schedule_support import SchedulerProcess

AGENTS = "tests.agents_pipelines"
HOSTILE = 'refused <img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'


@dataclass
class Console:
    api: ApiProcess
    server: RedisServer
    key: str
    tenant: str


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    logs = str(tmp_path_factory.mktemp("w"))
    server = RedisServer().start()
    worker = WorkerProcess(
        "sc1", server.url, agents=AGENTS, pool="threads", concurrency=4, log_dir=logs
    ).start()
    scheduler = SchedulerProcess("sc-scheduler", server.url, log_dir=logs).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    tenant = f"sc-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(server.client(), Keys()).create_key(tenant, "browser")
    yield Console(process, server, key, tenant)
    process.stop()
    scheduler.stop()
    worker.stop()
    server.cleanup()


@pytest.fixture
def http(console: Console) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.api.url, headers=bearer(console.key), timeout=30) as client:
        yield client


@pytest.fixture
def page(browser: Browser, console: Console) -> Iterator[Page]:
    with signed_in(browser, console.api.url, console.key, width=1400) as tab:
        yield tab


def test_the_schedules_page_lists_fire_times_and_runs_and_pauses_and_resumes(
    console: Console, http: httpx.Client, page: Page
) -> None:
    now = int(time.time())
    runs = http.post(
        "/v1/schedules",
        json={"agent": "worker", "input": "tick", "timing": {"every_s": 1}, "overlap": "allow"},
    )
    assert runs.status_code == 201, runs.text
    sid = runs.json()["schedule_id"]
    pipelines = http.post(
        "/v1/schedules",
        json={
            "pipeline": "chain",
            "input": "p",
            "timing": {"every_s": 1},
            "overlap": "allow",
            "until": now + 4,
        },
    )
    assert pipelines.status_code == 201, pipelines.text
    pid = pipelines.json()["schedule_id"]
    hourly = http.post("/v1/schedules", json={"agent": "worker", "input": "h", "timing": {"every_s": 3600}})
    assert hourly.status_code == 201, hourly.text
    hid = hourly.json()["schedule_id"]
    # Text the store holds is shown as text, never as markup (a refused tick's reason, here).
    hostile = ScheduleTick(tick=now - 60, outcome="failed", reason=HOSTILE, at=float(now))
    console.server.client().lpush(Keys().sched_history(console.tenant, hid), hostile.model_dump_json())

    page.goto(console.api.url + "/#/schedules")
    page.wait_for_selector("#schedules-view:not([hidden])")
    row = page.locator(f'tr[data-schedule="{sid}"]')
    run_link = row.locator('a[href^="#/runs/"]').first
    run_link.wait_for()
    hourly_row = page.locator(f'tr[data-schedule="{hid}"]')
    hourly_row.get_by_text("refused", exact=False).wait_for()
    assert HOSTILE[:60] in hourly_row.inner_text()  # the page shortens a reason to 60 characters
    assert hourly_row.locator("img, script").count() == 0
    assert page.evaluate("window.__pwned") is None
    # The hourly schedule shows its next three fire times, an hour apart.
    fire_times = http.get(f"/v1/schedules/{hid}/next?n=3").json()["next_fire_times"]
    assert len(fire_times) == 3 and fire_times[1] - fire_times[0] == 3600
    assert hourly_row.locator("td:nth-child(6) div").count() == 3
    # The pipeline schedule: a pipeline run per tick until its end date, each linking to its page.
    pipeline_row = page.locator(f'tr[data-schedule="{pid}"]')
    pipeline_row.get_by_text("pipeline chain").wait_for()
    pipeline_row.get_by_text("ended", exact=True).wait_for()
    pipeline_link = pipeline_row.locator('a[href^="#/pipelines/"]').first
    pipeline_link.wait_for()
    assert (pipeline_link.get_attribute("href") or "").startswith(f"#/pipelines/schedule-{pid}-")

    # A run link opens that run's page.
    href = run_link.get_attribute("href") or ""
    run_link.click()
    page.wait_for_selector("#run-view:not([hidden])")
    assert page.evaluate("location.hash") == href
    page.goto(console.api.url + "/#/schedules")
    page.wait_for_selector("#schedules-view:not([hidden])")

    # Pause, then resume, from the page.
    row.get_by_role("button", name="Pause").click()
    row.get_by_text("paused", exact=True).wait_for()
    assert http.get(f"/v1/schedules/{sid}").json()["paused"] is True
    assert row.locator("td:nth-child(6) div").count() == 0  # no next fire times while paused
    row.get_by_role("button", name="Resume").click()
    row.get_by_text("active", exact=True).wait_for()
    assert http.get(f"/v1/schedules/{sid}").json()["paused"] is False
    for schedule_id in (sid, pid, hid):
        assert http.delete(f"/v1/schedules/{schedule_id}").status_code == 204
    assert json.loads(http.get("/v1/schedules").text) == {"schedules": []}
