"""Worker liveness: each worker start says it is alive, and which claims its pool processes hold.

A claim's lease says only that its holder *process* keeps renewing it, from a heartbeat thread of
that process. Two things are known sooner and better by the worker's main process:

* that the whole worker died (SIGKILL, OOM, a lost machine): its main process stops saying it is
  alive, and a sweeper hands on every claim it listed once that record ran out, by Redis's clock,
  instead of waiting for each claim's lease (``lease_s``);
* that a pool process whose heartbeat thread is starved (a tool holding the GIL) is still alive and
  still running its task: Celery's main process knows which pool process runs which task, so a
  sweeper that finds such a claim expired extends it instead of handing the work on again.

Each start of a worker (its main process, one member of ``lives`` per start) writes, every
quarter of its ttl, the Redis time until which it is alive and the list of claims its pool
processes hold (``held``), with the pool processes themselves. Both live under the registry's hash
tag, in a slot of their own on a Redis Cluster: a sweeper reads them first and passes what it saw
to the run's script (``held_claim.lua``), which re-checks the claim's holder and fences by Redis's
clock.

A claim taken after the last beat is not in the list yet. Rather than beat once more for every
task it receives (a Redis round trip in the process that consumes and dispatches, per
transition), the main process leaves that to the claim itself: each claim script also keeps the
claim under its holder's *last-claim* key in the run's shard (``Keys.last_claim``, expiring with
the lease; one process holds one claim at a time on the prefork pool). A sweeper burying a dead
start reads the last claim of each of its pool processes in every shard, besides the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from shared.keys import Keys
from shared.scripts import register_scripts

__all__ = [
    "DeadStart",
    "HeldClaim",
    "Lives",
    "POOL_MARK",
    "dump_held",
    "parse_held",
    "parse_pool",
]


@dataclass(frozen=True)
class HeldClaim:
    """A claim a pool process of a worker start works under, as its main process lists it."""

    run_id: str
    field: str
    #: The claim's holder, as claims name it (``host:pid`` of the pool process).
    holder: str
    version: int

    def dump(self) -> str:
        return f"{self.run_id}\t{self.field}\t{self.holder}\t{self.version}"

    @classmethod
    def parse(cls, line: str) -> HeldClaim | None:
        parts = line.split("\t")
        if len(parts) != 4 or not parts[3].isdigit():
            return None
        return cls(parts[0], parts[1], parts[2], int(parts[3]))


@dataclass(frozen=True)
class DeadStart:
    """A worker start whose liveness ran out: the Redis time (ms) it ran out at, what it held."""

    life: str
    until_ms: int
    held: list[HeldClaim]
    #: Its pool processes (``host:pid``), whose last claims are read too.
    pool: tuple[str, ...] = ()


#: What marks a line of the held list naming a pool process rather than a claim.
POOL_MARK = "pool\t"


def dump_held(held: Iterable[HeldClaim], pool: Iterable[str] = ()) -> str:
    return "\n".join([*sorted(h.dump() for h in held), *(POOL_MARK + p for p in sorted(pool))])


def parse_held(raw: Any) -> list[HeldClaim]:
    return [h for line in _lines(raw) if (h := HeldClaim.parse(line)) is not None]


def parse_pool(raw: Any) -> tuple[str, ...]:
    """The pool processes a held list names (the claims' holders; none listed by older workers)."""
    return tuple(line.removeprefix(POOL_MARK) for line in _lines(raw) if line.startswith(POOL_MARK))


def _lines(raw: Any) -> list[str]:
    if raw is None:
        return []
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return [line for line in text.split("\n") if line]


class Lives:
    """The liveness records of every worker start, and the claim operations they justify."""

    def __init__(self, client: redis.Redis, keys: Keys, lease_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.lease_ms = int(lease_s * 1000)
        self._scripts = register_scripts(client)

    # -- a worker's main process ---------------------------------------------------------------

    def beat(
        self, life: str, ttl_s: float, held: Sequence[HeldClaim] | None, pool: Sequence[str] = ()
    ) -> bool:
        """Say ``life`` is alive for ``ttl_s``; with ``held``, replace its list of held claims (and
        of its pool processes, ``pool``).

        Returns False when the list is gone (a sweeper judged this start dead): send it again.
        """
        args: list[Any] = [life, int(ttl_s * 1000), "keep", ""]
        if held is not None:
            args[2:] = ["set", dump_held(held, pool)]
        reply = self._scripts["worker_live"](keys=[self.keys.lives(), self.keys.held(life)], args=args)
        return int(reply) == 1

    def leave(self, life: str) -> None:
        """A worker stopping: it holds nothing any more and is not to be judged dead."""
        self.redis.zrem(self.keys.lives(), life)
        self.redis.delete(self.keys.held(life))

    # -- a sweeper -----------------------------------------------------------------------------

    def now_ms(self) -> int:
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def dead(self, now_ms: int, limit: int = 100) -> list[DeadStart]:
        """Starts whose liveness ran out by ``now_ms`` (Redis time), with the claims they listed."""
        entries: list[Any] = self.redis.zrangebyscore(
            self.keys.lives(), "-inf", now_ms, start=0, num=limit, withscores=True
        )
        if not entries:
            return []
        lives = [_text(life) for life, _ in entries]
        with self.redis.pipeline(transaction=False) as pipe:
            for life in lives:
                pipe.get(self.keys.held(life))
            raw = pipe.execute()
        return [
            DeadStart(life, int(score), parse_held(held), parse_pool(held))
            for life, (_, score), held in zip(lives, entries, raw, strict=True)
        ]

    def last_claims(self, pool: Sequence[str]) -> list[HeldClaim]:
        """The last claim each of these processes took in each shard, while its lease runs (a
        claim taken after its main process last listed what the pool holds)."""
        if not pool:
            return []
        names = [self.keys.last_claim(shard, holder) for holder in pool for shard in range(self.keys.shards)]
        with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(name)
            raw = pipe.execute()
        return [claim for line in raw if line is not None and (claim := HeldClaim.parse(_text(line)))]

    def alive(self, now_ms: int) -> dict[tuple[str, str], tuple[HeldClaim, int]]:
        """Every claim a live start lists, by (run id, field): the claim and until when (Redis ms)
        its start is known alive."""
        entries: list[Any] = self.redis.zrangebyscore(
            self.keys.lives(), f"({now_ms}", "+inf", withscores=True
        )
        if not entries:
            return {}
        with self.redis.pipeline(transaction=False) as pipe:
            for life, _ in entries:
                pipe.get(self.keys.held(_text(life)))
            raw = pipe.execute()
        found: dict[tuple[str, str], tuple[HeldClaim, int]] = {}
        for (_, score), held in zip(entries, raw, strict=True):
            for claim in parse_held(held):
                found[(claim.run_id, claim.field)] = (claim, int(score))
        return found

    def forget(self, dead: DeadStart) -> bool:
        """Drop a dead start once its claims were handed on (unless it beat again meanwhile)."""
        reply = self._scripts["worker_gone"](
            keys=[self.keys.lives(), self.keys.held(dead.life)], args=[dead.life, dead.until_ms]
        )
        return int(reply) == 1

    def extend(self, claim: HeldClaim, alive_until_ms: int) -> bool:
        """Extend ``claim`` by the lease for its live main process (see ``held_claim.lua``)."""
        return self._held_claim(claim, "extend", alive_until_ms, "")

    def expire(self, claim: HeldClaim, died_at_ms: int, reason: str) -> bool:
        """Expire ``claim`` of a dead start now, unless renewed after ``died_at_ms``."""
        return self._held_claim(claim, "expire", died_at_ms, reason)

    def _held_claim(self, claim: HeldClaim, mode: str, fence_ms: int, reason: str) -> bool:
        k = self.keys
        reply = self._scripts["held_claim"](
            keys=[k.run(claim.run_id), k.leases_of(claim.run_id), k.attempts(claim.run_id)],
            args=[
                claim.run_id,
                claim.field,
                claim.holder,
                mode,
                self.lease_ms,
                fence_ms,
                claim.version,
                reason[:500],
            ],
        )
        return int(reply) == 1


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
