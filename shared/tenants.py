"""Tenants and their API keys, in Redis.

A tenant owns the runs started with its keys: it sees, follows, lists, cancels and approves only
those. Keys are shown once, when created, and stored only as their SHA-256 digest; a key's public
id is the start of that digest. Each tenant has a webhook signing secret (created on first use),
its limits, and the queue namespaces its runs may name besides the default one (none unless an
operator allows some), so one tenant cannot put work on the workers another team runs, and the
Celery tasks and queues its runs' completion callbacks may name (none unless an operator allows
some), so one tenant cannot send messages to queues or tasks it was not given.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from pydantic import BaseModel, Field

from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.queues import check_namespace
from shared.request import check_callback_queue, check_callback_task, check_name
from shared.webhooks import new_secret

__all__ = [
    "KEY_PREFIX",
    "MAX_TENANT_CALLBACKS",
    "MAX_TENANT_NAMESPACES",
    "CeleryCallbacks",
    "KeyRecord",
    "TenantLimits",
    "TenantSettings",
    "Tenants",
    "digest",
    "live_record",
]

KEY_PREFIX = "wsk_"
#: Queue namespaces one tenant may be allowed (the default namespace is always allowed besides).
MAX_TENANT_NAMESPACES = 100
#: Celery callback tasks, and queues, one tenant may be allowed (each).
MAX_TENANT_CALLBACKS = 100


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRecord(BaseModel):
    """An API key as stored (never the key itself)."""

    #: The key's public id: the first 12 hex digits of its digest.
    id: str
    tenant: str
    name: str = ""
    created_at: float
    revoked_at: float | None = None


class TenantLimits(BaseModel):
    """What one tenant may do at once (answered with 429 past it)."""

    max_inflight: int = Field(default=1000, ge=1, description="Runs not ended yet.")
    submits_per_minute: int = Field(default=600, ge=1, description="New runs per minute.")
    max_memory_items: int = Field(
        default=10_000, ge=1, le=10_000_000, description="Items in its long-term memory."
    )


@dataclass(frozen=True)
class CeleryCallbacks:
    """The Celery tasks a tenant's runs may name as their completion callback, and the queues
    they may send them to (a callback that names no queue goes where the pool routes the task)."""

    tasks: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantSettings:
    """What the API checks a tenant's submits against, read in one round trip."""

    limits: TenantLimits
    #: The webhook of its runs that name none.
    default_callback: str | None
    #: The queue namespaces its runs may name besides the default one (sorted).
    namespaces: tuple[str, ...]
    #: The Celery callbacks its runs may name (none: webhooks only).
    callbacks: CeleryCallbacks = CeleryCallbacks()


