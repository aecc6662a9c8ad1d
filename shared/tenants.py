"""Tenants and their API keys, in Redis.

A tenant owns the runs started with its keys: it sees, follows, lists, cancels and approves only
those. Keys are shown once, when created, and stored only as their SHA-256 digest; a key's public
id is the start of that digest. Each tenant has a webhook signing secret (created on first use),
its limits, and the queue namespaces its runs may name besides the default one (none unless an
operator allows some), so one tenant cannot put work on the workers another team runs, and the
Celery tasks and queues its runs' completion callbacks may name (none unless an operator allows
some), so one tenant cannot send messages to queues or tasks it was not given; and the models its
requests may name for a run (none unless an operator allows some: its runs use the models of
their agents), so a tenant spends only the provider accounts, and sends its conversations only
under the terms, an operator chose for it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from pydantic import BaseModel, Field

from shared.errors import ConfigError, InvalidRequest
from shared.keys import Keys
from shared.llm.names import REACT_PREFIX, split_model_string
from shared.queues import check_namespace
from shared.request import MAX_NAME_CHARS, check_callback_queue, check_callback_task, check_name
from shared.state import RunHead
from shared.webhooks import new_secret

__all__ = [
    "KEY_PREFIX",
    "ANY_MODEL",
    "MAX_TENANT_CALLBACKS",
    "MAX_TENANT_MODELS",
    "MAX_TENANT_NAMESPACES",
    "CeleryCallbacks",
    "KeyRecord",
    "ModelNotAllowed",
    "NotAllowed",
    "TenantLimits",
    "TenantSettings",
    "Tenants",
    "check_callback_allowed",
    "check_copy_allowed",
    "check_tenant_name",
    "check_model_allowed",
    "check_models_allowed",
    "check_namespace_allowed",
    "digest",
    "live_record",
    "model_pattern",
]

KEY_PREFIX = "wsk_"
#: Queue namespaces one tenant may be allowed (the default namespace is always allowed besides).
MAX_TENANT_NAMESPACES = 100
#: Celery callback tasks, and queues, one tenant may be allowed (each).
MAX_TENANT_CALLBACKS = 100
#: Models (or ``PROVIDER:*`` patterns) one tenant may be allowed.
MAX_TENANT_MODELS = 100
#: The model part of an allowed pattern that stands for every model of its provider.
ANY_MODEL = "*"


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


#: What follows a tenant's name in the keys of its own records (``Keys.submits``, ``api_keys``,
#: ``rate``): no tenant's name may end in one after a ':'.
_KEY_TAILS = frozenset({"submits", "keys", "rate"})


def check_tenant_name(tenant: str) -> None:
    """Refuse (:class:`InvalidRequest`) a name no tenant's records may be kept under: not a name
    (``check_name``), or ending as another tenant's own records' keys do (``Keys.tenant`` of
    tenant ``acme:keys`` would be ``Keys.api_keys`` of tenant acme)."""
    check_name("tenant", tenant)
    tail = tenant.rsplit(":", 1)[-1]
    if ":" in tenant and tail in _KEY_TAILS:
        raise InvalidRequest(
            f"tenant {tenant[:80]!r} ends in ':{tail}', as the keys of another tenant's own records do"
        )


class TenantLimits(BaseModel):
    """What one tenant may do at once (answered with 429 past it)."""

    max_inflight: int = Field(default=1000, ge=1, description="Runs not ended yet.")
    submits_per_minute: int = Field(default=600, ge=1, description="New runs per minute.")
    max_memory_items: int = Field(
        default=10_000, ge=1, le=10_000_000, description="Items in its long-term memory."
    )
    max_assistant_bytes: int = Field(
        default=16 * 2**20,
        ge=1,
        le=2**34,
        description="Bytes its assistants' versions hold, a deleted assistant's kept versions included"
        " until they expire.",
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
    #: The models its requests may name for a run, ``PROVIDER:MODEL`` or ``PROVIDER:*`` (sorted;
    #: none: its runs use their agents' models).
    models: tuple[str, ...] = ()


class ModelNotAllowed(InvalidRequest):
    """A tenant's request names a model for a run (its own ``model``, or its assistant's) that
    the tenant is not allowed; ``details`` name the model and the tenant's allowed ones."""

    def __init__(self, tenant: str, model: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"tenant {tenant} may not name the model {model[:MAX_NAME_CHARS]!r}",
            model=model[:MAX_NAME_CHARS],
            allowed=list(allowed),
        )


