"""The console's assistants page in a real headless browser (Debian's chromium) against a real
``wesichain api``, a real worker and a real redis-server: a tenant's assistants, the versions of
one, a diff of two, a rollback from the page, hostile text rendered as text, and nothing of another
tenant's. ``WESICHAIN_SCREENSHOTS=dir`` keeps the page's picture as ``dir/console-assistants.png``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.console.support import screenshot, signed_in
from tests.harness import RedisServer, WorkerProcess

AGENTS = "tests.agents_assistants"
HOSTILE = '<img src=x onerror="window.__owned=1"><script>window.__owned=1</script> {input}'


@pytest.fixture(scope="module")
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    worker = WorkerProcess(
        "asst", server.url, agents=AGENTS, log_dir=str(tmp_path_factory.mktemp("w"))
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


def _client(api: ApiProcess, server: RedisServer) -> tuple[str, httpx.Client]:
    tenants = Tenants(server.client(), Keys())
    key, record = tenants.create_key(f"t-{uuid.uuid4().hex[:8]}", "browser")
    tenants.set_models(record.tenant, ["scripted:*"])  # its assistants name scripted models
    return key, httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)


@pytest.fixture
def page(browser: Browser, api: ApiProcess, server: RedisServer) -> Iterator[tuple[Page, httpx.Client]]:
    key, http = _client(api, server)
    with http, signed_in(browser, api.url, key) as tab:
        yield tab, http


def test_versions_diff_and_rollback_from_the_assistants_page(
    page: tuple[Page, httpx.Client], api: ApiProcess, server: RedisServer
) -> None:
    tab, http = page
    name = f"desk-{uuid.uuid4().hex[:6]}"
    v1 = {"model": "scripted:concierge-a", "system_prompt": HOSTILE, "tools": ["lookup"]}
    v2 = {"model": "scripted:concierge-b", "system_prompt": HOSTILE, "tools": ["lookup", "book"]}
    created = http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": v1})
    assert created.status_code == 201, created.text
    assert http.put(f"/v1/assistants/{name}", json={"config": v2}).status_code == 200
    # Another tenant's assistant is not listed.
    _, other = _client(api, server)
    with other:
        theirs = other.post("/v1/assistants", json={"name": "theirs", "agent": "concierge", "config": v1})
        assert theirs.status_code == 201, theirs.text

    tab.goto(f"{api.url}/#/assistants")
    tab.wait_for_selector(f'#assistants tr[data-assistant="{name}"]')
    assert tab.eval_on_selector_all(
        "#assistants tr[data-assistant]", "r => r.map(e => e.dataset.assistant)"
    ) == [name]
    tab.click(f'#assistants tr[data-assistant="{name}"] a')
    tab.wait_for_selector('#assistant-versions tr[data-version="2"]')
    assert tab.eval_on_selector_all(
        "#assistant-versions tr[data-version]", "r => r.map(e => e.dataset.version)"
    ) == [
        "2",
        "1",
    ]
    tab.click("#diff-button")
    tab.wait_for_selector('#assistant-diff tr[data-field="model"]')
    changed = tab.eval_on_selector_all("#assistant-diff tr[data-field]", "r => r.map(e => e.dataset.field)")
    assert sorted(changed) == ["model", "tools"]
    assert "scripted:concierge-b" in (tab.text_content('#assistant-diff tr[data-field="model"]') or "")

    # The hostile prompt is text: no element was made of it, no script of it ran.
    assert HOSTILE.replace('"', '\\"') in (tab.text_content('#assistant-versions tr[data-version="1"]') or "")
    assert tab.query_selector("#assistants-view img") is None
    assert tab.query_selector("#assistants-view script") is None
    assert tab.evaluate("window.__owned") is None

    screenshot(tab, "assistants")
    tab.click('#assistant-versions tr[data-version="1"] button.rollback')
    tab.wait_for_selector('#assistant-versions tr[data-version="3"]')
    assert "rollback to v1" in (tab.text_content('#assistant-versions tr[data-version="3"]') or "")
    current = http.get(f"/v1/assistants/{name}").json()
    assert current["version"] == 3 and current["restored_from"] == 1
    assert current["config"]["model"] == "scripted:concierge-a"


def test_an_assistant_is_deleted_from_its_page_on_a_second_click(
    page: tuple[Page, httpx.Client], api: ApiProcess
) -> None:
    tab, http = page
    name = f"gone-{uuid.uuid4().hex[:6]}"
    config = {"model": "scripted:concierge-a", "tools": ["lookup"]}
    created = http.post("/v1/assistants", json={"name": name, "agent": "concierge", "config": config})
    assert created.status_code == 201, created.text

    tab.goto(f"{api.url}/#/assistants")
    tab.click(f'#assistants tr[data-assistant="{name}"] a')
    tab.wait_for_selector('#assistant-versions tr[data-version="1"]')
    tab.click("#assistant-delete")
    assert tab.text_content("#assistant-delete") == f"Delete {name}: no new run can name it (click again)"
    assert http.get(f"/v1/assistants/{name}").status_code == 200  # one click deletes nothing
    tab.click("#assistant-delete")
    tab.wait_for_selector(f'#assistants tr[data-assistant="{name}"]', state="detached")
    assert tab.is_hidden("#assistant-box")
    gone = http.get(f"/v1/assistants/{name}")
    assert gone.status_code == 404, gone.text
