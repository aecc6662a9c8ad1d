"""Human review of an eval's case runs: a reviewer's label (pass or fail), score overrides and a
note, stored in Redis per tenant, eval and case run, with who and when.

The latest annotation of a case run is its label (a hash, item -> JSON); every annotation is also
appended to the eval's log (a bounded list), so the history of who said what survives a later
change of mind. Both are written in one transaction: a reader never sees a label without its log
entry. They expire with the eval's keys (the retention after it completed).

Agreement between the human labels and the automatic verdicts is the share of labelled case runs
on which both agree, and Cohen's kappa, which discounts the agreement two raters would reach by
chance given how often each says "pass".
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.archive.base import EvalArchive
from shared.errors import InvalidRequest
from shared.evals.errors import EvalNotFound
from shared.evals.outcome import CaseResult
from shared.evals.store import EvalMeta, Item
from shared.keys import Keys

__all__ = [
    "MAX_ANNOTATION_BYTES",
    "MAX_HISTORY",
    "MAX_NOTE_CHARS",
    "MAX_OVERRIDES",
    "Agreement",
    "Annotation",
    "AnnotationInput",
    "AnnotationStore",
    "agreement",
    "annotation_columns",
    "check_item",
]

#: Characters of a reviewer's note.
MAX_NOTE_CHARS = 2000
#: Scores one annotation may override.
MAX_OVERRIDES = 50
#: Bytes of one annotation as stored (UTF-8 JSON): characters alone let a 2,000-character note and
#: 50 long scorer names of four-byte characters make 28 KB.
MAX_ANNOTATION_BYTES = 8_192
#: Annotations kept in one eval's log (the oldest go first): at most 16 MiB of Redis per eval.
MAX_HISTORY = 2_000
_MAX_SCORER_NAME = 100


class AnnotationInput(BaseModel):
    """What a reviewer sends: everything optional, nothing else accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: Literal["pass", "fail"] | None = Field(
        default=None, description="The reviewer's verdict on the case run; null: no verdict."
    )
    scores: dict[str, float] = Field(
        default_factory=dict,
        max_length=MAX_OVERRIDES,
        description="Scorer name -> the value (0..1) the reviewer gives instead of the automatic one.",
    )
    note: str = Field(default="", max_length=MAX_NOTE_CHARS, description="A comment, plain text.")

    @field_validator("scores")
    @classmethod
    def _scores(cls, value: dict[str, float]) -> dict[str, float]:
        for name, score in value.items():
            if not name or len(name) > _MAX_SCORER_NAME:
                raise ValueError(f"a scorer name must be 1..{_MAX_SCORER_NAME} characters")
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"score {name[:40]!r} must be within 0..1, got {score}")
        return value


class Annotation(AnnotationInput):
    """An annotation as stored: the input, the case run it is about, who made it and when."""

    item: str = Field(description="The case run: 'variant:case:repeat' indexes.")
    by: str = Field(description="Who annotated: the API key's id (or the operator's name on the CLI).")
    at: float = Field(description="When, Unix seconds.")


def check_item(meta: EvalMeta, item: str) -> Item:
    """The case run ``item`` (``variant:case:repeat``) of the eval; :class:`EvalNotFound` when the
    eval has no such case run (or ``item`` is not written the way the eval writes its items)."""
    try:
        parsed = Item.parse(item)
    except ValueError:
        parsed = None
    if (
        parsed is None
        or str(parsed) != item
        or not 0 <= parsed.variant < len(meta.spec.variants)
        or not 0 <= parsed.case < meta.cases
        or not 0 <= parsed.repeat < meta.spec.repeats
    ):
        raise EvalNotFound(f"eval {meta.eval_id!r} has no case run {item[:40]!r}")
    return parsed


