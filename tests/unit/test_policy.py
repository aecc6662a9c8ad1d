"""Policy: bounded retries only, validated configuration, deterministic decision tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import PolicyConfigInvalid, RunErrorInfo
from shared.policy import (
    MAX_ATTEMPTS,
    Fail,
    Interrupt,
    Policy,
    Reprompt,
    Retry,
    Verdict,
    after_tools,
    on_invalid_action,
    on_model_error,
    on_truncated,
)
from shared.state import ToolResult


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
    assert p.on_truncated == "accept"
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
        ("on_truncated", "continue"),
        ("on_truncated", Reprompt(n=1)),
        ("on_truncated", None),
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


# -- on_invalid_action ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "used", "budget", "expected"),
    [
        (Fail(), 0, 5, Verdict("fail")),
        (Interrupt(), 0, 5, Verdict("interrupt")),
        (Interrupt(), 99, 5, Verdict("interrupt")),
        (Reprompt(n=2), 0, 5, Verdict("reprompt", True)),
        (Reprompt(n=2), 1, 5, Verdict("reprompt", True)),
        (Reprompt(n=2), 2, 5, Verdict("fail")),
        (Reprompt(n=2), 3, 5, Verdict("fail")),
        (Reprompt(n=2), 0, 0, Verdict("fail")),  # a charged reprompt needs budget left
        (Reprompt(n=1, consume_budget=False), 0, 0, Verdict("reprompt", False)),
        (Reprompt(n=1, consume_budget=False), 1, 5, Verdict("fail")),
    ],
)
def test_on_invalid_action(action: Any, used: int, budget: int, expected: Verdict) -> None:
    assert on_invalid_action(Policy(on_invalid_action=action), used, budget) == expected


# -- on_model_error ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "used", "retryable", "expected"),
    [
        (Retry(n=2), 0, True, Verdict("retry", False, 1.0)),
        (Retry(n=2), 1, True, Verdict("retry", False, 2.0)),
        (Retry(n=2), 2, True, Verdict("fail")),
        (Retry(n=2), 0, False, Verdict("fail")),  # non-retryable is never retried
        (Retry(n=MAX_ATTEMPTS), 0, False, Verdict("fail")),
        (Retry(n=3, consume_budget=True, backoff_s=0), 0, True, Verdict("retry", True, 0.0)),
        (Retry(n=3, consume_budget=True), 3, True, Verdict("fail")),
        (Fail(), 0, True, Verdict("fail")),
        (Fail(), 0, False, Verdict("fail")),
        (Interrupt(), 0, True, Verdict("interrupt")),
        (Interrupt(), 0, False, Verdict("interrupt")),
    ],
)
def test_on_model_error(action: Any, used: int, retryable: bool, expected: Verdict) -> None:
    assert on_model_error(Policy(on_model_error=action), used, retryable) == expected


def test_retry_count_is_bounded_by_n() -> None:
    policy = Policy(on_model_error=Retry(n=4))
    actions = [on_model_error(policy, used, True).action for used in range(10)]
    assert actions == ["retry"] * 4 + ["fail"] * 6
    policy2 = Policy(on_invalid_action=Reprompt(n=3))
    actions2 = [on_invalid_action(policy2, used, 99).action for used in range(5)]
    assert actions2 == ["reprompt"] * 3 + ["fail"] * 2


# -- after_tools ------------------------------------------------------------------------------------


def result(call_id: str, kind: str | None = None) -> ToolResult:
    error = RunErrorInfo.model_validate({"kind": kind, "message": f"{kind} of {call_id}"}) if kind else None
    return ToolResult(call_id=call_id, name="t", ok=error is None, output="x", error=error)


@pytest.mark.parametrize(
    ("policy", "results", "budget", "action", "error_of"),
    [
        (Policy(), [result("a"), result("b")], 3, "next_step", None),
        (Policy(), [result("a"), result("b", "ToolDispatch")], 3, "next_step", None),
        (Policy(on_tool_error="fail_fast"), [result("a"), result("b", "ToolDispatch")], 3, "fail", "b"),
        (Policy(), [result("a", "ToolOutcomeUnknown")], 3, "fail", "a"),
        (
            Policy(on_unknown_outcome="await_approval"),
            [result("a", "ToolOutcomeUnknown")],
            3,
            "park_unknown",
            None,
        ),
        # Poison and bugs fail the run whatever the policy, before anything else is considered.
        (
            Policy(on_unknown_outcome="await_approval"),
            [result("a", "ToolOutcomeUnknown"), result("b", "PoisonPhase")],
            3,
            "fail",
            "b",
        ),
        (Policy(), [result("a", "InternalInvariant")], 3, "fail", "a"),
        (Policy(), [result("a")], 0, "fail", None),  # the budget is spent
    ],
)
def test_after_tools(
    policy: Policy, results: list[ToolResult], budget: int, action: str, error_of: str | None
) -> None:
    verdict = after_tools(policy, results, budget_left=budget, max_steps=4, step=2)
    assert verdict.action == action
    if action == "fail" and error_of is None:
        assert verdict.error is not None and verdict.error.kind == "BudgetExceeded"
        assert verdict.error.message == "step budget of 4 spent before the model gave a final answer"
    elif error_of is not None:
        assert verdict.error is not None and verdict.error.message.endswith(f"of {error_of}")
    else:
        assert verdict.error is None


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


@pytest.mark.parametrize(
    ("mode", "cut_before", "budget", "expected"),
    [
        ("accept", 0, 5, Verdict("accept")),
        ("fail", 0, 5, Verdict("fail")),
        ("fail", 3, 0, Verdict("fail")),
        ("reprompt", 0, 5, Verdict("reprompt", consume_budget=True)),
        ("reprompt", 0, 1, Verdict("reprompt", consume_budget=True)),
        # Cut again after the one reprompt, or no budget left for another call: accepted (recorded).
        ("reprompt", 1, 5, Verdict("accept")),
        ("reprompt", 0, 0, Verdict("accept")),
    ],
)
def test_on_truncated(mode: Any, cut_before: int, budget: int, expected: Verdict) -> None:
    assert on_truncated(Policy(on_truncated=mode), cut_before, budget) == expected
