"""The eval's state in Redis: its spec and cases, the work not started, the cap's slots, the results.

Work items are ``variant:case:repeat`` index triples; the case run of an item has a deterministic
id (:func:`run_id_of`), so a run is never created twice for one item, whoever tries. An item moves
``pending`` -> ``slots`` (leased while its run is created, then held until its result is recorded)
-> ``results``, each move one script, so the cap (the slots) holds across the whole pool and a
result is recorded once.

A completed eval may have been moved to the archive (``shared/evals/archiving.py``): with one, the
reads answer from it what Redis no longer holds, so a caller cannot tell where an eval was read
from, and an archived eval's id is not created again.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.archive.base import EvalArchive
from shared.archive.record import EvalHead
from shared.evals.dataset import Case
from shared.evals.errors import EvalNotFound
from shared.evals.outcome import CaseResult
from shared.evals.spec import EvalSpec, spec_json
from shared.keys import Keys
from shared.protocol import EVAL_COST_MICRO, EVAL_DONE, EVAL_FAILED, EVAL_PASSED, EVAL_TOKENS, variant_field
from shared.scripts import is_cluster, register_script

__all__ = [
    "BOUND",
    "JUDGE_WAITS",
    "MAX_ITEMS",
    "STOPPED",
    "Acquired",
    "EvalMeta",
    "EvalStore",
    "Item",
    "Recorded",
    "VariantCounts",
    "run_id_of",
]

#: Case runs (cases x variants x repeats) one eval may have.
MAX_ITEMS = 200_000
#: Added to the score of a slot whose run exists (the score is then when it was last looked at):
#: far above any lease deadline, so the two kinds of slot never mix in a range.
BOUND = 1e15
#: Statuses of an eval that starts no new case runs (``resume`` restarts it).
STOPPED = ("cancelled", "budget_exhausted")
#: The field of an eval's counts that counts its scorings deferred for a judge's provider capacity.
JUDGE_WAITS = "judge_waits"
_SCRIPTS = ("eval_create", "eval_acquire", "eval_claim", "eval_record", "eval_status", "eval_drop")


@dataclass(frozen=True)
class Item:
    """One case run of an eval: variant, case and repeat indexes."""

    variant: int
    case: int
    repeat: int

    def __str__(self) -> str:
        return f"{self.variant}:{self.case}:{self.repeat}"

    @classmethod
    def parse(cls, raw: str) -> Item:
        v, c, r = (int(p) for p in raw.split(":"))
        return cls(v, c, r)


def run_id_of(eval_id: str, item: Item) -> str:
    """The case run's id: the same (eval, variant, case, repeat), the same run."""
    return f"{eval_id}:v{item.variant}:c{item.case}:r{item.repeat}"


@dataclass(frozen=True)
class EvalMeta:
    """An eval's spec and where it stands."""

    eval_id: str
    spec: EvalSpec
    status: str
    items: int
    cases: int
    created_at: float
    finished_at: float | None
    dataset: str
    #: The tenant the eval belongs to (None: the operator's); only that tenant's API keys see it.
    tenant: str | None = None
    #: Where it came from (``shared/evals/context.py``): content hashes, code version.
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True)
class VariantCounts:
    """Running totals of one variant."""

    done: int = 0
    passed: int = 0
    failed: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class Recorded(enum.IntEnum):
    """What :meth:`EvalStore.record` did (false only when the result was recorded already)."""

    #: Recorded already: nothing changed.
    DUPLICATE = 0
    #: Recorded; items wait to start, and may take the slot it gave back.
    ITEMS_PENDING = 1
    #: Recorded; no item waits to start.
    NONE_PENDING = 2


@dataclass(frozen=True)
class Acquired:
    """What :meth:`EvalStore.acquire` got: ``ok`` with items, or why none."""

    status: str
    items: list[Item]