class Tenants:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    def create_key(self, tenant: str, name: str = "") -> tuple[str, KeyRecord]:
        """A new key for ``tenant`` (the tenant is created with it): the key, shown once, and its record."""
        check_name("tenant", tenant)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        hashed = digest(key)
        record = KeyRecord(id=hashed[:12], tenant=tenant, name=name[:200], created_at=time.time())
        # Three keys in three slots of a cluster, so no transaction: the key's record is written
        # last, and a key is only valid once it is (a digest listed without a record is skipped).
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(self.keys.tenants(), tenant)
            pipe.sadd(self.keys.api_keys(tenant), hashed)
            pipe.execute()
        self.redis.set(self.keys.api_key(hashed), record.model_dump_json())
        return key, record

    def authenticate(self, key: str) -> KeyRecord | None:
        """The record of a live key, or None (unknown or revoked)."""
        address = self.record_key(key)
        return live_record(self.redis.get(address)) if address is not None else None

    def record_key(self, key: str) -> str | None:
        """The Redis key holding the record of API key ``key``; None for a string that is no key
        (for a caller reading the record with another client, then :func:`live_record`)."""
        if not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None
        return self.keys.api_key(digest(key))

    def keys_of(self, tenant: str) -> list[KeyRecord]:
        digests = sorted(str(d) for d in self.redis.smembers(self.keys.api_keys(tenant)))
        with self.redis.pipeline(transaction=False) as pipe:  # the keys lie in many slots of a cluster
            for d in digests:
                pipe.get(self.keys.api_key(d))
            raw = pipe.execute()
        records = [KeyRecord.model_validate_json(r) for r in raw if r is not None]
        return sorted(records, key=lambda r: r.created_at)

    def revoke(self, tenant: str, key_id: str) -> bool:
        """Revoke the tenant's key whose id is ``key_id``; False if it has none."""
        for hashed in self.redis.smembers(self.keys.api_keys(tenant)):
            hashed = str(hashed)
            if hashed.startswith(key_id) and len(key_id) >= 8:
                raw = self.redis.get(self.keys.api_key(hashed))
                if raw is None:
                    continue
                record = KeyRecord.model_validate_json(raw)
                if record.revoked_at is None:
                    record = record.model_copy(update={"revoked_at": time.time()})
                    self.redis.set(self.keys.api_key(hashed), record.model_dump_json())
                return True
        return False

    def names(self) -> list[str]:
        return sorted(str(t) for t in self.redis.smembers(self.keys.tenants()))

    def webhook_secret(self, tenant: str) -> str:
        """The tenant's webhook signing secret, made on first use."""
        key = self.keys.tenant(tenant)
        self.redis.hsetnx(key, "webhook_secret", new_secret())
        return str(self.redis.hget(key, "webhook_secret"))

    def limits(self, tenant: str) -> TenantLimits:
        raw = self.redis.hget(self.keys.tenant(tenant), "limits")
        return TenantLimits.model_validate_json(raw) if raw else TenantLimits()

    def settings(self, tenant: str) -> TenantSettings:
        """The tenant's limits, default webhook URL and allowed namespaces, in one read."""
        raw_limits, callback, raw_namespaces, raw_tasks, raw_queues = self.redis.hmget(
            self.keys.tenant(tenant),
            "limits",
            "callback_url",
            "namespaces",
            "callback_tasks",
            "callback_queues",
        )
        return TenantSettings(
            limits=TenantLimits.model_validate_json(raw_limits) if raw_limits else TenantLimits(),
            default_callback=str(callback) if callback else None,
            namespaces=_names_of(raw_namespaces),
            callbacks=CeleryCallbacks(_names_of(raw_tasks), _names_of(raw_queues)),
        )

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks:
        """The Celery callback tasks and queues the tenant's runs may name."""
        return self.settings(tenant).callbacks

    def set_celery_callbacks(
        self, tenant: str, tasks: Iterable[str], queues: Iterable[str]
    ) -> CeleryCallbacks:
        """Allow exactly ``tasks`` and ``queues`` for the tenant's Celery callbacks; returns them
        sorted. Raises :class:`InvalidRequest` for a malformed or reserved name, or too many."""
        check_name("tenant", tenant)
        allowed_tasks, allowed_queues = sorted(set(tasks)), sorted(set(queues))
        for task in allowed_tasks:
            check_callback_task(task)
        for queue in allowed_queues:
            check_callback_queue(queue)
        if max(len(allowed_tasks), len(allowed_queues)) > MAX_TENANT_CALLBACKS:
            raise InvalidRequest(
                f"a tenant may be allowed at most {MAX_TENANT_CALLBACKS} callback tasks and as many queues"
            )
        key = self.keys.tenant(tenant)
        for field, names in (("callback_tasks", allowed_tasks), ("callback_queues", allowed_queues)):
            if names:
                self.redis.hset(key, field, json.dumps(names))
            else:
                self.redis.hdel(key, field)
        self.redis.sadd(self.keys.tenants(), tenant)
        return CeleryCallbacks(tuple(allowed_tasks), tuple(allowed_queues))

    def is_operator(self, tenant: str) -> bool:
        """Whether the tenant's keys see the whole pool (``GET /v1/pool``: worker hosts, every
        queue, pool-wide counts); never other tenants' runs."""
        return self.redis.hget(self.keys.tenant(tenant), "operator") in (b"1", "1")

    def set_operator(self, tenant: str, operator: bool) -> None:
        check_name("tenant", tenant)
        if operator:
            self.redis.hset(self.keys.tenant(tenant), "operator", "1")
            self.redis.sadd(self.keys.tenants(), tenant)
        else:
            self.redis.hdel(self.keys.tenant(tenant), "operator")

    def namespaces(self, tenant: str) -> tuple[str, ...]:
        """The queue namespaces the tenant's runs may name besides the default one (sorted)."""
        return _names_of(self.redis.hget(self.keys.tenant(tenant), "namespaces"))

    def set_namespaces(self, tenant: str, namespaces: Iterable[str]) -> tuple[str, ...]:
        """Allow exactly ``namespaces`` (besides the default one, always allowed); returns them
        sorted. Raises :class:`InvalidRequest` for a malformed name or too many."""
        check_name("tenant", tenant)
        allowed = sorted({name for raw in namespaces if (name := check_namespace(raw)) is not None})
        if len(allowed) > MAX_TENANT_NAMESPACES:
            raise InvalidRequest(
                f"a tenant may be allowed at most {MAX_TENANT_NAMESPACES} namespaces, not {len(allowed)}"
            )
        key = self.keys.tenant(tenant)
        if allowed:
            self.redis.hset(key, "namespaces", json.dumps(allowed))
        else:
            self.redis.hdel(key, "namespaces")
        self.redis.sadd(self.keys.tenants(), tenant)
        return tuple(allowed)

    def set_limits(self, tenant: str, limits: TenantLimits) -> None:
        check_name("tenant", tenant)
        self.redis.hset(self.keys.tenant(tenant), "limits", limits.model_dump_json())
        self.redis.sadd(self.keys.tenants(), tenant)

    def archive_retention(self) -> dict[str, float]:
        """Tenants whose archived runs are kept for their own number of days (0: forever)."""
        raw = self.redis.hgetall(self.keys.archive_retention())
        return {str(tenant): float(days) for tenant, days in raw.items()}

    def set_archive_retention(self, tenant: str, days: float | None) -> None:
        """Keep ``tenant``'s archived runs ``days`` days after they ended (0: forever); None: as
        every tenant's (``WESICHAIN_ARCHIVE_RETENTION_DAYS``)."""
        check_name("tenant", tenant)
        if days is None:
            self.redis.hdel(self.keys.archive_retention(), tenant)
            return
        if not 0 <= days <= 36_500:
            raise ValueError(f"an archive retention is 0 (forever) to 36500 days, got {days}")
        self.redis.hset(self.keys.archive_retention(), tenant, str(days))

    def default_callback(self, tenant: str) -> str | None:
        """The webhook URL of runs of this tenant that name no callback of their own."""
        raw = self.redis.hget(self.keys.tenant(tenant), "callback_url")
        return str(raw) if raw else None

    def set_default_callback(self, tenant: str, url: str | None) -> None:
        if url is None:
            self.redis.hdel(self.keys.tenant(tenant), "callback_url")
        else:
            self.redis.hset(self.keys.tenant(tenant), "callback_url", url)


def _names_of(raw: object) -> tuple[str, ...]:
    """An allow-list as stored (a JSON list of names; absent: none)."""
    if not raw:
        return ()
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return tuple(sorted(str(name) for name in json.loads(text)))


def live_record(raw: str | bytes | None) -> KeyRecord | None:
    """The key record stored as ``raw`` if the key is live; None if there is none or it is revoked."""
    if raw is None:
        return None
    record = KeyRecord.model_validate_json(raw)
    return record if record.revoked_at is None else None
