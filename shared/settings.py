"""Settings, resolved once per process from arguments and the environment, then passed down."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from shared.errors import ConfigError
from shared.limits import ProviderLimit, parse_limits
from shared.llm.settings import LlmSettings

__all__ = [
    "DEFAULT_AGENTS_MODULE",
    "ENV_AGENTS",
    "ENV_ARCHIVE_AFTER",
    "ENV_ARCHIVE_BATCH",
    "ENV_ARCHIVE_INTERVAL",
    "ENV_ARCHIVE_RETENTION",
    "ENV_ARCHIVE_URL",
    "ENV_BROKER_HEARTBEAT",
    "ENV_BROKER_OPTIONS",
    "ENV_CLAIM_WAIT_MS",
    "ENV_COMMIT_PUBLISH",
    "ENV_BROKER_PREFIX",
    "ENV_BROKER_URL",
    "ENV_HOOKS",
    "ENV_LEASE",
    "ENV_WORKER_LEASE",
    "ENV_LOGLEVEL",
    "ENV_LOG_FORMAT",
    "ENV_MAX_ATTEMPTS",
    "ENV_METRICS_PORT",
    "ENV_OTEL",
    "ENV_PROVIDER_LIMITS",
    "ENV_SUBMIT_MEMORY",
    "ENV_PREFIX",
    "ENV_QUEUED_LEASE",
    "ENV_REDIS_CA_FILE",
    "ENV_REDIS_CERT_FILE",
    "ENV_REDIS_KEY_FILE",
    "ENV_REDIS_CLUSTER",
    "ENV_REDIS_TLS_INSECURE",
    "ENV_REDIS_URL",
    "ENV_SEARCH_ATTRIBUTES",
    "ENV_MEMORY_EMBEDDING",
    "ENV_SHARDS",
    "ENV_SWEEPER",
    "ENV_SWEEPER_SCHEDULES",
    "ENV_TASK_EVENTS",
    "ENV_WEBHOOK_ALLOW_PRIVATE",
    "ENV_WEBHOOK_RETRY",
    "ENV_WEBHOOK_SECRET",
    "ENV_WORKER_NAME",
    "Limits",
    "QUEUE_CALLBACKS",
    "QUEUE_MODEL",
    "QUEUE_TOOLS",
    "MAX_SEARCH_ATTRIBUTES",
    "SEARCH_KEY_PATTERN",
    "Settings",
    "celery_config",
    "redact_url",
]

ENV_REDIS_URL = "WESICHAIN_REDIS_URL"
ENV_REDIS_CLUSTER = "WESICHAIN_REDIS_CLUSTER"
ENV_AGENTS = "WESICHAIN_AGENTS"
ENV_PREFIX = "WESICHAIN_PREFIX"
ENV_LEASE = "WESICHAIN_LEASE_S"
ENV_QUEUED_LEASE = "WESICHAIN_QUEUED_LEASE_S"
ENV_WORKER_LEASE = "WESICHAIN_WORKER_LEASE_S"
ENV_MAX_ATTEMPTS = "WESICHAIN_MAX_PHASE_ATTEMPTS"
ENV_TASK_EVENTS = "WESICHAIN_TASK_EVENTS"
ENV_SHARDS = "WESICHAIN_SHARDS"
ENV_HOOKS = "WESICHAIN_HOOKS"
ENV_SWEEPER = "WESICHAIN_SWEEPER"
ENV_SWEEPER_SCHEDULES = "WESICHAIN_SWEEPER_SCHEDULES"
ENV_WORKER_NAME = "WESICHAIN_WORKER_NAME"
ENV_LOGLEVEL = "WESICHAIN_LOGLEVEL"
ENV_BROKER_PREFIX = "WESICHAIN_BROKER_PREFIX"
ENV_BROKER_OPTIONS = "WESICHAIN_BROKER_TRANSPORT_OPTIONS"
ENV_WEBHOOK_SECRET = "WESICHAIN_WEBHOOK_SECRET"
ENV_WEBHOOK_ALLOW_PRIVATE = "WESICHAIN_WEBHOOK_ALLOW_PRIVATE"
ENV_WEBHOOK_RETRY = "WESICHAIN_WEBHOOK_RETRY_S"
ENV_REDIS_CA_FILE = "WESICHAIN_REDIS_CA_FILE"
ENV_REDIS_CERT_FILE = "WESICHAIN_REDIS_CERT_FILE"
ENV_REDIS_KEY_FILE = "WESICHAIN_REDIS_KEY_FILE"
ENV_REDIS_TLS_INSECURE = "WESICHAIN_REDIS_TLS_INSECURE"
ENV_PROVIDER_LIMITS = "WESICHAIN_PROVIDER_LIMITS"
ENV_METRICS_PORT = "WESICHAIN_METRICS_PORT"
ENV_LOG_FORMAT = "WESICHAIN_LOG_FORMAT"
ENV_OTEL = "WESICHAIN_OTEL"
ENV_SUBMIT_MEMORY = "WESICHAIN_SUBMIT_MAX_MEMORY"
ENV_COMMIT_PUBLISH = "WESICHAIN_COMMIT_PUBLISH"
ENV_CLAIM_WAIT_MS = "WESICHAIN_CLAIM_WAIT_MS"
ENV_BROKER_URL = "WESICHAIN_BROKER_URL"
ENV_BROKER_HEARTBEAT = "WESICHAIN_BROKER_HEARTBEAT_S"
ENV_ARCHIVE_URL = "WESICHAIN_ARCHIVE_URL"
ENV_ARCHIVE_AFTER = "WESICHAIN_ARCHIVE_AFTER_S"
ENV_ARCHIVE_BATCH = "WESICHAIN_ARCHIVE_BATCH"
ENV_ARCHIVE_INTERVAL = "WESICHAIN_ARCHIVE_INTERVAL_S"
ENV_ARCHIVE_RETENTION = "WESICHAIN_ARCHIVE_RETENTION_DAYS"
ENV_SEARCH_ATTRIBUTES = "WESICHAIN_SEARCH_ATTRIBUTES"
ENV_MEMORY_EMBEDDING = "WESICHAIN_MEMORY_EMBEDDING"

#: A metadata key an operator may declare searchable (``shared/search.py``).
SEARCH_KEY_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
#: Metadata keys that may be declared searchable: each is one more index entry per run created.
MAX_SEARCH_ATTRIBUTES = 20

DEFAULT_AGENTS_MODULE = "shared.examples.research"

QUEUE_MODEL = "wesichain.model"
QUEUE_TOOLS = "wesichain.tools"
#: Completion callbacks (webhooks, Celery tasks): I/O bound, like model calls.
QUEUE_CALLBACKS = "wesichain.callbacks"


@dataclass(frozen=True)
class Limits:
    """Every size the runtime accepts is bounded here."""

    max_input_chars: int = 32_000
    max_message_chars: int = 64_000
    max_tool_output_chars: int = 32_000
    max_tool_calls_per_step: int = 32
    max_event_payload_chars: int = 16_000
    max_metadata_chars: int = 8_000
    events_maxlen: int = 10_000
    #: A tool's custom event (``ctx.emit``): its data as JSON, at most this many bytes (UTF-8).
    max_custom_event_bytes: int = 8_192
    #: Custom events one delivery of a call may append; the rest are dropped and counted.
    max_custom_events_per_call: int = 500
    #: Their rate, per delivery of a call: a token bucket this many per second, bursts of twice it.
    custom_events_per_s: float = 20.0


@dataclass(frozen=True)
class Settings:
    #: ``redis://``, ``rediss://`` (TLS, the server's certificate always verified unless
    #: ``redis_tls_insecure``) or ``memory://`` (embedded). A ``rediss://`` URL may carry the
    #: redis-py/kombu query parameters ``ssl_ca_certs``, ``ssl_certfile`` and ``ssl_keyfile``
    #: instead of the three file settings below (and ``ssl_cert_reqs=required``,
    #: ``ssl_check_hostname=true``, which change nothing).
    """Everything a process of the runtime is configured with, resolved once (``from_env``)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    #: ``WESICHAIN_REDIS_CLUSTER=1``: the run state is a Redis Cluster, ``redis_url`` one of its
    #: nodes (redis-py's ``RedisCluster.from_url`` convention: the client learns the others from
    #: it). Needs ``broker_url``: Celery's Redis transport cannot use a cluster as its broker.
    redis_cluster: bool = False
    #: ``WESICHAIN_CLAIM_WAIT_MS``: on a Redis Cluster, the claim of a non-retry-safe tool call is
    #: acknowledged by a replica (``WAIT 1``) before the tool runs, waiting at most this long (0:
    #: never wait). Replication is asynchronous: without it, a primary killed right after the
    #: claim could take the claim with it, and the promoted replica would let the call run again.
    claim_wait_ms: int = 500
    prefix: str = "wesichain:"
    agents_module: str = DEFAULT_AGENTS_MODULE
    #: A claimed phase must renew its lease within this; the sweeper recovers it after.
    lease_s: float = 10.0
    #: A prefork worker's main process says every quarter of this that it is alive and which claims
    #: its pool processes hold; once it has not for this long (by Redis's clock), the sweeper hands
    #: those claims on without waiting for their leases (``shared/liveness.py``).
    worker_lease_s: float = 2.0
    #: How long a committed next phase may wait in the queue before the sweeper re-publishes it
    #: (covers a message lost between broker pop and delivery, and a crash before publish).
    queued_lease_s: float = 30.0
    #: How often the sweeper looks for expired leases.
    sweep_interval_s: float = 1.0
    #: Deliveries of one (run, step, phase) that may start work before the run is failed as poison.
    max_phase_attempts: int = 5
    #: How long a terminal run's keys are kept.
    retention_s: int = 7 * 24 * 3600
    #: Celery task events (for Flower). Off by default: they cost a third of a worker's CPU per
    #: task, and Flower switches worker events on by itself while it runs (its enable_events).
    task_events: bool = False
    #: Celery broker visibility timeout: above the longest phase; recovery uses leases instead.
    visibility_timeout_s: int = 3600
    #: Longest wait between two checks that a queued phase's message is still in the broker (the
    #: wait doubles from ``queued_lease_s`` up to this while a backlog lasts).
    max_queued_check_s: float = 300.0
    #: How often each worker writes its record to the worker registry (what it serves, whether
    #: it consumes); a worker is live while its last record is at most three intervals old.
    registry_interval_s: float = 2.0
    #: Shards of the run key space (see ``shared/keys.py``): fixed for the life of a deployment.
    shards: int = 16
    #: ``module:Class`` of the worker's hooks (``worker.hooks.Hooks``); empty = none.
    hooks: str = ""
    #: Every worker's main process runs a sweeper (one sweeps at a time); off for a worker that
    #: must never sweep.
    sweeper: bool = True
    #: ``wesichain sweeper`` also fires the schedules' due ticks (as ``wesichain scheduler`` does).
    sweeper_schedules: bool = False
    #: This process's name in events and in the worker registry (default: the host name).
    worker_name: str = ""
    #: Log level of the embedded worker.
    loglevel: str = "WARNING"
    #: kombu's ``global_keyprefix`` for the broker's keys; empty (the default) so that any plain
    #: Celery app with the broker URL reaches the workers' queues.
    broker_prefix: str = ""
    #: Extra options for the broker's transport (kombu's ``broker_transport_options``), JSON in
    #: ``WESICHAIN_BROKER_TRANSPORT_OPTIONS``; they win over the runtime's own.
    broker_options: dict[str, Any] = field(default_factory=dict)
    #: RabbitMQ: the AMQP heartbeat the worker asks for (the broker may lower it; 0: none). A
    #: connection that hears nothing from the broker for one heartbeat marks the worker deaf in
    #: the registry; Celery gives the connection up after two.
    broker_heartbeat_s: float = 60.0
    #: ``WESICHAIN_REDIS_CA_FILE``: PEM file of the CA(s) a ``rediss://`` server's certificate must
    #: chain to, for a private CA; None trusts the system's CAs. Store and broker both use it.
    redis_ca_file: str | None = None
    #: ``WESICHAIN_REDIS_CERT_FILE``: PEM client certificate for mutual TLS (may hold the key too).
    redis_cert_file: str | None = None
    #: ``WESICHAIN_REDIS_KEY_FILE``: its private key (unencrypted PEM); needs the certificate.
    redis_key_file: str | None = None
    #: ``WESICHAIN_REDIS_TLS_INSECURE=1``: encrypt but do NOT verify the server's certificate or
    #: host name (anyone on the path can impersonate Redis). Never the default; logged as a warning.
    redis_tls_insecure: bool = False
    #: Signs the webhooks of runs without a tenant (``whsec_...``; tenants have their own).
    webhook_secret: str = field(default="", repr=False)
    #: Deliver webhooks to loopback, private and link-local addresses too (tests, private networks).
    webhook_allow_private: bool = False
    #: Seconds before each further delivery attempt of a callback; its length bounds the attempts.
    webhook_retry_s: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0, 600.0, 1800.0)
    #: How long one webhook delivery may take.
    webhook_timeout_s: float = 10.0
    #: Provider rate limits shared by the pool, by model pattern (``provider:model``,
    #: ``provider:*``, ``*``); JSON in ``WESICHAIN_PROVIDER_LIMITS`` (see ``shared/limits.py``).
    provider_limits: dict[str, ProviderLimit] = field(default_factory=dict)
    #: ``WESICHAIN_METRICS_PORT``: a worker serves Prometheus metrics on this port (0: none).
    metrics_port: int = 0
    #: ``WESICHAIN_LOG_FORMAT``: ``text`` (the default) or ``json`` (one object per line, with the
    #: run, step, phase, task, worker and tenant of the phase that logged it).
    log_format: str = "text"
    #: ``WESICHAIN_OTEL=1``: OpenTelemetry spans per phase, model call and tool call (needs the
    #: ``otel`` extra; exported as the OpenTelemetry SDK's own environment variables say).
    otel: bool = False
    #: ``WESICHAIN_SUBMIT_MAX_MEMORY``: refuse new runs once Redis uses this fraction of its
    #: ``maxmemory``, keeping the rest for the runs already going (0 < x <= 1).
    submit_max_memory: float = 0.9
    #: ``WESICHAIN_COMMIT_PUBLISH``: with a Redis broker on the store's server, the commit script
    #: pushes the next phase's Celery message itself (one round trip, no commit/publish gap), and
    #: the client's create script a new run's start message. ``0`` commits (creates), then
    #: publishes, leaving the gap to the outbox and the sweeper.
    commit_publish: bool = True
    #: ``WESICHAIN_BROKER_URL`` / ``--broker``: an ``amqp://`` (or ``amqps://``) RabbitMQ, or a
    #: ``redis://`` (``rediss://``) standalone Redis other than the run state's, as the broker; empty
    #: (the default): the run state's Redis. A Redis Cluster run state needs one of the two.
    broker_url: str = field(default="", repr=False)
    #: ``WESICHAIN_ARCHIVE_URL``: where finished runs are moved out of Redis (``postgresql://...``
    #: or ``sqlite:///path``); empty: no archive, ended runs live in Redis for ``retention_s``.
    archive_url: str = field(default="", repr=False)
    #: ``WESICHAIN_ARCHIVE_AFTER_S``: a run is archived once it ended this long ago.
    archive_after_s: float = 300.0
    #: ``WESICHAIN_ARCHIVE_BATCH``: runs written to the archive per transaction.
    archive_batch: int = 500
    #: ``WESICHAIN_ARCHIVE_INTERVAL_S``: how often the beat schedule sends the archiving task.
    archive_interval_s: float = 30.0
    #: ``WESICHAIN_ARCHIVE_RETENTION_DAYS``: archived runs are deleted (audited) this many days
    #: after they ended; 0 keeps them forever. A tenant may have its own (``Tenants``).
    archive_retention_days: float = 0.0
    #: ``WESICHAIN_SEARCH_ATTRIBUTES``: the metadata keys runs are indexed by, comma-separated
    #: (``shared/search.py``); a search may filter on these only. Every process that creates runs
    #: (the API, clients, workers starting child runs) must be given the same list.
    search_attributes: tuple[str, ...] = ()
    #: ``WESICHAIN_MEMORY_EMBEDDING``: ``package.module:function`` embedding texts for semantic
    #: memory search (``shared/embedding.py``); empty: text search only. Give it to the workers and
    #: to the API process alike.
    memory_embedding: str = ""
    limits: Limits = field(default_factory=Limits)
    #: How workers call model providers (timeouts, retries, scripted model files).
    llm: LlmSettings = field(default_factory=LlmSettings)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Settings from the environment (the variables named in this module), then ``overrides``."""
        values: dict[str, Any] = {}
        for env, name, parse in _ENVIRONMENT:
            raw = os.environ.get(env)
            if raw:
                values[name] = parse(env, raw)
        values["llm"] = LlmSettings.from_env(os.environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def validate(self) -> None:
        parts = urlsplit(self.redis_url)
        if parts.scheme not in ("redis", "rediss", "memory"):
            raise ConfigError(
                "Redis URL must start with redis://, rediss:// or memory://,"
                f" got {redact_url(self.redis_url)!r}"
            )
        if parts.scheme != "memory" and not parts.hostname:
            raise ConfigError(f"Redis URL has no host: {redact_url(self.redis_url)!r}")
        self._validate_broker()
        self._validate_cluster()
        if self.lease_s <= 0 or self.queued_lease_s <= 0 or self.max_phase_attempts < 1:
            raise ConfigError("lease_s and queued_lease_s must be > 0 and max_phase_attempts >= 1")
        if self.worker_lease_s <= 0:
            raise ConfigError(f"{ENV_WORKER_LEASE} must be > 0")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"{ENV_LOG_FORMAT}={self.log_format!r}: use text or json")
        if not 0 < self.submit_max_memory <= 1:
            raise ConfigError(f"{ENV_SUBMIT_MEMORY}={self.submit_max_memory}: must be in (0, 1]")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"{ENV_METRICS_PORT}={self.metrics_port}: not a port")
        if self.archive_url and urlsplit(self.archive_url).scheme not in _ARCHIVE_SCHEMES:
            raise ConfigError(
                f"{ENV_ARCHIVE_URL} must start with postgresql:// or sqlite:///,"
                f" got {redact_url(self.archive_url)!r}"
            )
        if not 0 <= self.archive_retention_days <= 36_500:
            raise ConfigError(f"{ENV_ARCHIVE_RETENTION} must be in 0..36500 (0: keep forever)")
        if self.archive_after_s < 0 or self.archive_interval_s <= 0 or not 1 <= self.archive_batch <= 5_000:
            raise ConfigError(
                f"{ENV_ARCHIVE_AFTER} must be >= 0, {ENV_ARCHIVE_INTERVAL} > 0 and {ENV_ARCHIVE_BATCH}"
                " in 1..5000"
            )
        if not 0 <= self.claim_wait_ms <= 60_000:
            raise ConfigError(f"{ENV_CLAIM_WAIT_MS}={self.claim_wait_ms}: must be in 0..60000")
        if not 1 <= self.shards <= 1024:
            raise ConfigError(f"{ENV_SHARDS}={self.shards}: shards must be in 1..1024")
        from shared.tls import endpoint  # shared.tls builds on this module

        endpoint(self)  # TLS files exist and load, the URL's TLS parameters are consistent

    def _validate_broker(self) -> None:
        if not self.broker_url:
            return
        broker = urlsplit(self.broker_url)
        if broker.scheme not in _BROKER_SCHEMES or not broker.hostname:
            raise ConfigError(
                f"{ENV_BROKER_URL} must be an amqp://, amqps://, redis:// or rediss:// URL with a host,"
                f" got {redact_url(self.broker_url)!r}"
            )
        if self.embedded:
            raise ConfigError(f"{ENV_BROKER_URL} cannot be used in the embedded mode")
        if not 0 <= self.broker_heartbeat_s <= 3600:
            raise ConfigError(
                f"{ENV_BROKER_HEARTBEAT}={self.broker_heartbeat_s}: must be in 0..3600 (0: none)"
            )

    def _validate_cluster(self) -> None:
        if not self.redis_cluster:
            return
        if self.embedded:
            raise ConfigError(f"{ENV_REDIS_CLUSTER}=1 cannot be used in the embedded mode (memory://)")
        if not self.broker_url:
            raise ConfigError(
                f"{ENV_REDIS_CLUSTER}=1 needs {ENV_BROKER_URL}: Celery's Redis transport cannot use a"
                " Redis Cluster as its broker; give RabbitMQ (amqp://...) or a standalone Redis"
                " (redis://...)"
            )
        database = urlsplit(self.redis_url).path.strip("/")
        if database not in ("", "0"):
            raise ConfigError(
                f"a Redis Cluster has only database 0, the Redis URL names {database!r}:"
                f" {redact_url(self.redis_url)!r}"
            )

    @property
    def embedded(self) -> bool:
        return self.redis_url.startswith("memory://")

    @property
    def broker_is_redis(self) -> bool:
        """The broker is Celery's Redis transport (the run state's server, or ``broker_url``'s)."""
        if self.embedded:
            return False
        return not self.broker_url or self.broker_url.startswith(("redis:", "rediss:"))

    def broker_endpoint(self) -> Settings:
        """These settings with the broker's Redis URL as ``redis_url`` (its TLS files are the same),
        so that :func:`shared.tls.endpoint` and :func:`shared.redis_client.connect` reach the broker."""
        if not self.broker_is_redis:
            raise ConfigError("the broker is not a Redis")
        if not self.broker_url:
            return self
        return replace(self, redis_url=self.broker_url, redis_cluster=False, broker_url="")


