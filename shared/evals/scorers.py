"""Scorers: each turns one case run into a value in [0, 1] with an explanation.

A scorer is configured in the spec (``[[scorers]]`` with a ``kind``) and runs on the pool, in the
task that records the case. A case passes when its run completed and every scorer's value reached
that scorer's ``threshold``. A scorer that raises (or cannot be imported) scores 0 with the error
as its explanation, on that case only.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.evals.dataset import Case
from shared.evals.errors import EvalSpecError
from shared.evals.outcome import RunOutcome, Score, Step
from shared.limits import Throttled

__all__ = [
    "ContainsScorer",
    "CustomScorer",
    "ExactScorer",
    "JUDGE_SYSTEM",
    "JsonScorer",
    "Judge",
    "JudgeReply",
    "JudgeScorer",
    "JudgeVerdictError",
    "LimitsScorer",
    "MAX_REASON",
    "Normalisation",
    "NumericScorer",
    "RegexScorer",
    "ScoreFn",
    "ScorerSpec",
    "ToolExpectation",
    "TrajectoryScorer",
    "check_importable",
    "import_path",
    "parse_verdict",
    "run_scorers",
    "scorer_names",
]

Normalisation = Literal["case", "whitespace", "punctuation"]
_DEFAULT_NORMALISATION: tuple[Normalisation, ...] = ("case", "whitespace")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_PUNCT = str.maketrans("", "", string.punctuation)


class ScoreFn(Protocol):
    """A custom scorer: returns a value in [0, 1] (or a bool), optionally with an explanation."""

    def __call__(self, case: Case, outcome: RunOutcome) -> float | bool | tuple[float | bool, str]: ...


def import_path(path: str) -> Any:
    """The object at ``package.module:attribute``; raises :class:`EvalSpecError` when missing."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise EvalSpecError(f"{path!r} is not an import path of the form package.module:name")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise EvalSpecError(f"cannot import module {module_name!r} of {path!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise EvalSpecError(f"module {module_name!r} has no {attr!r} (from {path!r})")
        target = getattr(target, part)
    return target


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Shown in reports; defaults to the kind.
    name: str | None = None
    #: The value at or above which this scorer passes the case.
    threshold: float = Field(default=1.0, ge=0, le=1)

    @property
    def label(self) -> str:
        return self.name or str(getattr(self, "kind", "scorer"))

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        raise NotImplementedError

    def check(self) -> None:
        """Raise :class:`EvalSpecError` if the scorer cannot run (checked at submit)."""


def _expected(case: Case, field: str) -> Any:
    if field == "expected":
        return case.expected
    return case.columns.get(field)


def _normalise(text: str, how: Sequence[str]) -> str:
    if "case" in how:
        text = text.casefold()
    if "punctuation" in how:
        text = text.translate(_PUNCT)
    if "whitespace" in how:
        text = " ".join(text.split())
    return text.strip()


class ExactScorer(_Base):
    """The answer equals the expected value (after the chosen normalisations)."""

    kind: Literal["exact"]
    field: str = "expected"
    normalize: list[Normalisation] = Field(default_factory=lambda: list(_DEFAULT_NORMALISATION))

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        want = _expected(case, self.field)
        if want is None:
            return 0.0, f"the case has no {self.field!r}"
        got = _normalise(outcome.answer or "", self.normalize)
        if got == _normalise(str(want), self.normalize):
            return 1.0, "the answer equals the expected value"
        return 0.0, f"expected {str(want)[:200]!r}, got {(outcome.answer or '')[:200]!r}"


class ContainsScorer(_Base):
    """The answer contains the expected text (or each of several)."""

    kind: Literal["contains"]
    field: str = "expected"
    #: Fixed text(s) to look for instead of the case's field.
    value_: str | list[str] | None = Field(default=None, alias="text")
    ignore_case: bool = True

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        want = self.value_ if self.value_ is not None else _expected(case, self.field)
        if want is None:
            return 0.0, f"the case has no {self.field!r}"
        needles = [str(w) for w in want] if isinstance(want, list) else [str(want)]
        answer = outcome.answer or ""
        if self.ignore_case:
            answer = answer.casefold()
        missing = [n for n in needles if (n.casefold() if self.ignore_case else n) not in answer]
        if not missing:
            return 1.0, f"the answer contains {', '.join(repr(n) for n in needles)[:300]}"
        found = len(needles) - len(missing)
        return found / len(needles), f"missing {', '.join(repr(n) for n in missing)[:300]}"


class RegexScorer(_Base):
    """The answer matches a regular expression (the spec's ``pattern``, or the case's field)."""

    kind: Literal["regex"]
    pattern: str | None = None
    field: str = "expected"
    ignore_case: bool = True

    @model_validator(mode="after")
    def _compiles(self) -> RegexScorer:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r} is not a regular expression: {exc}") from None
        return self

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        pattern = self.pattern if self.pattern is not None else _expected(case, self.field)
        if pattern is None:
            return 0.0, f"the case has no {self.field!r}"
        flags = re.IGNORECASE if self.ignore_case else 0
        if re.search(str(pattern), outcome.answer or "", flags):
            return 1.0, f"the answer matches /{pattern}/"
        return 0.0, f"the answer does not match /{pattern}/"