class NotAllowed(InvalidRequest):
    """A tenant's new run would send work where the tenant may not: a queue namespace, or a Celery
    callback's task or queue, it was never allowed or was allowed once and no longer is (a retry,
    a fork or a bulk job copies those of a run made while they were). ``details`` name it and the
    allowed ones."""


def check_namespace_allowed(tenant: str, namespace: str | None, allowed: tuple[str, ...]) -> None:
    """Raise :class:`NotAllowed` unless the tenant may send a run to ``namespace`` (None: the
    default one, everyone's); ``allowed``: its allowed namespaces."""
    if namespace is not None and namespace not in allowed:
        raise NotAllowed(
            f"tenant {tenant} may not send runs to the queue namespace {namespace!r}",
            namespace=namespace,
            allowed=list(allowed),
        )


def check_callback_allowed(
    tenant: str, task: str | None, queue: str | None, allowed: CeleryCallbacks
) -> None:
    """Raise :class:`NotAllowed` unless the tenant may name the Celery callback ``task`` (None:
    none, or a webhook) on ``queue``. The queue is checked whatever the run's namespace: a callback
    queue is where the message lands, so it would be a way around the namespace allow-list."""
    if task is None:
        return
    if task not in allowed.tasks:
        raise NotAllowed(
            f"tenant {tenant} may not name the Celery callback task {task!r}",
            task=task,
            allowed=list(allowed.tasks),
        )
    if queue is not None and queue not in allowed.queues:
        raise NotAllowed(
            f"tenant {tenant} may not send callbacks to the queue {queue!r}",
            queue=queue,
            allowed=list(allowed.queues),
        )


def check_copy_allowed(
    source: RunHead, namespaces: tuple[str, ...], callbacks: CeleryCallbacks, *, callback: bool
) -> None:
    """Raise :class:`NotAllowed` unless a new run copied from ``source`` (a retry, which keeps its
    Celery callback: ``callback``; a fork, which does not) may still go where it went: what its
    tenant was allowed when it was made may have been taken back since. ``namespaces`` and
    ``callbacks``: what the tenant is allowed now."""
    if source.tenant is None:
        return
    check_namespace_allowed(source.tenant, source.namespace, namespaces)
    if callback and source.callback is not None:
        check_callback_allowed(source.tenant, source.callback.task, source.callback.queue, callbacks)


def _model_key(model: str) -> tuple[str, str] | None:
    """``model`` as the workers read it (``shared/llm/names.py``): its provider (lower case) and
    model, whatever the case of the provider, the spaces around them or a ReAct wrapper (the same
    model called through a text protocol); None if no worker could read it as a model."""
    if len(model) > MAX_NAME_CHARS:
        return None
    try:
        _, provider, name = split_model_string(model)
    except ConfigError:
        return None
    return provider, name


