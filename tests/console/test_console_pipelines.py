"""The console's pipeline page in a real headless browser (Debian's chromium), against a real API
and a real worker: its steps with each child run's state, live until it ends, links to each
child's own page, and cancel."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Browser, Page

from shared.keys import Keys
from shared.pipeline.store import child_run_id
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.console.support import screenshot, signed_in, wait_js
from tests.harness import RedisServer, WorkerProcess

AGENTS = "tests.agents_pipelines"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str]]:
    server = RedisServer().start()
    worker = WorkerProcess(
        "pc1",
        server.url,
        agents=AGENTS,
        concurrency=3,
        log_dir=str(tmp_path_factory.mktemp("w")),
        env={"PIPE_SLOW_S": "0.5"},
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    key, _ = Tenants(server.client(), Keys()).create_key(f"pc-{uuid.uuid4().hex[:8]}", "browser")
    yield process, key
    process.stop()
    worker.stop()
    server.cleanup()


@pytest.fixture
def http(api: tuple[ApiProcess, str]) -> Iterator[httpx.Client]:
    process, key = api
    with httpx.Client(base_url=process.url, headers=bearer(key), timeout=30) as client:
        yield client


@pytest.fixture
def page(browser: Browser, api: tuple[ApiProcess, str]) -> Iterator[Page]:
    process, key = api
    with signed_in(browser, process.url, key) as tab:
        yield tab


def start(http: httpx.Client, pipeline: str, items: list[str]) -> str:
    response = http.post("/v1/pipelines", json={"pipeline": pipeline, "input": ",".join(items)})
    assert response.status_code == 202, response.text
    pipeline_id: str = response.json()["pipeline_id"]
    return pipeline_id


def test_a_pipelines_page_shows_its_steps_and_children_live(
    page: Page, http: httpx.Client, api: tuple[ApiProcess, str]
) -> None:
    items = [f"slow p{i}" for i in range(6)]
    pid = start(http, "fan", items)
    page.goto(f"{api[0].url}/#/pipelines/{pid}")
    page.wait_for_selector("#pipeline-status.badge.running")
    page.evaluate("window.__loaded_once = true")  # gone if the page reloads
    page.wait_for_selector("#pipeline-status.badge.completed")  # no reload: it refreshes itself
    assert page.evaluate("window.__loaded_once") is True
    kinds = page.eval_on_selector_all("#pipeline-graph .step", "els => els.map(e => e.dataset.kind)")
    assert kinds == ["then", "map", "reduce"]
    assert page.eval_on_selector_all('.step[data-kind="map"] .child.completed', "els => els.length") == 6
    links = page.eval_on_selector_all(
        '.step[data-kind="map"] a[data-run]', "els => els.map(e => e.dataset.run)"
    )
    # The children's ids build on the id the pipeline run is stored under (the tenant's own).
    first_child = http.get(f"/v1/pipelines/{pid}").json()["steps"][0]["children"][0]["run_id"]
    stored = first_child.removesuffix(":s0:i0:a0")
    assert links == [child_run_id(stored, 1, i, 0) for i in range(6)]
    assert "0:done slow p0 | 1:done slow p1" in (page.text_content("#pipeline-facts") or "")
    page.click(f'a[data-run="{child_run_id(stored, 1, 2, 0)}"]')  # a child's own page
    page.wait_for_selector("#run-status.badge.completed")
    assert child_run_id(stored, 1, 2, 0) in (page.text_content("#run-title") or "")
    # And back: the child names its pipeline run by the id its tenant gave it.
    assert http.get(f"/v1/runs/{child_run_id(stored, 1, 2, 0)}").json()["link"] == {
        "kind": "pipeline", "pipeline_id": pid, "seq": 1, "item": 2, "attempt": 0,
    }  # fmt: skip
    assert "(step 1, item 2)" in (page.text_content("#run-facts") or "")
    page.click("#pipeline-link")
    page.wait_for_selector(f'#pipeline-title:text("Pipeline run {pid}")')
    # The list of pipeline runs leads to it too.
    page.click("#pipelines-link")
    page.click(f'#pipelines tr[data-pipeline="{pid}"] a')
    page.wait_for_selector("#pipeline-status.badge.completed")
    screenshot(page, "pipeline")  # the documentation's picture


def test_a_pipeline_is_cancelled_from_its_page(
    page: Page, http: httpx.Client, api: tuple[ApiProcess, str]
) -> None:
    pid = start(http, "fan", [f"slow q{i}" for i in range(30)])
    page.goto(f"{api[0].url}/#/pipelines/{pid}")
    page.wait_for_selector('.step[data-kind="map"] .child.running')
    page.click("#pipeline-cancel")
    page.wait_for_selector("#pipeline-status.badge.interrupted")
    assert page.text_content("#pipeline-status") == "cancelled"
    assert page.is_hidden("#pipeline-cancel")
    assert http.get(f"/v1/pipelines/{pid}").json()["status"] == "cancelled"


def test_a_pipeline_id_with_dot_segments_never_opens_another_pipeline(
    page: Page, http: httpx.Client, api: tuple[ApiProcess, str]
) -> None:
    """A link to the page of a pipeline run whose id holds "/.." (the API refuses such an id now;
    one made before, or a link made up to mislead) must not make the page read (or cancel) the
    pipeline run it points at, only the one it names."""
    other = start(http, "fan", [f"slow o{i}" for i in range(30)])
    hostile = f"h/../{other}"
    made = http.post("/v1/pipelines", json={"pipeline": "chain", "input": "x", "pipeline_id": hostile})
    assert made.status_code == 422, made.text
    named = http.get(f"/v1/pipelines/{quote(hostile, safe='')}")  # the one path segment it is
    assert named.status_code == 404
    page.goto(f"{api[0].url}/#/pipelines/{hostile}")
    wait_js(page, "$('#pipeline-error').textContent || $('#pipeline-facts').children.length")
    assert page.text_content("#pipeline-title") == f"Pipeline run {hostile}"
    assert page.text_content("#pipeline-error") == named.json()["error"]["message"]
    assert page.eval_on_selector("#pipeline-facts", "e => e.children.length") == 0
    assert page.eval_on_selector("#pipeline-graph", "e => e.children.length") == 0
    assert page.is_hidden("#pipeline-cancel")
    assert http.get(f"/v1/pipelines/{other}").json()["status"] == "running"
    assert http.post(f"/v1/pipelines/{other}/cancel").status_code == 202


def test_a_child_run_of_a_pipeline_id_holding_at_opens_its_own_page(
    page: Page, http: httpx.Client, api: tuple[ApiProcess, str]
) -> None:
    """A pipeline id may hold '@' (so its children's run ids do): the child's link opens the
    child's page, as written and percent-encoded, not the list of runs."""
    pid = f"order@{uuid.uuid4().hex[:8]}"
    made = http.post("/v1/pipelines", json={"pipeline": "fan", "input": "slow a,slow b", "pipeline_id": pid})
    assert made.status_code == 202, made.text
    page.goto(f"{api[0].url}/#/pipelines/{pid}")
    page.wait_for_selector("#pipeline-status.badge.completed")
    child = http.get(f"/v1/pipelines/{pid}").json()["steps"][1]["children"][0]["run_id"]
    assert "@" in child
    page.click(f'a[data-run="{child}"]')
    page.wait_for_selector("#run-status.badge.completed")
    assert child in (page.text_content("#run-title") or "")
    page.goto(f"{api[0].url}/#/pipelines")
    page.wait_for_selector("#pipelines")
    page.goto(f"{api[0].url}/#/runs/{quote(child, safe='')}")
    page.wait_for_selector("#run-status.badge.completed")
    assert child in (page.text_content("#run-title") or "")
