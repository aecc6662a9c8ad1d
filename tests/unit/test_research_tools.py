"""The flagship agent's tools: a calculator that never evaluates code, the clock, the corpus search."""

from __future__ import annotations

import builtins
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from shared.examples import research
from shared.examples.research import calculator, current_time, search
from shared.tools import Tool, ToolContext

CTX = ToolContext(run_id="r", step=1, call_id="c", deadline=0)


def call(t: Tool, **arguments: Any) -> Any:
    return json.loads(t.invoke(t.validate(arguments), CTX))


def calc(expression: str) -> float:
    out = call(calculator, expression=expression)
    assert out["expression"] == expression
    return float(out["value"])


@pytest.fixture
def no_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the calculator must never eval/exec")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)


# -- calculator: values ----------------------------------------------------------------------------


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("3.5 * 24 * 60 * 60", 302400.0),
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("10 / 4", 2.5),
        ("7 // 2", 3.0),
        ("-7 // 2", -4.0),
        ("7 % 3", 1.0),
        ("2 ** 10", 1024.0),
        ("2 ** -1", 0.5),
        ("-3 + +2", -1.0),
        ("--4", 4.0),
        ("sqrt(16)", 4.0),
        ("abs(-2.5)", 2.5),
        ("round(2.4)", 2.0),
        ("log(8, 2)", 3.0),
        ("log(e)", 1.0),
        ("pi", math.pi),
        ("2 * pi", 2 * math.pi),
        ("1e3 + 1", 1001.0),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("2 ** 900 / 2 ** 899", 2.0),
    ],
)
def test_arithmetic(expression: str, value: float) -> None:
    assert calc(expression) == pytest.approx(value, rel=1e-12)


def test_result_is_json_with_expression_and_value() -> None:
    out = calculator.invoke(calculator.validate({"expression": "6*7"}), CTX)
    assert out == '{"expression":"6*7","value":42.0}'


# -- calculator: safety ----------------------------------------------------------------------------


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize(
    ("expression", "element"),
    [
        ("__import__('os')", "Call"),
        ("__import__('os').system('true')", "Call"),
        ("open('/etc/passwd')", "Call"),
        ("eval('1')", "Call"),
        ("sqrt(x=4)", "Call"),  # keywords
        ("sqrt(1, 2, 3)", "Call"),  # too many arguments
        ("(1).__class__", "Attribute"),
        ("math.pi", "Attribute"),
        ("os", "Name"),
        ("x + 1", "Name"),
        ("__builtins__", "Name"),
        ("lambda: 1", "Lambda"),
        ("(lambda: 1)()", "Call"),
        ("[1, 2]", "List"),
        ("(1, 2)", "Tuple"),
        ("{1: 2}", "Dict"),
        ("'a' * 3", "Constant"),
        ("True + 1", "Constant"),
        ("1 if 1 else 2", "IfExp"),
        ("1 < 2", "Compare"),
        ("1 and 2", "BoolOp"),
        ("~1", "UnaryOp"),
        ("not 1", "UnaryOp"),
        ("1 << 3", "BinOp"),
        ("1 & 3", "BinOp"),
        ("[x for x in (1,)]", "ListComp"),
        ("f'{1}'", "JoinedStr"),
        ("1j", "Constant"),
        ("(y := 2)", "NamedExpr"),
    ],
)
def test_rejects_everything_but_arithmetic(expression: str, element: str) -> None:
    with pytest.raises(ValueError, match=f"unsupported expression element: {element}$"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["import os", "1; 2", "x = 1", "1 +", "", "print 1"])
def test_statements_and_syntax_errors(expression: str) -> None:
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["9**9**9", "2 ** 1001", "2 ** -1001", "1.0001 ** 100000"])
def test_huge_exponents_are_refused(expression: str) -> None:
    with pytest.raises(ValueError, match="exponent too large"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["2 ** 1000", "1e308 * 10", "1e200 * 1e200", "-(1e300 * 1e10)"])
def test_out_of_range_results_are_refused(expression: str) -> None:
    with pytest.raises(ValueError, match="result out of range"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["1 / 0", "1 // 0", "5 % 0", "0 ** -1"])
def test_division_by_zero_is_an_error(expression: str) -> None:
    with pytest.raises(ValueError, match="^division by zero$"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["sqrt(-1)", "log(0)", "log(-1)"])
def test_math_domain_errors(expression: str) -> None:
    with pytest.raises(ValueError, match="math domain error"):
        calc(expression)


