"""Per-tenant limits on new runs: runs in flight, and submits per minute (429 with Retry-After).

Submits per minute is a sliding window in Redis (one sorted-set entry per admitted submit, by
Redis's clock), so it holds across every API process. Runs in flight are the counts the create
and commit scripts keep; they are read before a submit, so concurrent submits at the very edge
of the limit may pass it by a few. A tenant's limits, default webhook and allowed queue
namespaces are read at most every ``cache_s`` seconds.
"""

from __future__ import annotations

import math
import threading
import time
import uuid

from api.errors import ApiError
from shared.store import RunStore
from shared.tenants import TenantLimits, Tenants, TenantSettings

__all__ = ["INFLIGHT_RETRY_S", "SubmitGate", "WINDOW_MS"]

WINDOW_MS = 60_000
#: What a tenant at its in-flight limit is told to wait: runs end at their own pace.
INFLIGHT_RETRY_S = 5


class SubmitGate:
    def __init__(self, store: RunStore, tenants: Tenants, cache_s: float = 5.0) -> None:
        self.store = store
        self.tenants = tenants
        self.cache_s = cache_s
        self._window = store.redis.register_script(_window_source())
        self._cache: dict[str, tuple[float, TenantSettings]] = {}
        self._lock = threading.Lock()

    def limits(self, tenant: str) -> TenantLimits:
        return self._settings(tenant).limits

    def default_callback(self, tenant: str) -> str | None:
        """The tenant's default webhook URL (read with its limits, as cached)."""
        return self._settings(tenant).default_callback

    def namespaces(self, tenant: str) -> tuple[str, ...]:
        """The queue namespaces the tenant may name besides the default one (as cached)."""
        return self._settings(tenant).namespaces

    def _settings(self, tenant: str) -> TenantSettings:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        settings = self.tenants.settings(tenant)
        with self._lock:
            if len(self._cache) > 10_000:  # bounded: tenants come and go
                self._cache.clear()
            self._cache[tenant] = (now, settings)
        return settings

    def admit(self, tenant: str) -> None:
        """Count one submit of ``tenant``; raise a 429 :class:`ApiError` if a limit forbids it."""
        limits = self.limits(tenant)
        inflight = self.store.inflight(tenant)
        if inflight >= limits.max_inflight:
            raise ApiError(
                429,
                "too_many_in_flight",
                f"tenant {tenant} has {inflight} runs in flight; its limit is {limits.max_inflight}",
                details={"limit": limits.max_inflight, "in_flight": inflight},
                headers={"Retry-After": str(INFLIGHT_RETRY_S)},
            )
        admitted, wait_ms = self._window(
            keys=[self.store.keys.submits(tenant)],
            args=[limits.submits_per_minute, WINDOW_MS, uuid.uuid4().hex],
        )
        if not int(admitted):
            retry_s = max(1, math.ceil(int(wait_ms) / 1000))
            raise ApiError(
                429,
                "rate_limited",
                f"tenant {tenant} may start {limits.submits_per_minute} runs a minute; retry in {retry_s}s",
                details={"limit": limits.submits_per_minute, "retry_after_s": retry_s},
                headers={"Retry-After": str(retry_s)},
            )


def _window_source() -> str:
    from shared.scripts import script_source

    return script_source("submit_window")
