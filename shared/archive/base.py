"""The archive's interface: finished runs kept in a database, read as the run store reads Redis.

Two implementations share it (:mod:`shared.archive.sql`): PostgreSQL for deployments and SQLite
for the embedded mode. Every read answers with the same types the store answers from Redis, so a
caller cannot tell where a run was read from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from shared.archive.record import Deletion, EvalHead, EvalRecord, RunRecord, RunSummary, StoredRun
from shared.events import Event
from shared.memory import Item
from shared.messages import Message
from shared.state import RunHead, ToolResult

__all__ = ["Archive", "EvalArchive", "ListingFilter", "MemoryArchive"]


class ListingFilter:
    """Which of a tenant's runs a listing (a search) asks for (all given filters apply)."""

    __slots__ = ("agent", "error_kind", "metadata", "since_ms", "status", "tenant", "thread_id", "version")

    def __init__(
        self,
        tenant: str | None,
        *,
        agent: str | None = None,
        status: str | None = None,
        thread_id: str | None = None,
        since_ms: int | None = None,
        version: str | None = None,
        error_kind: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        self.tenant = tenant
        self.agent = agent
        self.status = status
        self.thread_id = thread_id
        self.since_ms = since_ms
        #: The agent version, the error kind and metadata key=value (string values only) are read
        #: from the archived head's JSON.
        self.version = version
        self.error_kind = error_kind
        self.metadata = dict(metadata or {})


class EvalArchive(ABC):
    """Completed evals in the database: written by the archiver, read by the eval store."""

    @abstractmethod
    def put_eval(self, record: EvalRecord) -> bool:
        """Write one eval in one transaction; False if the archive holds it already."""

    @abstractmethod
    def eval_summary(self, eval_id: str) -> tuple[int, int] | None:
        """(cases, results) the archive holds of an eval (None: not archived)."""

    @abstractmethod
    def eval_head(self, eval_id: str) -> EvalHead | None: ...

    @abstractmethod
    def eval_cases(self, eval_id: str) -> dict[int, str]:
        """Case index -> the case's JSON."""

    @abstractmethod
    def eval_results(self, eval_id: str) -> dict[str, str]:
        """Item -> the result row's JSON."""

    @abstractmethod
    def list_evals(self, limit: int) -> list[tuple[float, str]]:
        """``(created_at, eval id)`` of the newest archived evals, newest first."""

    @abstractmethod
    def tenant_evals(self, tenant: str | None, limit: int) -> list[tuple[float, str]]:
        """:meth:`list_evals` of ``tenant``'s evals only (None: the operator's)."""

    def eval_annotations(self, eval_id: str) -> tuple[dict[str, str], list[str]]:
        """The archived eval's reviews: item -> its latest (JSON), and every one oldest first."""
        return {}, []


class MemoryArchive(ABC):
    """Tenants' long-term memory items as last exported from Redis (``shared/memory_archive.py``)."""

    @abstractmethod
    def archived_memory(self, tenant: str | None) -> dict[tuple[str, str], tuple[int, float, float | None]]:
        """``(path, key) -> (version, updated_at, expires_at)`` of every archived item of ``tenant``."""

    @abstractmethod
    def put_memory(self, tenant: str | None, items: Sequence[Item]) -> int:
        """Write (or replace) items in one transaction; how many."""

    @abstractmethod
    def drop_memory(self, tenant: str | None, entries: Sequence[tuple[str, str]]) -> int:
        """Remove ``(path, key)`` items in one transaction; how many there were."""

    @abstractmethod
    def memory_items(
        self,
        tenant: str | None,
        prefix: Sequence[str] = (),
        *,
        after: tuple[str, str] | None = None,
        limit: int = 100,
    ) -> list[Item]:
        """Archived items under a namespace prefix in namespace and key order, after ``(path, key)``."""


class Archive(EvalArchive, MemoryArchive):
    """Finished runs in a database: written in batches by the archiver, read by the store."""

    #: ``postgresql`` or ``sqlite``.
    kind: str

    # -- writing ----------------------------------------------------------------------------------

    @abstractmethod
    def put(self, records: Sequence[StoredRun]) -> int:
        """Write runs in one transaction, skipping those already archived; how many were new."""

    @abstractmethod
    def put_and_summarize(self, records: Sequence[StoredRun]) -> tuple[set[str], dict[str, RunSummary]]:
        """Write the runs not archived yet and read back what the archive holds of every one, in
        one transaction, committed when it returns: (the runs it held already, each run's summary;
        absent: not archived). What the archiver writes a batch with."""

    @abstractmethod
    def present(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs the archive holds."""

    @abstractmethod
    def summaries(self, run_ids: Sequence[str]) -> dict[str, RunSummary]:
        """What the archive holds of each of these runs (absent: not archived)."""

    # -- reading ----------------------------------------------------------------------------------

    @abstractmethod
    def load(self, run_id: str) -> RunHead | None: ...

    @abstractmethod
    def messages(self, run_id: str, start: int = 0, end: int = -1) -> list[Message]:
        """The conversation, sliced as Redis's LRANGE slices (``end`` inclusive, negatives from the end)."""

    @abstractmethod
    def checkpoints(self, run_id: str) -> list[RunHead]: ...

    @abstractmethod
    def events(self, run_id: str, after: str = "0-0", count: int = 1000) -> list[tuple[str, Event]]:
        """Events after the stream id ``after``, in order, at most ``count``."""

    @abstractmethod
    def results(self, run_id: str, step: int) -> list[ToolResult]: ...

    @abstractmethod
    def callback_state(self, run_id: str) -> str | None: ...

    @abstractmethod
    def record(self, run_id: str) -> RunRecord | None:
        """Everything kept of one run (an export, a comparison)."""

    @abstractmethod
    def list_runs(
        self, where: ListingFilter, before: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, RunHead]]:
        """Runs newest first by (creation ms, run id), strictly below ``before``; with their ms."""

    @abstractmethod
    def thread_runs(self, tenant: str | None, thread_id: str) -> list[str]:
        """The run ids of a conversation thread, oldest first."""

    # -- retention --------------------------------------------------------------------------------

    @abstractmethod
    def expired(
        self, ended_before: float, limit: int, *, tenant: str | None = None, exclude: Sequence[str] = ()
    ) -> list[tuple[str, str]]:
        """``(run id, tenant)`` of runs that ended before ``ended_before`` (Unix time), oldest
        first: of ``tenant`` (as stored: ``-`` for none), or of every tenant but ``exclude``."""

    @abstractmethod
    def delete(self, run_ids: Sequence[str], reason: str) -> int:
        """Delete runs and record each deletion (:class:`Deletion`) in the same transaction."""

    @abstractmethod
    def deletions(self, tenant: str | None = None, limit: int = 1000) -> list[Deletion]:
        """The audit records of deleted runs, newest first (of one tenant, as stored, or all)."""

    # -- lifecycle --------------------------------------------------------------------------------

    @abstractmethod
    def close(self) -> None: ...
