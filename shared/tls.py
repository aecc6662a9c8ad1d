"""TLS to Redis: the same verified TLS parameters for the store (redis-py) and the broker (kombu).

With a ``rediss://`` URL both connections verify the server: its certificate must chain to a
trusted CA (the system's, or ``WESICHAIN_REDIS_CA_FILE`` for a private CA) and name the URL's host.
Left to itself, kombu turns a bare ``rediss://`` broker URL into ``ssl_cert_reqs=CERT_NONE``, so
the broker gets these parameters explicitly, as Celery's ``broker_use_ssl``; and the URL's own
``ssl_*`` query parameters, which would override them in both libraries, are taken out of the
URL and merged here. Turning verification off takes ``WESICHAIN_REDIS_TLS_INSECURE=1`` and is
logged as a warning.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis

from shared.errors import ConfigError, WesichainError
from shared.settings import (
    ENV_REDIS_CA_FILE,
    ENV_REDIS_CERT_FILE,
    ENV_REDIS_KEY_FILE,
    ENV_REDIS_TLS_INSECURE,
    Settings,
    redact_url,
)

__all__ = [
    "Endpoint",
    "FILE_PARAMETERS",
    "RedisTls",
    "RedisTlsError",
    "URL_PARAMETERS",
    "describe",
    "endpoint",
]

log = logging.getLogger("wesichain.tls")

#: URL query parameter (redis-py and kombu spelling) -> (settings field, environment variable).
FILE_PARAMETERS = {
    "ssl_ca_certs": ("redis_ca_file", ENV_REDIS_CA_FILE),
    "ssl_certfile": ("redis_cert_file", ENV_REDIS_CERT_FILE),
    "ssl_keyfile": ("redis_key_file", ENV_REDIS_KEY_FILE),
}
URL_PARAMETERS = frozenset([*FILE_PARAMETERS, "ssl_cert_reqs", "ssl_check_hostname"])


class RedisTlsError(WesichainError, redis.ConnectionError):
    """The Redis server's certificate failed verification: another CA, or issued for another host.

    A ``redis.ConnectionError`` too, so code that handles an unreachable Redis handles this; but
    unlike an outage it does not go away by retrying.
    """

    def __init__(self, url: str, reason: str, ca_file: str | None) -> None:
        self.url = url
        self.reason = reason
        self.ca_file = ca_file
        trusted = f"the CA file {ca_file}" if ca_file else f"the system's CAs (set {ENV_REDIS_CA_FILE})"
        super().__init__(f"TLS verification of Redis at {url} failed: {reason} (trusting {trusted})")


@dataclass(frozen=True)
class RedisTls:
    """How a ``rediss://`` connection authenticates the server (and, with a certificate, itself)."""

    verify: bool = True
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments of redis-py's ``SSLConnection``: the store passes them to redis-py,
        and kombu hands ``broker_use_ssl`` to the same class unchanged."""
        return {
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.verify else ssl.CERT_NONE,
            "ssl_check_hostname": self.verify,
            "ssl_ca_certs": self.ca_file,
            "ssl_certfile": self.cert_file,
            "ssl_keyfile": self.key_file,
        }


class Endpoint(NamedTuple):
    #: The URL to connect to, without its ``ssl_*`` query parameters (they are in ``tls``).
    """A Redis URL stripped of its TLS parameters, with the TLS options built from them and the settings."""

    url: str
    #: None for ``redis://`` and ``memory://``.
    tls: RedisTls | None
    #: ``url`` with its password replaced by ``***``: the only form to print.
    display: str


def endpoint(settings: Settings) -> Endpoint:
    """The Redis URL of ``settings`` and its TLS parameters, checked; raises :class:`ConfigError`."""
    url = settings.redis_url
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return Endpoint(url, None, redact_url(url))
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = {name: value for name, value in query if name.startswith("ssl_")}
    if given:
        url = parts._replace(query=urlencode([(n, v) for n, v in query if not n.startswith("ssl_")])).geturl()
    display = redact_url(url)
    if parts.scheme == "redis":
        _refuse_tls_options_without_tls(settings, given, display)
        return Endpoint(url, None, display)
    unknown = sorted(set(given) - URL_PARAMETERS)
    if unknown:
        raise ConfigError(
            f"unsupported TLS parameter {', '.join(unknown)} in the Redis URL {display}"
            f" (supported: {', '.join(sorted(URL_PARAMETERS))})"
        )
    _refuse_weakening(given, settings.redis_tls_insecure)
    files = _files(settings, given)
    _check_files(files)
    paths = {field_name: path for field_name, (path, _) in files.items()}
    tls = RedisTls(
        verify=not settings.redis_tls_insecure,
        ca_file=paths.get("redis_ca_file"),
        cert_file=paths.get("redis_cert_file"),
        key_file=paths.get("redis_key_file"),
    )
    if not tls.verify:
        _warn_insecure(display)
    return Endpoint(url, tls, display)


def describe(exc: ssl.SSLCertVerificationError) -> str:
    """Why the server's certificate was refused, in OpenSSL's words."""
    return f"certificate verify failed: {exc.verify_message or exc.reason or exc}"


def _refuse_tls_options_without_tls(settings: Settings, given: dict[str, str], display: str) -> None:
    if given:
        raise ConfigError(
            f"TLS parameters ({', '.join(sorted(given))}) in a redis:// URL, which does not use TLS:"
            f" use rediss:// ({display})"
        )
    for field_name, env in FILE_PARAMETERS.values():
        if getattr(settings, field_name):
            raise ConfigError(
                f"{env} is set but the Redis URL {display} is redis://, which does not use TLS: use rediss://"
            )


def _refuse_weakening(given: dict[str, str], insecure: bool) -> None:
    """A URL may restate the defaults; turning verification off takes the explicit switch."""
    reqs = given.get("ssl_cert_reqs")
    if reqs is not None:
        value = reqs.strip().lower().removeprefix("cert_")
        if value not in ("required", "optional", "none"):
            raise ConfigError(f"ssl_cert_reqs={reqs!r} in the Redis URL: use required")
        if value != "required" and not insecure:
            raise ConfigError(
                f"ssl_cert_reqs={reqs} in the Redis URL would stop verifying the server's certificate;"
                f" it stays verified unless {ENV_REDIS_TLS_INSECURE}=1"
            )
        if value == "required" and insecure:
            raise ConfigError(f"ssl_cert_reqs={reqs} in the Redis URL contradicts {ENV_REDIS_TLS_INSECURE}=1")
    check_hostname = given.get("ssl_check_hostname")
    if check_hostname is not None:
        value = check_hostname.strip().lower()
        if value not in ("true", "false"):
            raise ConfigError(f"ssl_check_hostname={check_hostname!r} in the Redis URL: use true")
        if value == "false" and not insecure:
            raise ConfigError(
                "ssl_check_hostname=false in the Redis URL would accept a certificate issued for any"
                f" host; the host name stays verified unless {ENV_REDIS_TLS_INSECURE}=1"
            )


def _files(settings: Settings, given: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Settings field -> (path, where it was given), from the settings or else the URL."""
    files: dict[str, tuple[str, str]] = {}
    for parameter, (field_name, env) in FILE_PARAMETERS.items():
        configured: str | None = getattr(settings, field_name)
        in_url = given.get(parameter)
        if configured and in_url and configured != in_url:
            raise ConfigError(
                f"{env}={configured!r} and {parameter}={in_url!r} in the Redis URL disagree: give one"
            )
        if configured:
            files[field_name] = (configured, env)
        elif in_url:
            files[field_name] = (in_url, f"{parameter} in the Redis URL")
    return files


