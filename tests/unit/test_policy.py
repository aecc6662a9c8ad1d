"""Policy: bounded retries only, validated configuration, deterministic decision tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import PolicyConfigInvalid
from shared.policy import (
    MAX_ATTEMPTS,
    Fail,
    Interrupt,
    Policy,
    Reprompt,
    Retry,
    decide_invalid_action,
    decide_model_error,
)


@pytest.mark.parametrize("n", [0, -1, 10**9, MAX_ATTEMPTS + 1, True, False, 1.0, 2.5, "3", None])
def test_retry_bound(n: Any) -> None:
    with pytest.raises(PolicyConfigInvalid, match=r"Retry\(n=.*retries are bounded"):
        Retry(n=n)


@pytest.mark.parametrize("n", [0, -5, 10**9, MAX_ATTEMPTS + 1, True, 1.5, "2"])
def test_reprompt_bound(n: Any) -> None:
    with pytest.raises(PolicyConfigInvalid, match=r"Reprompt\(n="):
        Reprompt(n=n)


@pytest.mark.parametrize("n", [1, 2, MAX_ATTEMPTS])
def test_valid_bounds(n: int) -> None:
    assert Retry(n=n).n == n
    assert Reprompt(n=n).n == n


def test_reprompt_strategy_checked() -> None:
    with pytest.raises(PolicyConfigInvalid, match="unknown reprompt strategy 'guess'"):
        Reprompt(strategy="guess")  # type: ignore[arg-type]


def test_defaults() -> None:
    p = Policy()
    assert p.on_invalid_action == Fail()
    assert p.on_model_error == Retry(n=2)
    assert p.on_tool_error == "append_error_and_continue"
    assert p.on_unknown_outcome == "fail"
    assert Retry() == Retry(n=3, consume_budget=False)
    assert Reprompt() == Reprompt(n=2, strategy="explain_error", consume_budget=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("on_invalid_action", Retry(n=1)),
        ("on_invalid_action", "fail"),
        ("on_invalid_action", None),
        ("on_invalid_action", Fail),  # the class, not an instance
        ("on_model_error", Reprompt(n=1)),
        ("on_model_error", 3),
        ("on_model_error", Retry),
        ("on_tool_error", "ignore"),
        ("on_tool_error", Fail()),
        ("on_tool_error", None),
        ("on_unknown_outcome", "retry"),
        ("on_unknown_outcome", True),
    ],
)
def test_wrong_policy_field_types(field: str, value: Any) -> None:
    with pytest.raises(PolicyConfigInvalid, match=field):
        Policy(**{field: value})


def test_valid_policies() -> None:
    for action in (Fail(), Reprompt(n=1), Interrupt()):
        assert Policy(on_invalid_action=action).on_invalid_action is action
    for err in (Fail(), Retry(n=1), Interrupt()):
        assert Policy(on_model_error=err).on_model_error is err
    assert Policy(on_tool_error="fail_fast", on_unknown_outcome="await_approval").on_tool_error == "fail_fast"


# -- decide_invalid_action -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "used", "expected"),
    [
        (Fail(), 0, ("fail", False)),
        (Interrupt(), 0, ("interrupt", False)),
        (Interrupt(), 99, ("interrupt", False)),
        (Reprompt(n=2), 0, ("reprompt", True)),
        (Reprompt(n=2), 1, ("reprompt", True)),
        (Reprompt(n=2), 2, ("fail", False)),
        (Reprompt(n=2), 3, ("fail", False)),
        (Reprompt(n=1, consume_budget=False), 0, ("reprompt", False)),
        (Reprompt(n=1, consume_budget=False), 1, ("fail", False)),
    ],
)
def test_decide_invalid_action(action: Any, used: int, expected: tuple[str, bool]) -> None:
    assert decide_invalid_action(Policy(on_invalid_action=action), used) == expected


# -- decide_model_error ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "used", "retryable", "expected"),
    [
        (Retry(n=2), 0, True, ("retry", False)),
        (Retry(n=2), 1, True, ("retry", False)),
        (Retry(n=2), 2, True, ("fail", False)),
        (Retry(n=2), 0, False, ("fail", False)),  # non-retryable is never retried
        (Retry(n=MAX_ATTEMPTS), 0, False, ("fail", False)),
        (Retry(n=3, consume_budget=True), 0, True, ("retry", True)),
        (Retry(n=3, consume_budget=True), 3, True, ("fail", False)),
        (Fail(), 0, True, ("fail", False)),
        (Fail(), 0, False, ("fail", False)),
        (Interrupt(), 0, True, ("interrupt", False)),
        (Interrupt(), 0, False, ("interrupt", False)),
    ],
)
def test_decide_model_error(action: Any, used: int, retryable: bool, expected: tuple[str, bool]) -> None:
    assert decide_model_error(Policy(on_model_error=action), used, retryable) == expected


def test_retry_count_is_bounded_by_n() -> None:
    policy = Policy(on_model_error=Retry(n=4))
    decisions = [decide_model_error(policy, used, True)[0] for used in range(10)]
    assert decisions == ["retry"] * 4 + ["fail"] * 6
    policy2 = Policy(on_invalid_action=Reprompt(n=3))
    decisions = [decide_invalid_action(policy2, used)[0] for used in range(5)]
    assert decisions == ["reprompt"] * 3 + ["fail"] * 2


def test_policy_objects_are_frozen() -> None:
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        Retry(n=1).n = 10**9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Policy().on_model_error = Retry(n=1)  # type: ignore[misc]


@pytest.mark.parametrize("make", [Retry, Reprompt])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_consume_budget_must_be_a_bool(make: Any, value: Any) -> None:
    with pytest.raises(PolicyConfigInvalid, match="consume_budget"):
        make(n=1, consume_budget=value)
