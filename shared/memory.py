"""Long-term memory: a tenant's store of JSON items under namespaces the agent chooses.

Modelled on LangGraph's ``BaseStore``: an item is a JSON object under a *namespace* (a tuple of
short labels, ``("users", "u-42", "preferences")``) and a *key*; ``put``, ``get``, ``delete``,
``search`` under a namespace prefix (a text query, a filter on top-level fields) and
``list_namespaces``. Items outlive runs and threads: what one thread wrote, another recalls.

Scope. Every item belongs to one tenant (the run's, the API key's); the tenant is part of every
Redis key and is never named by a caller of :class:`Memory` methods, so a tool, a middleware or an
HTTP caller cannot reach another tenant's items.

Layout. All of a tenant's items live under one Redis Cluster hash tag (``{m:<tenant>}``): a put
checks the tenant's quota (its item count) and a search walks a namespace prefix across
namespaces, each atomically in one script, which an index per namespace spread over slots could
not do. The price is that one tenant's memory sits on one node; the quota
(``TenantLimits.max_memory_items``) and the value bound keep that small.

Writes from tools are made once. A tool's ``ctx.memory.put``/``delete`` is buffered in its call
(:class:`CallMemory`) and carried in the call's :class:`~shared.state.ToolResult`, so it is
recorded atomically with the result, exactly once per call, and only if the call succeeds. Each
write has an id ``run:step:call:n``; applying writes (:meth:`Memory.apply`, ``memory_write.lua``)
skips an id already applied. The delivery that recorded the result applies them at once, and the
observe phase of the step applies them again before it commits (a no-op unless the first delivery
died in between). So a delivery killed after writing applies nothing, the delivery whose result is
recorded applies its writes exactly once, and reads in a tool see the store as it is (a call's own
writes take effect when its result is recorded). Middleware writes at once through
:class:`PhaseMemory`, with ids from the run's version and the hook, so a phase that runs again after
a crash writes nothing twice. Both ``ctx.memory`` kinds live in ``shared/call_memory.py``, which
every phase loads; this module is loaded by a phase's first memory operation.

A full Redis (``maxmemory``, ``noeviction``) refuses a write that holds a put, before anything of it
is written (``OutOfMemoryError``); deletes alone go through. The API answers the refusal; the
workers apply a call's or a hook's writes with an :class:`UntilRoom` (``worker.full.until_room``),
which tries the script again until memory is freed: the write ids make the retry apply each once.

Bounds: namespace depth and label length, key length, value bytes, writes per call, search page
and scan (a search looks at a bounded number of items and bytes of a prefix and says when it
stopped short: ``SearchResult.truncated``), items per tenant.

Semantic search, where an embedding function is configured (``shared/embedding.py``): a put
embeds the value's JSON text and keeps the vector beside the item (written in the same script, and
dropped with it); ``search(query=..., semantic=True)`` ranks the items the search scans by cosine
similarity to the query's embedding. There is no approximate-nearest-neighbour index.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import redis
from pydantic import BaseModel, Field

from shared.embedding import Embedding, cosine, pack_vector, unpack_vector
from shared.errors import InvalidRequest, WesichainError
from shared.keys import Keys
from shared.request import check_json_depth
from shared.scripts import Script, register_script
from shared.state import MemoryWrite
from shared.tenants import Tenants

__all__ = [
    "APPLIED_KEEP_S",
    "MAX_CALL_WRITE_BYTES",
    "MAX_DEPTH",
    "MAX_KEY_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_LIMIT",
    "MAX_NAMESPACES",
    "MAX_TTL_S",
    "MAX_VALUE_BYTES",
    "MAX_WRITES_PER_CALL",
    "NAMESPACE_SCAN",
    "SCAN_BYTES",
    "SCAN_ITEMS",
    "Item",
    "Memory",
    "MemoryFull",
    "SearchResult",
    "UntilRoom",
    "check_key",
    "check_namespace",
    "check_ttl",
    "check_value",
    "memory_of",
]

log = logging.getLogger("wesichain.memory")

T = TypeVar("T")


class UntilRoom(Protocol):
    """How a caller waits out a full Redis: runs ``write``, again while Redis refuses it for want
    of memory, and returns its reply (``worker.full.until_room``; ``what`` names it in the log)."""

    def __call__(self, write: Callable[[], T], what: str) -> T: ...


#: A namespace is 1..MAX_DEPTH labels of 1..MAX_LABEL_CHARS of these characters.
MAX_DEPTH = 8
MAX_LABEL_CHARS = 64
_LABEL = re.compile(r"[A-Za-z0-9_.:@+=-]{1,64}")
MAX_KEY_CHARS = 256
#: A value is a JSON object of at most this many bytes (UTF-8, compact).
MAX_VALUE_BYTES = 16 * 1024
MAX_TTL_S = 366 * 86400
#: What one tool call may write: this many puts and deletes, this many bytes of values in all
#: (they travel in its recorded result).
MAX_WRITES_PER_CALL = 32
MAX_CALL_WRITE_BYTES = 64 * 1024
#: Items a search answers at most, per page.
MAX_LIMIT = 100
#: What one search (or listing) looks at, at most: items of the prefix, and bytes of their values.
SCAN_ITEMS = 2000
SCAN_BYTES = 2 * 1024 * 1024
#: Namespaces listed at most per page, and index entries a listing walks.
MAX_NAMESPACES = 1000
NAMESPACE_SCAN = 20_000
#: How long an applied write id is remembered (a re-apply comes within the step that wrote it).
APPLIED_KEEP_S = 7 * 86400
#: Expired items removed per write script, at most (the rest on later writes; reads skip them).
_PURGE_PER_WRITE = 100

# An item's entry in the tenant's index: each label then _SEP, then _END, then the key. Labels and
# keys hold no control characters, so a namespace prefix is a prefix of its items' entries.
_SEP = "\x1f"
_END = "\x1e"

#: The parts of a tenant's memory in Redis (``Keys.memory``), in the order the scripts take them.
_PARTS = ("values", "versions", "created", "updated", "index", "expiry")


class MemoryFull(WesichainError):
    """The tenant holds as many items as its quota allows (``TenantLimits.max_memory_items``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the tenant's memory holds its limit of {limit} items: delete some first")
        self.limit = limit


class Item(BaseModel):
    """One stored item."""

    namespace: list[str] = Field(description="The labels it is stored under.")
    key: str
    value: dict[str, Any] = Field(description="A JSON object.")
    created_at: float = Field(description="When the key was first written (Unix seconds).")
    updated_at: float = Field(description="When it was last written (Unix seconds).")
    expires_at: float | None = Field(default=None, description="When it expires (none: never).")
    version: int = Field(description="Writes applied to the key since it was created.")
    score: float | None = Field(
        default=None, description="A semantic search's cosine similarity to the query (else none)."
    )


class SearchResult(BaseModel):
    """A page of items matching a search."""

    items: list[Item]
    #: The search stopped at its scan bound before the end of the prefix: narrow the prefix to see
    #: items past it.
    truncated: bool = False


# -- checks ---------------------------------------------------------------------------------------


def check_namespace(namespace: object, *, prefix: bool = False) -> tuple[str, ...]:
    """The namespace as a tuple; :class:`InvalidRequest` unless it is 1..MAX_DEPTH labels (0.. for
    a ``prefix``) of 1..MAX_LABEL_CHARS letters, digits and ``_ . : @ + = -``."""
    if isinstance(namespace, str) or not isinstance(namespace, Iterable):
        raise InvalidRequest("a namespace is a list of labels, e.g. ['users', 'u-42']")
    labels = tuple(namespace)
    if len(labels) > MAX_DEPTH or (not labels and not prefix):
        raise InvalidRequest(f"a namespace has 1 to {MAX_DEPTH} labels, not {len(labels)}")
    for label in labels:
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            shown = label[:80] if isinstance(label, str) else type(label).__name__
            raise InvalidRequest(
                f"namespace label {shown!r} must be 1..{MAX_LABEL_CHARS} letters, digits and _ . : @ + = -"
            )
    return labels


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS or not key.isprintable():
        raise InvalidRequest(f"a memory key is 1..{MAX_KEY_CHARS} printable characters")
    return key


def check_value(value: object) -> str:
    """The value as compact JSON text; :class:`InvalidRequest` unless it is a JSON object of at
    most MAX_VALUE_BYTES (the message never quotes the value: it is tenant content)."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"a memory value is a JSON object, not {type(value).__name__}")
    check_json_depth("a memory value", value)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidRequest(f"a memory value must be JSON ({exc.__class__.__name__})") from None
    if size > MAX_VALUE_BYTES:
        raise InvalidRequest(f"a memory value is {size} bytes of JSON, over the {MAX_VALUE_BYTES} allowed")
    return text


def check_ttl(ttl_s: object) -> float | None:
    if ttl_s is None:
        return None
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s <= MAX_TTL_S:
        raise InvalidRequest(f"a memory TTL is more than 0 and at most {MAX_TTL_S} seconds")
    return float(ttl_s)


def _prefix_of(namespace: Sequence[str]) -> str:
    return "".join(label + _SEP for label in namespace)


def _entry(namespace: Sequence[str], key: str) -> str:
    return _prefix_of(namespace) + _END + key


def _parse_entry(entry: str) -> tuple[list[str], str]:
    names, _, key = entry.partition(_END)
    return names.split(_SEP)[:-1], key


def _range(prefix: str) -> tuple[bytes, bytes]:
    """The ZRANGEBYLEX bounds of every entry that starts with ``prefix`` (0xff follows any UTF-8)."""
    if not prefix:
        return b"-", b"+"
    raw = prefix.encode()
    return b"[" + raw, b"(" + raw + b"\xff"


def _matches(value: dict[str, Any], text: str, tokens: Sequence[str], where: Mapping[str, Any]) -> bool:
    if any(value.get(field, _MISSING) != wanted for field, wanted in where.items()):
        return False
    lowered = text.lower()
    return all(token in lowered for token in tokens)


_MISSING = object()


# -- the store ------------------------------------------------------------------------------------


class Memory:
    """One tenant's memory (``tenant`` None: the memory of runs without a tenant).

    ``quota`` gives the tenant's item limit, read at each put (an operator's change applies at
    once). Reads skip expired items; writes purge them.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        tenant: str | None,
        quota: Callable[[], int],
        embed: Embedding | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        self.tenant = tenant
        self.quota = quota
        #: Embeds the values put and the queries of semantic searches (None: text search only).
        self.embed = embed
        self._keys = [keys.memory(tenant, part) for part in _PARTS]
        self._applied = keys.memory(tenant, "applied")
        self._vectors = keys.memory(tenant, "vectors")
        self._write: Script = register_script(client, "memory_write")
        self._scan: Script = register_script(client, "memory_scan")

    # reads

    def get(self, namespace: Sequence[str], key: str) -> Item | None:
        entry = _entry(check_namespace(namespace), check_key(key))
        raw = entry.encode()
        items, _ = self._read(b"[" + raw, b"[" + raw, 1)
        return items[0][0] if items else None

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
        """Items under ``namespace_prefix`` (in namespace and key order) whose value holds every
        word of ``query`` (case-insensitive, anywhere in its JSON text) and whose top-level fields
        equal those of ``filter``; ``offset`` of them skipped, ``limit`` answered.

        ``semantic``: the items matching ``filter`` ranked by the cosine similarity of their
        vectors to ``query``'s embedding, most similar first (each with its ``score``); items
        without a vector are left out. :class:`InvalidRequest` without an embedding function."""
        prefix = check_namespace(namespace_prefix, prefix=True)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidRequest(f"limit is 1..{MAX_LIMIT}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= SCAN_ITEMS:
            raise InvalidRequest(f"offset is 0..{SCAN_ITEMS}")
        if query is not None and (not isinstance(query, str) or len(query) > 1000):
            raise InvalidRequest("a search query is text of at most 1000 characters")
        where = dict(filter or {})
        if len(where) > 32:
            raise InvalidRequest("a search filter names at most 32 fields")
        check_value(where)
        if semantic:
            target = self._query_vector(query)
        tokens = [] if semantic else (query or "").lower().split()
        low, high = _range(_prefix_of(prefix))
        scanned, truncated = self._read(low, high, SCAN_ITEMS)
        matched = [item for item, text in scanned if _matches(item.value, text, tokens, where)]
        if semantic:
            matched = self._ranked(matched, target)
        return SearchResult(items=matched[offset : offset + limit], truncated=truncated)

    def _query_vector(self, query: str | None) -> tuple[float, ...]:
        if self.embed is None:
            raise InvalidRequest(
                "semantic search needs an embedding function (WESICHAIN_MEMORY_EMBEDDING) where it runs"
            )
        if not query or not query.strip():
            raise InvalidRequest("a semantic search needs a query")
        return unpack_vector(pack_vector(self.embed(query)))

    def _ranked(self, items: list[Item], target: Sequence[float]) -> list[Item]:
        """``items`` with a vector, most similar to ``target`` first (ties in namespace and key
        order, as scanned)."""
        if not items:
            return []
        raw = self.redis.hmget(self._vectors, [_entry(i.namespace, i.key) for i in items])
        scored: list[tuple[float, int, Item]] = []
        for position, (item, vector) in enumerate(zip(items, raw, strict=True)):
            if not vector:
                continue
            score = cosine(unpack_vector(vector), target)
            if score is not None:
                scored.append((-score, position, item.model_copy(update={"score": round(score, 6)})))
        return [item for _, _, item in sorted(scored, key=lambda s: (s[0], s[1]))]

    def list_namespaces(
        self,
        *,
        prefix: Sequence[str] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """The namespaces holding items under ``prefix``, cut to ``max_depth`` labels, sorted."""
        start = check_namespace(prefix, prefix=True)
        if max_depth is not None and (isinstance(max_depth, bool) or not 1 <= max_depth <= MAX_DEPTH):
            raise InvalidRequest(f"max_depth is 1..{MAX_DEPTH}")
        if not 1 <= limit <= MAX_NAMESPACES or not 0 <= offset <= NAMESPACE_SCAN:
            raise InvalidRequest(f"limit is 1..{MAX_NAMESPACES}, offset 0..{NAMESPACE_SCAN}")
        low, high = _range(_prefix_of(start))
        entries = self.redis.zrangebylex(self._keys[4], low, high, 0, NAMESPACE_SCAN)
        found: set[tuple[str, ...]] = set()
        for entry in entries:
            labels, _ = _parse_entry(entry.decode() if isinstance(entry, bytes) else str(entry))
            found.add(tuple(labels[:max_depth] if max_depth else labels))
        return sorted(found)[offset : offset + limit]

    def items(self) -> Iterator[Item]:
        """Every live item, in namespace and key order, a scan's worth at a time (an export)."""
        low = b"-"
        while True:
            page, more = self._read(low, b"+", SCAN_ITEMS)
            for item, _ in page:
                yield item
            if not page or not more:
                return
            last = page[-1][0]
            low = b"(" + _entry(last.namespace, last.key).encode()

    def count(self) -> int:
        """Items held (expired ones not purged yet included): what the quota counts."""
        return int(self.redis.hlen(self._keys[0]))

    # writes

    def put(
        self, namespace: Sequence[str], key: str, value: Mapping[str, Any], *, ttl_s: float | None = None
    ) -> Item:
        """Store ``value`` under ``(namespace, key)``, replacing what was there; it expires after
        ``ttl_s`` (None: never; a put sets the TTL anew). :class:`MemoryFull` past the quota."""
        write = MemoryWrite(
            op="put",
            namespace=list(check_namespace(namespace)),
            key=check_key(key),
            value=json.loads(check_value(value)),
            ttl_s=check_ttl(ttl_s),
            write_id="",
        )
        ((status, item),) = self._apply([write])
        if status == "full" or item is None:
            raise MemoryFull(self.quota())
        return item

    def delete(self, namespace: Sequence[str], key: str) -> bool:
        """Remove the item; False if there was none."""
        write = MemoryWrite(
            op="delete", namespace=list(check_namespace(namespace)), key=check_key(key), write_id=""
        )
        ((status, _),) = self._apply([write])
        return status == "deleted"

    def apply(self, writes: Sequence[MemoryWrite], until_room: UntilRoom | None = None) -> list[str]:
        """Apply recorded writes, each id once (``duplicate`` for one applied before); a put past
        the quota is dropped (``full``) and logged by its id. Returns each write's status.

        A full Redis refuses writes holding a put (``OutOfMemoryError``, nothing written); with
        ``until_room`` they are sent again through it (the values embedded once) until it takes
        them."""
        if not writes:
            return []
        statuses = [status for status, _ in self._apply(writes, until_room)]
        for write, status in zip(writes, statuses, strict=True):
            if status == "full":
                # The call's result is recorded already: nothing can be told to the tool any more.
                log.warning("memory write %s was dropped: the tenant's memory is full", write.write_id)
        return statuses

    def _apply(
        self, writes: Sequence[MemoryWrite], until_room: UntilRoom | None = None
    ) -> list[tuple[str, Item | None]]:
        args: list[Any] = [self.quota(), APPLIED_KEEP_S * 1000, _PURGE_PER_WRITE]
        vectors = self._vectors_of(writes)
        for w, vector in zip(writes, vectors, strict=True):
            value = "" if w.value is None else check_value(w.value)
            ttl_ms = "" if w.ttl_s is None else int(w.ttl_s * 1000)
            args += [w.write_id, w.op, _entry(w.namespace, w.key), value, ttl_ms, vector]
        keys = [*self._keys, self._applied, self._vectors]
        if until_room is None:
            replies = self._write(keys, args)
        else:
            what = "memory writes " + ", ".join(w.write_id or "(direct)" for w in writes)
            replies = until_room(lambda: self._write(keys, args), what)
        out: list[tuple[str, Item | None]] = []
        for w, reply in zip(writes, replies, strict=True):
            status = _text(reply[0])
            item = None
            if status == "put" and w.value is not None:
                version, created, updated, expires = (_text(part) for part in reply[1:5])
                item = Item(
                    namespace=w.namespace,
                    key=w.key,
                    value=w.value,
                    created_at=int(created) / 1000,
                    updated_at=int(updated) / 1000,
                    expires_at=int(expires) / 1000 if expires else None,
                    version=int(version),
                )
            out.append((status, item))
        return out

    def _vectors_of(self, writes: Sequence[MemoryWrite]) -> list[str]:
        """Each put's embedding ('' for a delete, without an embedding function, or when it fails:
        the item is stored without one). A write whose id was applied already is not embedded
        again (observe re-applies the writes a delivery applied)."""
        if self.embed is None:
            return ["" for _ in writes]
        ids = [w.write_id for w in writes if w.write_id]
        applied = dict(zip(ids, self.redis.zmscore(self._applied, ids), strict=True)) if ids else {}
        out: list[str] = []
        for w in writes:
            if w.op != "put" or w.value is None or applied.get(w.write_id) is not None:
                out.append("")
                continue
            try:
                out.append(pack_vector(self.embed(check_value(w.value))))
            except Exception as exc:  # the operator's function: the item is kept without a vector
                log.warning(
                    "memory write %s stored without a vector: the embedding failed (%s)",
                    w.write_id or "(direct put)",
                    exc.__class__.__name__,
                )
                out.append("")
        return out

    def _read(self, low: bytes, high: bytes, most: int) -> tuple[list[tuple[Item, str]], bool]:
        """Live items whose entries lie in [low, high], at most ``most`` and SCAN_BYTES of values,
        with their values' JSON text; and whether the range held more."""
        reply = self._scan(self._keys, [low, high, most, SCAN_BYTES])
        more, rows = reply[0], reply[1:]
        items: list[tuple[Item, str]] = []
        for row in rows:
            entry, text, version, created, updated, expires = (_text(part) for part in row)
            labels, key = _parse_entry(entry)
            items.append(
                (
                    Item(
                        namespace=labels,
                        key=key,
                        value=json.loads(text),
                        created_at=int(created) / 1000,
                        updated_at=int(updated) / 1000,
                        expires_at=int(expires) / 1000 if expires else None,
                        version=int(version),
                    ),
                    text,
                )
            )
        return items, _text(more) == "1"


def _text(raw: object) -> str:
    if raw is None:
        return ""
    if isinstance(raw, bytes):
        return raw.decode()
    return str(raw)


def memory_of(client: redis.Redis, keys: Keys, tenant: str | None, embed: Embedding | None = None) -> Memory:
    """The memory of ``tenant``, its quota read from the tenant's limits at each put; ``embed``:
    the configured embedding function (``load_embedding(settings.memory_embedding)``)."""
    tenants = Tenants(client, keys)

    def quota() -> int:
        return tenants.limits(tenant).max_memory_items

    return Memory(client, keys, tenant, quota, embed)
