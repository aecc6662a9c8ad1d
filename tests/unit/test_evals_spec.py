"""Eval specs, datasets and scorers: clear errors for bad input, exact verdicts for good."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from shared.evals.dataset import Case, DatasetError, parse_dataset
from shared.evals.errors import EvalSpecError
from shared.evals.outcome import RunOutcome, Step
from shared.evals.scorers import check_importable, run_scorers
from shared.evals.spec import EvalSpec, load_spec, parse_spec
from shared.evals.summary import pass_at_k, summarise, wilson

BASE = {
    "name": "t",
    "dataset": "d.jsonl",
    "variants": [{"agent": "doubler"}],
    "scorers": [{"kind": "exact"}],
}


def spec(**changes: object) -> EvalSpec:
    return parse_spec({**BASE, **changes})


def outcome(answer: str | None, calls: Sequence[tuple[str, Mapping[str, Any]]] = (), **kw: Any) -> RunOutcome:
    trajectory = [Step(kind="call", tool=n, arguments=dict(a)) for n, a in calls]
    return RunOutcome(run_id="r", status="completed", answer=answer, trajectory=trajectory, **kw)


def case(expected: object = None, **columns: object) -> Case:
    return Case(id="c1", input="q", expected=expected, columns=columns)


def test_a_minimal_spec_gets_defaults() -> None:
    s = spec()
    assert s.repeats == 1 and s.concurrency == 8 and s.variants[0].name == "doubler"
    assert spec(variants=[{"agent": "a", "model": "scripted:x"}]).variants[0].name == "a@scripted:x"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scorers": [{"kind": "bleu"}]}, "scorers.0: Input tag 'bleu' found using 'kind' does not match"),
        ({"variants": []}, "variants: List should have at least 1 item"),
        ({"variants": [{"agent": "a"}, {"agent": "a"}]}, "variant names must be unique"),
        ({"repeats": 0}, "repeats: Input should be greater than or equal to 1"),
        ({"concurrency": "lots"}, "concurrency: Input should be a valid integer"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
        ({"scorers": [{"kind": "regex", "pattern": "("}]}, "is not a regular expression"),
        ({"scorers": [{"kind": "exact"}, {"kind": "exact"}]}, "scorer names must be unique"),
        ({"variants": [{"agent": "bad agent!"}]}, "agent 'bad agent!' must be 1..200 chars"),
        ({"scorers": [{"kind": "json", "schema": {"type": 12}}]}, "schema is not a valid JSON schema"),
    ],
)
def test_a_bad_spec_says_where_and_why(changes: dict[str, object], message: str) -> None:
    with pytest.raises(EvalSpecError) as info:
        spec(**changes)
    assert message in str(info.value)


def test_a_spec_file_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "e.toml"
    bad.write_text('name = "x"\nvariants = [\n')
    with pytest.raises(EvalSpecError, match="is not valid TOML"):
        load_spec(bad)
    with pytest.raises(EvalSpecError, match="cannot read eval spec"):
        load_spec(tmp_path / "missing.toml")


def test_the_bundled_example_is_valid() -> None:
    from importlib import resources

    from shared.evals.dataset import load_dataset

    path = Path(str(resources.files("shared.examples").joinpath("research-eval.toml")))
    s, base = load_spec(path)
    cases, _ = load_dataset(base / s.dataset)
    assert len(cases) >= 50 and len(s.variants) == 2


def test_datasets_read_jsonl_and_csv_and_keep_extra_columns() -> None:
    jsonl = b'{"id": 1, "input": "a", "expected": 2, "tag": "x"}\n\n{"id": "b", "input": "c"}\n'
    cases = parse_dataset(jsonl, "d.jsonl")
    assert [(c.id, c.expected, c.columns) for c in cases] == [("1", 2, {"tag": "x"}), ("b", None, {})]
    csv = b'id,input,expected,metadata\nx,"hello, you",hi,"{""k"": 1}"\ny,yo,,\n'
    cases = parse_dataset(csv, "d.csv")
    assert [(c.id, c.input, c.expected, c.metadata) for c in cases] == [
        ("x", "hello, you", "hi", {"k": 1}),
        ("y", "yo", "", {}),
    ]


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (b'{"id": "a", "input": "x"}\n{"id": "b", "input": \n', "d.jsonl", "d.jsonl:2: not valid JSON"),
        (b'{"id": "a", "input": "x"}\n[1, 2]\n', "d.jsonl", "d.jsonl:2: a case is a JSON object"),
        (b'{"id": "a"}\n', "d.jsonl", "d.jsonl:1: the case has no 'input'"),
        (b'{"id": "a", "input": "x"}\n{"id": "a", "input": "y"}\n', "d.jsonl", "case id 'a' repeats line 1"),
        (b'{"id": "a", "input": ""}\n', "d.jsonl", "input must be non-empty text"),
        (b"id,input\na,b,c\n", "d.csv", "d.csv:2: the row does not have one value per column"),
        (b"", "d.jsonl", "has no cases"),
        (b"x", "d.txt", "must end in .jsonl or .csv"),
        (b"\xff\xfe", "d.jsonl", "is not UTF-8"),
    ],
)
def test_a_broken_dataset_names_the_line(data: bytes, name: str, message: str) -> None:
    with pytest.raises(DatasetError) as info:
        parse_dataset(data, name)
    assert message in str(info.value)


def score(kind: Mapping[str, Any], c: Case, o: RunOutcome) -> tuple[float, bool, str]:
    (s,) = run_scorers(spec(scorers=[kind]).scorers, c, o)
    return s.value, s.passed, s.explanation


def test_exact_normalises_case_and_whitespace_by_default() -> None:
    assert score({"kind": "exact"}, case("Paris"), outcome("  paris "))[:2] == (1.0, True)
    assert score({"kind": "exact", "normalize": []}, case("Paris"), outcome("paris"))[:2] == (0.0, False)
    exact = {"kind": "exact", "normalize": ["case", "punctuation"]}
    assert score(exact, case("Paris"), outcome("Paris!"))[:2] == (1.0, True)
    assert "the case has no 'expected'" in score({"kind": "exact"}, case(None), outcome("x"))[2]


def test_contains_and_regex() -> None:
    assert score({"kind": "contains"}, case("391"), outcome("The answer is 391."))[:2] == (1.0, True)
    value, passed, why = score({"kind": "contains", "text": ["a", "zz"]}, case(), outcome("abc"))
    assert (value, passed) == (0.5, False) and "missing 'zz'" in why
    assert score({"kind": "regex", "pattern": r"^\d+$"}, case(), outcome("42"))[:2] == (1.0, True)
    assert score({"kind": "regex"}, case(r"\bcat\b"), outcome("concatenate"))[:2] == (0.0, False)


def test_numeric_finds_a_number_within_tolerance() -> None:
    num = {"kind": "numeric", "tolerance": 0.01}
    assert score(num, case("302400"), outcome("3.5 days is 302,400 seconds."))[:2] == (1.0, True)
    assert score(num, case(2.72), outcome("about 2.718"))[:2] == (1.0, True)
    value, _, why = score(num, case(10), outcome("it is 11"))
    assert value == 0.0 and "the closest number 11 is 1 from 10" in why
    assert score({"kind": "numeric", "relative": 0.1}, case(100), outcome("95"))[:2] == (1.0, True)
    assert "has no number" in score(num, case(1), outcome("none"))[2]


def test_json_against_a_schema_or_a_pydantic_model() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    kind = {"kind": "json", "schema": schema}
    assert score(kind, case(), outcome('```json\n{"n": 3}\n```'))[:2] == (1.0, True)
    value, _, why = score(kind, case(), outcome('{"n": "x"}'))
    assert value == 0.0 and "not valid against the schema" in why
    assert "is not JSON" in score(kind, case(), outcome("n=3"))[2]
    model = {"kind": "json", "model": "shared.evals.outcome:Step"}
    assert score(model, case(), outcome('{"kind": "call"}'))[:2] == (1.0, True)
    assert score(model, case(), outcome('{"kind": 3}'))[:2] == (0.0, False)


def test_trajectory_in_any_order_in_order_and_exactly() -> None:
    calls = [("search", {"query": "x"}), ("calculator", {"expression": "1+1"})]
    o = outcome("done", calls)
    tools = [{"name": "calculator"}, {"name": "search", "arguments": {"query": "x"}}]
    assert score({"kind": "trajectory", "tools": tools}, case(), o)[:2] == (1.0, True)
    assert score({"kind": "trajectory", "tools": tools, "order": "in_order"}, case(), o)[0] == 0.5
    assert score({"kind": "trajectory", "tools": tools[::-1], "order": "exact"}, case(), o)[0] == 1.0
    wrong_args = [{"name": "search", "arguments": {"query": "y"}}]
    assert score({"kind": "trajectory", "tools": wrong_args}, case(), o)[0] == 0.0
    # From the case's column, a list or "a;b" text.
    assert score({"kind": "trajectory"}, case(expected_tools=["search"]), o)[0] == 1.0
    assert score({"kind": "trajectory"}, case(expected_tools="search;clock"), o)[0] == 0.5


def test_limits_and_custom_scorers() -> None:
    o = outcome("4", steps=3, input_tokens=100, output_tokens=20)
    assert score({"kind": "limits", "max_steps": 3, "max_tokens": 120}, case(), o)[:2] == (1.0, True)
    assert "3 steps > 2" in score({"kind": "limits", "max_steps": 2}, case(), o)[2]
    even = {"kind": "custom", "function": "tests.eval_scorers:even_answer"}
    assert score(even, case(), o) == (1.0, True, "4 is even")


def test_a_scorer_that_raises_scores_zero_on_that_case_only() -> None:
    s = spec(
        scorers=[
            {"kind": "custom", "name": "flaky", "function": "tests.eval_scorers:raises_on_seven"},
            {"kind": "contains"},
        ]
    )
    broken, fine = run_scorers(s.scorers, Case(id="c7", input="q", expected="4"), outcome("4"))
    assert (broken.value, broken.error, fine.value) == (0.0, True, 1.0)
    assert broken.explanation == "the scorer failed: RuntimeError: this scorer breaks on c7"
    ok, _ = run_scorers(s.scorers, Case(id="c8", input="q", expected="4"), outcome("4"))
    assert (ok.value, ok.error) == (1.0, False)


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("tests.no_such_module:f", "cannot import module 'tests.no_such_module'"),
        ("tests.eval_scorers:nope", "module 'tests.eval_scorers' has no 'nope'"),
        ("tests.eval_scorers:NOT_CALLABLE", "is not callable"),
        ("no_colon", "is not an import path"),
    ],
)
def test_a_custom_scorer_that_cannot_load_is_refused_at_submit(function: str, message: str) -> None:
    s = spec(scorers=[{"kind": "custom", "name": "mine", "function": function}])
    with pytest.raises(EvalSpecError) as info:
        check_importable(s.scorers)
    assert "scorer 'mine'" in str(info.value) and message in str(info.value)


def test_pass_rates_intervals_and_pass_at_k() -> None:
    low, high = wilson(8, 10)
    assert 0.49 < low < 0.5 and 0.94 < high < 0.95
    assert wilson(0, 0) == (0.0, 1.0)
    assert pass_at_k(2, 1, 1) == 0.5 and pass_at_k(2, 1, 2) == 1.0 and pass_at_k(3, 0, 2) == 0.0
    from shared.evals.outcome import CaseResult

    rows = [
        CaseResult(
            item=f"0:{c}:{r}",
            variant="a",
            case_id=str(c),
            repeat=r,
            run_id="x",
            status="completed",
            passed=(c == 0 or r == 0),
        )
        for c in range(2)
        for r in range(2)
    ]
    (a,) = summarise(rows, ["a"], 2)
    assert (a.runs, a.passed, a.pass_at[1], a.pass_at[2]) == (4, 3, 0.75, 1.0)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ('{"score": 0.5, "reason": "half"}', (0.5, "half")),
        ('```json\n{"score": 1, "reason": "ok"}\n```', (1.0, "ok")),
        ("Looks fine", "did not answer with JSON"),
        ('{"score": 1}', "must have exactly score and reason"),
        ('{"score": 1, "reason": "x", "extra": 2}', "must have exactly score and reason"),
        ('{"score": true, "reason": "x"}', "must be a number in [0, 1], got True"),
        ('{"score": 7, "reason": "x"}', "must be a number in [0, 1], got 7"),
        ('{"score": 1, "reason": 3}', "reason must be text"),
        ("[1, 2]", "must have exactly score and reason"),
        (None, "did not answer with JSON"),
    ],
)
def test_a_judges_verdict_is_parsed_strictly(reply: str | None, verdict: tuple[float, str] | str) -> None:
    from shared.evals.scorers import JudgeVerdictError, parse_verdict

    if isinstance(verdict, tuple):
        assert parse_verdict(reply) == verdict
    else:
        with pytest.raises(JudgeVerdictError, match=re.escape(verdict)):
            parse_verdict(reply)


def test_a_judges_tokens_count_in_the_case_cost_even_when_its_verdict_is_garbage() -> None:
    from shared.evals.scorers import JudgeReply
    from shared.evals.scoring import result_of
    from shared.evals.store import Item

    s = spec(
        scorers=[{"kind": "judge", "model": "openai:gpt-4o-mini", "rubric": "Be exact."}],
        pricing={"openai:gpt-4o-mini": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}},
    )
    run = outcome("four", input_tokens=10, output_tokens=5)
    for text in ('{"score": 1, "reason": "ok"}', "Sure, fine!"):
        r = result_of(
            s, Item(0, 0, 0), case("4"), run, "scripted:x", lambda *_, t=text: JudgeReply(t, 100, 20)
        )
        assert r.judge_tokens == 120 and r.cost_usd == pytest.approx(140 / 1e6)
        assert r.passed == (text[0] == "{") and r.scores[0].error == (text[0] != "{")


def test_a_judge_scorer_sends_the_rubric_question_expected_and_answer() -> None:
    from shared.evals.scorers import JudgeReply

    asked: list[tuple[str, str, str]] = []

    def ask(model: str, system: str, prompt: str) -> JudgeReply:
        asked.append((model, system, prompt))
        return JudgeReply('{"score": 0.4, "reason": "partly"}', 100, 20)

    s = spec(scorers=[{"kind": "judge", "model": "openai:gpt-4o-mini", "rubric": "Be exact."}])
    (verdict,) = run_scorers(s.scorers, case("4"), outcome("four"), ask)
    assert (verdict.value, verdict.passed, verdict.explanation) == (0.4, False, "partly")
    assert (verdict.model, verdict.input_tokens, verdict.output_tokens) == ("openai:gpt-4o-mini", 100, 20)
    ((model, system, prompt),) = asked
    assert model == "openai:gpt-4o-mini" and "ONLY one JSON object" in system
    assert prompt == 'Rubric:\nBe exact.\n\nQuestion:\nq\n\nExpected answer:\n"4"\n\nAnswer to grade:\nfour'


def test_comparisons_pair_runs_and_test_the_change() -> None:
    from shared.evals.compare import compare, mcnemar_exact
    from shared.evals.outcome import CaseResult

    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert mcnemar_exact(3, 1) == pytest.approx(0.625) and mcnemar_exact(0, 0) == 1.0

    def rows(passing: set[int]) -> list[CaseResult]:
        return [
            CaseResult(
                item=f"0:{c}:0",
                variant="v",
                case_id=f"c{c}",
                repeat=0,
                run_id="x",
                status="completed",
                passed=c in passing,
            )
            for c in range(40)
        ]

    base = rows(set(range(30)))
    regressed = compare(base, rows(set(range(18))), "a", "b")
    assert (regressed.pairs, regressed.worse, regressed.better) == (40, 12, 0)
    assert regressed.regressions == sorted(f"c{c}" for c in range(18, 30))
    assert regressed.significant_regression and "significant regression" in regressed.verdict()
    noise = compare(base, rows(set(range(1, 31))), "a", "b")  # one worse, one better
    assert (noise.worse, noise.better, noise.significant) == (1, 1, False)
    assert noise.verdict() == "no significant change (p = 1)"


def test_the_watch_view_shows_each_variants_progress_pass_rate_cost_and_eta() -> None:
    from collections import Counter

    from rich.console import Console

    from producer.evals.client import Progress
    from producer.evals.watch import Rate, view
    from shared.evals.store import EvalMeta, VariantCounts

    s = spec(variants=[{"name": "a", "agent": "x"}, {"name": "b", "agent": "x"}], pass_threshold=0.8)
    meta = EvalMeta("e-1", s, "running", 200, 100, 0.0, None, "d.jsonl")
    counts = [VariantCounts(50, 45, 1, 750, 0.0123), VariantCounts(30, 12, 0, 450, 0.001)]
    rate = Rate(window_s=30)
    assert rate.add(0.0, 0) == 0.0 and rate.add(10.0, 40) == 4.0
    console = Console(record=True, width=140, color_system=None)
    console.print(view(Progress(meta, counts, 5, 115, 80), Counter({0: 3, 1: 2}), 4.0))
    text = console.export_text()
    assert "eval e-1  running  80/200 recorded, 5 in flight, 115 not started" in text
    assert "240.0 runs/min, ETA 0m30s" in text
    rows = {line.split()[0]: line.split()[-6:] for line in text.splitlines()[2:] if line.strip()}
    assert rows == {
        "a": ["50/100", "1", "3", "90.0%", "750", "$0.0123"],
        "b": ["30/100", "0", "2", "40.0%", "450", "$0.0010"],
    }
