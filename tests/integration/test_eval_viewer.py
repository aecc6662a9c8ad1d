"""The eval viewer served by a real ``wesichain api``, over evals run by real workers on a real
redis-server, driven in Debian's chromium through Playwright: sign in with a tenant's key, the
index with its trends, one eval's verdict, context and breakdown, a case's diff and its link to
the run's page, a review saved and found in the CSV export and the comparison, two evals compared
per case; hostile texts (case ids, inputs, expected answers, answers, notes) shown as text; no
script error and no request to another origin. Another tenant sees and changes none of it."""

from __future__ import annotations

import asyncio
import base64
import csv
import hashlib
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Dialog, Request, sync_playwright

from producer.api_client import ApiClient, AsyncClient
from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.errors import EvalNotFound
from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.broker import Settings
from tests.browser import chromium
from tests.console.support import wait_js
from tests.harness import ROOT, RedisServer, WorkerProcess, running

AGENTS = "tests.agents_evals"
TENANT, RIVAL = "acme", "rival"
#: Generous: the machine running the suite may be loaded.
UI_TIMEOUT_MS = 30_000
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'
NOTE = 'Wrong unit. </textarea><script>window.__pwned=1</script><b onclick="x()">bold</b>'


def write_eval(tmp: Path, stem: str, b_model: str) -> Path:
    """Six cases in two categories; the last case's id, input and expected answer are markup."""
    cases: list[dict[str, Any]] = [
        {"id": f"d{m}", "input": f"double {m}", "expected": str(2 * m), "category": "arithmetic"}
        for m in range(1, 6)
    ]
    cases.append(
        {"id": f"h{HOSTILE}", "input": f"double 7 {HOSTILE}", "expected": HOSTILE, "category": "hostile"}
    )
    (tmp / "nightly.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    spec = tmp / f"{stem}.toml"
    spec.write_text(
        'name = "nightly"\ndataset = "nightly.jsonl"\npass_threshold = 0.6\n'
        '[[variants]]\nname = "a"\nagent = "doubler"\n'
        f'model = "{b_model}"\n'
        '[[variants]]\nname = "echo"\nagent = "doubler"\nmodel = "scripted:evals-echo"\n'
        '[[scorers]]\nkind = "exact"\n'
    )
    return spec


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("viewer")
    server = RedisServer().start()
    try:
        workers = [
            WorkerProcess(f"v{i}", server.url, agents=AGENTS, concurrency=3, log_dir=str(tmp)) for i in (1, 2)
        ]
        with running(workers):
            client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
            evals = EvalClient(client)
            first, second = (
                write_eval(tmp, "first", "scripted:evals-a"),
                write_eval(tmp, "second", "scripted:evals-b"),
            )
            base, _ = evals.submit_file(first, eval_id="nightly-1", tenant=TENANT)
            evals.wait(base, timeout=120)
            cand, _ = evals.submit_file(second, eval_id="nightly-2", tenant=TENANT)
            evals.wait(cand, timeout=120)
            tenants = Tenants(server.client(), Keys())
            key, _ = tenants.create_key(TENANT)
            rival, _ = tenants.create_key(RIVAL)
            api = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
            try:
                yield {
                    "api": api.url,
                    "key": key,
                    "rival": rival,
                    "dataset": tmp / "nightly.jsonl",
                    "evals": evals,
                }
            finally:
                api.stop()
                client.close()
    finally:
        server.stop()


def test_another_tenant_sees_and_reviews_none_of_a_tenants_evals(served: dict[str, Any]) -> None:
    with httpx.Client(base_url=served["api"], headers=bearer(served["rival"]), timeout=30) as http:
        assert http.get("/v1/evals").json() == {"evals": []}
        for path in (
            "/v1/evals/nightly-1",
            "/v1/evals/nightly-1/results?format=csv",
            "/v1/evals/nightly-1/annotations",
            "/v1/evals/nightly-1/compare/nightly-2",
        ):
            answer = http.get(path)
            assert answer.status_code == 404 and answer.json()["error"]["kind"] == "not_found", path
        put = http.put("/v1/evals/nightly-1/annotations/0:0:0", json={"label": "fail"})
        assert put.status_code == 404 and put.json()["error"]["kind"] == "not_found"
        # A case run of the tenant's eval is the tenant's run: not the rival's.
        assert http.get("/v1/runs/nightly-1:v0:c0:r0").status_code == 404
    with httpx.Client(base_url=served["api"], timeout=30) as anonymous:
        assert anonymous.get("/v1/evals").status_code == 401
    assert served["evals"].labels("nightly-1") == {}
    with httpx.Client(base_url=served["api"], headers=bearer(served["key"]), timeout=30) as http:
        # Bad input: a structured error, nothing written.
        for body, status in (
            ({"label": "maybe"}, 422),
            ({"note": "x" * 2001}, 422),
            ({"scores": {"exact": 1.5}}, 422),
            ({"label": "pass", "by": "someone-else"}, 422),
            # Within every character bound, but 28 KB of four-byte characters: past the byte bound.
            (
                {
                    "note": "\U0001f600" * 2000,
                    "scores": {"\U0001f600" * 98 + f"{i:02}": 0.5 for i in range(50)},
                },
                422,
            ),
        ):
            answer = http.put("/v1/evals/nightly-1/annotations/0:0:0", json=body)
            assert answer.status_code == status and answer.json()["error"]["kind"] == "invalid_request", body
        for item in ("9:0:0", "0:99:0", "0:0:1", "00:0:0", "x"):
            answer = http.put(f"/v1/evals/nightly-1/annotations/{item}", json={"label": "pass"})
            assert answer.status_code == 404, item
        assert http.get("/v1/evals/nightly-1/annotations").json() == {"latest": [], "history": []}
        assert http.get("/v1/runs/nightly-1:v0:c0:r0").json()["status"] == "completed"


def test_the_viewer_in_a_real_browser(served: dict[str, Any], tmp_path: Path) -> None:
    api = served["api"]
    # WESICHAIN_SCREENSHOTS=docs writes the documentation's pictures of each page.
    shots = Path(os.environ.get("WESICHAIN_SCREENSHOTS") or tmp_path)
    errors: list[str] = []
    dialogs: list[str] = []
    foreign: list[str] = []

    def request(r: Request) -> None:
        if not r.url.startswith(api + "/"):
            foreign.append(r.url)

    def dialog(d: Dialog) -> None:  # an alert() would be script that ran
        dialogs.append(d.message)
        d.dismiss()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            # The index is asked for once before the key is given: that 401 is how it knows to ask.
            # The console's page (where a case's link leads) names no icon: chromium asks for one.
            page.on(
                "console",
                lambda m: (
                    errors.append(f"{m.text} {m.location.get('url')}")
                    if m.type == "error"
                    and "status of 401" not in m.text
                    and not str(m.location.get("url")).endswith("/favicon.ico")
                    else None
                ),
            )
            page.on("request", request)
            page.on("dialog", dialog)

            # The index asks for a key, then lists the tenant's evals with their trends.
            page.goto(api + "/evals/")
            page.wait_for_selector("#key-input", timeout=UI_TIMEOUT_MS)
            page.fill("#key-input", served["key"])
            page.click("#key-form button")
            page.wait_for_selector("#evals tr.eval", timeout=UI_TIMEOUT_MS)
            rows = page.eval_on_selector_all("#evals tr.eval", "rs => rs.map(r => r.dataset.eval)")
            assert rows == ["nightly-2", "nightly-1"]
            assert page.locator("#trends figure.trend").count() == 2  # pass rate, and the exact scorer's mean
            assert page.locator("#trends polyline").count() == 4  # two variants, two evals each
            page.screenshot(path=str(shots / "eval-index.png"), full_page=True)

            # Two evals compared per case: the baseline's variant a doubles right, the candidate's
            # gets multiples of 3 wrong (d3).
            page.select_option("#compare-a", "nightly-1")
            page.select_option("#compare-b", "nightly-2")
            page.click("#compare-go")
            page.wait_for_selector("#compare-cases tr.pair", timeout=UI_TIMEOUT_MS)
            regressions = page.eval_on_selector_all(
                "#compare-cases tr.pair.regression",
                "rs => rs.map(r => r.cells[0].textContent + '/' + r.cells[2].textContent)",
            )
            assert regressions == ["d3/a"]
            assert page.url.endswith("/evals/nightly-2#compare=nightly-1")
            page.locator("#compare-evals").screenshot(path=str(shots / "eval-compare.png"))

            # Verdict first, then the context.
            verdict = page.text_content("#verdict") or ""
            assert verdict.startswith("MIXED") and "a reaches" in verdict and "echo does not" in verdict
            context = page.eval_on_selector_all(
                "#context dt, #context dd", "es => es.map(e => e.textContent)"
            )
            facts = dict(zip(context[::2], context[1::2], strict=True))
            assert facts["dataset sha256"] == hashlib.sha256(served["dataset"].read_bytes()).hexdigest()
            assert (
                facts["spec sha256"]
                == hashlib.sha256((served["dataset"].parent / "second.toml").read_bytes()).hexdigest()
            )
            head = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
            )
            assert facts["code version"] == (
                head.stdout.strip() if head.returncode == 0 else facts["code version"]
            )
            assert page.eval_on_selector_all(
                "#variant-settings tbody tr", "rs => rs.map(r => Array.from(r.cells).map(c => c.textContent))"
            ) == [["a", "doubler", "scripted:evals-b", "-"], ["echo", "doubler", "scripted:evals-echo", "-"]]

            page.evaluate("window.scrollTo(0, 0)")
            # Two frames: the capture shows the page as laid out after the scroll.
            page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            page.screenshot(path=str(shots / "eval-viewer.png"))
            # Every table's header row has its labels (none painted blank).
            headers = page.eval_on_selector_all(
                "#variant-settings thead th, #summary thead th", "ts => ts.map(t => t.textContent)"
            )
            assert headers[:4] == ["variant", "agent", "model", "settings"]
            assert headers[4:8] == ["variant", "runs", "pass rate [95% CI]", "runs failed"]

            # The breakdown by the dataset's category; a group filters the cases.
            groups = page.eval_on_selector_all("#breakdown tr.group", "rs => rs.map(r => r.dataset.value)")
            assert groups == ["arithmetic", "hostile"]
            page.click("#breakdown tr.group[data-value=hostile] a")
            wait_js(
                page,
                "document.getElementById('case-count').textContent === '1 of 6 cases'",
                timeout=UI_TIMEOUT_MS,
            )

            # The hostile case: its texts are text; a diff of answer against expected; the run's link.
            page.click("#case-rows tr.case")
            page.wait_for_selector("#case-rows tr.drill", timeout=UI_TIMEOUT_MS)
            assert page.eval_on_selector_all(
                "#case-rows tr.case td:first-child", "t => t.map(e => e.textContent)"
            ) == [f"h{HOSTILE}"]
            answers = page.eval_on_selector_all("tr.drill .run pre", "ps => ps.map(p => p.textContent)")
            assert answers == ["14", f"double 7 {HOSTILE}"]
            echo = page.locator("tr.drill .run").nth(1)
            assert echo.locator(".diff del").count() == 0 and echo.locator(".diff ins").count() >= 2
            link = echo.locator("a.run-link")
            assert link.get_attribute("href") == "/#/runs/nightly-2:v1:c5:r0"

            # Review it: a label, a score override and a hostile note; saved, shown, kept.
            form = echo.locator("form.annotate")
            form.locator("select[name=label]").select_option("pass")
            form.locator("input[name='score:exact']").fill("0.9")
            form.locator("textarea").fill(NOTE)
            form.locator("button").click()
            page.wait_for_selector("tr.drill .run >> nth=1 >> .human p.note", timeout=UI_TIMEOUT_MS)
            shown = page.locator("tr.drill .run").nth(1)
            assert shown.locator(".human p.note").text_content() == NOTE
            assert (shown.locator(".human p.label").text_content() or "").startswith("human: pass by ")
            assert "disagrees with the scorers" in (shown.locator(".human p.label").text_content() or "")
            page.reload()
            page.wait_for_selector("#case-rows tr.drill .human p.note", timeout=UI_TIMEOUT_MS)
            agreement = page.eval_on_selector_all("#summary td.agreement", "ts => ts.map(t => t.textContent)")
            assert agreement == ["-", "0.0% of 1 labelled, \u03ba 0.00"]
            page.locator("#case-rows tr.drill").screenshot(path=str(shots / "eval-review.png"))

            # The run's page in the console opens for the tenant, and links back to its case.
            page.goto(api + "/#/runs/nightly-2:v1:c5:r0")
            wait_js(
                page,
                "document.querySelector('#run-title') && document.querySelector('#run-title').textContent"
                " === 'Run nightly-2:v1:c5:r0'",
                timeout=UI_TIMEOUT_MS,
            )
            # A locator, not an element handle: the run's page re-renders as it refreshes, and a
            # handle to the link it replaced can no longer be clicked.
            back = page.locator("#eval-link")
            back.wait_for(timeout=UI_TIMEOUT_MS)
            assert back.get_attribute("href") == "/evals/nightly-2#item=1%3A5%3A0"
            assert back.text_content() == "case 5, variant 1, repeat 0 of eval nightly-2"
            back.click()
            # The viewer opens that case and marks this run among its variants' runs.
            page.wait_for_selector('#case-rows tr.drill .run.focus[data-item="1:5:0"]', timeout=UI_TIMEOUT_MS)
            assert page.eval_on_selector_all("#case-rows tr.case", "t => t.map(e => e.dataset.case)") != []
            assert page.locator("#case-rows tr.drill").count() == 1
            assert page.locator(".run.focus").count() == 1
            # The console's header leads to the viewer's index; the viewer leads back to the console.
            page.click("#console-link")
            page.wait_for_selector("#list-view:not([hidden])", timeout=UI_TIMEOUT_MS)
            family = page.wait_for_selector(
                '#runs tr[data-run="nightly-2:v1:c5:r0"] a.eval-link', timeout=UI_TIMEOUT_MS
            )
            assert family is not None and family.get_attribute("href") == "/evals/nightly-2#item=1%3A5%3A0"
            page.click("#evals-link")
            page.wait_for_selector("#evals tr.eval", timeout=UI_TIMEOUT_MS)

            # No text ran as script, nor became an element.
            for url in (api + "/evals/nightly-2#open=" + f"h{HOSTILE}", api + "/evals/"):
                page.goto(url)
                wait_js(page, "document.body.dataset.ready === '1'", timeout=UI_TIMEOUT_MS)
                assert page.evaluate("typeof window.__pwned") == "undefined"
                assert page.evaluate("document.querySelectorAll('img').length") == 0
        finally:
            browser.close()
    assert errors == [] and dialogs == [] and foreign == []

    # The review is in the CSV export and the comparison, beside the automatic scores.
    with httpx.Client(base_url=api, headers=bearer(served["key"]), timeout=30) as http:
        text = http.get("/v1/evals/nightly-2/results", params={"format": "csv"}).text
        rows = {(r["variant"], r["case_id"]): r for r in csv.DictReader(io.StringIO(text))}
        reviewed = rows[("echo", f"h{HOSTILE}")]
        assert (reviewed["passed"], reviewed["human_label"], reviewed["human_note"]) == (
            "False",
            "pass",
            NOTE,
        )
        assert json.loads(reviewed["human_scores"]) == {"exact": 0.9}
        assert reviewed["human_by"] == http.get("/v1/whoami").json()["key_id"]
        assert rows[("a", "d1")]["human_label"] == ""
        compared = http.get("/v1/evals/nightly-1/compare/nightly-2").json()
        assert compared["agreement"]["candidate"] == {"labelled": 1, "agreed": 0, "rate": 0.0, "kappa": 0.0}
        history = http.get("/v1/evals/nightly-2/annotations").json()["history"]
        assert [(a["item"], a["label"]) for a in history] == [("1:5:0", "pass")]
    assert served["evals"].labels("nightly-2")["1:5:0"].note == NOTE


