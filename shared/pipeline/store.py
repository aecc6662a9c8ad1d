"""A pipeline run's state in Redis: its request and status, the current step's counters, each
step's items, attempts, child runs and results, and its events.

The pipeline runs one step at a time (``seq`` counts the steps it went through, branches
included). A step's items are numbered; item ``i``'s child run for attempt ``a`` has the id
:func:`child_run_id` ``(pipeline, seq, i, a)``, so whoever creates it, it is created once. Each
move is one script: taking items within the step's cap, recording an item once, moving an item to
its next attempt once, moving on to the next step once, ending once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from shared import protocol
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.scripts import ScriptConnections, register_script

__all__ = [
    "DEFAULT_RETENTION_S",
    "EVENTS_MAXLEN",
    "PIPELINE_ID",
    "PIPELINE_ITEM",
    "PIPELINE_STEP",
    "ItemToStart",
    "PipelineMeta",
    "PipelinePage",
    "PipelineStore",
    "PumpLease",
    "Recorded",
    "child_run_id",
    "parse_cursor",
    "public_pipeline_id",
    "stored_pipeline_id",
]

#: Child runs' metadata: which pipeline run, step and item they belong to.
PIPELINE_ID = "pipeline_id"
PIPELINE_STEP = "pipeline_step"
PIPELINE_ITEM = "pipeline_item"
#: Events a pipeline run keeps (about the last ones when more).
EVENTS_MAXLEN = 10_000
#: How long an ended pipeline run's keys stay by default (``Settings.retention_s``'s default).
DEFAULT_RETENTION_S = 7 * 24 * 3600

_SCRIPTS = (
    "pipe_create",
    "pipe_advance",
    "pipe_reserve",
    "pipe_record",
    "pipe_retry",
    "pipe_end",
    "pipe_mark",
)


def stored_pipeline_id(tenant: str | None, pipeline_id: str) -> str:
    """The id a pipeline run is stored under: a tenant's ids are its own (as its threads and
    idempotency keys are), so two tenants may use the same id, and no tenant can take or even
    detect another's. A run without a tenant (the operator's) keeps its id as given.

    The prefix is a fixed-length digest of the tenant, so no two (tenant, id) pairs meet, and the
    stored id stays a valid name for the child run ids built on it.
    """
    if tenant is None:
        return pipeline_id
    return "t" + hashlib.sha256(tenant.encode()).hexdigest()[:16] + "." + pipeline_id


def public_pipeline_id(tenant: str | None, stored_id: str) -> str:
    """The id a tenant knows a stored pipeline run by (the inverse of :func:`stored_pipeline_id`)."""
    prefix = stored_pipeline_id(tenant, "")
    return stored_id[len(prefix) :] if prefix and stored_id.startswith(prefix) else stored_id


def child_run_id(pipeline_id: str, seq: int, item: int, attempt: int) -> str:
    """The child run of (pipeline run, step, item, attempt): the same four, the same run."""
    return f"{pipeline_id}:s{seq}:i{item}:a{attempt}"


@dataclass(frozen=True)
class PipelineMeta:
    """A pipeline run's request, status and where it is."""

    #: The id it is stored under (:func:`stored_pipeline_id`): its child runs' ids build on it.
    pipeline_id: str
    name: str
    input: str
    tenant: str | None
    status: str
    #: The queue namespace of its child runs and of its own tasks (None: the default queues).
    namespace: str | None
    #: The step it is at (-1: not started yet), in which pipeline (a branch moves it to another).
    seq: int
    target: str
    index: int
    kind: str
    cap: int
    total: int
    started: int
    done: int
    output: Any
    error: dict[str, Any] | None
    created_at: float
    updated_ms: float
    finished_at: float | None
    #: The id its tenant gave it (or was given), which the API shows and takes.
    public_id: str = ""

    @property
    def terminal(self) -> bool:
        return self.status != "running"


#: An item of a step to start: (item, its current attempt, its input text).
ItemToStart = tuple[int, int, str]


class PumpLease(NamedTuple):
    """A pump's claim on taking a step's items (``Keys.pipe_pump``): whoever holds it takes the
    room other ends give back meanwhile, before it gives the lease up (``pipe_mark.lua``)."""

    token: str
    #: How long the lease lasts unless its holder takes items again (a dead holder's lapses).
    lease_ms: int


