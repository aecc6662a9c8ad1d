"""Searching runs: the query and the metadata keys an operator declares indexable (the indexes a
run is in are ``shared/search_index.py``'s).

A search combines filters (agent, agent version, status, error kind, thread, a creation time range
and ``metadata`` key=value pairs) over one tenant's runs, newest first, paged with the listing's
cursor (creation ms, run id) across the runs in Redis and those in the archive
(``shared/store/listing.py``).

Metadata is the producer's, so only the keys the operator declares (``WESICHAIN_SEARCH_ATTRIBUTES``,
Temporal's search attributes) are indexed: the create script enters a run in one index per declared
key whose value is a string of at most
:data:`~shared.search_index.MAX_SEARCH_VALUE_CHARS` characters. A search naming
any other key is refused (:class:`UndeclaredSearchKey`) rather than answered by a scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shared.errors import InvalidRequest
from shared.search_index import MAX_SEARCH_VALUE_CHARS, meta_value, searchable_value
from shared.settings import SEARCH_KEY_PATTERN
from shared.state import RunHead, RunStatus

__all__ = [
    "MAX_SEARCH_FILTERS",
    "MAX_UNIX_S",
    "SearchQuery",
    "UndeclaredSearchKey",
]

#: Metadata key=value filters one search may combine.
MAX_SEARCH_FILTERS = 8
#: The latest time a filter may name (Unix seconds, the year 2286): bounds the arithmetic.
MAX_UNIX_S = 10_000_000_000

_Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
_Value = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SEARCH_VALUE_CHARS)]
_Key = Annotated[str, StringConstraints(pattern=SEARCH_KEY_PATTERN)]


class UndeclaredSearchKey(InvalidRequest):
    """A search names metadata keys the operator did not declare indexable."""

    def __init__(self, keys: Sequence[str], declared: Sequence[str]) -> None:
        listed = ", ".join(sorted(keys))
        offer = ", ".join(declared) if declared else "none (WESICHAIN_SEARCH_ATTRIBUTES)"
        super().__init__(f"metadata keys not declared searchable: {listed}; declared: {offer}")
        self.keys = sorted(keys)
        self.declared = list(declared)


class SearchQuery(BaseModel):
    """Which of a tenant's runs a search (or a bulk job) is about; all given filters apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: _Name | None = Field(default=None, description="The agent the run was started for.")
    version: _Name | None = Field(default=None, description="The agent version the run is pinned to.")
    status: RunStatus | None = None
    error_kind: _Name | None = Field(
        default=None, description="The kind of a failed run's error (ModelTransport, ToolDispatch...)."
    )
    thread_id: _Name | None = None
    since: float | None = Field(
        default=None, ge=0, le=MAX_UNIX_S, description="Only runs created at or after (Unix seconds)."
    )
    until: float | None = Field(
        default=None, ge=0, le=MAX_UNIX_S, description="Only runs created before (Unix seconds)."
    )
    metadata: dict[_Key, _Value] = Field(
        default_factory=dict,
        max_length=MAX_SEARCH_FILTERS,
        description="Declared metadata keys and the string value each must have.",
    )

    @property
    def since_ms(self) -> int | None:
        return None if self.since is None else int(self.since * 1000)

    @property
    def until_ms(self) -> int | None:
        return None if self.until is None else int(self.until * 1000)

    def check_declared(self, declared: Iterable[str]) -> None:
        """Raise :class:`UndeclaredSearchKey` for a metadata key the operator did not declare."""
        allowed = tuple(declared)
        undeclared = [key for key in self.metadata if key not in allowed]
        if undeclared:
            raise UndeclaredSearchKey(undeclared, allowed)

    def primary_index(self) -> tuple[str, str]:
        """The index a search reads (the rest of its filters are applied to the runs read): the
        narrowest one it names, by how few runs it usually holds."""
        if self.thread_id is not None:
            return "thread", self.thread_id
        if self.metadata:
            key = min(self.metadata)
            return "meta", meta_value(key, self.metadata[key])
        if self.agent is not None:
            return "agent", self.agent
        if self.status is not None:
            return "status", self.status
        return "all", ""

    def matches(self, head: RunHead) -> bool:
        """Whether a run read from an index passes every filter but the time range (the index's
        score, its creation ms, is bounded by the read itself)."""
        if self.agent is not None and head.agent != self.agent:
            return False
        if self.version is not None and head.agent_version != self.version:
            return False
        if self.status is not None and head.status != self.status:
            return False
        if self.error_kind is not None and (head.error is None or head.error.kind != self.error_kind):
            return False
        if self.thread_id is not None and head.thread_id != self.thread_id:
            return False
        return all(searchable_value(head.metadata.get(k)) == v for k, v in self.metadata.items())

    def frozen_at(self, now: float) -> SearchQuery:
        """This query bounded to the runs created before ``now``: what a bulk job acts on, so the
        runs it creates itself (a retry, a fork) never match it."""
        until = now if self.until is None else min(self.until, now)
        return self.model_copy(update={"until": until})