def _check_files(files: dict[str, tuple[str, str]]) -> None:
    """Every file exists and loads now, so a mistake is a ConfigError naming where it was given
    rather than a handshake failure later."""
    for path, source in files.values():
        if not os.path.isfile(path):
            raise ConfigError(f"{source}: {path!r} does not exist or is not a file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{source}: {path!r} is not readable")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if "redis_ca_file" in files:
        path, source = files["redis_ca_file"]
        try:
            context.load_verify_locations(cafile=path)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{source}: {path!r} holds no PEM CA certificate ({_reason(exc)})") from None
    if "redis_key_file" in files and "redis_cert_file" not in files:
        key_source = files["redis_key_file"][1]
        raise ConfigError(f"{key_source} is set without a client certificate: set {ENV_REDIS_CERT_FILE}")
    if "redis_cert_file" in files:
        cert, cert_source = files["redis_cert_file"]
        key, key_source = files.get("redis_key_file", (None, cert_source))

        def encrypted() -> NoReturn:
            raise ConfigError(f"{key_source}: the private key is encrypted; give an unencrypted PEM key")

        try:
            context.load_cert_chain(cert, key, password=encrypted)
        except (ssl.SSLError, OSError) as exc:
            given = f"{cert_source} {cert!r}" + (f" with {key_source} {key!r}" if key else "")
            raise ConfigError(
                f"{given}: not a PEM client certificate and its private key ({_reason(exc)})"
            ) from None


def _reason(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return exc.strerror or str(exc)


_warned: set[str] = set()


def _warn_insecure(display: str) -> None:
    """Loud, once per process and URL (not once per connection or prefork child)."""
    if display in _warned:
        return
    _warned.add(display)
    log.warning(
        "TLS certificate verification for Redis at %s is OFF (%s=1): the connection is encrypted"
        " but the server is not authenticated; anyone on the network path can pose as Redis and"
        " read or alter tasks and run state",
        display,
        ENV_REDIS_TLS_INSECURE,
    )
