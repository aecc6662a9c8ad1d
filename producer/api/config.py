"""How one API process is configured: the run store's settings plus the API's own (environment)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from shared.errors import ConfigError
from shared.settings import Settings

__all__ = [
    "ApiConfig",
    "ENV_API_AUTH",
    "ENV_API_BODY_TIMEOUT",
    "ENV_API_HEAD_TIMEOUT",
    "ENV_API_HOST",
    "ENV_API_KEEPALIVE",
    "ENV_API_MAX_BODY",
    "ENV_API_MAX_STREAMS",
    "ENV_API_MAX_STREAMS_PER_TENANT",
    "head_timeout_from_env",
    "is_loopback",
]

#: ``off`` turns authentication off; refused unless the server is bound to a loopback address.
ENV_API_AUTH = "WESICHAIN_API_AUTH"
#: The address the server is bound to (set by ``wesichain api``; checked when auth is off).
ENV_API_HOST = "WESICHAIN_API_HOST"
ENV_API_KEEPALIVE = "WESICHAIN_API_KEEPALIVE_S"
ENV_API_MAX_STREAMS = "WESICHAIN_API_MAX_STREAMS"
ENV_API_MAX_STREAMS_PER_TENANT = "WESICHAIN_API_MAX_STREAMS_PER_TENANT"
ENV_API_MAX_BODY = "WESICHAIN_API_MAX_BODY_BYTES"
ENV_API_BODY_TIMEOUT = "WESICHAIN_API_BODY_TIMEOUT_S"
ENV_API_HEAD_TIMEOUT = "WESICHAIN_API_HEAD_TIMEOUT_S"


def head_timeout_from_env() -> float:
    """``WESICHAIN_API_HEAD_TIMEOUT_S`` (default 10): seconds a request's line and headers have to
    arrive in. Read by the server's connections (``producer/api/http_protocol.py``), which are
    built before, and apart from, the app and its :class:`ApiConfig`."""
    raw = os.environ.get(ENV_API_HEAD_TIMEOUT, "10")
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"bad API setting: {ENV_API_HEAD_TIMEOUT}={raw!r} is not a number") from None
    if not 0 < seconds <= 3600:
        raise ConfigError(f"{ENV_API_HEAD_TIMEOUT} must be above 0 and at most 3600, not {raw!r}")
    return seconds


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ApiConfig:
    settings: Settings = field(default_factory=Settings.from_env)
    #: False only for a development server bound to loopback: every caller is then the operator
    #: (no tenant) and sees the runs started without a tenant.
    auth: bool = True
    host: str = "127.0.0.1"
    #: The largest request body taken (a full input in UTF-8 plus metadata fits).
    max_body_bytes: int = 256 * 1024
    #: Seconds a request's whole body has to arrive in, from when the API starts reading it: a
    #: client that trickles its body (or stops sending it) is answered 408 and its connection
    #: closed, so it holds a connection for this long at most, however slowly it sends.
    body_timeout_s: float = 30.0
    #: Seconds between keep-alive comments on an idle event stream.
    keepalive_s: float = 15.0
    #: Event streams one process serves at once (each holds one Redis connection while it waits).
    max_streams: int = 1000
    #: Event streams one tenant may hold in one process (None: a quarter of ``max_streams``), so
    #: a tenant that opens streams and never reads them leaves the other tenants theirs.
    max_streams_per_tenant: int | None = None

    def __post_init__(self) -> None:
        if not self.auth and not is_loopback(self.host):
            raise ConfigError(
                f"authentication can be turned off only on a loopback address, not {self.host!r}"
            )
        if self.max_streams < 1 or self.keepalive_s <= 0 or self.max_body_bytes < 1024:
            raise ConfigError("max_streams >= 1, keepalive_s > 0 and max_body_bytes >= 1024 are required")
        if not 0 < self.body_timeout_s <= 3600:
            raise ConfigError("body_timeout_s must be above 0 and at most 3600")
        if self.max_streams_per_tenant is not None and self.max_streams_per_tenant < 1:
            raise ConfigError("max_streams_per_tenant >= 1 is required")

    @property
    def streams_per_tenant(self) -> int:
        """The event streams one tenant may hold in this process."""
        if self.max_streams_per_tenant is None:
            return max(1, self.max_streams // 4)
        return min(self.max_streams_per_tenant, self.max_streams)

    @classmethod
    def from_env(cls) -> ApiConfig:
        env = os.environ
        auth = env.get(ENV_API_AUTH, "on").strip().lower()
        if auth not in ("on", "off"):
            raise ConfigError(f"{ENV_API_AUTH} is 'on' or 'off', not {auth!r}")
        per_tenant = env.get(ENV_API_MAX_STREAMS_PER_TENANT, "").strip()
        try:
            return cls(
                settings=Settings.from_env(),
                auth=auth == "on",
                host=env.get(ENV_API_HOST, "127.0.0.1"),
                keepalive_s=float(env.get(ENV_API_KEEPALIVE, "15")),
                max_streams=int(env.get(ENV_API_MAX_STREAMS, "1000")),
                max_streams_per_tenant=int(per_tenant) if per_tenant else None,
                max_body_bytes=int(env.get(ENV_API_MAX_BODY, str(256 * 1024))),
                body_timeout_s=float(env.get(ENV_API_BODY_TIMEOUT, "30")),
            )
        except ValueError as exc:
            raise ConfigError(f"bad API setting: {exc}") from None