class NumericScorer(_Base):
    """A number in the answer is within tolerance of the expected number."""

    kind: Literal["numeric"]
    field: str = "expected"
    #: Absolute tolerance.
    tolerance: float = Field(default=1e-6, ge=0)
    #: Relative tolerance (of the expected value), used when larger than the absolute one.
    relative: float = Field(default=0.0, ge=0)

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        want_raw = _expected(case, self.field)
        try:
            want = float(str(want_raw).replace(",", ""))
        except ValueError:
            return 0.0, f"the expected value {want_raw!r} is not a number"
        allowed = max(self.tolerance, abs(want) * self.relative)
        numbers = [float(m.replace(",", "")) for m in _NUMBER.findall(outcome.answer or "")]
        if not numbers:
            return 0.0, "the answer has no number"
        best = min(numbers, key=lambda n: abs(n - want))
        if math.isclose(best, want, abs_tol=allowed, rel_tol=0) or abs(best - want) <= allowed:
            return 1.0, f"{best:g} is within {allowed:g} of {want:g}"
        return 0.0, f"the closest number {best:g} is {abs(best - want):g} from {want:g} (allowed {allowed:g})"


class JsonScorer(_Base):
    """The answer is JSON valid against a JSON schema, or a pydantic model given by import path."""

    kind: Literal["json"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    model: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one(self) -> JsonScorer:
        if self.schema_ is not None and self.model is not None:
            raise ValueError("give a schema or a model, not both")
        if self.schema_ is not None:
            import jsonschema

            try:
                jsonschema.Draft202012Validator.check_schema(self.schema_)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"schema is not a valid JSON schema: {exc.message}") from None
        return self

    def check(self) -> None:
        if self.model is not None:
            model = import_path(self.model)
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise EvalSpecError(f"{self.model!r} is not a pydantic model")

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        text = (outcome.answer or "").strip()
        fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
        if fenced:
            text = fenced.group(1)
        try:
            data = json.loads(text)
        except ValueError as exc:
            return 0.0, f"the answer is not JSON: {exc}"
        if self.model is not None:
            try:
                import_path(self.model).model_validate(data)
            except ValidationError as exc:
                return 0.0, f"not a valid {self.model}: {exc.errors(include_url=False)[0]['msg']}"
            return 1.0, f"a valid {self.model}"
        if self.schema_ is not None:
            import jsonschema

            errors = list(jsonschema.Draft202012Validator(self.schema_).iter_errors(data))
            if errors:
                return 0.0, f"not valid against the schema: {errors[0].message[:300]}"
            return 1.0, "valid against the schema"
        return 1.0, "valid JSON"