_ARCHIVE_SCHEMES = ("postgresql", "postgres", "sqlite")
_BROKER_SCHEMES = ("amqp", "amqps", "redis", "rediss")


def _text(env: str, raw: str) -> str:
    return raw


def _number(kind: type[int] | type[float]) -> Any:
    def parse(env: str, raw: str) -> int | float:
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"{env}={raw!r} is not a valid {kind.__name__}") from None

    return parse


def _seconds_list(env: str, raw: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in raw.split(","))
    except ValueError:
        raise ConfigError(f"{env}={raw!r} is not a comma-separated list of seconds") from None
    if not values or any(v < 0 or v > 3000 for v in values):
        raise ConfigError(f"{env}: each wait must be in 0..3000 s (below the broker's visibility timeout)")
    return values


def _json_object(env: str, raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{env} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{env} must be a JSON object")
    return value


def _search_attributes(env: str, raw: str) -> tuple[str, ...]:
    keys = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    bad = [key for key in keys if not re.match(SEARCH_KEY_PATTERN, key)]
    if bad:
        raise ConfigError(
            f"{env}: {', '.join(repr(k[:80]) for k in bad)} not a metadata key (a letter, then up to 63"
            " letters, digits and . _ -)"
        )
    if len(keys) > MAX_SEARCH_ATTRIBUTES:
        raise ConfigError(f"{env}: at most {MAX_SEARCH_ATTRIBUTES} keys, got {len(keys)}")
    return keys


def _provider_limits(env: str, raw: str) -> dict[str, ProviderLimit]:
    return parse_limits(_json_object(env, raw), env)


def _parse_switch(env: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{env}={raw!r} is not a valid switch (use 1 or 0)")


#: Every variable ``Settings.from_env`` reads: (variable, field, parser).
_ENVIRONMENT: tuple[tuple[str, str, Any], ...] = (
    (ENV_REDIS_URL, "redis_url", _text),
    (ENV_REDIS_CLUSTER, "redis_cluster", _parse_switch),
    (ENV_AGENTS, "agents_module", _text),
    (ENV_PREFIX, "prefix", _text),
    (ENV_TASK_EVENTS, "task_events", _parse_switch),
    (ENV_REDIS_CA_FILE, "redis_ca_file", _text),
    (ENV_REDIS_CERT_FILE, "redis_cert_file", _text),
    (ENV_REDIS_KEY_FILE, "redis_key_file", _text),
    (ENV_REDIS_TLS_INSECURE, "redis_tls_insecure", _parse_switch),
    (ENV_HOOKS, "hooks", _text),
    (ENV_WORKER_NAME, "worker_name", _text),
    (ENV_LOGLEVEL, "loglevel", _text),
    (ENV_BROKER_PREFIX, "broker_prefix", _text),
    (ENV_BROKER_OPTIONS, "broker_options", _json_object),
    (ENV_SWEEPER, "sweeper", _parse_switch),
    (ENV_SWEEPER_SCHEDULES, "sweeper_schedules", _parse_switch),
    (ENV_WEBHOOK_SECRET, "webhook_secret", _text),
    (ENV_WEBHOOK_ALLOW_PRIVATE, "webhook_allow_private", _parse_switch),
    (ENV_WEBHOOK_RETRY, "webhook_retry_s", _seconds_list),
    (ENV_LEASE, "lease_s", _number(float)),
    (ENV_WORKER_LEASE, "worker_lease_s", _number(float)),
    (ENV_QUEUED_LEASE, "queued_lease_s", _number(float)),
    (ENV_MAX_ATTEMPTS, "max_phase_attempts", _number(int)),
    (ENV_SHARDS, "shards", _number(int)),
    (ENV_PROVIDER_LIMITS, "provider_limits", _provider_limits),
    (ENV_METRICS_PORT, "metrics_port", _number(int)),
    (ENV_LOG_FORMAT, "log_format", _text),
    (ENV_OTEL, "otel", _parse_switch),
    (ENV_SUBMIT_MEMORY, "submit_max_memory", _number(float)),
    (ENV_COMMIT_PUBLISH, "commit_publish", _parse_switch),
    (ENV_CLAIM_WAIT_MS, "claim_wait_ms", _number(int)),
    (ENV_BROKER_URL, "broker_url", _text),
    (ENV_BROKER_HEARTBEAT, "broker_heartbeat_s", _number(float)),
    (ENV_ARCHIVE_URL, "archive_url", _text),
    (ENV_ARCHIVE_AFTER, "archive_after_s", _number(float)),
    (ENV_ARCHIVE_BATCH, "archive_batch", _number(int)),
    (ENV_ARCHIVE_INTERVAL, "archive_interval_s", _number(float)),
    (ENV_ARCHIVE_RETENTION, "archive_retention_days", _number(float)),
    (ENV_SEARCH_ATTRIBUTES, "search_attributes", _search_attributes),
    (ENV_MEMORY_EMBEDDING, "memory_embedding", _text),
)


def redact_url(url: str) -> str:
    """A URL safe to print: the password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return parts._replace(netloc=netloc).geturl()


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration shared by workers and producers (a plain dict: no Celery import).

    Reliability settings follow the measured behaviour of Celery 5.7 + Redis: late acks and
    prefetch 1 so a message is acked only after its phase committed; reject/retry on worker loss
    so a dead prefork child's task comes back quickly; JSON only; no result backend, since the
    run state lives in our own keys.
    """
    from shared.tls import endpoint  # shared.tls builds on this module

    broker_use_ssl: dict[str, Any] | bool = False
    queues: dict[str, Any] = {}
    transport_options: dict[str, Any]
    if settings.broker_url and not settings.broker_is_redis:
        # RabbitMQ: quorum queues (replicated, durable), publisher confirms (a publish returns once
        # the broker took the message), topic exchanges so that countdowns use RabbitMQ's native
        # delayed delivery instead of holding the message in a worker.
        broker = settings.broker_url
        broker_use_ssl = settings.broker_url.startswith("amqps://")
        transport_options = {"confirm_publish": True, "connect_timeout": 5}
        transport_options.update(settings.broker_options)
        queues = {
            "broker_heartbeat": settings.broker_heartbeat_s,
            "task_default_queue_type": "quorum",
            "task_create_missing_queue_type": "quorum",
            "task_default_exchange_type": "topic",
            "task_create_missing_queue_exchange_type": "topic",
        }
    elif settings.embedded:
        broker = "memory://localhost/"
        transport_options = {"polling_interval": 0.005}
    else:
        # With rediss://, explicit TLS parameters: given none, kombu would connect with
        # ssl_cert_reqs=CERT_NONE. The URL loses its ssl_* parameters, which would override these.
        target = endpoint(settings.broker_endpoint())
        broker = target.url
        if target.tls is not None:
            broker_use_ssl = target.tls.options()
        transport_options = {
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": 5,
            "unacked_restore_throttle": 1,
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "health_check_interval": 25,
            # No retry_on_timeout: with it, redis-py silently reconnects a connection kombu is
            # polling (BRPOP, pub/sub) after a reset, kombu never learns it lost the connection,
            # and the worker stays up without ever consuming again. Without it the error reaches
            # Celery's consumer, which reconnects everything within a second.
        }
        if settings.broker_prefix:
            transport_options["global_keyprefix"] = settings.broker_prefix
        transport_options.update(settings.broker_options)
    return {
        "broker_url": broker,
        "broker_use_ssl": broker_use_ssl,
        "broker_transport_options": transport_options,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_reject_on_worker_lost": True,
        "task_retry_on_worker_lost": True,
        # Retries on worker loss are delayed by this ETA; it must stay far below the visibility timeout.
        "task_annotations": {"*": {"default_retry_delay": 1, "max_retries": 3}},
        "task_acks_on_failure": True,
        "task_routes": {
            "wesichain.tool": {"queue": QUEUE_TOOLS},
            "wesichain.callback": {"queue": QUEUE_CALLBACKS},
            "wesichain.*": {"queue": QUEUE_MODEL},
        },
        "task_default_queue": QUEUE_MODEL,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A lost broker connection is a blip, not a crash: the tasks running go on (their claims
        # stay live through the heartbeat, so the copies the broker hands out again after the
        # reconnect find the work held and are dropped), instead of being killed mid-call.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_soft_shutdown_timeout": 10,
        "worker_enable_soft_shutdown_on_idle": True,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        # A pool child is replaced after this many tasks, bounding what a leaking tool could grow
        # it by. Not every 1,000: a new child's first phases build its runtime and load what the
        # runtime loads on first use (70-80 ms more on a 2-core VM), which at 1,000 tasks was a
        # few percent of every transition's CPU and a stall of whichever run came next.
        "worker_max_tasks_per_child": 10_000,
        "broker_pool_limit": 10,
        **queues,
    }
