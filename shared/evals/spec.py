"""An eval spec: what to run (dataset x variants x repeats), how to score it, and how fast.

Written as TOML (``wesichain eval run SPEC.toml``) and validated by :class:`EvalSpec`; every mistake
is an :class:`EvalSpecError` naming the field and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.errors import InvalidRequest
from shared.evals.errors import EvalSpecError
from shared.evals.scorers import ScorerSpec, scorer_names
from shared.queues import check_namespace, queue_in
from shared.request import check_name

__all__ = [
    "MAX_REPEATS",
    "MAX_VARIANTS",
    "Budget",
    "EvalSpec",
    "Pricing",
    "Variant",
    "describe_errors",
    "load_spec",
    "parse_spec",
    "spec_json",
]

MAX_VARIANTS = 20
MAX_REPEATS = 100


class Variant(BaseModel):
    """One way of answering the cases: an agent, optionally with another model and metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Shown in reports; defaults to the agent's name (with the model when overridden).
    name: str = ""
    agent: str
    #: ``PROVIDER:MODEL`` overriding the agent's model (``--model`` overrides it for every variant).
    model: str | None = None
    #: Added to every case run's metadata.
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _named(self) -> Variant:
        check_name("agent", self.agent)
        if not self.name:
            object.__setattr__(self, "name", f"{self.agent}@{self.model}" if self.model else self.agent)
        check_name("variant name", self.name)
        return self


class Budget(BaseModel):
    """Stop starting new case runs once the eval has used this much (runs in flight finish)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = Field(default=None, gt=0)
    cost_usd: float | None = Field(default=None, gt=0)


class Pricing(BaseModel):
    """What a model costs, in US dollars per million tokens (for cost figures and the budget)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class EvalSpec(BaseModel):
    """An eval: the dataset, its variants and repeats, the scorers, the cap and the pass bar."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    #: A JSONL or CSV file, relative to the spec's own directory.
    dataset: str
    variants: list[Variant] = Field(min_length=1, max_length=MAX_VARIANTS)
    #: Runs per case and variant (flakiness, pass@k).
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS)
    scorers: list[ScorerSpec] = Field(min_length=1, max_length=50)
    #: Case runs of this eval in flight at once, across the whole pool.
    concurrency: int = Field(default=8, ge=1, le=10_000)
    #: The queue of the eval's own tasks (scoring, starting the next cases).
    queue: str | None = None
    #: The queue namespace of the case runs (``shared/queues.py``): every task of each case run,
    #: and the eval's own tasks when ``queue`` names none, go to ``NAMESPACE.*``.
    namespace: str | None = None
    #: The pass rate (0..1) a CI gate requires of every variant.
    pass_threshold: float = Field(default=0.0, ge=0, le=1)
    budget: Budget | None = None
    #: ``PROVIDER:MODEL`` -> price, for cost figures and the cost budget.
    pricing: dict[str, Pricing] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        check_name("eval name", value)
        return value

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str | None) -> str | None:
        if value is not None:
            check_name("queue", value)
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return check_namespace(value)

    @property
    def task_queue(self) -> str | None:
        """Where the eval's own tasks (pumps, scorings sent as tasks) go: its ``queue``, else its
        namespace's model queue, else the default routes."""
        if self.queue is not None:
            return self.queue
        return queue_in(self.namespace, "model") if self.namespace is not None else None

    @model_validator(mode="after")
    def _unique(self) -> EvalSpec:
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must be unique, got {names}")
        scorers = scorer_names(self.scorers)
        if len(set(scorers)) != len(scorers):
            raise ValueError(f"scorer names must be unique (set name = ...), got {scorers}")
        return self

    def digest(self, dataset_bytes: bytes) -> str:
        """A short hash of the spec and its dataset's content: the same eval, the same digest."""
        # A spec that names no namespace digests as it did before namespaces existed.
        h = hashlib.sha256(
            self.model_dump_json(exclude={"namespace"} if self.namespace is None else None).encode()
        )
        h.update(b"\x00")
        h.update(dataset_bytes)
        return h.hexdigest()[:12]

    def with_namespace(self, namespace: str) -> EvalSpec:
        """Every case run in queue namespace ``namespace`` (``--namespace``)."""
        return parse_spec({**self.model_dump(mode="json"), "namespace": namespace}, "--namespace")

    def with_model(self, model: str) -> EvalSpec:
        """Every variant on ``model`` (``--model``): names keep telling the variants apart."""
        variants = [v.model_copy(update={"model": model}) for v in self.variants]
        return self.model_copy(update={"variants": variants})


def describe_errors(exc: ValidationError) -> str:
    """Pydantic's errors as ``where: what`` lines."""
    lines = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "(spec)"
        lines.append(f"{where}: {error['msg']}")
    return "; ".join(lines)


def load_spec(path: str | Path) -> tuple[EvalSpec, Path]:
    """The spec in a TOML file, and the directory its dataset path is relative to."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EvalSpecError(f"cannot read eval spec {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise EvalSpecError(f"eval spec {str(path)!r} is not valid TOML: {exc}") from None
    return parse_spec(raw, str(path)), path.resolve().parent


def parse_spec(raw: Any, where: str = "eval spec") -> EvalSpec:
    try:
        return EvalSpec.model_validate(raw)
    except ValidationError as exc:
        raise EvalSpecError(f"{where}: {describe_errors(exc)}") from None
    except InvalidRequest as exc:
        raise EvalSpecError(f"{where}: {exc.message}") from None


def spec_json(spec: EvalSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), separators=(",", ":"))