class AnnotationStore:
    """Annotations of evals in Redis (the evals' client and keys)."""

    def __init__(
        self, client: redis.Redis, keys: Keys, retention_s: float, archive: EvalArchive | None = None
    ) -> None:
        self.redis = client
        self.keys = keys
        #: Where an archived eval's reviews are (moved with it: ``shared/evals/archiving.py``);
        #: reviews made after it was archived are in Redis, and both are read.
        self.archive = archive
        #: How long annotations of an eval whose keys do not expire yet are kept after each write.
        self.retention_s = retention_s

    def put(self, tenant: str | None, eval_id: str, item: str, value: AnnotationInput, by: str) -> Annotation:
        """Store ``value`` as ``by``'s annotation of case run ``item`` (now): it becomes the label."""
        annotation = Annotation(**value.model_dump(), item=item, by=by, at=round(time.time(), 3))
        raw = annotation.model_dump_json()
        size = len(raw.encode())
        if size > MAX_ANNOTATION_BYTES:
            raise InvalidRequest(
                f"an annotation is at most {MAX_ANNOTATION_BYTES} bytes of JSON as stored, this one"
                f" {size}: a shorter note or fewer scores"
            )
        latest, log = (
            self.keys.eval_annotations(tenant, eval_id),
            self.keys.eval_annotation_log(tenant, eval_id),
        )
        # The annotations go when the eval's keys go: as long as its meta lives, at least the retention.
        meta_ttl_ms = int(self.redis.pttl(self.keys.eval_meta(eval_id)))
        ttl_ms = max(meta_ttl_ms, int(self.retention_s * 1000))
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(latest, item, raw)
            pipe.rpush(log, raw)
            pipe.ltrim(log, -MAX_HISTORY, -1)
            pipe.pexpire(latest, ttl_ms)
            pipe.pexpire(log, ttl_ms)
            pipe.execute()
        return annotation

    def latest(self, tenant: str | None, eval_id: str) -> dict[str, Annotation]:
        """Item -> its latest annotation."""
        raw: Mapping[Any, Any] = self.redis.hgetall(self.keys.eval_annotations(tenant, eval_id))
        archived = self.archive.eval_annotations(eval_id)[0] if self.archive is not None else {}
        # Redis holds what was said since the archive took the eval: it is the newer.
        merged = {**archived, **{_text(k): _text(v) for k, v in raw.items()}}
        return {item: Annotation.model_validate_json(v) for item, v in merged.items()}

    def history(self, tenant: str | None, eval_id: str, limit: int = 1000) -> list[Annotation]:
        """The newest ``limit`` annotations of the eval, oldest first."""
        raw = [
            _text(v) for v in self.redis.lrange(self.keys.eval_annotation_log(tenant, eval_id), -limit, -1)
        ]
        if self.archive is not None:
            # The archived log first; an entry in both (an archiver that died before deleting the
            # Redis copy) once.
            archived = self.archive.eval_annotations(eval_id)[1]
            seen = set(archived)
            raw = [*archived, *(v for v in raw if v not in seen)][-limit:]
        return [Annotation.model_validate_json(v) for v in raw]


@dataclass(frozen=True)
class Agreement:
    """Human labels against the automatic verdicts, over the case runs that have both."""

    labelled: int
    agreed: int
    #: Cohen's kappa; None when it is undefined (no labels, or both raters always say the same).
    kappa: float | None

    @property
    def rate(self) -> float | None:
        return self.agreed / self.labelled if self.labelled else None

    def as_dict(self) -> dict[str, Any]:
        return {"labelled": self.labelled, "agreed": self.agreed, "rate": self.rate, "kappa": self.kappa}


def agreement(results: Iterable[CaseResult], labels: Mapping[str, Annotation]) -> Agreement:
    pairs = [
        (label.label == "pass", r.passed)
        for r in results
        if (label := labels.get(r.item)) is not None and label.label is not None
    ]
    n = len(pairs)
    if n == 0:
        return Agreement(0, 0, None)
    agreed = sum(h == a for h, a in pairs)
    human_pass = sum(h for h, _ in pairs) / n
    auto_pass = sum(a for _, a in pairs) / n
    chance = human_pass * auto_pass + (1 - human_pass) * (1 - auto_pass)
    kappa = None if chance >= 1 else (agreed / n - chance) / (1 - chance)
    return Agreement(n, agreed, kappa)


def annotation_columns(annotation: Annotation | None) -> dict[str, str]:
    """An annotation as the flat columns of a results export (empty when there is none)."""
    if annotation is None:
        return {"human_label": "", "human_scores": "", "human_note": "", "human_by": "", "human_at": ""}
    return {
        "human_label": annotation.label or "",
        "human_scores": json.dumps(annotation.scores, ensure_ascii=False) if annotation.scores else "",
        "human_note": annotation.note,
        "human_by": annotation.by,
        "human_at": f"{annotation.at:.3f}",
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
