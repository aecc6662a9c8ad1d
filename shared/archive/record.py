"""What the archive keeps of one finished run: everything its reads answer, as typed values."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.events import Event
from shared.messages import Message
from shared.state import RunHead, ToolResult

__all__ = ["Deletion", "EvalHead", "EvalRecord", "RunRecord", "RunSummary"]


@dataclass(frozen=True)
class RunRecord:
    """A finished run, whole: its head, conversation, checkpoints, events and tool results."""

    head: RunHead
    #: When the run was created, in Redis milliseconds: its place in every listing.
    created_ms: int
    messages: list[Message]
    #: Every committed head in version order (epochs are not part of a checkpoint: 0).
    checkpoints: list[RunHead]
    #: ``(stream id, event)`` in stream order; the ids are the ones Redis gave them.
    events: list[tuple[str, Event]]
    #: ``(step, result)`` of every tool call.
    results: list[tuple[int, ToolResult]]
    #: The JSON of its completion callback's delivery (None: it had no callback).
    callback_state: str | None = None

    @property
    def run_id(self) -> str:
        return self.head.run_id

    def summary(self) -> RunSummary:
        return RunSummary(
            version=self.head.version,
            messages=len(self.messages),
            checkpoints=len(self.checkpoints),
            events=len(self.events),
            results=len(self.results),
        )


@dataclass(frozen=True)
class RunSummary:
    """How much of a run there is: what the archiver compares after writing, before deleting."""

    version: int
    messages: int
    checkpoints: int
    events: int
    results: int


@dataclass(frozen=True)
class Deletion:
    """The audit record of an archived run deleted: what it was, when, and why."""

    run_id: str
    #: ``-`` for a run without a tenant.
    tenant: str
    agent: str
    status: str
    created_ms: int
    ended_at: float
    deleted_at: float
    #: ``retention: N days`` or what the operator gave.
    reason: str


@dataclass(frozen=True)
class EvalHead:
    """An archived eval without its cases and results: its meta and counters as Redis held them
    (field -> value), and how many result rows it has."""

    eval_id: str
    meta: dict[str, str]
    counts: dict[str, int]
    results: int


@dataclass(frozen=True)
class EvalRecord:
    """A completed eval, whole, as Redis held it: what the archive keeps of it."""

    eval_id: str
    meta: dict[str, str]
    counts: dict[str, int]
    #: Case index -> the case as JSON.
    cases: dict[int, str]
    #: Item (``variant:case:repeat``) -> its result row as JSON.
    results: dict[str, str]
    created_at: float
    finished_at: float
    #: Item -> its latest human review (``shared/evals/annotations.py``) as JSON: its label.
    annotations: dict[str, str] = field(default_factory=dict)
    #: Every review as JSON, oldest first (the eval's bounded log).
    annotation_log: list[str] = field(default_factory=list)

    def summary(self) -> tuple[int, int]:
        """(cases, results): what the archiver compares after writing, before deleting."""
        return len(self.cases), len(self.results)
