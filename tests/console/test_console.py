"""The run console in a real headless browser (Debian's chromium) against a real API and workers.

The list shows a tenant's runs; a running run's page updates live over SSE; a parked run is
approved from its page and completes; a fan-out run with a worker SIGKILLed in its think draws its
takeover, and the page is screenshotted (``WESICHAIN_SCREENSHOT=path`` keeps that picture).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Page

from shared.state import Phase
from shared.timeline import Timeline
from tests.agents_fixture import HOLDING_KEY, RELEASE_KEY
from tests.api_support import ApiProcess, wait_status
from tests.chaos.support import Cluster, wait_paused
from tests.console.support import submit, wait_js
from tests.harness import RedisServer, WorkerProcess, wait_until


@contextmanager
def pausing_workers(cluster: Cluster) -> Iterator[list[WorkerProcess]]:
    """The module's workers swapped, for one test, for two that pause in a run's first think (once
    per run, so the other one runs it again after a kill); the module's own workers come back."""
    regular = [w for w in cluster.workers if w.alive]
    paused = cluster.start(2, concurrency=2, env={"WESICHAIN_FAULT": "pause:thinking"})
    for worker in regular:
        worker.stop()  # so that the run's first think lands on a pausing worker
    try:
        yield paused
    finally:
        for worker in paused:
            worker.kill()
            worker.stop()
        cluster.workers = [w for w in cluster.workers if w not in paused]
        for worker in regular:
            worker.start(wait=False)
        for worker in regular:
            worker.wait_ready(timeout=60)


def test_the_list_shows_the_tenants_runs(page: Page, http: httpx.Client, key: str) -> None:
    ids = [submit(http, "direct") for _ in range(3)]
    for run_id in ids:
        wait_status(http, run_id, {"completed"})
    for run_id in ids:  # the list refreshes itself: no reload
        page.wait_for_selector(f'#runs tr[data-run="{run_id}"] .badge.completed')
    # The counts are read beside the list, not from it: a refresh may have read them just before
    # the last run ended, and the next one (2 s later) counts it.
    wait_js(
        page,
        "parseInt((document.querySelector('#counts .count[data-status=\"completed\"] b') || {}).textContent)"
        " >= 3",
    )
    assert (page.text_content("#whoami") or "").startswith("tenant console-")


def test_a_running_runs_page_updates_live(page: Page, http: httpx.Client, api: ApiProcess) -> None:
    run_id = submit(http, "slow_step")  # a 3 s tool: the page is open while it runs
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-status.badge.running")
    page.evaluate("window.__loaded_once = true")  # gone if the page reloads
    # Without a reload: the tool's bar, the answer and the end arrive over the event stream.
    page.wait_for_selector("#run-status.badge.completed")
    page.wait_for_selector('#timeline rect.bar.tool[data-name="slow"]')
    page.wait_for_selector('#conversation li[data-kind="Completed"]')
    assert "slow step done" in (page.text_content("#run-facts") or "")
    assert page.evaluate("window.__loaded_once") is True
    # Grouped by step: each call holds its result.
    kinds = page.eval_on_selector_all("#conversation [data-kind]", "els => els.map(e => e.dataset.kind)")
    assert kinds == ["RunStarted", "ModelResponded", "ToolDispatched", "ToolCompleted",
                     "ModelResponded", "Completed"]  # fmt: skip
    steps = page.eval_on_selector_all("#conversation li.step", "els => els.map(e => e.dataset.step)")
    assert steps == ["1", "2"]


def test_a_parked_run_is_approved_from_its_page(page: Page, http: httpx.Client, api: ApiProcess) -> None:
    run_id = submit(http, "needs_approval")
    wait_status(http, run_id, {"awaiting_approval"})
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#approve:not([hidden])")
    page.wait_for_selector('#conversation li[data-kind="AwaitingApproval"]')
    page.fill("#note", "ok from the console")
    page.click("#approve")
    page.wait_for_selector("#run-status.badge.completed")
    assert http.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    page.wait_for_selector('#timeline rect.bar.phase[data-name="decide"]')
    assert page.is_hidden("#approve")


def test_timeline_of_a_fan_out_run_with_a_worker_killed(
    page: Page, http: httpx.Client, api: ApiProcess, server: RedisServer, cluster: Cluster, tmp_path: Path
) -> None:
    with pausing_workers(cluster):
        run_id = submit(http, "parallel")
        victim = cluster.owner(wait_paused(server.client(), Phase.THINKING, run_id))
        victim.kill()
        run = wait_status(http, run_id, {"completed"}, timeout=90)
    assert run["answer"] == "all four done"

    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-status.badge.completed")
    page.wait_for_selector("#timeline path.takeover")
    page.wait_for_selector("#timeline rect.wait.lost")
    tools = page.eval_on_selector_all("#timeline rect.bar.tool", "els => els.length")
    assert tools == 4
    timeline = http.get(f"/v1/runs/{run_id}/timeline").json()
    (takeover,) = [m for m in timeline["markers"] if m["kind"] == "takeover"]
    assert not takeover["lane"].startswith(f"{victim.name}:")
    shot = tmp_path / "console.png"
    wait_until(lambda: page.is_visible("#timeline svg"), timeout=10, what="the timeline")
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000
    if target := os.environ.get("WESICHAIN_SCREENSHOT"):
        shutil.copyfile(shot, target)


def test_cli_timeline_over_the_api(http: httpx.Client, api: ApiProcess, key: str) -> None:
    run_id = submit(http, "one_hop")
    wait_status(http, run_id, {"completed"})
    cli = [sys.executable, "-m", "producer.cli", "timeline", run_id, "--api", api.url, "--key", key]
    out = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60, check=True)
    assert Timeline.model_validate_json(out.stdout) == Timeline.model_validate(
        http.get(f"/v1/runs/{run_id}/timeline").json()
    )
    assert [b.name for b in Timeline.model_validate_json(out.stdout).bars if b.kind == "phase"] == [
        "start", "think", "observe", "think",
    ]  # fmt: skip
    refused = subprocess.run([*cli[:-1], "wsk_not-a-key"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "unknown or revoked" in refused.stderr


def test_a_message_is_sent_from_a_running_runs_page(
    page: Page, http: httpx.Client, api: ApiProcess, server: RedisServer
) -> None:
    run_id = submit(http, "inbox")  # holds in its tool until released
    r = server.client()
    wait_until(lambda: r.exists(HOLDING_KEY + run_id), 60, what="the hold call")
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#send-form:not([hidden])")
    text = "<b>not markup</b> from the console"
    page.fill("#send-text", text)
    page.click("#send")
    page.wait_for_selector('#send-result:text("message #1: pending")')
    page.wait_for_selector('#conversation li[data-kind="SignalReceived"]')
    r.set(RELEASE_KEY + run_id, "1", ex=3600)
    page.wait_for_selector("#run-status.badge.completed")
    page.wait_for_selector('#conversation li[data-kind="SignalApplied"]')
    assert f"heard: {text}" in (page.text_content("#run-facts") or "")  # shown as text, not markup
    assert page.query_selector("#run-facts b") is None
    assert page.is_hidden("#send-form")
