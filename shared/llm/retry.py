"""Which failed provider calls are tried again, and after how long.

* 408, 429 and 5xx answers and network trouble (refused connection, timeout, dropped connection)
  are retried, a bounded number of times, with exponential backoff and full jitter;
* a ``Retry-After`` is honoured when it is short enough; a longer one fails the call at once
  (still retryable) instead of parking a worker thread;
* other 4xx answers are never retried: the same request would fail the same way.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import UTC
from typing import TypeVar

from shared.errors import ModelTransport
from shared.llm.settings import HttpSettings

__all__ = [
    "RAISE_RATE_LIMITED",
    "RETRYABLE_STATUSES",
    "Restate",
    "Retrier",
    "RetryableStatus",
    "backoff_delay",
    "is_retryable_status",
    "network_failure",
    "parse_retry_after",
]

T = TypeVar("T")

#: Statuses worth trying again besides 5xx: the provider is busy or had a transient fault.
RETRYABLE_STATUSES = frozenset({408, 429})


#: Set while a limit shared by the worker pool governs the call (``shared/limits.py``): a 429 is
#: then raised at once, with its Retry-After, instead of being waited out in this thread, so the
#: shared limiter makes the whole pool back off and the think is re-queued without a sleeping thread.
RAISE_RATE_LIMITED: ContextVar[bool] = ContextVar("wesichain_raise_rate_limited", default=False)


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def network_failure(exc: Exception) -> tuple[str, bool]:
    """What an httpx exception means, and whether trying again could help."""
    # Here, not at the top: the worker imports this module for RAISE_RATE_LIMITED, and a worker
    # whose models make no HTTP calls should not load httpx (the adapters that raise these did).
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout", True
    if isinstance(exc, httpx.ReadTimeout):
        return "read timeout (no data within the request's timeout)", True
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", True
    if isinstance(exc, httpx.ConnectError):
        return "connection failed", True
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection broken by the server", True
    if isinstance(exc, httpx.NetworkError):
        return "network error", True
    if isinstance(exc, httpx.DecodingError):
        return "undecodable response body", False
    return "HTTP client error", False


class RetryableStatus(Exception):
    """A retryable HTTP status and how long the server asked us to wait (None: it did not say)."""

    def __init__(self, error: ModelTransport, retry_after_s: float | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after_s = retry_after_s


# --- Retry-After and backoff ------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, or None if it did not say (or said nonsense).

    ``retry-after-ms`` (sent by OpenAI) is more precise and wins; ``Retry-After`` is either
    delay-seconds or an HTTP date.
    """
    millis = _finite_non_negative(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_non_negative(raw)
    if seconds is not None:
        return seconds
    return _seconds_until_http_date(raw.strip(), time.time() if now is None else now)


def _finite_non_negative(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None  # also rejects NaN


def _seconds_until_http_date(raw: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT by definition
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def backoff_delay(attempt: int, settings: HttpSettings, rng: Callable[[], float] = random.random) -> float:
    """Full jitter: spreads out clients that all failed at the same moment."""
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2.0 ** (attempt - 1))
    return rng() * ceiling


# --- The loop ---------------------------------------------------------------------------------

#: Builds the error to raise in place of ``error``, its message rewritten by the function given.
Restate = Callable[[ModelTransport, Callable[[str], str]], ModelTransport]


class Retrier:
    """Runs one call's attempts as :class:`HttpSettings` says. Thread-safe (holds no state)."""

    def __init__(
        self,
        settings: HttpSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self._rng = rng

    def run(self, attempt: Callable[[], T], restate: Restate) -> T:
        """Calls ``attempt`` until it returns, raises something not retryable, or the attempts
        are spent. ``attempt`` signals a retryable status with :class:`RetryableStatus` and other
        failures with :class:`ModelTransport` (``retryable`` says whether to try again)."""
        settings = self.settings
        for number in range(1, settings.max_attempts + 1):
            try:
                return attempt()
            except RetryableStatus as failure:
                error, wait = failure.error, failure.retry_after_s
                if error.status_code == 429 and RAISE_RATE_LIMITED.get():
                    error.retry_after_s = wait
                    raise error from None
            except ModelTransport as exc:
                if not exc.retryable:
                    raise
                error, wait = exc, None
            if number == settings.max_attempts:
                break
            if wait is not None and wait > settings.retry_after_cap_s:
                # Waiting longer would park a worker thread; the caller's retry policy (which
                # sees retryable=True) is the right place to come back much later.
                raise restate(
                    error,
                    _appending(
                        f" (server asked to retry after {wait:.0f}s, more than "
                        f"the {settings.retry_after_cap_s:.0f}s this client waits)"
                    ),
                )
            self._sleep(wait if wait is not None else backoff_delay(number, settings, self._rng))
        if settings.max_attempts == 1:
            raise error
        raise restate(error, _prepending(f"gave up after {settings.max_attempts} attempts: "))


def _appending(suffix: str) -> Callable[[str], str]:
    return lambda message: message + suffix


def _prepending(prefix: str) -> Callable[[str], str]:
    return lambda message: prefix + message
