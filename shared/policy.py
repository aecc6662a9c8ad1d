"""Policy: what happens when the model or a tool misbehaves. Deterministic, side-effect free.

Every retrying action carries a bound ``n > 0`` (capped at :data:`MAX_ATTEMPTS`), so an unbounded
retry cannot be configured: such a policy raises :class:`PolicyConfigInvalid` when built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from shared.errors import BudgetExceeded, PolicyConfigInvalid, RunErrorInfo
from shared.state import ToolResult

__all__ = [
    "Action",
    "Fail",
    "Interrupt",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_S",
    "Policy",
    "Reprompt",
    "Retry",
    "StepAction",
    "StepVerdict",
    "TRUNCATION_REPROMPTS",
    "ToolFailureMode",
    "TruncationMode",
    "UnknownOutcomeMode",
    "Verdict",
    "VerdictAction",
    "after_tools",
    "on_invalid_action",
    "on_model_error",
    "on_truncated",
]

MAX_ATTEMPTS = 20
#: Longest wait between model retries; kept well below the queued lease, so the sweeper never
#: mistakes a delayed retry for a lost one.
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class Fail:
    """End the run as FAILED with the error."""


@dataclass(frozen=True)
class Interrupt:
    """End the run as INTERRUPTED (halted by policy), keeping the error for inspection."""


@dataclass(frozen=True)
class Retry:
    """Call the model again, at most ``n`` times for one step."""

    n: int = 3
    consume_budget: bool = False
    #: Delay before retry k (0-based) is ``backoff_s * 2**k``, capped at :data:`MAX_BACKOFF_S`.
    backoff_s: float = 1.0

    def __post_init__(self) -> None:
        _check_bound("Retry", self.n)
        _check_flag("Retry", self.consume_budget)
        if (
            not isinstance(self.backoff_s, int | float)
            or isinstance(self.backoff_s, bool)
            or not 0 <= self.backoff_s <= MAX_BACKOFF_S
        ):
            raise PolicyConfigInvalid(
                f"Retry(backoff_s={self.backoff_s!r}): must be a number in 0..{MAX_BACKOFF_S}"
            )

    def delay_s(self, retries_used: int) -> float:
        return float(min(self.backoff_s * 2**retries_used, MAX_BACKOFF_S))


@dataclass(frozen=True)
class Reprompt:
    """Tell the model what was wrong and let it try again, at most ``n`` times per run."""

    n: int = 2
    strategy: Literal["explain_error"] = "explain_error"
    consume_budget: bool = True

    def __post_init__(self) -> None:
        _check_bound("Reprompt", self.n)
        _check_flag("Reprompt", self.consume_budget)
        if self.strategy != "explain_error":
            raise PolicyConfigInvalid(f"unknown reprompt strategy {self.strategy!r}")


def _check_bound(what: str, n: object) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_ATTEMPTS:
        raise PolicyConfigInvalid(
            f"{what}(n={n!r}): n must be an integer in 1..{MAX_ATTEMPTS}; retries are bounded"
        )


def _check_flag(what: str, value: object) -> None:
    if not isinstance(value, bool):
        raise PolicyConfigInvalid(f"{what}(consume_budget={value!r}): must be True or False")


Action = Fail | Retry | Reprompt | Interrupt


ToolFailureMode = Literal["fail_fast", "append_error_and_continue"]
UnknownOutcomeMode = Literal["fail", "await_approval"]
TruncationMode = Literal["accept", "reprompt", "fail"]
#: Reprompts a run gets for answers cut at the output limit (``on_truncated="reprompt"``): a
#: model that is cut again would most likely be cut every time.
TRUNCATION_REPROMPTS = 1


@dataclass(frozen=True)
class Policy:
    #: Malformed model action: unknown tool, arguments not JSON, arguments failing validation.
    """What an agent does about malformed model actions, provider errors, tool errors and unknown outcomes."""

    on_invalid_action: Fail | Reprompt | Interrupt = Fail()
    #: The provider failed (network, 5xx, malformed body).
    on_model_error: Fail | Retry | Interrupt = Retry(n=2)
    #: A tool raised or timed out.
    on_tool_error: ToolFailureMode = "append_error_and_continue"
    #: A tool that is not retry-safe lost its worker mid-call.
    on_unknown_outcome: UnknownOutcomeMode = "fail"
    #: A final answer the provider cut at its output token limit: ``accept`` it as the answer (the
    #: run, its ``ModelResponded`` and ``Completed`` events say ``truncated``), ``reprompt`` the
    #: model once for a complete, shorter one (accepted, marked truncated, if cut again), or
    #: ``fail`` the run (``InvalidModelAction``).
    on_truncated: TruncationMode = "accept"

    def __post_init__(self) -> None:
        if not isinstance(self.on_invalid_action, Fail | Reprompt | Interrupt):
            raise PolicyConfigInvalid(
                f"on_invalid_action must be Fail, Reprompt or Interrupt, got {self.on_invalid_action!r}"
            )
        if not isinstance(self.on_model_error, Fail | Retry | Interrupt):
            raise PolicyConfigInvalid(
                f"on_model_error must be Fail, Retry or Interrupt, got {self.on_model_error!r}"
            )
        if self.on_tool_error not in ("fail_fast", "append_error_and_continue"):
            raise PolicyConfigInvalid(
                f"on_tool_error must be fail_fast or append_error_and_continue, got {self.on_tool_error!r}"
            )
        if self.on_unknown_outcome not in ("fail", "await_approval"):
            raise PolicyConfigInvalid(
                f"on_unknown_outcome must be fail or await_approval, got {self.on_unknown_outcome!r}"
            )
        if self.on_truncated not in ("accept", "reprompt", "fail"):
            raise PolicyConfigInvalid(
                f"on_truncated must be accept, reprompt or fail, got {self.on_truncated!r}"
            )


VerdictAction = Literal["fail", "retry", "reprompt", "interrupt", "accept"]


@dataclass(frozen=True)
class Verdict:
    """What the policy says to do about a malformed model action or a provider error."""

    action: VerdictAction
    #: The retry or reprompt is charged against the run's step budget.
    consume_budget: bool = False
    #: Seconds to wait before the retry (a model retry's backoff).
    delay_s: float = 0.0


def on_invalid_action(policy: Policy, reprompts_used: int, budget_left: int) -> Verdict:
    """What to do with a malformed model action: reprompt while the policy and the budget allow."""
    action = policy.on_invalid_action
    if isinstance(action, Reprompt):
        if reprompts_used < action.n and (not action.consume_budget or budget_left > 0):
            return Verdict("reprompt", action.consume_budget)
        return Verdict("fail")
    return Verdict("interrupt" if isinstance(action, Interrupt) else "fail")


def on_model_error(policy: Policy, retries_used: int, retryable: bool) -> Verdict:
    """What to do when the provider failed; a non-retryable error (e.g. 400) is never retried."""
    action = policy.on_model_error
    if isinstance(action, Retry):
        if retryable and retries_used < action.n:
            return Verdict("retry", action.consume_budget, action.delay_s(retries_used))
        return Verdict("fail")
    return Verdict("interrupt" if isinstance(action, Interrupt) else "fail")


def on_truncated(policy: Policy, truncation_reprompts: int, budget_left: int) -> Verdict:
    """What to do with a final answer cut at the output limit. A reprompt is charged to the step
    budget (it is another model call for the same answer); once the reprompts are used, or the
    budget is, the answer is accepted (and recorded as truncated)."""
    if policy.on_truncated == "fail":
        return Verdict("fail")
    if policy.on_truncated == "reprompt" and truncation_reprompts < TRUNCATION_REPROMPTS and budget_left > 0:
        return Verdict("reprompt", consume_budget=True)
    return Verdict("accept")


StepAction = Literal["next_step", "fail", "park_unknown"]


@dataclass(frozen=True)
class StepVerdict:
    """What follows a step once all its tool results are in."""

    action: StepAction
    #: The run's error when the verdict is to fail.
    error: RunErrorInfo | None = None


def after_tools(
    policy: Policy, results: Sequence[ToolResult], *, budget_left: int, max_steps: int, step: int
) -> StepVerdict:
    """Fail, park for a human, or go on to the next step, from a step's results and the policy.

    A call that was poison or hit a bug fails the run whatever the policy; a non-retry-safe call
    with an unknown outcome fails or parks as ``on_unknown_outcome`` says; other tool errors fail
    the run only under ``fail_fast``; a spent budget fails it before the model is asked again.
    """
    failures = [r.error for r in results if not r.ok and r.error is not None]
    fatal = [e for e in failures if e.kind in ("PoisonPhase", "InternalInvariant")]
    if fatal:
        return StepVerdict("fail", fatal[0])
    unknown = [e for e in failures if e.kind == "ToolOutcomeUnknown"]
    if unknown:
        if policy.on_unknown_outcome == "fail":
            return StepVerdict("fail", unknown[0])
        return StepVerdict("park_unknown")
    if failures and policy.on_tool_error == "fail_fast":
        return StepVerdict("fail", failures[0])
    if budget_left <= 0:
        error = BudgetExceeded(
            f"step budget of {max_steps} spent before the model gave a final answer", step=step
        )
        return StepVerdict("fail", error.info())
    return StepVerdict("next_step")