class Recorded(NamedTuple):
    """What recording an item's end did (``pipe_record.lua`` lists the answers), and the items the
    record took to start, under the pump lease it then holds (none: it holds no lease)."""

    answer: str
    items: list[ItemToStart]


@dataclass(frozen=True)
class PipelinePage:
    """A page of a tenant's pipeline runs, newest first."""

    pipelines: list[PipelineMeta]
    #: Where the next page starts (``CREATED_MS.PIPELINE_ID``); None: no more.
    next_cursor: str | None


class PipelineStore:
    """Reads and writes pipeline runs on the run store's Redis client and keys."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        retention_s: float = DEFAULT_RETENTION_S,
        connections: ScriptConnections | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        #: How long an ended pipeline run's keys stay (as an ended run's do: ``Settings.retention_s``).
        self.retention_s = retention_s
        # ``connections``: the run store's kept ones, so the scripts skip redis-py's pool per call.
        self._scripts = {name: register_script(client, name, connections) for name in _SCRIPTS}

    def create(
        self,
        pipeline_id: str,
        name: str,
        input: str,
        tenant: str | None,
        namespace: str | None = None,
        public_id: str | None = None,
    ) -> bool:
        """Store a new pipeline run (running, at no step) under ``pipeline_id`` (the stored id),
        known to its tenant as ``public_id`` (default: the same); False if the id is taken."""
        k = self.keys
        now = time.time()
        fields = {
            "id": public_id or pipeline_id,
            "name": name,
            "input": input,
            "tenant": tenant or "",
            "namespace": namespace or "",
            "status": "running",
            "seq": "-1",
            "target": name,
            "index": "-1",
            "kind": "",
            "cap": "0",
            "total": "0",
            "started": "0",
            "done": "0",
            "created_at": repr(now),
            "updated_ms": str(int(now * 1000)),
        }
        reply = self._scripts["pipe_create"](
            keys=[k.pipe_meta(pipeline_id), k.pipes_active(), k.pipes_index(), k.pipes_index_of(tenant)],
            args=[
                pipeline_id,
                int(now * 1000),
                int(self.retention_s * 1000),
                *[part for pair in fields.items() for part in pair],
            ],
        )
        return _text(reply) == "created"

    def meta(self, pipeline_id: str) -> PipelineMeta | None:
        return _meta_of(pipeline_id, self.redis.hgetall(self.keys.pipe_meta(pipeline_id)))

    def metas(self, pipeline_ids: list[str]) -> list[PipelineMeta | None]:
        """The metas of several pipeline runs in one round trip (None for one that expired)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for pipeline_id in pipeline_ids:
                pipe.hgetall(self.keys.pipe_meta(pipeline_id))
            replies = pipe.execute()
        return [_meta_of(pid, raw) for pid, raw in zip(pipeline_ids, replies, strict=True)]

    # -- moving on ---------------------------------------------------------------------------------

    def advance(
        self,
        pipeline_id: str,
        from_seq: int,
        target: str,
        index: int,
        kind: str,
        cap: int,
        step: dict[str, Any],
        inputs: list[str],
    ) -> bool:
        """Start step ``from_seq + 1`` with these item inputs; False if another delivery did."""
        k, seq = self.keys, from_seq + 1
        reply = self._scripts["pipe_advance"](
            keys=[k.pipe_meta(pipeline_id), k.pipe_steps(pipeline_id), k.pipe_items(pipeline_id, seq)],
            args=[
                from_seq,
                seq,
                target,
                index,
                kind,
                cap,
                len(inputs),
                json.dumps(step),
                int(time.time() * 1000),
                *inputs,
            ],
        )
        return _text(reply) == "ok"

    def reserve(self, pipeline_id: str, seq: int, want: int) -> list[ItemToStart]:
        """Up to ``want`` items of step ``seq`` to start now, within its cap (empty: none)."""
        k = self.keys
        reply = self._scripts["pipe_reserve"](
            keys=[
                k.pipe_meta(pipeline_id),
                k.pipe_items(pipeline_id, seq),
                k.pipe_attempts(pipeline_id, seq),
            ],
            args=[seq, want],
        )
        return _taken(reply)

    def record(
        self,
        pipeline_id: str,
        seq: int,
        item: int,
        attempt: int,
        result: dict[str, Any],
        event: dict[str, Any],
        started: dict[str, Any] | None = None,
        created_at: float | None = None,
        want: int = 0,
        lease: PumpLease | None = None,
    ) -> Recorded:
        """Record how an item ended, and its event, once (see ``pipe_record.lua`` for the answers).
        ``started``: the ``child_started`` event of the child run that ended (None: the item had
        none), written with the child's note if its creator died before noting it.
        ``created_at``: the pipeline run's creation time as the caller knows it from an earlier
        read ('unknown' when the id is no longer that run's; None: the caller read it just now).
        ``want`` > 0 with a ``lease``: when items wait to start, take the step's pump lease (else
        'pumping': its holder takes the room) and up to ``want`` items within the cap."""
        k = self.keys
        reply = self._scripts["pipe_record"](
            keys=[
                k.pipe_meta(pipeline_id),
                k.pipe_results(pipeline_id, seq),
                k.pipe_attempts(pipeline_id, seq),
                k.pipe_events(pipeline_id),
                k.pipe_children(pipeline_id, seq),
                k.pipe_items(pipeline_id, seq),
                k.pipe_pump(pipeline_id, seq),
            ],
            args=[
                seq,
                item,
                attempt,
                json.dumps(result),
                _event_json(event),
                EVENTS_MAXLEN,
                started["run_id"] if started is not None else "",
                _event_json(started) if started is not None else "",
                repr(created_at) if created_at is not None else "",
                want if lease is not None else 0,
                lease.token if lease is not None else "",
                lease.lease_ms if lease is not None else 0,
            ],
        )
        return Recorded(_text(reply[0]), _taken(reply[1:]) if len(reply) > 1 else [])

    def retry(self, pipeline_id: str, seq: int, item: int, attempt: int) -> bool:
        """Move the item to attempt ``attempt + 1``; False if that happened already (or cannot)."""
        k = self.keys
        reply = self._scripts["pipe_retry"](
            keys=[k.pipe_meta(pipeline_id), k.pipe_attempts(pipeline_id, seq)], args=[seq, item, attempt]
        )
        return _text(reply) == "ok"

    def end(
        self, pipeline_id: str, seq: int | None, status: str, output: Any = None, error: Any = None
    ) -> str:
        """End the pipeline run (at step ``seq``; None: wherever it is); 'ok', or why not."""
        reply = self._scripts["pipe_end"](
            keys=[self.keys.pipe_meta(pipeline_id)],
            args=[
                "*" if seq is None else seq,
                status,
                json.dumps(output) if output is not None else "",
                json.dumps(error) if error is not None else "",
                int(time.time() * 1000),
            ],
        )
        return _text(reply)

    # -- a step's items ------------------------------------------------------------------------

    def item_input(self, pipeline_id: str, seq: int, item: int) -> str | None:
        raw = self.redis.hget(self.keys.pipe_items(pipeline_id, seq), str(item))
        return _text(raw) if raw is not None else None

    def attempts(self, pipeline_id: str, seq: int) -> dict[int, int]:
        raw = self.redis.hgetall(self.keys.pipe_attempts(pipeline_id, seq))
        return {int(_text(k)): int(v) for k, v in raw.items()}

    def mark_children(
        self,
        pipeline_id: str,
        seq: int,
        children: list[tuple[int, str, dict[str, Any]]],
        lease: PumpLease | None = None,
        want: int = 0,
        hand_on: bool = False,
    ) -> tuple[list[bool], bool, list[ItemToStart]]:
        """Note that each child run of step ``seq`` named (item, run id, event) exists (it is the
        one to cancel, or to wait for) and add its event, once, in one script: for each, True the
        first time it is noted, whoever notes it; whether the pipeline run was still running
        once they were noted (if not, its end's cascade may have missed them); and, for the holder
        of the step's pump ``lease``, up to ``want`` more items to start (none: the lease is given
        up; ``hand_on``: given up while a child of the step is live, see ``pipe_mark.lua``)."""
        k = self.keys
        status, noted, taken = self._scripts["pipe_mark"](
            keys=[
                k.pipe_children(pipeline_id, seq),
                k.pipe_events(pipeline_id),
                k.pipe_meta(pipeline_id),
                k.pipe_items(pipeline_id, seq),
                k.pipe_attempts(pipeline_id, seq),
                k.pipe_pump(pipeline_id, seq),
            ],
            args=[
                EVENTS_MAXLEN,
                seq,
                want if lease is not None else 0,
                lease.token if lease is not None else "",
                lease.lease_ms if lease is not None else 0,
                "1" if hand_on else "0",
                *[part for item, run_id, event in children for part in (item, run_id, _event_json(event))],
            ],
        )
        running = status is not None and _text(status) == protocol.PIPE_RUNNING
        return [int(n) == 1 for n in noted], running, _taken(taken)

    def children(self, pipeline_id: str, seq: int) -> dict[int, str]:
        raw = self.redis.hgetall(self.keys.pipe_children(pipeline_id, seq))
        return {int(_text(k)): _text(v) for k, v in raw.items()}

    def results(self, pipeline_id: str, seq: int) -> dict[int, dict[str, Any]]:
        raw = self.redis.hgetall(self.keys.pipe_results(pipeline_id, seq))
        return {int(_text(k)): json.loads(v) for k, v in raw.items()}

    def steps(self, pipeline_id: str) -> dict[int, dict[str, Any]]:
        raw = self.redis.hgetall(self.keys.pipe_steps(pipeline_id))
        return {int(_text(k)): json.loads(v) for k, v in raw.items()}

    # -- events and the sweeper's set ----------------------------------------------------------

    def add_event(self, pipeline_id: str, kind: str, **fields: Any) -> None:
        self.redis.xadd(
            self.keys.pipe_events(pipeline_id),
            {"event": _event_json({"kind": kind, **fields})},
            maxlen=EVENTS_MAXLEN,
            approximate=True,
        )

    def events(
        self, pipeline_id: str, after: str = "0-0", count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        start = "-" if after == "0-0" else f"({after}"
        raw: Any = self.redis.xrange(self.keys.pipe_events(pipeline_id), min=start, count=count)
        return [(_text(event_id), json.loads(_event_field(fields))) for event_id, fields in raw]

    def active(self) -> list[str]:
        return sorted(_text(m) for m in self.redis.smembers(self.keys.pipes_active()))

    def cancel_children(self, pipeline_id: str, cancel_run: Callable[[str], object]) -> int:
        """Cancel (``cancel_run``) every live child of an ended pipeline run, then stop watching it."""
        meta = self.meta(pipeline_id)
        if meta is None or not meta.terminal:
            return 0
        cancelled = 0
        if meta.seq >= 0:
            results = self.results(pipeline_id, meta.seq)
            for item, run_id in self.children(pipeline_id, meta.seq).items():
                if item not in results:
                    cancel_run(run_id)
                    cancelled += 1
        self.settle(pipeline_id)
        return cancelled

    def settle(self, pipeline_id: str) -> None:
        """The pipeline run ended and no child of it is left live: its keys expire after the
        retention, and the sweeper forgets it."""
        meta = self.meta(pipeline_id)
        k = self.keys
        keys = [k.pipe_meta(pipeline_id), k.pipe_steps(pipeline_id), k.pipe_events(pipeline_id)]
        for seq in range((meta.seq if meta is not None else -1) + 1):
            keys += [
                k.pipe_items(pipeline_id, seq),
                k.pipe_attempts(pipeline_id, seq),
                k.pipe_children(pipeline_id, seq),
                k.pipe_results(pipeline_id, seq),
            ]
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.expire(key, int(self.retention_s))
        pipe.srem(k.pipes_active(), pipeline_id)
        pipe.execute()

    def list_pipelines(
        self,
        tenant: str | None,
        *,
        name: str | None = None,
        status: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
        max_scan: int = 2000,
    ) -> PipelinePage:
        """A tenant's pipeline runs (None: those without a tenant), newest first, from the tenant's
        index (never a key scan), a page at a time.

        ``name`` (the pipeline started), ``status`` and ``since`` (Unix seconds, created at or
        after) filter the runs read. At most ``max_scan`` index entries are read per page, so a
        page may hold fewer than ``limit`` runs and still have a ``next_cursor``, as a page of runs
        may. Entries whose pipeline run expired are dropped from the index as they are met.
        """
        index = self.keys.pipes_index_of(tenant)
        position = parse_cursor(cursor)
        bottom = "-inf" if since is None else str(int(since * 1000))
        found: list[PipelineMeta] = []
        scanned = 0
        while scanned < max_scan:
            entries, exhausted = self._index_after(index, position, bottom, min(200, max_scan - scanned))
            metas = self.metas([pipeline_id for _, pipeline_id in entries])
            for (created_ms, pipeline_id), meta in zip(entries, metas, strict=True):
                scanned += 1
                position = (created_ms, pipeline_id)
                if meta is None:
                    self.redis.zrem(index, pipeline_id)  # expired
                    continue
                if (name is None or meta.name == name) and (status is None or meta.status == status):
                    found.append(meta)
                    if len(found) == limit:
                        return PipelinePage(found, _cursor(position))
            if exhausted:
                return PipelinePage(found, None)
        return PipelinePage(found, _cursor(position) if position is not None else None)

    def _index_after(
        self, index: str, position: tuple[int, str] | None, bottom: str, num: int
    ) -> tuple[list[tuple[int, str]], bool]:
        """Up to ``num`` entries of ``index`` after ``position`` (newest first, by creation ms and
        then id), and whether none is left after them."""
        top = "+inf" if position is None else str(position[0])
        while True:
            reply: Any = self.redis.zrevrangebyscore(index, top, bottom, start=0, num=num, withscores=True)
            entries = [(int(score), _text(member)) for member, score in reply]
            if position is not None:
                entries = [e for e in entries if e < position]
            full = len(reply) == num
            if entries or not full:
                return entries, not full
            num *= 4  # every entry read sits at the cursor's own millisecond: read further into it

    def trim_index(self) -> int:
        """Forget pipeline runs created longer ago than the retention (their keys expired since)."""
        cutoff_ms = (time.time() - self.retention_s) * 1000
        return int(self.redis.zremrangebyscore(self.keys.pipes_index(), "-inf", cutoff_ms))


def _meta_of(pipeline_id: str, raw: Any) -> PipelineMeta | None:
    """A pipeline run's meta from its hash (None: it has none, it expired)."""
    if not raw:
        return None
    f = {_text(k): _text(v) for k, v in raw.items()}
    return PipelineMeta(
        pipeline_id=pipeline_id,
        name=f["name"],
        input=f["input"],
        tenant=f.get("tenant") or None,
        status=f["status"],
        namespace=f.get("namespace") or None,
        seq=int(f["seq"]),
        target=f["target"],
        index=int(f["index"]),
        kind=f.get("kind", ""),
        cap=int(f["cap"]),
        total=int(f["total"]),
        started=int(f["started"]),
        done=int(f["done"]),
        output=json.loads(f["output"]) if f.get("output") else None,
        error=json.loads(f["error"]) if f.get("error") else None,
        created_at=float(f["created_at"]),
        updated_ms=float(f.get("updated_ms", "0")),
        finished_at=float(f["finished_ms"]) / 1000 if f.get("finished_ms") else None,
        public_id=f.get("id") or pipeline_id,
    )


def parse_cursor(cursor: str | None) -> tuple[int, str] | None:
    """A listing cursor (``CREATED_MS.PIPELINE_ID``); raises :class:`InvalidRequest` when malformed."""
    if not cursor:
        return None
    created_ms, _, pipeline_id = cursor.partition(".")
    if not created_ms.isdigit() or len(created_ms) > 15 or not pipeline_id:
        raise InvalidRequest(f"bad listing cursor {cursor[:80]!r}")
    return int(created_ms), pipeline_id


def _cursor(position: tuple[int, str]) -> str:
    return f"{position[0]}.{position[1]}"


def _taken(reply: Any) -> list[ItemToStart]:
    """The items ``pipe_take`` took: (item, attempt, input text) of each."""
    first, count = int(reply[0]), int(reply[1])
    texts, attempts = reply[2 : 2 + count], reply[2 + count : 2 + 2 * count]
    return [
        (first + i, int(attempt), _text(text))
        for i, (text, attempt) in enumerate(zip(texts, attempts, strict=True))
    ]


def _event_json(event: dict[str, Any]) -> str:
    return json.dumps({"kind": event["kind"], "at": time.time(), **event})


def _event_field(fields: dict[Any, Any]) -> str:
    return _text(fields.get("event", fields.get(b"event", "{}")))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
