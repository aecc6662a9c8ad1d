"""The console's pages that had no browser test, in a real headless browser (Debian's chromium)
against a real ``wesichain api``, real workers and Redis: the memory page (a tenant's namespaces
and items, searched by prefix and text, another tenant's items never shown), a handed-off run's
page (the agent it is with now, the handoff in the conversation and on the timeline, the transfer
call that made it), a tool's custom events under their call, the send form of a run that ended (closed, and a
send that crossed the end refused with the API's reason), and the agent versions table. Every text
a run, a tool or a memory item holds carries markup and script and must render as text; no page
may raise a script error or ask another origin for anything. ``WESICHAIN_SCREENSHOTS=DIR`` keeps
the pictures (``DIR/console-*.png``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from playwright.sync_api import Browser, Page

from tests.agents_console import HOSTILE
from tests.api_support import ApiProcess, wait_status
from tests.console.support import new_key, screenshot, signed_in, submit, wait_js
from tests.harness import RedisServer

AGENTS = "tests.agents_console"
TENANT = "pages"
#: Elements that would exist only if some text had been taken as markup.
MARKUP = "#{view} img, #{view} script, #{view} b:not(.step-head b)"


def no_markup(page: Page, view: str) -> None:
    assert page.query_selector(MARKUP.format(view=view)) is None


def put_item(client: httpx.Client, namespace: list[str], key: str, value: dict[str, object]) -> None:
    answer = client.put("/v1/memory/items", json={"namespace": namespace, "key": key, "value": value})
    assert answer.status_code == 200, answer.text


def test_the_memory_page_shows_the_tenants_items_as_text(
    page: Page, http: httpx.Client, attacker: httpx.Client, api: ApiProcess
) -> None:
    put_item(http, ["users", "u-42"], "prefs", {"tone": HOSTILE})
    put_item(http, ["users", "u-7"], "prefs", {"tone": "dry"})
    put_item(http, ["teams", "t1"], HOSTILE, {"size": 3})
    put_item(attacker, ["users", "u-42"], "secret", {"leak": "the rival's"})
    page.goto(f"{api.url}/#/memory")
    page.wait_for_selector("#memory-view:not([hidden])")
    wait_js(page, "document.querySelectorAll('#memory-items tbody tr').length === 3")
    assert (page.text_content("#memory-namespaces") or "").removeprefix("Namespaces: ").split(", ") == [
        "teams/t1", "users/u-42", "users/u-7",
    ]  # fmt: skip
    rows = page.eval_on_selector_all(
        "#memory-items tbody tr",
        "rs => rs.map(r => [r.cells[0].textContent, r.cells[1].textContent, r.cells[5].textContent])",
    )
    assert sorted(rows) == sorted([
        ["users/u-42", "prefs", json.dumps({"tone": HOSTILE}, separators=(",", ":"))],
        ["users/u-7", "prefs", '{"tone":"dry"}'],
        ["teams/t1", HOSTILE, '{"size":3}'],
    ])  # fmt: skip
    assert "rival" not in (page.text_content("#memory-view") or "")  # another tenant's item
    no_markup(page, "memory-view")
    screenshot(page, "memory", "#memory-view")
    # A prefix narrows to its namespaces; a text to the items whose value holds it.
    page.fill('#memory-form input[name="prefix"]', "users")
    page.click("#memory-form button")
    wait_js(page, "document.querySelectorAll('#memory-items tbody tr').length === 2")
    assert page.text_content("#memory-namespaces") == "Namespaces: users/u-42, users/u-7"
    page.fill('#memory-form input[name="query"]', "dry")
    page.click("#memory-form button")
    wait_js(page, "document.querySelectorAll('#memory-items tbody tr').length === 1")
    assert page.text_content("#memory-items tbody tr td:first-child") == "users/u-7"
    # Bad input: a structured error on the page, nothing shown as found.
    page.fill('#memory-form input[name="prefix"]', "bad label!")
    page.fill('#memory-form input[name="query"]', "")
    page.click("#memory-form button")
    wait_js(page, "document.querySelector('#memory-error').textContent !== ''")
    assert "bad label!" in (page.text_content("#memory-error") or "")
    no_markup(page, "memory-view")


def test_a_handed_off_runs_page_shows_whom_it_is_with_and_the_handoff(
    page: Page, http: httpx.Client, attacker: httpx.Client, api: ApiProcess
) -> None:
    run_id = submit(http, "desk")
    run = wait_status(http, run_id, {"completed"})
    assert run["answer"] == f"refunds took it {HOSTILE}" and run["current_agent"] == "refunds"
    assert attacker.get(f"/v1/runs/{run_id}").status_code == 404
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-status.badge.completed")
    facts = page.eval_on_selector_all("#run-facts dt, #run-facts dd", "es => es.map(e => e.textContent)")
    told = dict(zip(facts[::2], facts[1::2], strict=True))
    assert told["Agent"].startswith("desk v") and told["Now with"] == "refunds"
    assert told["Handoffs"] == "step 1: desk → refunds v3"
    assert told["Answer"] == f"refunds took it {HOSTILE}"
    # The step: the desk's words (as text), its transfer call, and the handoff it made.
    page.wait_for_selector('#conversation li[data-kind="HandedOff"]')
    step = '#conversation li.step[data-step="1"]'
    said = page.text_content(f'{step} li[data-kind="ModelResponded"] .body') or ""
    assert said == f"Passing you to refunds {HOSTILE}"
    handoff = page.text_content(f'{step} li[data-kind="HandedOff"] .body') or ""
    assert handoff == "desk → refunds v3 by its transfer call call_0 (kept history)"
    assert page.get_attribute(f'{step} li[data-kind="HandedOff"]', "class") == "handoff"
    answered = page.text_content('#conversation li.step[data-step="2"] li[data-kind="ModelResponded"] .body')
    assert answered == f"refunds took it {HOSTILE}"
    # On the timeline: a handoff marker whose title names both agents.
    marker = page.wait_for_selector("#timeline path.handoff")
    assert marker is not None
    assert "refunds" in (page.eval_on_selector("#timeline path.handoff title", "t => t.textContent") or "")
    no_markup(page, "run-view")
    screenshot(page, "handoff")


def test_a_tools_custom_events_show_under_their_call_as_text(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    run_id = submit(http, "shouter")
    wait_status(http, run_id, {"completed"})
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#run-status.badge.completed")
    call = '#conversation li.step[data-step="1"] li.call[data-call="call_0"]'
    page.wait_for_selector(f'{call} [data-kind="ToolCompleted"]')
    custom = page.eval_on_selector_all(
        f'{call} [data-kind="CustomEvent"]',
        "es => es.map(e => [e.querySelector('.kind').textContent, e.querySelector('pre').textContent,"
        " e.classList.contains('void')])",
    )
    assert [(kind.split(" · step")[0], json.loads(data), void) for kind, data, void in custom] == [
        ("note · shout call_0 (attempt 1)", {"n": 1, "text": HOSTILE}, False),
        ("note · shout call_0 (attempt 1)", {"n": 2, "text": HOSTILE}, False),
    ]
    assert "shouted 2 times" in (page.text_content(f'{call} [data-kind="ToolCompleted"]') or "")
    no_markup(page, "run-view")
    screenshot(page, "events", "#conversation")


def test_the_send_form_of_an_ended_run_is_closed_and_a_late_send_is_refused(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    run_id = submit(http, "hostile_charge")  # parks on its charge: not ended, takes messages
    wait_status(http, run_id, {"awaiting_approval"})
    page.goto(f"{api.url}/#/runs/{run_id}")
    page.wait_for_selector("#send-form:not([hidden])")
    assert page.is_hidden("#send-closed")
    page.fill("#send-text", f"too late {HOSTILE}")
    assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
    wait_status(http, run_id, {"interrupted"})
    # The page follows the end without a reload: the form goes, a line says why.
    page.wait_for_selector("#run-status.badge.interrupted")
    page.wait_for_selector("#send-closed:not([hidden])")
    assert page.is_hidden("#send-form")
    assert page.text_content("#send-closed") == "This run has ended: it takes no more messages."
    # A send that crossed the end (typed before it, sent after): the API's refusal, said plainly.
    page.evaluate("document.querySelector('#send-form').requestSubmit()")
    wait_js(page, "document.querySelector('#send-result').textContent.startsWith('refused')")
    refused = page.text_content("#send-result") or ""
    assert refused.startswith("refused (run_ended): "), refused
    answer = http.post(f"/v1/runs/{run_id}/messages", json={"text": "x"})
    assert answer.status_code == 409 and answer.json()["error"]["kind"] == "run_ended"
    assert refused == f"refused (run_ended): {answer.json()['error']['message']}"
    assert http.get(f"/v1/runs/{run_id}").json()["status"] == "interrupted"  # nothing else changed
    no_markup(page, "run-view")


def test_the_agent_versions_table_lists_the_pools_versions(
    page: Page, http: httpx.Client, api: ApiProcess
) -> None:
    listed = http.get("/v1/versions").json()["versions"]
    assert {(v["agent"], v["version"]) for v in listed} >= {("refunds", "3")}
    wait_js(page, f"document.querySelectorAll('#versions tbody tr').length === {len(listed)}")
    rows = page.eval_on_selector_all(
        "#versions tbody tr",
        "rs => rs.map(r => [r.dataset.version, ...Array.from(r.cells).map(c => c.textContent)])",
    )

    def state(v: dict[str, Any]) -> str:
        if v["waiting"]:
            return f"waiting for a worker serving {v['agent']} v{v['version']}"
        return "live" if v["workers"] else "no workers"

    expected = [
        [f"{v['agent']}:{v['version']}", f"{v['agent']} v{v['version']}",
         *(str(v[n]) for n in ("workers", "draining", "active_runs", "parked_runs")), state(v)]
        for v in listed
    ]  # fmt: skip
    assert rows == expected
    refunds = next(r for r in rows if r[0] == "refunds:3")
    assert refunds[1:3] == ["refunds v3", "2"] and refunds[-1] == "live"  # both workers serve it
    screenshot(page, "list", "#list-view")


def test_the_operator_view_of_a_small_pool(browser: Browser, api: ApiProcess, server: RedisServer) -> None:
    """The operator's picture of this module's pool (two workers, a dozen agents): workers with
    what they serve, queue depths, parked runs, throughput (``console-operator.png``)."""
    with signed_in(browser, api.url, new_key(server, "ops", operator=True)) as page:
        page.goto(f"{api.url}/#/operator")
        wait_js(page, "document.querySelectorAll('#pool-workers tr[data-worker]').length === 2")
        serves = page.text_content("#pool-workers tr[data-worker] td:nth-child(2)") or ""
        assert "refunds v3" in serves and "shouter v1" in serves
        screenshot(page, "operator")


def test_another_tenants_run_reads_on_the_console_as_a_run_that_does_not_exist(
    browser: Browser, http: httpx.Client, api: ApiProcess, server: RedisServer
) -> None:
    """A key of another tenant that opens a run's address sees what a run that never existed
    shows: the same 404, and none of the run's content."""
    run_id = submit(http, "desk", f"private {HOSTILE}")
    wait_status(http, run_id, {"completed"})
    missing = uuid.uuid4().hex
    with signed_in(browser, api.url, new_key(server, "rival")) as tab:
        for target in (run_id, missing):
            tab.goto(f"{api.url}/#/runs/{target}")
            wait_js(tab, f"$('#run-title').textContent === 'Run {target}' && $('#run-error').textContent")
            assert tab.text_content("#run-error") == f"no run '{target}'"
            assert (
                tab.eval_on_selector_all(
                    "#run-facts > *, #conversation > *, #checkpoints tbody > *, #timeline > *",
                    "es => es.length",
                )
                == 0
            )
            assert tab.is_hidden("#run-failure") and tab.is_hidden("#pending")
            shown = tab.text_content("#run-view") or ""
            assert "private" not in shown and "refunds" not in shown and "desk" not in shown


