"""Settings of the model providers' HTTP calls.

:class:`LlmSettings` is what an operator sets, from the worker's environment; :class:`HttpSettings`
is what one adapter's transport runs with (the operator's values plus the backoff and size bounds
that have no variable). Values are validated when built: a bad one is a
:class:`~shared.errors.ConfigError` naming the variable or field to fix.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ConfigError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_RETRY_AFTER_CAP_S",
    "ENV_CONNECT_TIMEOUT",
    "ENV_MAX_ATTEMPTS",
    "ENV_READ_TIMEOUT",
    "ENV_RETRY_AFTER_CAP",
    "ENV_SCRIPTS_DIR",
    "HttpSettings",
    "LlmSettings",
    "MAX_ATTEMPTS_LIMIT",
]

ENV_READ_TIMEOUT = "WESICHAIN_LLM_READ_TIMEOUT_S"
ENV_CONNECT_TIMEOUT = "WESICHAIN_LLM_CONNECT_TIMEOUT_S"
ENV_MAX_ATTEMPTS = "WESICHAIN_LLM_MAX_ATTEMPTS"
ENV_RETRY_AFTER_CAP = "WESICHAIN_LLM_RETRY_AFTER_CAP_S"
ENV_SCRIPTS_DIR = "WESICHAIN_SCRIPTS_DIR"

DEFAULT_READ_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_RETRY_AFTER_CAP_S = 30.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: More attempts than this inside one model call only park a worker thread; the run's own
#: ``Retry`` policy is the place for more.
MAX_ATTEMPTS_LIMIT = 10


@dataclass(frozen=True)
class HttpSettings:
    """Timeouts, retry and size bounds of one adapter's HTTP calls."""

    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    #: The longest wait for the next byte of an answer. A request's own
    #: ``ModelRequest.timeout_s``, when set, replaces it for that request.
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    #: Attempts in all, the first included; 1 disables retries.
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Full-jitter backoff: attempt n sleeps uniformly in [0, min(max, base * 2**(n-1))].
    backoff_base_s: float = 0.5
    backoff_max_s: float = 8.0
    #: The longest ``Retry-After`` waited for in process; a longer one fails the call at once.
    retry_after_cap_s: float = DEFAULT_RETRY_AFTER_CAP_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be at least 1, got {self.max_attempts}")
        numbers = {
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "backoff_base_s": self.backoff_base_s,
            "backoff_max_s": self.backoff_max_s,
            "retry_after_cap_s": self.retry_after_cap_s,
        }
        for name, value in numbers.items():
            if value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        if self.connect_timeout_s == 0 or self.read_timeout_s == 0 or self.max_body_bytes <= 0:
            raise ConfigError("connect_timeout_s, read_timeout_s and max_body_bytes must be positive")


@dataclass(frozen=True)
class LlmSettings:
    """What an operator sets for the model calls of a worker.

    ``scripts_dir``: the directory from which a run may name a ``scripted:FILE.json`` model of
    its own (see :mod:`shared.llm.resolver`); None allows no such file.
    """

    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_after_cap_s: float = DEFAULT_RETRY_AFTER_CAP_S
    scripts_dir: Path | None = None

    def __post_init__(self) -> None:
        _check_seconds("read_timeout_s", self.read_timeout_s, zero_ok=False)
        _check_seconds("connect_timeout_s", self.connect_timeout_s, zero_ok=False)
        _check_seconds("retry_after_cap_s", self.retry_after_cap_s, zero_ok=True)
        if (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise ConfigError(
                f"max_attempts must be a whole number in 1..{MAX_ATTEMPTS_LIMIT}, got {self.max_attempts!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LlmSettings:
        """Reads ``WESICHAIN_LLM_*`` and ``WESICHAIN_SCRIPTS_DIR``; an unset or empty variable
        keeps its default. A bad value raises ConfigError naming the variable."""
        env = os.environ if environ is None else environ
        scripts = env.get(ENV_SCRIPTS_DIR, "").strip()
        return cls(
            read_timeout_s=_seconds(env, ENV_READ_TIMEOUT, DEFAULT_READ_TIMEOUT_S, zero_ok=False),
            connect_timeout_s=_seconds(env, ENV_CONNECT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT_S, zero_ok=False),
            retry_after_cap_s=_seconds(env, ENV_RETRY_AFTER_CAP, DEFAULT_RETRY_AFTER_CAP_S, zero_ok=True),
            max_attempts=_attempts(env),
            scripts_dir=_directory(scripts) if scripts else None,
        )

    def http(self) -> HttpSettings:
        """The transport settings these values give, with the default backoff and body bound."""
        return HttpSettings(
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s,
            max_attempts=self.max_attempts,
            retry_after_cap_s=self.retry_after_cap_s,
        )


def _check_seconds(name: str, value: float, *, zero_ok: bool) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
    ):
        bound = "at least 0" if zero_ok else "greater than 0"
        raise ConfigError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def _seconds(env: Mapping[str, str], variable: str, default: float, *, zero_ok: bool) -> float:
    raw = env.get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "more than 0"
        raise ConfigError(f"{variable}={raw!r} is not valid: set it to a number of seconds, {bound}")
    return value


def _attempts(env: Mapping[str, str]) -> int:
    raw = env.get(ENV_MAX_ATTEMPTS, "").strip()
    if not raw:
        return DEFAULT_MAX_ATTEMPTS
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_ATTEMPTS_LIMIT:
        raise ConfigError(
            f"{ENV_MAX_ATTEMPTS}={raw!r} is not valid:"
            f" set it to a whole number from 1 to {MAX_ATTEMPTS_LIMIT}"
        )
    return int(raw)


def _directory(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"{ENV_SCRIPTS_DIR}={raw!r} is not valid: set it to an absolute directory path")
    return path.resolve()
