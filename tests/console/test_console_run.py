"""The run page in a real headless browser (Debian's chromium) against a real API, real workers
and Redis: approvals that say what is approved and who decided, a run's family (subagent runs and
their parent, both ways), a failed run's error in full and its retry, fork from a checkpoint, a bulk
retry of failed runs from the list, the conversation grouped by step after a worker is SIGKILLed
in a tool call, and hostile text rendered as text. ``WESICHAIN_SCREENSHOTS=DIR`` keeps the
pictures (``docs/console-*.png``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route

from tests.agents_console import HOSTILE
from tests.api_support import ApiProcess, wait_status
from tests.chaos.support import Cluster, idem, wait_tool_started
from tests.console.support import screenshot, signed_in, submit, wait_js
from tests.harness import RedisServer, wait_until

AGENTS = "tests.agents_console"
TENANT = "runpage"


@pytest.fixture
def page(browser: Browser, api: ApiProcess, key: str) -> Iterator[Page]:
    with signed_in(browser, api.url, key, height=1000) as tab:
        yield tab


def test_an_approval_says_what_is_approved_and_who_decided(
    page: Page, http: httpx.Client, api: ApiProcess, attacker: httpx.Client
) -> None:
    run_id = submit(http, "hostile_charge")
    wait_status(http, run_id, {"awaiting_approval"})
    assert attacker.post(f"/v1/runs/{run_id}/approve", json={"note": "x"}).status_code == 404
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#pending:not([hidden])")
    # The panel is filled as its data arrives: wait for the last part of it.
    wait_js(page, "() => (document.querySelector('#pending').textContent || '').includes('Asked by')")
    # The parked call with its arguments, as text, and what asked for the decision.
    pending = page.text_content("#pending") or ""
    assert "charge · call_0" in pending and f'"label": {json.dumps(HOSTILE)}' in pending
    asked_by = "Asked by the agent's approval rule (approval_required): tool calls need approval: charge"
    assert asked_by in pending
    assert page.query_selector("#run-view img, #run-view script, #pending b") is None
    # The console's own step headers are bold; nothing else in the conversation may be.
    planted = "els => els.filter((e) => !e.closest('.step-head')).length"
    assert page.eval_on_selector_all("#conversation b", planted) == 0
    screenshot(page, "approval")
    note = "<i>fine</i> by finance"
    page.fill("#note", note)
    page.click("#approve")
    page.wait_for_selector("#run-status.badge.completed")
    decided = page.wait_for_selector('#conversation li[data-kind="ApprovalDecided"]')
    assert decided is not None
    text = decided.text_content() or ""
    assert "approved by tenant runpage-" in text and f": {note}" in text
    # After the decision the step still shows what was approved: the park's arguments.
    asked = page.text_content('#conversation li[data-kind="AwaitingApproval"]') or ""
    assert json.dumps(HOSTILE) in asked
    assert f"charged {HOSTILE}" in (page.text_content("#run-facts") or "")
    assert page.query_selector("#run-view img, #run-view script, #run-view i, #run-facts b") is None
    assert page.is_hidden("#pending")


def test_a_runs_subagents_are_linked_both_ways(
    page: Page, http: httpx.Client, api: ApiProcess, attacker: httpx.Client
) -> None:
    run_id = submit(http, "delegator")
    run = wait_status(http, run_id, {"completed"})
    assert run["answer"] == "both helpers answered" and run["parent"] is None and run["link"] is None
    children = http.get(f"/v1/runs/{run_id}/children").json()["runs"]
    assert [c["run_id"] for c in children] == [f"{run_id}.s1.call_0", f"{run_id}.s1.call_1"]
    assert [(c["parent"]["run_id"], c["parent"]["call_id"]) for c in children] == [
        (run_id, "call_0"), (run_id, "call_1"),
    ]  # fmt: skip
    for attack in (
        attacker.get(f"/v1/runs/{run_id}/children"),
        attacker.get(f"/v1/runs/{children[0]['run_id']}/children"),
        attacker.post(f"/v1/runs/{run_id}/retry"),
    ):
        assert attack.status_code == 404 and attack.json()["error"]["kind"] == "not_found"

    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-family:not([hidden])")
    rows = page.eval_on_selector_all("#run-children tbody tr", "els => els.map(e => e.dataset.run)")
    assert rows == [c["run_id"] for c in children]
    # The subagent calls in the conversation name their runs too.
    linked = page.eval_on_selector_all("#conversation a[data-child]", "els => els.map(e => e.dataset.child)")
    assert linked == rows
    screenshot(page, "family")
    page.click(f'#run-children tr[data-run="{rows[1]}"] a')
    page.wait_for_selector(f'#run-title:text("Run {rows[1]}")')
    page.wait_for_selector("#parent-link")
    assert "its subagent call call_1 in step 1" in (page.text_content("#run-facts") or "")
    assert page.is_hidden("#retry")  # the runtime started it: its parent is what to retry
    page.click("#parent-link")
    page.wait_for_selector(f'#run-title:text("Run {run_id}")')
    page.wait_for_selector("#run-family:not([hidden])")


def test_a_run_page_whose_reads_are_refused_for_a_moment_shows_when_they_are_served(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    # A tenant's timelines share two places per API process (429 too_many_scans past them), and a
    # page refreshing as events came overlapped its own reads: a refused one left the page with an
    # error and without its checkpoints, for good once the run had ended (no event asks again).
    run_id = submit(http, "tool_fails")
    wait_status(http, run_id, {"failed"})
    refused: list[str] = []
    busy = {"error": {"kind": "too_many_scans", "message": "the tenant runs 2 scans", "details": {}}}

    def twice(route: Route) -> None:
        if len(refused) < 2:
            refused.append(route.request.url)
            headers = {"Retry-After": "1", "Content-Type": "application/json"}
            route.fulfill(status=429, headers=headers, body=json.dumps(busy))
        else:
            route.continue_()

    page.route("**/timeline", twice)
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector('#checkpoints button.fork[data-version="1"]')
    page.wait_for_selector("#run-failure:not([hidden])")
    assert len(refused) == 2
    assert page.text_content("#run-error") == ""


def test_a_failed_run_shows_its_error_and_is_retried_and_forked_from_its_page(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    run_id = submit(http, "tool_fails")
    failed = wait_status(http, run_id, {"failed"})
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-failure:not([hidden])")
    assert (page.text_content("#run-failure .kind") or "").startswith(failed["error"]["kind"])
    assert failed["error"]["message"] in (page.text_content("#run-failure") or "")
    assert page.is_hidden("#stream-box")  # the error, not an empty streaming bar
    # The step: the call and its failed result together.
    page.wait_for_selector('#conversation li.step li.call[data-call="call_0"] .result.bad')
    screenshot(page, "failed")
    page.click("#retry")
    wait_js(page, f"location.hash.startsWith('#/runs/') && !location.hash.endsWith('{run_id}')")
    retried = page.evaluate("location.hash").removeprefix("#/runs/")
    page.wait_for_selector("#run-status.badge.failed")
    again = http.get(f"/v1/runs/{retried}").json()
    assert (again["agent"], again["input"], again["fork"]) == ("tool_fails", "go", None)
    # Fork from its first checkpoint: the new run names its origin.
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.click('#checkpoints button.fork[data-version="1"]')
    wait_js(
        page,
        f"location.hash.startsWith('#/runs/') && !location.hash.endsWith('{run_id}')"
        f" && !location.hash.endsWith('{retried}')",
    )
    page.wait_for_selector(f'#run-facts a[href="#/runs/{run_id}"]')
    assert f"{run_id} v1" in (page.text_content("#run-facts") or "")


def test_a_run_page_left_for_another_keeps_nothing_clickable_while_the_next_loads(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    """Moving from one run's page to another's hides the first at once: its retry and fork
    buttons, still drawn while the next page checks the key, would act on the run left behind."""
    first = submit(http, "tool_fails")
    second = submit(http, "tool_fails")
    wait_status(http, first, {"failed"})
    page.goto(f"{api.url}/#/runs/{first}")
    page.wait_for_selector('#checkpoints button.fork[data-version="1"]')
    # A listener added after the console's own runs once its navigation has begun.
    shown = page.evaluate(
        """(to) => new Promise((resolve) => {
            window.addEventListener("hashchange", () => resolve(!$("#run-view").hidden), { once: true });
            location.hash = to;
        })""",
        f"#/runs/{second}",
    )
    assert shown is False
    page.wait_for_selector(f'#run-title:text("Run {second}")')
    page.wait_for_selector("#run-view:not([hidden])")


def test_retry_is_refused_for_a_run_that_has_not_ended(http: httpx.Client) -> None:
    run_id = submit(http, "hostile_charge")
    wait_status(http, run_id, {"awaiting_approval"})
    refused = http.post(f"/v1/runs/{run_id}/retry")
    assert refused.status_code == 409 and refused.json()["error"]["kind"] == "wrong_state"
    assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
    wait_status(http, run_id, {"interrupted"})
    first = http.post(f"/v1/runs/{run_id}/retry", headers={"Idempotency-Key": "retry-once"})
    second = http.post(f"/v1/runs/{run_id}/retry", headers={"Idempotency-Key": "retry-once"})
    assert first.status_code == second.status_code == 202
    assert first.json()["run_id"] == second.json()["run_id"] != run_id


def test_failed_runs_are_retried_in_bulk_from_the_list(page: Page, http: httpx.Client) -> None:
    ids = [submit(http, "tool_fails") for _ in range(2)]
    for run_id in ids:
        wait_status(http, run_id, {"failed"})
    page.fill('#filters input[name="agent"]', "tool_fails")
    page.click("#retry-failed")
    page.wait_for_selector("#bulk-view:not([hidden])")
    page.wait_for_selector("#bulk-jobs tbody tr[data-job]")
    job_id = page.get_attribute("#bulk-jobs tbody tr[data-job]", "data-job")
    job = wait_until(
        lambda: (j := http.get(f"/v1/bulk/{job_id}").json())["status"] != "running" and j,
        timeout=60,
        what="the bulk retry to end",
    )
    page.wait_for_selector(f'#bulk-jobs tr[data-job="{job_id}"] .badge.completed')  # live, no reload
    assert job["query"]["status"] == "failed" and job["query"]["agent"] == "tool_fails"
    assert job["acted"] >= 2 and job["failed"] == 0


def test_a_call_whose_worker_was_killed_reads_as_one_call_with_its_result(
    page: Page, http: httpx.Client, api: ApiProcess, server: RedisServer, cluster: Cluster
) -> None:
    run_id = submit(http, "progress_held")
    r = server.client()
    victim = cluster.owner(wait_tool_started(r, idem(run_id)))
    victim.kill()  # SIGKILL, mid-call: another worker takes the call over
    try:
        wait_status(http, run_id, {"completed"}, timeout=90)
        page.goto(f"{api.url}/#/runs/{run_id}")
        page.wait_for_selector("#run-status.badge.completed")
        call = '#conversation li.step[data-step="1"] li.call[data-call="call_0"]'
        page.wait_for_selector(f'{call} [data-kind="ToolCompleted"]')
        assert page.eval_on_selector_all(f'{call} [data-kind="ToolCompleted"]', "els => els.length") == 1
        assert "attempt 2" in (page.text_content(f'{call} [data-kind="ToolCompleted"] .kind') or "")
        custom = page.eval_on_selector_all(
            f'{call} [data-kind="CustomEvent"]', "els => els.map(e => e.classList.contains('void'))"
        )
        assert custom == [True, True, True, False, False, False]  # the dead delivery's, then the rerun's
        steps = page.eval_on_selector_all("#conversation li.step", "els => els.map(e => e.dataset.step)")
        assert steps == ["1", "2"]
        head = page.text_content('#conversation li.step[data-step="1"] .step-head') or ""
        assert "10 in / 5 out tokens" in head and "think " in head
        screenshot(page, "run")
    finally:
        victim.stop()  # reaps it and closes its log; then the pool is whole again
        victim.start(wait=False)
        victim.wait_ready(timeout=60)
