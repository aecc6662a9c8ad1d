"""Provider rate limits shared by the whole worker pool, enforced in Redis.

A :class:`ProviderLimit` caps the model calls of one provider and model (optionally per tenant):
requests per minute, tokens per minute and concurrent calls. Every worker asks the same Redis
before calling the model (:class:`RateLimiter`), so sixteen workers stay under the provider's
limits together, not each on its own:

* requests and tokens are **token buckets** refilled continuously, one minute's worth at most,
  by Redis's clock; a call takes one request and its estimated tokens, and is charged what it
  really used when it ends (the token bucket may go into debt: no call until it is refilled);
* concurrent calls are a **semaphore with leases**: a call holds a slot whose lease its worker
  renews; a worker that dies stops renewing and its slot comes back within the lease;
* a provider's ``429`` (and its ``Retry-After``) sets a **back-off** on the limit, so the whole
  pool waits it out instead of every worker finding out by itself.

Each check is one atomic script; a denied call writes nothing. Limits are configured per model
string in ``WESICHAIN_PROVIDER_LIMITS`` (``Settings.provider_limits``), a JSON object whose keys
are ``provider:model``, ``provider:*`` or ``*``, or on an agent (``Agent.limits``) for its own
model when the settings name none.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import ConfigError
from shared.keys import Keys
from shared.scripts import register_scripts, run_many

__all__ = [
    "Denied",
    "DenyReason",
    "Grant",
    "MAX_COUNTDOWN_S",
    "ProviderLimit",
    "RateLimiter",
    "Throttled",
    "find_limit",
    "parse_limits",
    "scope_of",
]

DenyReason = Literal["retry_after", "concurrency", "rpm", "tpm"]

#: The longest countdown of a re-queued model call (far below the broker's visibility timeout).
MAX_COUNTDOWN_S = 60.0


class Throttled(Exception):
    """A model call got no capacity (or the provider said 429): the task that wanted it is
    re-queued instead of waiting in its worker thread (a think, or an eval's judge)."""

    def __init__(self, scope: str, reason: DenyReason, wait_s: float) -> None:
        super().__init__(f"{scope}: {reason}")
        self.scope = scope
        self.reason = reason
        self.wait_s = wait_s

    def countdown(self, rng: random.Random | None = None) -> float:
        """When to try again: the wait the limiter named, spread out so that the waiting tasks
        do not all come back at the same instant; a slot's freeing cannot be foreseen, so a task
        waiting for one tries again within a second or so."""
        pick = (rng or random).uniform
        if self.reason == "concurrency" or self.wait_s <= 0:
            wait = pick(0.2, 1.0)
        else:
            wait = self.wait_s + pick(0.0, min(1.0, 0.1 + self.wait_s / 4))
        return round(min(wait, MAX_COUNTDOWN_S), 3)


class ProviderLimit(BaseModel):
    """What the pool may ask of one provider and model at once (None: no such limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(default=None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    #: Each tenant gets the whole limit of its own (the provider's limit is per tenant's account).
    per_tenant: bool = False


def parse_limits(raw: Mapping[str, Any], where: str) -> dict[str, ProviderLimit]:
    """Limits by model pattern from a JSON object; a bad entry is a ConfigError naming ``where``."""
    limits: dict[str, ProviderLimit] = {}
    for pattern, value in raw.items():
        if pattern != "*" and ":" not in pattern:
            raise ConfigError(f"{where}: key {pattern!r} must be provider:model, provider:* or *")
        try:
            limits[pattern] = ProviderLimit.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"{where}: limit of {pattern!r} is invalid: {problems}") from None
    return limits


def find_limit(limits: Mapping[str, ProviderLimit], model: str) -> tuple[str, ProviderLimit] | None:
    """The limit for a ``provider:model`` string, most specific pattern first, and its pattern."""
    provider, _, name = model.removeprefix("react+").partition(":")
    for pattern in (f"{provider}:{name}", f"{provider}:*", "*"):
        limit = limits.get(pattern)
        if limit is not None:
            return f"{provider}:{name}", limit
    return None


def scope_of(model: str, limit: ProviderLimit, tenant: str | None) -> str:
    """The name of the buckets a call counts against: ``provider:model``, with ``@tenant`` when
    the limit is per tenant. Braces are replaced (the scope is a Redis Cluster hash tag)."""
    scope = f"{model}@{tenant or '-'}" if limit.per_tenant else model
    return scope.replace("{", "(").replace("}", ")")[:300]


@dataclass(frozen=True)
class Grant:
    """Capacity taken for one call; give it back with :meth:`RateLimiter.release`."""

    scope: str
    limit: ProviderLimit
    holder: str
    estimated_tokens: int


@dataclass(frozen=True)
class Denied:
    """No capacity now: why, and how long until there may be (0: unknown, a slot must free)."""

    scope: str
    reason: DenyReason
    wait_s: float


class RateLimiter:
    """The shared limits, in one Redis (the run store's)."""

    def __init__(self, client: redis.Redis, keys: Keys, lease_s: float) -> None:
        self.redis = client
        self.keys = keys
        self.lease_ms = max(1, int(lease_s * 1000))
        self._scripts = register_scripts(client)

    def _keys(self, scope: str) -> list[str]:
        return [self.keys.limit(scope), self.keys.limit_slots(scope)]

    def acquire(self, scope: str, limit: ProviderLimit, estimated_tokens: int) -> Grant | Denied:
        holder = uuid.uuid4().hex
        reply = self._scripts["limit_acquire"](
            keys=self._keys(scope),
            args=[
                limit.requests_per_minute or 0,
                limit.tokens_per_minute or 0,
                limit.concurrency or 0,
                max(0, estimated_tokens),
                holder,
                self.lease_ms,
            ],
        )
        status = _text(reply[0])
        if status == "ok":
            return Grant(scope, limit, holder, max(0, estimated_tokens))
        return Denied(scope, status, int(reply[1]) / 1000.0)  # type: ignore[arg-type]

    def release(self, grant: Grant, used_tokens: int | None = None, back_off_s: float | None = None) -> None:
        """End the call: free its slot, charge the tokens it used beyond its estimate, and make the
        pool back off for ``back_off_s`` (a provider's 429)."""
        extra = 0 if used_tokens is None else used_tokens - grant.estimated_tokens
        self._release(grant.scope, grant.limit, grant.holder, extra, back_off_s)

    def back_off(self, scope: str, limit: ProviderLimit, seconds: float) -> None:
        """Make every worker wait ``seconds`` before its next call under this limit."""
        self._release(scope, limit, "", 0, seconds)

    def _release(
        self, scope: str, limit: ProviderLimit, holder: str, extra: int, back_off_s: float | None
    ) -> None:
        self._scripts["limit_release"](
            keys=self._keys(scope),
            args=[holder, limit.tokens_per_minute or 0, extra, int(max(0.0, back_off_s or 0.0) * 1000)],
        )

    def renew(self, grants: Sequence[Grant]) -> list[bool]:
        """Extend the slots of calls still running, in one round trip; False for a slot lost."""
        held = [g for g in grants if g.limit.concurrency]
        if not held:
            return [True] * len(grants)
        calls = [([self.keys.limit_slots(g.scope)], [g.holder, self.lease_ms]) for g in held]
        replies = iter(run_many(self.redis, self._scripts["limit_renew"], calls))
        return [int(next(replies)) == 1 if g.limit.concurrency else True for g in grants]

    def in_use(self, scope: str) -> int:
        """Concurrent calls holding a live slot now (by Redis's clock)."""
        now = self.redis.time()
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        return int(self.redis.zcount(self.keys.limit_slots(scope), f"({now_ms}", "+inf"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