def model_pattern(raw: str) -> str:
    """An entry of a tenant's allowed models as stored: ``provider:MODEL`` or ``provider:*`` (the
    provider in lower case, as the workers read it). Raises :class:`InvalidRequest` for anything
    else: a ``*`` anywhere but as the whole model, a ReAct wrapper (allowing a model allows it
    wrapped too), an entry over ``MAX_NAME_CHARS``."""
    key = _model_key(raw) if not raw.strip().startswith(REACT_PREFIX) else None
    if key is None or not _PROVIDER.fullmatch(key[0]):
        raise InvalidRequest(
            f"an allowed model is PROVIDER:MODEL or PROVIDER:{ANY_MODEL} (at most {MAX_NAME_CHARS}"
            f" chars, no {REACT_PREFIX!r}), got {raw[:80]!r}"
        )
    provider, name = key
    if ANY_MODEL in name and name != ANY_MODEL:
        raise InvalidRequest(
            f"only a whole model may be {ANY_MODEL!r} (PROVIDER:{ANY_MODEL}), got {raw[:80]!r}"
        )
    return f"{provider}:{name}"


def check_model_allowed(tenant: str, model: str, allowed: tuple[str, ...]) -> None:
    """Raise :class:`ModelNotAllowed` unless ``model`` is one of ``allowed`` (entries of
    :func:`model_pattern`) as the workers read it. A ``*`` the request names is a model name like
    any other: only an allowed entry is a pattern."""
    key = _model_key(model)
    if key is None or not allowed:
        raise ModelNotAllowed(tenant, model, allowed)
    provider, name = key
    if f"{provider}:{name}" not in allowed and f"{provider}:{ANY_MODEL}" not in allowed:
        raise ModelNotAllowed(tenant, model, allowed)


def check_models_allowed(tenant: str | None, allowed: tuple[str, ...] | None, *named: str | None) -> None:
    """:func:`check_model_allowed` for each model a tenant's new run would name (its own, its
    assistant version's); None (no tenant, or no list: the operator's) allows any. An empty model
    names none: a stored request without an override has ``""``."""
    if allowed is None or tenant is None:
        return
    for model in named:
        if model:
            check_model_allowed(tenant, model, allowed)


#: A provider's name in an allowed model (the providers' names and a caller's own, in lower case).
_PROVIDER = re.compile(r"[a-z0-9][a-z0-9_.-]{0,47}")


