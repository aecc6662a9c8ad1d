"""The eval report opened in a real headless browser: it renders without script errors, shows the
summary and the case table, filters, opens a drill-down, shows every text of the eval (markup and
JSON's own escapes included) as that text and never as markup or script, and can be photographed."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from playwright.sync_api import Dialog, sync_playwright

from producer.evals.report import render_report
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult, Score, Step
from shared.evals.spec import parse_spec
from shared.evals.store import EvalMeta
from shared.llm.text import clean_text
from tests.browser import chromium, load, screenshot

#: Generous: the machine running the suite may be loaded.
UI_TIMEOUT_MS = 30_000

HOSTILE = '</script><script>document.title="pwned"</script><img src=x onerror=alert(1)>'


def report(tmp_path: Path) -> Path:
    spec = parse_spec(
        {
            "name": "r",
            "dataset": "d.jsonl",
            "repeats": 2,
            "variants": [{"name": "a", "agent": "x"}, {"name": "b", "agent": "x"}],
            "scorers": [{"kind": "exact"}],
            "pass_threshold": 0.5,
        }
    )
    cases = {i: Case(id=f"c{i}", input=f"double {i}", expected=str(2 * i)) for i in range(30)}
    results = []
    for i in range(30):
        for v, name in enumerate(("a", "b")):
            for r in range(2):
                wrong = name == "b" and i % 3 == 0
                failed = name == "b" and i == 7
                answer = HOSTILE if (i, name) == (5, "a") else str(2 * i + wrong)
                results.append(
                    CaseResult(
                        item=f"{v}:{i}:{r}",
                        variant=name,
                        case_id=f"c{i}",
                        repeat=r,
                        run_id=f"r:v{v}:c{i}:r{r}",
                        status="failed" if failed else "completed",
                        passed=not (wrong or failed or (i, name) == (5, "a")),
                        answer=None if failed else answer,
                        error={"kind": "ModelTransport", "message": "the provider answered 503"}
                        if failed
                        else None,
                        steps=2,
                        input_tokens=20 + i,
                        output_tokens=5,
                        latency_s=0.1 + i / 100,
                        scores=[]
                        if failed
                        else [Score(name="exact", value=float(not wrong), passed=not wrong)],
                        trajectory=[
                            Step(kind="thought", text="Let me calculate that."),
                            Step(kind="call", tool="calculator", arguments={"expression": f"2 * {i}"}),
                            Step(kind="result", tool="calculator", text=f'{{"value": {2 * i}}}'),
                        ],
                    )
                )
    meta = EvalMeta("r-123", spec, "completed", len(results), 30, 0.0, None, "d.jsonl")
    path = tmp_path / "report.html"
    path.write_text(render_report(meta, cases, results))
    return path


def count(dom: str) -> str:
    match = re.search(r'id="case-count">([^<]*)<', dom)
    assert match is not None, dom[:2000]
    return match.group(1)


def test_the_report_renders_filters_and_drills_down_in_a_real_browser(tmp_path: Path) -> None:
    url = report(tmp_path).as_uri()
    page = load(url)
    assert page.errors == [], page.console
    assert 'data-ready="1"' in page.dom  # the script ran to its end
    assert '<table class="summary">' in page.dom and "ModelTransport" in page.dom
    assert count(page.dom) == "30 of 30 cases"
    assert len(re.findall(r'<tr class="case"', page.dom)) == 30
    # The hostile answer is text, never markup: the title is untouched and nothing was injected.
    assert "<title>Eval r-123</title>" in page.dom and "pwned" not in page.dom.split("</title>")[0]
    rendered = re.sub(
        r'<script type="application/json" id="eval-data">.*?</script>', "", page.dom, flags=re.S
    )
    assert "<img" not in rendered and "pwned" not in rendered

    filtered = load(url + "#q=c1")  # c1, c10..c19
    assert filtered.errors == [] and count(filtered.dom) == "11 of 30 cases"
    failing = load(url + "#show=failing")  # b is wrong on multiples of 3 (10), b fails c7, a is wrong on c5
    assert count(failing.dom) == "12 of 30 cases"
    differ = load(url + "#show=differ&q=c2")  # c2, c20..c29: of those, b is wrong on c21, c24, c27
    assert count(differ.dom) == "3 of 30 cases"
    drilled = load(url + "#open=c7")
    assert drilled.errors == [] and '<tr class="drill">' in drilled.dom
    hostile = load(url + "#open=c5")  # its answer is shown as text in the drill-down
    assert hostile.errors == [] and "&lt;img src=x onerror=alert(1)&gt;" in hostile.dom
    drill = drilled.dom.split('<tr class="drill">')[1]
    assert "the provider answered 503" in drill and "call calculator" in drill and "double 7" in drill


def test_a_screenshot_of_the_report(tmp_path: Path) -> None:
    shot = screenshot(report(tmp_path).as_uri(), tmp_path / "report.png")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    if target := os.environ.get("WESICHAIN_SCREENSHOTS"):  # the documentation's picture
        shutil.copyfile(shot, Path(target) / "eval-report.png")


#: Texts that end, open or confuse the markup around the report's data, or its JSON.
MARKUP = [
    "</script>",
    "</SCRIPT >",
    "<!--",
    "<script>",
    "]]>",
    "\u2028",
    "\u2029",
    "&lt;",
    "\"double\" 'single' `back`",
    "back\\slash \\u003c \\\\ \\n \\",
    "<\\!--",
    "</script><script>window.__pwned=1</script>",
    "<!--<script>window.__pwned=1</script>-->",
    '<img src=x onerror="window.__pwned=1">',
    "]]></title><script>window.__pwned=1</script>",
]
#: Half a character, not text: no UTF-8 file can hold it, so the report shows U+FFFD in its place,
#: as a UTF-8 decoder does. The models refuse it in their ``str`` fields, but a value of any type
#: (an expected value, an error, a tool call's arguments) and the eval's meta can carry it.
LONE = "\ud800"
#: Submission allows no markup in an eval id or a variant name; the report, which reads them back
#: from the store, does not rely on that.
EVAL_ID = "".join(MARKUP) + LONE
DATASET = f"d</title><script>window.__pwned=1</script>{LONE}.jsonl"
VARIANTS = ("base/v1:@x", "cand-2.0_b")  # all the punctuation a variant name may hold


def shown(text: str) -> str:
    """What the report shows of ``text``."""
    return clean_text(text)


def hostile_report(tmp_path: Path) -> Path:
    """One case per text, which is in its id, input, expected value, metadata and dataset columns;
    the first variant answers it (with a scorer's explanation and a trajectory), the second fails
    with it in the error's kind and message. Where a value may be of any type, a lone surrogate
    follows the text."""
    spec = parse_spec(
        {
            "name": "r",
            "dataset": "d.jsonl",
            "variants": [{"name": VARIANTS[0], "agent": "x"}, {"name": VARIANTS[1], "agent": "x"}],
            "scorers": [{"kind": "exact"}],
        }
    )
    cases = {
        i: Case(
            id=s,
            input=f"in:{s}",
            expected={"v": s + LONE},
            metadata={s: s + LONE},
            columns={"extra": s + LONE},
        )
        for i, s in enumerate(MARKUP)
    }
    results = []
    for i, s in enumerate(MARKUP):
        results.append(
            CaseResult(
                item=f"0:{i}:0",
                variant=VARIANTS[0],
                case_id=s,
                repeat=0,
                run_id=f"r:v0:c{i}:r0",
                status="completed",
                passed=True,
                answer=f"answer:{s}",
                steps=2,
                latency_s=0.5,
                scores=[Score(name="exact", value=1.0, passed=True, explanation=f"why:{s}")],
                trajectory=[
                    Step(kind="thought", text=f"thought:{s}"),
                    Step(kind="call", tool="calc", arguments={"q": s + LONE}),
                    Step(kind="result", tool="calc", text=f"result:{s}"),
                ],
            )
        )
        results.append(
            CaseResult(
                item=f"1:{i}:0",
                variant=VARIANTS[1],
                case_id=s,
                repeat=0,
                run_id=f"r:v1:c{i}:r0",
                status="failed",
                passed=False,
                error={"kind": f"kind:{s}{LONE}", "message": f"error:{s}{LONE}"},
                latency_s=0.5,
            )
        )
    meta = EvalMeta(EVAL_ID, spec, "completed", len(results), len(cases), 0.0, None, DATASET)
    path = tmp_path / "report.html"
    path.write_text(render_report(meta, cases, results), encoding="utf-8")
    return path


def test_the_report_embeds_every_text_as_data_that_reads_back_exactly(tmp_path: Path) -> None:
    page = hostile_report(tmp_path).read_bytes().decode("utf-8")  # strict: no lone surrogate in the file
    data = page.split('<script type="application/json" id="eval-data">')[1].split("</script>")[0]
    # Nothing in the data can end the element, open a comment or start a tag, whatever the text.
    assert not set(data) & {"<", ">", "&", "\u2028", "\u2029"}
    parsed = json.loads(data)
    assert parsed["eval"] == shown(EVAL_ID)
    assert [c["id"] for c in parsed["cases"]] == MARKUP
    assert [c["input"] for c in parsed["cases"]] == [f"in:{s}" for s in MARKUP]
    assert [c["runs"][0]["a"] for c in parsed["cases"]] == [f"answer:{s}" for s in MARKUP]
    assert [c["runs"][1]["e"] for c in parsed["cases"]] == [f"error:{s}\ufffd" for s in MARKUP]


def test_markup_in_every_text_renders_as_that_text_in_a_real_browser(tmp_path: Path) -> None:
    url = hostile_report(tmp_path).as_uri()
    errors: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

            def dialog(d: Dialog) -> None:  # an alert() would be script that ran
                dialogs.append(d.message)
                d.dismiss()

            page.on("dialog", dialog)
            page.goto(url)  # returns on the load event, after the page's inline scripts ran
            assert page.get_attribute("body", "data-ready") == "1", f"the script did not finish: {errors}"

            assert page.evaluate("document.querySelector('title').textContent") == f"Eval {shown(EVAL_ID)}"
            assert page.text_content("h1") == f"Eval {shown(EVAL_ID)}"
            assert shown(DATASET) in (page.text_content("p.meta") or "")
            assert page.evaluate(
                "Array.from(document.querySelectorAll('#summary tbody th'))"
                ".map(function(th){return th.textContent;})"
            ) == list(VARIANTS)
            failures = page.evaluate(
                "Array.from(document.querySelectorAll('ul.failures li')).map(function(li){return ["
                "li.querySelector('b').textContent, li.querySelector('q').textContent,"
                " li.querySelector('small').textContent];})"
            )
            assert sorted(failures) == sorted(
                [shown(f"kind:{s}{LONE}"), shown(f"error:{s}{LONE}"), f"e.g. {s} ({VARIANTS[1]})"]
                for s in MARKUP
            )

            rows = page.evaluate(
                "Array.from(document.querySelectorAll('#case-rows tr.case')).map(function(tr){"
                "return Array.from(tr.cells).map(function(td){return td.textContent;});})"
            )
            assert rows == [[s, f"in:{s}", "1/1", "0/1", "mixed"] for s in MARKUP]

            # Open every case's drill-down, by clicking its row as a reader does.
            for at in range(len(MARKUP)):
                page.locator("#case-rows tr.case").nth(at).click()
            page.wait_for_function(
                f"document.querySelectorAll('#case-rows tr.drill').length === {len(MARKUP)}",
                timeout=UI_TIMEOUT_MS,
            )
            drills = page.evaluate(
                "Array.from(document.querySelectorAll('#case-rows tr.drill')).map(function(tr){"
                "function texts(sel){return Array.from(tr.querySelectorAll(sel))"
                ".map(function(e){return e.textContent;});}"
                "return {pre: texts('pre'), h4: texts('h4'), scores: texts('.run ul li'),"
                " steps: texts('ol.traj li'), label: texts('.run div.k')};})"
            )
            assert len(drills) == len(MARKUP)
            for i, (s, drill) in enumerate(zip(MARKUP, drills, strict=True)):
                assert drill["pre"] == [
                    f"in:{s}",
                    shown(json.dumps({"v": s + LONE}, ensure_ascii=False)),
                    f"answer:{s}",
                    "(none)",
                    shown(f"error:{s}{LONE}"),
                ]
                assert drill["h4"] == [
                    f"{VARIANTS[0]} \u2014 pass (completed)",
                    f"{VARIANTS[1]} \u2014 fail (failed)",
                ]
                assert drill["scores"] == [f"exact: 1 \u2713 why:{s}"]
                assert drill["steps"] == [
                    f"thought: thought:{s}",
                    shown(f"call calc({json.dumps({'q': s + LONE}, ensure_ascii=False)})"),
                    f"result of calc: result:{s}",
                ]
                assert drill["label"] == [
                    "answer",
                    f"trajectory (2 steps, 0 tokens, 0.50s, run {shown(EVAL_ID)}:v0:c{i}:r0)",
                    "answer",
                    shown(f"error (kind:{s}{LONE})"),
                    f"trajectory (0 steps, 0 tokens, 0.50s, run {shown(EVAL_ID)}:v1:c{i}:r0)",
                ]

            # The open cases are kept in the URL: a reload (or a shared link) opens them again.
            page.reload()
            page.wait_for_function(
                f"document.querySelectorAll('#case-rows tr.drill').length === {len(MARKUP)}",
                timeout=UI_TIMEOUT_MS,
            )

            # No text ran as script, nor became an element.
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.evaluate("document.querySelectorAll('img').length") == 0
            assert page.evaluate("document.scripts.length") == 2
        finally:
            browser.close()
    assert errors == [] and dialogs == []
