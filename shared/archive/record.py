"""What the archive keeps of one finished run: everything its reads answer, as typed values."""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field

from shared.events import Event, dump_event
from shared.messages import Message, dump_message
from shared.state import RunHead, ToolResult

__all__ = ["Deletion", "EvalHead", "EvalRecord", "RunRecord", "RunSummary", "StoredRun"]


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
        return RunSummary.of(self.head.version, self.messages, self.checkpoints, self.events, self.results)

    def stored(self) -> StoredRun:
        """The run as the runtime stores it: each part as its model's JSON."""
        return StoredRun(
            head=self.head,
            created_ms=self.created_ms,
            messages=[dump_message(m) for m in self.messages],
            checkpoints=[(c.version, c.dump_body()) for c in self.checkpoints],
            events=[(stream_id, dump_event(e)) for stream_id, e in self.events],
            results=[(step, r.call_id, r.model_dump_json()) for step, r in self.results],
            callback_state=self.callback_state,
        )


@dataclass(frozen=True)
class StoredRun:
    """A finished run as Redis holds it: what the archiver copies into the database.

    The head is typed (its columns and listing indexes come from it); every other part is the JSON
    the runtime wrote, which its model validated when it was written and validates again whenever
    it is read back (from Redis or the archive alike), so the copy neither parses nor re-dumps it.
    """

    head: RunHead
    created_ms: int
    #: Each message's JSON, in conversation order.
    messages: list[str]
    #: ``(version, body JSON)`` of every committed head (``RunHead.dump_body``), in version order.
    checkpoints: list[tuple[int, str]]
    #: ``(stream id, event JSON)`` in stream order.
    events: list[tuple[str, str]]
    #: ``(step, call id, result JSON)`` of every tool call.
    results: list[tuple[int, str, str]]
    #: The JSON of its completion callback's delivery (None: it had no callback).
    callback_state: str | None = None

    @property
    def run_id(self) -> str:
        return self.head.run_id

    def summary(self) -> RunSummary:
        return RunSummary.of(self.head.version, self.messages, self.checkpoints, self.events, self.results)


@dataclass(frozen=True)
class RunSummary:
    """How much of a run there is: what the archiver compares after writing, before deleting."""

    version: int
    messages: int
    checkpoints: int
    events: int
    results: int

    @classmethod
    def of(
        cls, version: int, messages: Sized, checkpoints: Sized, events: Sized, results: Sized
    ) -> RunSummary:
        """The summary of a run at ``version`` with these parts, typed or as stored."""
        return cls(version, len(messages), len(checkpoints), len(events), len(results))


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