class Tenants:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys

    def create_key(self, tenant: str, name: str = "") -> tuple[str, KeyRecord]:
        """A new key for ``tenant`` (the tenant is created with it): the key, shown once, and its record."""
        check_tenant_name(tenant)
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
        check_tenant_name(tenant)
        key = self.keys.tenant(tenant)
        self.redis.hsetnx(key, "webhook_secret", new_secret())
        return str(self.redis.hget(key, "webhook_secret"))

    def limits(self, tenant: str | None) -> TenantLimits:
        """The tenant's limits (the defaults for runs without a tenant, whose owner sets none)."""
        if tenant is None:
            return TenantLimits()
        raw = self.redis.hget(self.keys.tenant(tenant), "limits")
        return TenantLimits.model_validate_json(raw) if raw else TenantLimits()

    def settings(self, tenant: str) -> TenantSettings:
        """The tenant's limits, default webhook URL and allow-lists, in one read."""
        raw_limits, callback, raw_namespaces, raw_tasks, raw_queues, raw_models = self.redis.hmget(
            self.keys.tenant(tenant),
            "limits",
            "callback_url",
            "namespaces",
            "callback_tasks",
            "callback_queues",
            "models",
        )
        return TenantSettings(
            limits=TenantLimits.model_validate_json(raw_limits) if raw_limits else TenantLimits(),
            default_callback=str(callback) if callback else None,
            namespaces=_names_of(raw_namespaces),
            callbacks=CeleryCallbacks(_names_of(raw_tasks), _names_of(raw_queues)),
            models=_names_of(raw_models),
        )

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks:
        """The Celery callback tasks and queues the tenant's runs may name."""
        return self.settings(tenant).callbacks

    def set_celery_callbacks(
        self, tenant: str, tasks: Iterable[str], queues: Iterable[str]
    ) -> CeleryCallbacks:
        """Allow exactly ``tasks`` and ``queues`` for the tenant's Celery callbacks; returns them
        sorted. Raises :class:`InvalidRequest` for a malformed or reserved name, or too many."""
        check_tenant_name(tenant)
        allowed_tasks, allowed_queues = sorted(set(tasks)), sorted(set(queues))
        for task in allowed_tasks:
            check_callback_task(task)
        for queue in allowed_queues:
            check_callback_queue(queue)
        if max(len(allowed_tasks), len(allowed_queues)) > MAX_TENANT_CALLBACKS:
            raise InvalidRequest(
                f"a tenant may be allowed at most {MAX_TENANT_CALLBACKS} callback tasks and as many queues"
            )
        self._set_allowed(tenant, "callback_tasks", allowed_tasks)
        self._set_allowed(tenant, "callback_queues", allowed_queues)
        return CeleryCallbacks(tuple(allowed_tasks), tuple(allowed_queues))

    def is_operator(self, tenant: str) -> bool:
        """Whether the tenant's keys see the whole pool (``GET /v1/pool``: worker hosts, every
        queue, pool-wide counts); never other tenants' runs."""
        return self.redis.hget(self.keys.tenant(tenant), "operator") in (b"1", "1")

    def set_operator(self, tenant: str, operator: bool) -> None:
        check_tenant_name(tenant)
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
        check_tenant_name(tenant)
        allowed = sorted({name for raw in namespaces if (name := check_namespace(raw)) is not None})
        if len(allowed) > MAX_TENANT_NAMESPACES:
            raise InvalidRequest(
                f"a tenant may be allowed at most {MAX_TENANT_NAMESPACES} namespaces, not {len(allowed)}"
            )
        self._set_allowed(tenant, "namespaces", allowed)
        return tuple(allowed)

    def models(self, tenant: str) -> tuple[str, ...]:
        """The models the tenant's requests may name for a run (sorted; none: their agents')."""
        return _names_of(self.redis.hget(self.keys.tenant(tenant), "models"))

    def set_models(self, tenant: str, models: Iterable[str]) -> tuple[str, ...]:
        """Allow exactly ``models`` (``PROVIDER:MODEL`` or ``PROVIDER:*``); returns them as stored,
        sorted. Raises :class:`InvalidRequest` for a malformed entry or too many."""
        check_tenant_name(tenant)
        allowed = sorted({model_pattern(raw) for raw in models})
        if len(allowed) > MAX_TENANT_MODELS:
            raise InvalidRequest(
                f"a tenant may be allowed at most {MAX_TENANT_MODELS} models, not {len(allowed)}"
            )
        self._set_allowed(tenant, "models", allowed)
        return tuple(allowed)

    def _set_allowed(self, tenant: str, field: str, names: list[str]) -> None:
        """Store one of the tenant's allow-lists (none: the field goes, and nothing is allowed)."""
        key = self.keys.tenant(tenant)
        if names:
            self.redis.hset(key, field, json.dumps(names))
        else:
            self.redis.hdel(key, field)
        self.redis.sadd(self.keys.tenants(), tenant)

    def set_limits(self, tenant: str, limits: TenantLimits) -> None:
        check_tenant_name(tenant)
        self.redis.hset(self.keys.tenant(tenant), "limits", limits.model_dump_json())
        self.redis.sadd(self.keys.tenants(), tenant)

    def archive_retention(self) -> dict[str, float]:
        """Tenants whose archived runs are kept for their own number of days (0: forever)."""
        raw = self.redis.hgetall(self.keys.archive_retention())
        return {str(tenant): float(days) for tenant, days in raw.items()}

    def set_archive_retention(self, tenant: str, days: float | None) -> None:
        """Keep ``tenant``'s archived runs ``days`` days after they ended (0: forever); None: as
        every tenant's (``WESICHAIN_ARCHIVE_RETENTION_DAYS``)."""
        check_tenant_name(tenant)
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
        check_tenant_name(tenant)
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
