"""The console's operator view in a real headless browser (Debian's chromium) against a real
``wesichain api``, real workers and a real redis-server.

An operator's key sees both live workers with their versions, queues and slots, the depth of a
namespace queue no worker consumes and the parked runs of a known setup; a tenant's key sees
pool-wide counts and its own runs only, over the page and over HTTP; a worker SIGKILLed while it
holds a run disappears from the view, is listed dead, and the run's timeline shows where it died.
The documentation's picture of this page is taken with a smaller pool, by
``tests/console/test_console_pages.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page

from shared.state import Phase
from tests.api_support import ApiProcess, bearer, wait_status
from tests.chaos.support import Cluster, wait_paused
from tests.console.support import new_key, signed_in, submit
from tests.harness import RedisServer, wait_until

NAMESPACE = f"opsq-{uuid.uuid4().hex[:6]}"
# Each run's first think pauses (once per run) on the worker that claimed it, long enough for the
# test to find and SIGKILL that worker; the other one takes the run over and does not pause.
WORKER_ENV = {"WESICHAIN_FAULT": "pause:thinking", "WESICHAIN_FAULT_PAUSE_S": "15"}


@pytest.fixture(scope="module")
def operator_key(server: RedisServer) -> str:
    return new_key(server, "ops", operator=True)


@pytest.fixture(scope="module")
def tenant_key(server: RedisServer) -> str:
    return new_key(server, "shop", namespaces=[NAMESPACE])


@pytest.fixture
def operator_page(browser: Browser, api: ApiProcess, operator_key: str) -> Iterator[Page]:
    with signed_in(browser, api.url, operator_key, height=1000, console_errors=True) as tab:
        yield tab


@pytest.fixture
def tenant_page(browser: Browser, api: ApiProcess, tenant_key: str) -> Iterator[Page]:
    with signed_in(browser, api.url, tenant_key, height=1000, console_errors=True) as tab:
        yield tab


def fact(page: Page, selector: str) -> str:
    return (page.text_content(selector) or "").strip()


def test_the_operator_view_shows_workers_queues_and_parked_runs(
    operator_page: Page,
    tenant_page: Page,
    api: ApiProcess,
    cluster: Cluster,
    operator_key: str,
    tenant_key: str,
) -> None:
    with (
        httpx.Client(base_url=api.url, headers=bearer(tenant_key), timeout=30) as shop,
        httpx.Client(base_url=api.url, headers=bearer(operator_key), timeout=30) as ops,
    ):
        # A known setup: two runs parked for approval, three queued where no worker consumes, one
        # of the operator's completed. Each run's first think pauses (WORKER_ENV): submitted
        # together, the three that reach a worker pause side by side, not one pause after another.
        parked = [submit(shop, "needs_approval") for _ in range(2)]
        own = submit(ops, "direct")
        queued = [submit(shop, "direct", namespace=NAMESPACE) for _ in range(3)]
        for run_id in parked:
            wait_status(shop, run_id, {"awaiting_approval"}, timeout=90)
        wait_status(ops, own, {"completed"}, timeout=90)

        page = operator_page
        page.goto(f"{api.url}/#/operator")
        page.wait_for_selector("#operator-view:not([hidden])")
        names = sorted(f"{w.name}@test" for w in cluster.workers if w.alive)
        wait_until(
            lambda: (
                sorted(
                    page.eval_on_selector_all(
                        "#pool-workers tr[data-worker]", "r => r.map(e => e.dataset.worker)"
                    )
                )
                == names
            ),
            timeout=60,
            what="both workers listed",
        )
        for name in names:
            row = f'#pool-workers tr[data-worker="{name}"]'
            text = fact(page, row)
            assert "direct v1" in text and "wesichain.model" in text and "prefork ×2" in text, text
            assert fact(page, f"{row} td[data-slots]").endswith("/2")
        page.wait_for_selector(f'#pool-queues tr[data-queue="{NAMESPACE}.model"] td[data-depth]:text-is("3")')
        assert "Operator view" in fact(page, "#pool-scope")

        # The tenant: pool-wide counts and its own runs, no worker, no namespace queue.
        page = tenant_page
        page.goto(f"{api.url}/#/operator")
        page.wait_for_selector('#pool-parked [data-parked="approval"] b:text-is("2")')
        page.wait_for_selector('#pool-facts [data-fact="workers"] b:text-is("2 live, 2 consuming")')
        assert page.is_hidden("#pool-workers") and page.is_hidden("#pool-deaths-box")
        assert page.query_selector(f'#pool-queues tr[data-queue="{NAMESPACE}.model"]') is None
        listed = page.eval_on_selector_all("#pool-running tr[data-run]", "r => r.map(e => e.dataset.run)")
        assert sorted(listed) == sorted(queued)
        assert "Tenant view" in fact(page, "#pool-scope")

        # Over HTTP, as an attacker holding the tenant's key would read it.
        seen = shop.get("/v1/pool").json()
        assert seen["scope"] == "tenant" and seen["workers"] == [] and seen["deaths"] == []
        assert seen["leases_due"] is None
        assert [q["queue"] for q in seen["queues"]] == [
            "wesichain.model",
            "wesichain.tools",
            "wesichain.callbacks",
        ]
        assert seen["parked"]["approval"] == 2 and seen["in_flight"] == 5
        text = shop.get("/v1/pool", params={"minutes": 1440}).text
        assert own not in text and "@test" not in text
        assert shop.get(f"/v1/runs/{own}/timeline").status_code == 404
        refused = shop.get("/v1/pool", params={"minutes": 100_000})
        assert refused.status_code == 422 and refused.json()["error"]["kind"] == "invalid_request"
        whole = ops.get("/v1/pool").json()
        assert whole["scope"] == "operator" and whole["parked"]["approval"] >= 2
        assert not {r["run_id"] for r in whole["running"]} & set(parked + queued)
        assert sum(m["completed"] for m in whole["throughput"]) >= 1


def test_a_worker_killed_holding_a_run_leaves_the_view_and_marks_the_timeline(
    operator_page: Page, api: ApiProcess, server: RedisServer, cluster: Cluster, operator_key: str
) -> None:
    page = operator_page
    with httpx.Client(base_url=api.url, headers=bearer(operator_key), timeout=30) as ops:
        page.goto(f"{api.url}/#/operator")
        page.wait_for_selector("#pool-workers tr[data-worker]")
        run_id = submit(ops, "direct")
        victim = cluster.owner(wait_paused(server.client(), Phase.THINKING, run_id))
        name = f"{victim.name}@test"
        page.wait_for_selector(f'#pool-workers tr[data-worker="{name}"]')
        victim.kill()  # SIGKILL, main process and pool: it never says goodbye
        run = wait_status(ops, run_id, {"completed"}, timeout=90)
        assert run["answer"]
        page.wait_for_selector(f'#pool-workers tr[data-worker="{name}"]', state="detached")
        page.wait_for_selector("#pool-deaths li[data-death]")
        assert len(page.eval_on_selector_all("#pool-workers tr[data-worker]", "r => r")) == 1

        timeline = ops.get(f"/v1/runs/{run_id}/timeline").json()
        died = [m for m in timeline["markers"] if m["kind"] == "worker_died"]
        assert len(died) == 1, timeline["markers"]
        assert "died (its liveness ran out)" in died[0]["text"]
        page.goto(f"{api.url}/#/runs/{run_id}")
        page.wait_for_selector("#run-status.badge.completed")
        # A dashed line across the lanes (no width of its own: attached, not "visible").
        page.wait_for_selector("#timeline g.worker-died", state="attached")
        title = page.text_content("#timeline g.worker-died title") or ""
        assert "died (its liveness ran out)" in title
