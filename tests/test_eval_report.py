"""The eval report opened in a real headless browser: it renders without script errors, shows the
summary and the case table, filters, opens a drill-down, escapes what runs answered, and can be
photographed."""

from __future__ import annotations

import re
from pathlib import Path

from producer.evals.report import render_report
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult, Score, Step
from shared.evals.spec import parse_spec
from shared.evals.store import EvalMeta
from tests.browser import load, screenshot

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