def test_the_http_clients_read_and_review_a_tenants_evals(served: dict[str, Any]) -> None:
    api = served["api"]
    with ApiClient(api, served["key"]) as client:
        assert [e["id"] for e in client.evals.list()] == ["nightly-2", "nightly-1"]
        assert [e["id"] for e in client.evals.list(limit=1)] == ["nightly-2"]
        view = client.evals.get("nightly-1")
        assert view["eval"] == "nightly-1" and view["verdict"]["verdict"] == "mixed"
        rows = list(csv.DictReader(io.StringIO(client.evals.results("nightly-1"))))
        assert len(rows) == 12 and {r["variant"] for r in rows} == {"a", "echo"}
        lines = client.evals.results("nightly-1", format="jsonl").splitlines()
        assert len(lines) == 12 and all(json.loads(line)["run_id"].startswith("nightly-1:") for line in lines)
        compared = client.evals.compare("nightly-1", "nightly-2")
        assert [(c["a"], c["b"]) for c in compared["comparisons"]] == [
            ("nightly-1/a", "nightly-2/a"), ("nightly-1/echo", "nightly-2/echo"),
        ]  # fmt: skip
        saved = client.evals.annotate(
            "nightly-1", "0:2:0", label="fail", scores={"exact": 0.25}, note=HOSTILE
        )
        assert (saved.item, saved.label, saved.scores, saved.note) == (
            "0:2:0",
            "fail",
            {"exact": 0.25},
            HOSTILE,
        )
        assert saved.by == client.http.get("/v1/whoami").json()["key_id"]
        latest, history = client.evals.annotations("nightly-1")
        assert [a.item for a in latest] == ["0:2:0"] and history[-1] == saved
        # Refused as the API refuses: a missing eval or case run, an id no path can name.
        for call in (
            lambda: client.evals.get("nightly-9"),
            lambda: client.evals.get("a/b"),
            lambda: client.evals.annotate("nightly-1", "0:99:0", label="pass"),
            lambda: client.evals.compare("nightly-1", "nope"),
        ):
            with pytest.raises(EvalNotFound):
                call()
    with ApiClient(api, served["rival"]) as rival:  # another tenant: none of it exists
        assert rival.evals.list() == []
        with pytest.raises(EvalNotFound):
            rival.evals.get("nightly-1")
        with pytest.raises(EvalNotFound):
            rival.evals.annotate("nightly-1", "0:2:0", label="pass")

    async def read() -> tuple[list[str], str, int]:
        async with AsyncClient(api, served["key"]) as client:
            listed = [e["id"] for e in await client.evals.list()]
            view = await client.evals.get("nightly-2")
            latest, _ = await client.evals.annotations("nightly-1")
            await client.evals.annotate("nightly-1", "1:0:0", label="pass")
            return listed, view["eval"], len(latest)

    assert asyncio.run(read()) == (["nightly-2", "nightly-1"], "nightly-2", 1)
    assert set(served["evals"].labels("nightly-1")) == {"0:2:0", "1:0:0"}


def test_the_pages_run_only_their_own_scripts_and_no_site_frames_them(served: dict[str, Any]) -> None:
    """The console and the viewer send a policy that runs only their own scripts and styles (the
    viewer's inline ones by hash), talks only to the API, and lets no other site frame them; the
    browser tests above run under it (any script it blocked would have left the pages blank)."""
    with httpx.Client(base_url=served["api"], timeout=30) as http:
        for path in ("/", "/evals/", "/evals/nightly-1"):
            answer = http.get(path)
            assert answer.status_code == 200, path
            policy = answer.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy, policy
            assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, policy
            assert answer.headers["x-frame-options"] == "DENY"
            assert answer.headers["x-content-type-options"] == "nosniff"
        # The viewer's inline script is allowed by its hash alone.
        script = http.get("/evals/").text.split("<script>")[1].split("</script>")[0]
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in http.get("/evals/").headers["content-security-policy"]
        assert "script-src 'self';" in http.get("/").headers["content-security-policy"]
        assert http.get("/console/console.js").headers["x-content-type-options"] == "nosniff"
