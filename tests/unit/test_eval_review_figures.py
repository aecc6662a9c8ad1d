"""The viewer's figures that need no server: the agreement of human labels with the scorers
(Cohen's kappa, at its edges) and the breakdown of an eval by a field of its dataset."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from shared.evals.annotations import Agreement, Annotation, agreement
from shared.evals.breakdown import MAX_FIELDS, MAX_GROUPS, breakdown, case_fields
from shared.evals.dataset import Case
from shared.evals.outcome import CaseResult, Score


def result(
    case: int, passed: bool, variant: int = 0, *, latency_s: float = 1.0, cost_usd: float = 0.0
) -> CaseResult:
    return CaseResult(
        item=f"{variant}:{case}:0",
        variant=f"v{variant}",
        case_id=f"c{case}",
        repeat=0,
        run_id=f"e:v{variant}:c{case}:r0",
        status="completed",
        passed=passed,
        latency_s=latency_s,
        cost_usd=cost_usd,
        scores=[Score(name="exact", value=1.0 if passed else 0.0, passed=passed)],
    )


def label(item: str, verdict: Literal["pass", "fail"] | None) -> Annotation:
    return Annotation(label=verdict, item=item, by="key-1", at=1.0)


def rated(pairs: list[tuple[bool, bool]]) -> Agreement:
    """(human says pass, scorers say pass) per case run."""
    results = [result(i, auto) for i, (_, auto) in enumerate(pairs)]
    labels = {
        r.item: label(r.item, "pass" if human else "fail")
        for r, (human, _) in zip(results, pairs, strict=True)
    }
    return agreement(results, labels)


# -- agreement and Cohen's kappa ------------------------------------------------------------------


def test_no_labels_give_no_rate_and_no_kappa() -> None:
    got = agreement([result(0, True), result(1, False)], {})
    assert got == Agreement(0, 0, None) and got.rate is None
    assert got.as_dict() == {"labelled": 0, "agreed": 0, "rate": None, "kappa": None}


def test_a_label_without_a_verdict_and_a_label_of_no_result_count_for_nothing() -> None:
    results = [result(0, True), result(1, False)]
    labels = {"0:0:0": label("0:0:0", None), "0:7:0": label("0:7:0", "pass"), "1:1:0": label("1:1:0", "fail")}
    assert agreement(results, labels) == Agreement(0, 0, None)


def test_the_textbook_example() -> None:
    # 50 case runs: both pass 20, only the human 5, only the scorers 10, neither 15.
    pairs = [(True, True)] * 20 + [(True, False)] * 5 + [(False, True)] * 10 + [(False, False)] * 15
    got = rated(pairs)
    assert (got.labelled, got.agreed, got.rate) == (50, 35, 0.7)
    # Observed 0.7; by chance 0.5 x 0.6 + 0.5 x 0.4 = 0.5; kappa (0.7 - 0.5) / (1 - 0.5).
    assert got.kappa == pytest.approx(0.4)


def test_perfect_agreement_on_both_verdicts_is_kappa_one() -> None:
    got = rated([(True, True), (False, False), (True, True)])
    assert got.rate == 1.0 and got.kappa == pytest.approx(1.0)


def test_opposite_verdicts_on_a_balanced_set_are_kappa_minus_one() -> None:
    got = rated([(True, False), (False, True)])
    assert got.rate == 0.0 and got.kappa == pytest.approx(-1.0)


@pytest.mark.parametrize("verdict", [True, False])
def test_both_raters_always_saying_the_same_leave_kappa_undefined(verdict: bool) -> None:
    # Chance agreement is 1: kappa would divide by zero, so it is None, not a number.
    got = rated([(verdict, verdict)] * 3)
    assert (got.rate, got.kappa) == (1.0, None)


def test_one_label_against_the_scorers_is_kappa_zero() -> None:
    # As the viewer shows it: "0.0% of 1 labelled, kappa 0.00".
    got = rated([(True, False)])
    assert (got.labelled, got.agreed, got.rate, got.kappa) == (1, 0, 0.0, 0.0)


def test_a_constant_human_against_varying_scorers_is_kappa_zero() -> None:
    # A rater who always says the same carries no information beyond chance.
    got = rated([(True, True), (True, False), (True, True), (True, False)])
    assert got.rate == 0.5 and got.kappa == pytest.approx(0.0)


# -- breakdown by a dataset field ------------------------------------------------------------------


def case(i: int, **columns: Any) -> Case:
    metadata = columns.pop("metadata", {})
    return Case(id=f"c{i}", input=f"input {i}", columns=columns, metadata=metadata)


def test_fields_that_group_usefully_are_offered_and_others_are_not() -> None:
    cases = {
        0: case(
            0,
            category="math",
            flag=True,
            level=1,
            same="x",
            tags=["a"],
            long="a" * 80,
            metadata={"team": "red"},
        ),
        1: case(
            1,
            category="text",
            flag=False,
            level=2,
            same="x",
            tags="b",
            long="b" * 81,
            metadata={"team": "blue"},
        ),
        2: case(
            2, category="math", flag=True, level=1, same="x", tags="c", long="c", metadata={"team": "red"}
        ),
    }
    fields = case_fields(cases)
    # "same" has one value, "tags" holds a list once, "long" a value over 80 characters once.
    assert list(fields) == ["category", "flag", "level", "metadata.team"]
    assert fields["flag"] == {0: "true", 1: "false", 2: "true"}
    assert fields["level"] == {0: "1", 1: "2", 2: "1"}
    assert fields["metadata.team"] == {0: "red", 1: "blue", 2: "red"}


def test_a_field_with_too_many_values_is_not_offered() -> None:
    cases = {i: case(i, id_like=f"x{i}", bucket=f"b{i % MAX_GROUPS}") for i in range(MAX_GROUPS + 1)}
    assert list(case_fields(cases)) == ["bucket"]


def test_at_most_max_fields_are_offered_in_the_datasets_order() -> None:
    names = [f"f{n:02d}" for n in range(MAX_FIELDS + 3)]
    cases = {i: case(i, **{name: f"{name}-{i % 2}" for name in names}) for i in range(4)}
    assert list(case_fields(cases)) == names[:MAX_FIELDS]


def test_each_group_has_every_variants_figures_over_its_own_cases() -> None:
    cases = {
        0: case(0, category="math"),
        1: case(1, category="math"),
        2: case(2, category="text"),
        3: case(3, category="art"),
    }
    results = [
        result(0, True, 0, latency_s=1.0, cost_usd=0.5),
        result(1, False, 0, latency_s=3.0, cost_usd=0.25),
        result(0, True, 1),
        result(1, True, 1),
        result(2, False, 0),
        result(2, True, 1),
        # case 3 has no result yet: it counts as a case of its group, with no runs.
    ]
    groups = breakdown(cases, results, ["v0", "v1"], repeats=1)
    assert list(groups) == ["category"]
    by_value = {g["value"]: g for g in groups["category"]}
    assert [g["value"] for g in groups["category"]] == ["art", "math", "text"]  # sorted by value
    assert {v: g["cases"] for v, g in by_value.items()} == {"art": 1, "math": 2, "text": 1}
    math = {f["name"]: f for f in by_value["math"]["variants"]}
    assert (math["v0"]["runs"], math["v0"]["passed"], math["v0"]["rate"]) == (2, 1, 0.5)
    assert (math["v1"]["runs"], math["v1"]["passed"], math["v1"]["rate"]) == (2, 2, 1.0)
    assert math["v0"]["cost_usd"] == 0.75 and math["v0"]["scores"] == {"exact": 0.5}
    assert 0.0 < math["v0"]["low"] < 0.5 < math["v0"]["high"] < 1.0  # the Wilson interval around 1 of 2
    text = {f["name"]: f for f in by_value["text"]["variants"]}
    assert (text["v0"]["rate"], text["v1"]["rate"]) == (0.0, 1.0)
    art = {f["name"]: f for f in by_value["art"]["variants"]}
    assert art["v0"]["runs"] == art["v1"]["runs"] == 0


def test_a_dataset_without_a_groupable_field_has_no_breakdown() -> None:
    cases = {i: case(i, note=f"free text {i}" * 20) for i in range(3)}
    assert breakdown(cases, [result(0, True)], ["v0"], repeats=1) == {}
