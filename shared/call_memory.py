"""``ctx.memory`` of a tool call and of a middleware hook: what every act and think phase builds.

The long-term memory store itself (``shared/memory.py``, with the tenants' quotas, the scripts and
the embedding it uses) is imported on a phase's first memory operation, not with the worker: most
phases never touch memory, and every pool process would carry the store's code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from shared.errors import InvalidRequest
from shared.state import MemoryWrite

if TYPE_CHECKING:
    from shared.memory import Item, Memory, SearchResult, UntilRoom

__all__ = ["CallMemory", "PhaseMemory"]


class CallMemory:
    """``ctx.memory`` of one tool call: reads see the store as it is; ``put`` and ``delete`` are
    checked now and held until the call's result is recorded (see the module's rules)."""

    def __init__(self, open_memory: Callable[[], Memory], write_prefix: str) -> None:
        # Opened on first use: most tool calls never touch memory.
        self._open = open_memory
        self._opened: Memory | None = None
        self._prefix = write_prefix
        self.pending: list[MemoryWrite] = []
        self._bytes = 0

    @property
    def _memory(self) -> Memory:
        if self._opened is None:
            self._opened = self._open()
        return self._opened

    def get(self, namespace: Sequence[str], key: str) -> Item | None:
        return self._memory.get(namespace, key)

    def search(
        self,
        namespace_prefix: Sequence[str] = (),
        *,
        query: str | None = None,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        semantic: bool = False,
    ) -> SearchResult:
        return self._memory.search(
            namespace_prefix, query=query, filter=filter, limit=limit, offset=offset, semantic=semantic
        )

    def list_namespaces(
        self, *, prefix: Sequence[str] = (), max_depth: int | None = None, limit: int = 100, offset: int = 0
    ) -> list[tuple[str, ...]]:
        return self._memory.list_namespaces(prefix=prefix, max_depth=max_depth, limit=limit, offset=offset)

    def put(
        self, namespace: Sequence[str], key: str, value: Mapping[str, Any], *, ttl_s: float | None = None
    ) -> None:
        """Store ``value`` when the call's result is recorded (if the call succeeds).
        ``ValueError`` (:class:`InvalidRequest`) for a bad namespace, key, value or TTL, or past
        the call's bounds; :class:`MemoryFull` if the tenant is at its quota already."""
        from shared import memory as store

        text = store.check_value(value)
        self._hold("put", namespace, key, json.loads(text), store.check_ttl(ttl_s), len(text.encode()))
        if self._memory.count() >= self._memory.quota():
            self.pending.pop()
            raise store.MemoryFull(self._memory.quota())

    def delete(self, namespace: Sequence[str], key: str) -> None:
        """Remove the item when the call's result is recorded (if the call succeeds)."""
        self._hold("delete", namespace, key, None, None, 0)

    def _hold(
        self,
        op: Literal["put", "delete"],
        namespace: Sequence[str],
        key: str,
        value: dict[str, Any] | None,
        ttl_s: float | None,
        size: int,
    ) -> None:
        from shared import memory as store

        labels, checked_key = store.check_namespace(namespace), store.check_key(key)
        if len(self.pending) >= store.MAX_WRITES_PER_CALL:
            raise InvalidRequest(f"a tool call writes memory at most {store.MAX_WRITES_PER_CALL} times")
        if self._bytes + size > store.MAX_CALL_WRITE_BYTES:
            raise InvalidRequest(
                f"a tool call writes at most {store.MAX_CALL_WRITE_BYTES} bytes of memory values"
            )
        self._bytes += size
        write_id = f"{self._prefix}:{len(self.pending)}"
        self.pending.append(
            MemoryWrite(
                op=op, namespace=list(labels), key=checked_key, value=value, ttl_s=ttl_s, write_id=write_id
            )
        )


class PhaseMemory(CallMemory):
    """``ctx.memory`` of a middleware hook: writes are made at once, each with an id from the run's
    version and the hook (``write_prefix``), so a phase that runs again after a crash, calling its
    hooks again in the same order, writes nothing twice.

    ``until_room``: how a write that a full Redis refuses waits for memory (the worker's
    ``until_room``, given here as this module may not import the worker); None: the refusal is
    raised."""

    def __init__(
        self, open_memory: Callable[[], Memory], write_prefix: str, until_room: UntilRoom | None = None
    ) -> None:
        super().__init__(open_memory, write_prefix)
        self._until_room = until_room

    def put(
        self, namespace: Sequence[str], key: str, value: Mapping[str, Any], *, ttl_s: float | None = None
    ) -> None:
        """Store ``value`` at once; :class:`MemoryFull` if the tenant is at its quota already
        (checked before writing, as a tool's put is: nothing is written, nothing logged)."""
        from shared import memory as store

        text = store.check_value(value)
        self._hold("put", namespace, key, json.loads(text), store.check_ttl(ttl_s), 0)
        # The refused write keeps its id (it stays in ``pending``): the hook's later writes have
        # the same ids whether or not a phase run again after a crash finds room for this one.
        if self._memory.count() >= self._memory.quota():
            raise store.MemoryFull(self._memory.quota())
        self._flush()

    def delete(self, namespace: Sequence[str], key: str) -> None:
        self._hold("delete", namespace, key, None, None, 0)
        self._flush()

    def _flush(self) -> None:
        write = self.pending[-1]
        if self._memory.apply([write], self._until_room) == ["full"]:
            from shared.memory import MemoryFull

            raise MemoryFull(self._memory.quota())