@pytest.mark.usefixtures("no_eval")
@pytest.mark.parametrize("expression", ["10 ** 400", "999999 ** 999"])
def test_float_overflow_is_an_error(expression: str) -> None:
    with pytest.raises((ValueError, OverflowError)):
        calc(expression)


def test_expression_length_is_bounded() -> None:
    with pytest.raises(ValidationError):
        calculator.validate({"expression": "1+" * 100 + "1"})
    assert calc("+".join(["1"] * 100)) == 100.0


def test_round_with_digits() -> None:
    assert calc("round(3.14159, 2)") == 3.14
    assert calc("round(1234.5, -2)") == 1200.0
    with pytest.raises(ValueError, match="whole number of digits"):
        calc("round(3.14159, 2.5)")


# -- current_time ----------------------------------------------------------------------------------


def test_current_time_utc() -> None:
    out = call(current_time)
    assert out["timezone"] == "UTC"
    stamp = datetime.fromisoformat(out["iso"])
    assert stamp.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 5


def test_current_time_in_a_zone() -> None:
    out = call(current_time, timezone="Asia/Kolkata")
    stamp = datetime.fromisoformat(out["iso"])
    assert out["timezone"] == "Asia/Kolkata"
    assert stamp.utcoffset() == timedelta(hours=5, minutes=30)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "/etc/localtime", "", "Not A Zone"])
def test_current_time_bad_zone(zone: str) -> None:
    with pytest.raises(ValueError, match=r"^unknown time zone "):
        call(current_time, timezone=zone)


# -- search ----------------------------------------------------------------------------------------


def hits(query: str, limit: int = 10) -> list[tuple[str, float]]:
    return [(h["id"], h["score"]) for h in call(search, query=query, limit=limit)["hits"]]


def test_search_ranks_the_best_match_first() -> None:
    assert hits("exactly once effects") == [("exactly-once", 1.0), ("idempotency", 0.333)]
    assert hits("What makes an agent run durable?") == [("durable-runs", 0.75), ("redis-streams", 0.25)]
    assert hits("lease heartbeat sweeper") == [("leases", 0.667)]


def test_search_ties_keep_corpus_order() -> None:
    assert hits("celery broker redis") == [
        ("celery", 1.0),
        ("durable-runs", 0.333),
        ("redis-streams", 0.333),
        ("flower", 0.333),
    ]


def test_search_limit() -> None:
    assert hits("celery broker redis", limit=2) == [("celery", 1.0), ("durable-runs", 0.333)]
    assert len(call(search, query="celery broker redis")["hits"]) == 3  # default limit
    with pytest.raises(ValidationError):
        search.validate({"query": "x", "limit": 0})
    with pytest.raises(ValidationError):
        search.validate({"query": "x", "limit": 11})
    with pytest.raises(ValidationError):
        search.validate({"query": ""})


def test_search_without_matches() -> None:
    assert hits("xyzzy") == []
    assert hits("the of and is") == []  # stop words only


def test_search_hit_fields() -> None:
    (hit,) = call(search, query="Flower web monitor")["hits"]
    doc = next(d for d in research._corpus() if d["id"] == "flower")
    assert hit == {"id": "flower", "title": "Flower", "snippet": research.snippet(doc["text"]), "score": 1.0}
    long_doc = max(research._corpus(), key=lambda d: len(d["text"]))
    assert len(long_doc["text"]) > 240
    (first, *_) = call(search, query=long_doc["title"])["hits"]
    assert first["id"] == long_doc["id"] and first["snippet"] == research.snippet(long_doc["text"])
    assert first["snippet"].endswith(".") and len(first["snippet"]) <= 240


def test_corpus_is_bundled_and_well_formed() -> None:
    corpus = research._corpus()
    assert len(corpus) == 10
    assert len({d["id"] for d in corpus}) == len(corpus)
    assert all(set(d) == {"id", "title", "text"} for d in corpus)


def test_research_agent_is_registered() -> None:
    agent = research.registry.get("research")
    assert agent.tools.names == ["search", "calculator", "current_time"]
    assert agent.model == "scripted:research-demo"
    assert research.registry.model("research-demo") is not None


def test_snippets_end_at_a_sentence_or_a_word() -> None:
    from shared.examples.research import _corpus, snippet

    for doc in _corpus():
        text = doc["text"]
        cut = snippet(text)
        assert len(cut) <= 241
        if cut != text:
            assert cut.endswith((".", "…")), cut
            assert text.startswith(cut.removesuffix("…"))
            # The last word is whole: the text goes on with a space or a sentence's end after it.
            assert text[len(cut.removesuffix("…"))] in " .", cut
    assert snippet("short") == "short"
    assert snippet("word " * 100, limit=22) == "word word word word…"