def test_the_console_runs_no_inline_script_and_keeps_the_key_in_its_tab(
    page: Page, api: ApiProcess, key: str
) -> None:
    """Markup that reached the page anyway (a rendering mistake) still could not run script: the
    policy allows the console's own files only. The key lives in this tab's sessionStorage: never
    in a cookie, localStorage or the address, and no link sends a Referer."""
    served = httpx.get(f"{api.url}/")
    assert served.headers["content-security-policy"] == (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
    assert served.headers["referrer-policy"] == "no-referrer"
    planted = (
        '<img src="/console/none.png" onerror="window.__pwned=1">'
        '<a href="javascript:window.__pwned=1" id="planted">x</a>'
    )
    page.evaluate(
        """(planted) => {
          window.__blocked = [];
          document.addEventListener('securitypolicyviolation',
            (e) => window.__blocked.push(e.violatedDirective));
          const box = document.createElement('div');
          box.innerHTML = planted;
          document.body.append(box);
          document.getElementById('planted').click();
        }""",
        planted,
    )
    wait_js(page, "window.__blocked.length >= 2")
    assert set(page.evaluate("window.__blocked")) == {"script-src-attr", "script-src-elem"}
    assert page.evaluate("window.__pwned") is None
    kept = page.evaluate("[sessionStorage.getItem('wesichain.key'), localStorage.length, document.cookie]")
    assert kept == [key, 0, ""]
    assert key not in page.url