class EvalStore:
    """Reads and writes evals in Redis (the same client and keys as the run store)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        retention_s: float = 7 * 24 * 3600,
        archive: EvalArchive | None = None,
    ) -> None:
        self.redis = client
        self.keys = keys
        #: How long a completed eval's keys are kept.
        self.retention_s = retention_s
        #: Where completed evals go after Redis (None: nowhere; they expire after the retention).
        self.archive = archive
        self._scripts = {name: register_script(client, name) for name in _SCRIPTS}
        #: Heads of archived evals read so far (an archived eval never changes).
        self._archived: dict[str, EvalHead] = {}

    def _from_archive(self, eval_id: str) -> EvalHead | None:
        """The archived eval, when Redis no longer holds it (None: in Redis, or archived nowhere)."""
        if self.archive is None:
            return None
        head = self._archived.get(eval_id)
        if head is None:
            if self.redis.exists(self.keys.eval_meta(eval_id)):
                return None
            head = self.archive.eval_head(eval_id)
            if head is None:
                return None
            if len(self._archived) >= 64:
                self._archived.clear()
            self._archived[eval_id] = head
        return head

    # -- creating --------------------------------------------------------------------------------

    def create(
        self,
        eval_id: str,
        spec: EvalSpec,
        cases: list[Case],
        dataset: str,
        *,
        tenant: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> bool:
        """Store a new eval (running); False if an eval with this id exists already (in Redis or,
        completed, in the archive). ``tenant`` owns it (None: the operator); ``context`` is kept
        as it is (JSON) for the report's header."""
        if self._from_archive(eval_id) is not None:
            return False
        items = [
            str(Item(v, c, r))
            for r in range(spec.repeats)
            for c in range(len(cases))
            for v in range(len(spec.variants))
        ]
        if len(items) > MAX_ITEMS:
            raise ValueError(
                f"{len(cases)} cases x {len(spec.variants)} variants x {spec.repeats} repeats ="
                f" {len(items)} case runs, more than {MAX_ITEMS}"
            )
        now = time.time()
        meta = {
            "spec": spec_json(spec),
            "status": "running",
            "items": str(len(items)),
            "cases": str(len(cases)),
            "created_at": repr(now),
            "dataset": dataset,
        }
        if tenant is not None:
            meta["tenant"] = tenant
        if context:
            meta["context"] = json.dumps(context, separators=(",", ":"))
        k = self.keys
        reply = self._scripts["eval_create"](
            keys=[k.eval_meta(eval_id), k.eval_cases(eval_id), k.eval_pending(eval_id)]
            + [k.evals_active(), k.evals_index(), k.evals_index_of(tenant)],
            args=[
                eval_id,
                int(now * 1000),
                len(cases),
                len(items),
                *[part for pair in meta.items() for part in pair],
                *[c.model_dump_json() for c in cases],
                *items,
            ],
        )
        created = _text(reply) == "created"
        if created:
            # The tenant's index forgets what expired as it grows (no one pass knows every tenant).
            cutoff_ms = (time.time() - self.retention_s) * 1000
            self.redis.zremrangebyscore(k.evals_index_of(tenant), "-inf", cutoff_ms)
        return created

    # -- reading ---------------------------------------------------------------------------------

    def meta(self, eval_id: str) -> EvalMeta:
        raw = self.redis.hgetall(self.keys.eval_meta(eval_id))
        archived = self._from_archive(eval_id) if not raw else None
        if not raw and archived is None:
            raise EvalNotFound(f"no eval {eval_id!r}")
        fields = archived.meta if archived is not None else {_text(k): _text(v) for k, v in raw.items()}
        return EvalMeta(
            eval_id=eval_id,
            spec=EvalSpec.model_validate_json(fields["spec"]),
            status=fields["status"],
            items=int(fields["items"]),
            cases=int(fields["cases"]),
            created_at=float(fields["created_at"]),
            finished_at=float(fields["finished_at"]) / 1000 if fields.get("finished_at") else None,
            dataset=fields.get("dataset", ""),
            tenant=fields.get("tenant") or None,
            context=_context(fields.get("context")),
        )

    def case(self, eval_id: str, index: int) -> Case:
        raw = self.redis.hget(self.keys.eval_cases(eval_id), str(index))
        if raw is None and self.archive is not None and self._from_archive(eval_id) is not None:
            raw = self.archive.eval_cases(eval_id).get(index)
        if raw is None:
            raise EvalNotFound(f"eval {eval_id!r} has no case {index}")
        return Case.model_validate_json(raw)

    def cases_of(self, eval_id: str, indexes: list[int]) -> list[Case]:
        """The cases at ``indexes``, read in one round trip (as :meth:`case` reads one)."""
        if len(indexes) == 1:
            return [self.case(eval_id, indexes[0])]
        raws = self.redis.hmget(self.keys.eval_cases(eval_id), [str(i) for i in indexes]) if indexes else []
        return [
            Case.model_validate_json(raw) if raw is not None else self.case(eval_id, index)
            for index, raw in zip(indexes, raws, strict=True)
        ]

    def cases(self, eval_id: str) -> dict[int, Case]:
        raw = {int(_text(k)): v for k, v in self.redis.hgetall(self.keys.eval_cases(eval_id)).items()}
        if not raw and self.archive is not None and self._from_archive(eval_id) is not None:
            raw = dict(self.archive.eval_cases(eval_id))
        return {index: Case.model_validate_json(v) for index, v in raw.items()}

    def counts(self, eval_id: str, variants: int) -> list[VariantCounts]:
        raw = {_text(k): int(v) for k, v in self.redis.hgetall(self.keys.eval_counts(eval_id)).items()}
        if not raw and (archived := self._from_archive(eval_id)) is not None:
            raw = archived.counts
        return [
            VariantCounts(
                done=raw.get(variant_field(i, EVAL_DONE), 0),
                passed=raw.get(variant_field(i, EVAL_PASSED), 0),
                failed=raw.get(variant_field(i, EVAL_FAILED), 0),
                tokens=raw.get(variant_field(i, EVAL_TOKENS), 0),
                cost_usd=raw.get(variant_field(i, EVAL_COST_MICRO), 0) / 1e6,
            )
            for i in range(variants)
        ]

    def pending(self, eval_id: str) -> int:
        return int(self.redis.llen(self.keys.eval_pending(eval_id)))

    def slots(self, eval_id: str) -> list[tuple[Item, float]]:
        """Items holding a slot, with their score: a lease deadline (Redis ms) while the run is being
        created, :data:`BOUND` plus the time it was last looked at once the run exists."""
        raw: Any = self.redis.zrange(self.keys.eval_slots(eval_id), 0, -1, withscores=True)
        return [(Item.parse(_text(member)), float(score)) for member, score in raw]

    def expired(self, eval_id: str, now_ms: float) -> list[Item]:
        """Slots whose lease ran out before their run was created (their creator died)."""
        raw = self.redis.zrangebyscore(self.keys.eval_slots(eval_id), "-inf", now_ms)
        return [Item.parse(_text(m)) for m in raw]

    def unchecked(self, eval_id: str, since_ms: float, limit: int = 500) -> list[Item]:
        """Slots of existing runs not looked at since ``since_ms`` (oldest first)."""
        raw = self.redis.zrangebyscore(self.keys.eval_slots(eval_id), BOUND, BOUND + since_ms, 0, limit)
        return [Item.parse(_text(m)) for m in raw]

    def checked(self, eval_id: str, items: list[Item], now_ms: float) -> None:
        """Mark these slots looked at now (the sweeper comes back to them later)."""
        if items:
            self.redis.zadd(self.keys.eval_slots(eval_id), {str(i): BOUND + now_ms for i in items}, xx=True)

    def in_flight(self, eval_id: str) -> int:
        return int(self.redis.zcard(self.keys.eval_slots(eval_id)))

    def result(self, eval_id: str, item: Item) -> CaseResult | None:
        raw = self.redis.hget(self.keys.eval_results(eval_id), str(item))
        if raw is None and self.archive is not None and self._from_archive(eval_id) is not None:
            raw = self.archive.eval_results(eval_id).get(str(item))
        return CaseResult.model_validate_json(raw) if raw is not None else None

    def results(self, eval_id: str) -> Iterator[CaseResult]:
        if self.archive is not None and self._from_archive(eval_id) is not None:
            for raw in self.archive.eval_results(eval_id).values():
                yield CaseResult.model_validate_json(raw)
            return
        for raw in _hash_values(self.redis, self.keys.eval_results(eval_id)):
            yield CaseResult.model_validate_json(raw)

    def recorded(self, eval_id: str) -> int:
        recorded = int(self.redis.hlen(self.keys.eval_results(eval_id)))
        if recorded == 0 and (archived := self._from_archive(eval_id)) is not None:
            return archived.results
        return recorded

    def active(self) -> list[str]:
        return sorted(_text(m) for m in self.redis.smembers(self.keys.evals_active()))

    def list_evals(self, limit: int = 50) -> list[str]:
        """The newest evals of every tenant, newest first: Redis's and, merged in by creation
        time, the archive's."""
        archived = self.archive.list_evals(limit) if self.archive is not None else []
        return self._newest(self.keys.evals_index(), limit, archived)

    def tenant_evals(self, tenant: str | None, limit: int = 50) -> list[str]:
        """The newest evals of ``tenant`` (None: the operator's), newest first, read from its own
        index in Redis and in the archive, so that no number of other tenants' evals crowds them
        out."""
        archived = self.archive.tenant_evals(tenant, limit) if self.archive is not None else []
        return self._newest(self.keys.evals_index_of(tenant), limit, archived)

    def _newest(self, index: str, limit: int, archived: list[tuple[float, str]]) -> list[str]:
        raw: Any = self.redis.zrevrange(index, 0, limit - 1, withscores=True)
        entries = {_text(m): float(score) / 1000 for m, score in raw}
        for created_at, eval_id in archived:
            entries.setdefault(eval_id, created_at)
        newest = sorted(entries.items(), key=lambda e: (e[1], e[0]), reverse=True)
        return [eval_id for eval_id, _ in newest[:limit]]

    def trim_index(self) -> int:
        """Forget evals created longer ago than the retention (their keys expired since)."""
        cutoff_ms = (time.time() - self.retention_s) * 1000
        return int(self.redis.zremrangebyscore(self.keys.evals_index(), "-inf", cutoff_ms))

    # -- the pool's moves ------------------------------------------------------------------------

    def acquire(self, eval_id: str, spec: EvalSpec, want: int, lease_s: float) -> Acquired:
        """Up to ``want`` items to start, within the cap and the budget."""
        k = self.keys
        budget = spec.budget
        max_tokens = budget.tokens or 0 if budget is not None else 0
        max_cost = int((budget.cost_usd or 0) * 1e6) if budget is not None else 0
        reply = self._scripts["eval_acquire"](
            keys=[
                k.eval_meta(eval_id),
                k.eval_pending(eval_id),
                k.eval_slots(eval_id),
                k.eval_counts(eval_id),
                k.evals_active(),
            ],
            args=[spec.concurrency, int(lease_s * 1000), want, max_tokens, max_cost, eval_id],
        )
        status = _text(reply[0])
        return Acquired(status, [Item.parse(_text(r)) for r in reply[1:]])

    def bind(self, eval_id: str, item: Item) -> None:
        """The item's run exists: its slot is held until its result is recorded."""
        self.checked(eval_id, [item], time.time() * 1000)

    def claim_scoring(self, eval_id: str, item: Item, lease_s: float) -> tuple[str, Case | None]:
        """Claim the scoring of ``item`` ('ok'; 'done': its result is recorded; 'busy': another
        scorer holds it), and with an 'ok' its case, read in the same round trip."""
        k = self.keys
        reply = self._scripts["eval_claim"](
            keys=[k.eval_results(eval_id), k.eval_scoring(eval_id), k.eval_cases(eval_id)],
            args=[str(item), int(lease_s * 1000), item.case],
        )
        status = _text(reply[0])
        if status != "ok":
            return status, None
        raw = reply[1]
        return status, Case.model_validate_json(raw) if raw else self.case(eval_id, item.case)

    def defer_scoring(self, eval_id: str, item: Item) -> None:
        """Give a claimed scoring back (its judge is waiting for provider capacity), so that the
        re-sent scoring task can claim it at once; counted in :meth:`judge_waits`."""
        k = self.keys
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(k.eval_scoring(eval_id), str(item))
            pipe.hincrby(k.eval_counts(eval_id), JUDGE_WAITS, 1)
            pipe.execute()

    def judge_waits(self, eval_id: str) -> int:
        """How many times a scoring of this eval waited for its judge's provider capacity."""
        raw = self.redis.hget(self.keys.eval_counts(eval_id), JUDGE_WAITS)
        if raw is None and (archived := self._from_archive(eval_id)) is not None:
            return archived.counts.get(JUDGE_WAITS, 0)
        return int(raw or 0)

    def record(self, eval_id: str, item: Item, result: CaseResult) -> Recorded:
        """Record the item's result once and give its slot back (see :class:`Recorded`)."""
        k = self.keys
        tokens = result.input_tokens + result.output_tokens + result.judge_tokens
        reply = self._scripts["eval_record"](
            keys=[
                k.eval_results(eval_id),
                k.eval_slots(eval_id),
                k.eval_scoring(eval_id),
                k.eval_counts(eval_id),
                k.eval_meta(eval_id),
                k.eval_pending(eval_id),
                k.evals_active(),
                k.eval_cases(eval_id),
            ],
            args=[
                str(item),
                result.model_dump_json(),
                item.variant,
                int(result.passed),
                int(result.failed),
                tokens,
                round(result.cost_usd * 1e6),
                eval_id,
                int(time.time() * 1000),
                int(self.retention_s * 1000),
            ],
        )
        return Recorded(int(reply))

    def drop(self, eval_id: str) -> bool:
        """Delete an archived eval's keys if it is still completed; False if it changed meanwhile."""
        k = self.keys
        reply = self._scripts["eval_drop"](
            keys=[
                k.eval_meta(eval_id),
                k.eval_cases(eval_id),
                k.eval_pending(eval_id),
                k.eval_slots(eval_id),
                k.eval_scoring(eval_id),
                k.eval_results(eval_id),
                k.eval_counts(eval_id),
                k.evals_index(),
                k.evals_active(),
                k.evals_index_of(_optional_text(self.redis.hget(k.eval_meta(eval_id), "tenant"))),
            ],
            args=[eval_id],
        )
        self._archived.pop(eval_id, None)
        return int(reply) == 1

    def set_status(self, eval_id: str, status: str, allowed: tuple[str, ...]) -> str:
        """Move the eval to ``status`` if it is in one of ``allowed``; returns the status it was in."""
        k = self.keys
        reply = self._scripts["eval_status"](
            keys=[k.eval_meta(eval_id), k.evals_active(), k.eval_slots(eval_id)],
            args=[eval_id, status, *allowed],
        )
        was = _text(reply)
        if not was:
            raise EvalNotFound(f"no eval {eval_id!r}")
        return was

    def now_ms(self) -> float:
        seconds, micros = self.redis.time()
        return float(seconds) * 1000 + float(micros) / 1000


def _hash_values(client: Any, key: str) -> Iterator[Any]:
    """A hash's values, read in batches (HSCAN). On a cluster each batch is read on the client of
    the primary of ``key``'s slot: redis-py's cluster client fails to route HSCAN by its key."""
    if not is_cluster(client):
        for _, raw in client.hscan_iter(key, count=500):
            yield raw
        return
    cursor = 0
    while True:
        primary = client.get_redis_connection(client.get_node_from_key(key))
        cursor, entries = primary.hscan(key, cursor, count=500)
        yield from entries.values()
        if int(cursor) == 0:
            return


def _context(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)