class ToolExpectation(BaseModel):
    """A tool call a trajectory should contain; ``arguments`` must be a subset of the call's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict[str, Any] | None = None

    def matches(self, call: Step) -> bool:
        if call.tool != self.name:
            return False
        if self.arguments is None:
            return True
        actual = call.arguments or {}
        return all(actual.get(k) == v for k, v in self.arguments.items())


class TrajectoryScorer(_Base):
    """The run called these tools (from the spec, or the case's ``field`` column), in order or not.

    ``order``: ``any`` (each expected call appears somewhere), ``in_order`` (as a subsequence),
    ``exact`` (exactly these calls, in this order). The value is the fraction matched.
    """

    kind: Literal["trajectory"]
    tools: list[ToolExpectation] | None = None
    field: str = "expected_tools"
    order: Literal["any", "in_order", "exact"] = "any"

    def _wanted(self, case: Case) -> list[ToolExpectation] | None:
        if self.tools is not None:
            return self.tools
        raw = _expected(case, self.field)
        if isinstance(raw, str):
            raw = json.loads(raw) if raw.strip().startswith("[") else [n for n in raw.split(";") if n]
        if not isinstance(raw, list):
            return None
        return [
            ToolExpectation(name=t) if isinstance(t, str) else ToolExpectation.model_validate(t) for t in raw
        ]

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        wanted = self._wanted(case)
        if wanted is None:
            return 0.0, f"the case has no {self.field!r}"
        calls = outcome.tool_calls
        called = ", ".join(c.tool or "?" for c in calls) or "no tools"
        if not wanted:
            ok = not calls if self.order == "exact" else True
            return float(ok), f"called {called}"
        if self.order == "exact":
            ok = len(calls) == len(wanted) and all(w.matches(c) for w, c in zip(wanted, calls, strict=True))
            return float(ok), f"called {called}" + ("" if ok else f"; expected exactly {_names(wanted)}")
        if self.order == "in_order":
            matched, position = 0, 0
            for want in wanted:
                while position < len(calls) and not want.matches(calls[position]):
                    position += 1
                if position == len(calls):
                    break
                matched += 1
                position += 1
        else:
            matched = sum(1 for want in wanted if any(want.matches(c) for c in calls))
        return matched / len(
            wanted
        ), f"{matched}/{len(wanted)} expected calls ({_names(wanted)}); called {called}"


def _names(wanted: Sequence[ToolExpectation]) -> str:
    return ", ".join(w.name for w in wanted)


class LimitsScorer(_Base):
    """The run stayed within a number of steps and tokens."""

    kind: Literal["limits"]
    max_steps: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        over = []
        if self.max_steps is not None and outcome.steps > self.max_steps:
            over.append(f"{outcome.steps} steps > {self.max_steps}")
        if self.max_tokens is not None and outcome.tokens > self.max_tokens:
            over.append(f"{outcome.tokens} tokens > {self.max_tokens}")
        if over:
            return 0.0, "; ".join(over)
        return 1.0, f"{outcome.steps} steps, {outcome.tokens} tokens: within limits"


class JudgeVerdictError(ValueError):
    """The judge's reply is not a verdict: anything but the one JSON object it was asked for."""


@dataclass(frozen=True)
class JudgeReply:
    """What a judge model answered, and the tokens it took."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0


#: Asks a model (``PROVIDER:MODEL``) with a system prompt and a user message.
Judge = Callable[[str, str, str], JudgeReply]

JUDGE_SYSTEM = (
    "You grade an AI assistant's answer against a rubric. Reply with ONLY one JSON object and"
    ' nothing else: {"score": <a number from 0 to 1>, "reason": "<one or two sentences>"}.'
)
MAX_REASON = 1000


def parse_verdict(text: str | None) -> tuple[float, str]:
    """The judge's score and reason; raises :class:`JudgeVerdictError` for anything else.

    Strict on purpose: one JSON object (a Markdown code fence around it is tolerated), exactly the
    keys ``score`` (a number in [0, 1], not a boolean) and ``reason`` (text).
    """
    raw = (text or "").strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", raw, re.DOTALL)
    if fenced:
        raw = fenced.group(1)
    try:
        data = json.loads(raw)
    except ValueError:
        raise JudgeVerdictError(f"the judge did not answer with JSON: {raw[:200]!r}") from None
    if not isinstance(data, dict) or set(data) != {"score", "reason"}:
        raise JudgeVerdictError(f"the judge's verdict must have exactly score and reason: {raw[:200]!r}")
    score, reason = data["score"], data["reason"]
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise JudgeVerdictError(f"the judge's score must be a number in [0, 1], got {score!r}")
    if not isinstance(reason, str):
        raise JudgeVerdictError("the judge's reason must be text")
    return float(score), reason[:MAX_REASON]


class JudgeScorer(_Base):
    """A model grades the answer against a rubric (through the workers' provider adapters)."""

    kind: Literal["judge"]
    #: ``PROVIDER:MODEL`` of the judge.
    model: str = Field(min_length=3, max_length=200)
    rubric: str = Field(min_length=1, max_length=4000)
    threshold: float = Field(default=0.5, ge=0, le=1)

    def prompt(self, case: Case, outcome: RunOutcome) -> str:
        expected = json.dumps(case.expected) if case.expected is not None else "(none given)"
        return (
            f"Rubric:\n{self.rubric}\n\nQuestion:\n{case.input}\n\nExpected answer:\n{expected}\n\n"
            f"Answer to grade:\n{outcome.answer or '(no answer)'}"
        )

    def ask(self, case: Case, outcome: RunOutcome, ask: Judge | None) -> JudgeReply:
        if ask is None:
            raise RuntimeError("no model is available to judge here")
        return ask(self.model, JUDGE_SYSTEM, self.prompt(case, outcome))

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        return parse_verdict(self.ask(case, outcome, None).text)


class CustomScorer(_Base):
    """A Python function by import path (``package.module:function``), see :class:`ScoreFn`."""

    kind: Literal["custom"]
    function: str

    def check(self) -> None:
        if not callable(import_path(self.function)):
            raise EvalSpecError(f"{self.function!r} is not callable")

    def value(self, case: Case, outcome: RunOutcome) -> tuple[float, str]:
        result = import_path(self.function)(case, outcome)
        explanation = ""
        if isinstance(result, tuple):
            result, explanation = result
        if isinstance(result, bool):
            return float(result), explanation
        if not isinstance(result, int | float) or not 0 <= float(result) <= 1:
            raise ValueError(f"{self.function} returned {result!r}, not a value in [0, 1]")
        return float(result), explanation


ScorerSpec = Annotated[
    ExactScorer
    | ContainsScorer
    | RegexScorer
    | NumericScorer
    | JsonScorer
    | TrajectoryScorer
    | LimitsScorer
    | JudgeScorer
    | CustomScorer,
    Field(discriminator="kind"),
]


def scorer_names(scorers: Sequence[ScorerSpec]) -> list[str]:
    return [s.label for s in scorers]


def check_importable(scorers: Sequence[ScorerSpec]) -> None:
    """Every scorer can run here: custom functions and models import (raises :class:`EvalSpecError`)."""
    for scorer in scorers:
        try:
            scorer.check()
        except EvalSpecError as exc:
            raise EvalSpecError(f"scorer {scorer.label!r}: {exc}") from None


def run_scorers(
    scorers: Sequence[ScorerSpec], case: Case, outcome: RunOutcome, judge: Judge | None = None
) -> list[Score]:
    """Every scorer's verdict; one that raises scores 0 with the error, the others are unaffected.

    ``judge`` asks a model for the ``judge`` scorers (the pool passes its provider adapters). It
    raises :class:`~shared.limits.Throttled` when the pool's provider limit has no capacity for
    the call; that is passed on, not scored.
    """
    scores = []
    for scorer in scorers:
        # A judge's tokens count even when its verdict is unusable: they were spent.
        usage: dict[str, Any] = {}
        try:
            if isinstance(scorer, JudgeScorer):
                reply = scorer.ask(case, outcome, judge)
                usage = {"model": scorer.model, "input_tokens": reply.input_tokens}
                usage["output_tokens"] = reply.output_tokens
                value, explanation = parse_verdict(reply.text)
            else:
                value, explanation = scorer.value(case, outcome)
            value = min(1.0, max(0.0, float(value)))
            scores.append(
                Score(
                    name=scorer.label,
                    value=value,
                    passed=value >= scorer.threshold,
                    explanation=explanation,
                    **usage,
                )
            )
        except Throttled:
            raise  # no capacity for the judge now: the whole scoring waits and is done again
        except Exception as exc:  # a broken scorer costs its own score on this case, nothing more
            scores.append(
                Score(
                    name=scorer.label,
                    value=0.0,
                    passed=False,
                    explanation=f"the scorer failed: {type(exc).__name__}: {str(exc)[:500]}",
                    error=True,
                    **usage,
                )
            )
    return scores
