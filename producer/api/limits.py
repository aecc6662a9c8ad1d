"""The API's side of the tenants' limits: their settings as cached for the submits (limits, default
webhook, allow-lists), read at most every ``cache_s`` seconds, the reservation of a submit's place
under its limits (``producer/admission.py``, where the protocol is), and each tenant's share of one
process's event streams and of its scans of long-term memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from producer.admission import Admissions, Reservation
from producer.api.errors import ApiError
from shared.scripts import LoopConnections
from shared.state import RunHead
from shared.store import RunStore
from shared.store.runs import Release
from shared.tenants import CeleryCallbacks, TenantLimits, Tenants, TenantSettings

__all__ = [
    "SCANS_PER_TENANT",
    "STREAMS_RETRY_S",
    "ScanShares",
    "StreamSlot",
    "StreamSlots",
    "SubmitGate",
    "TenantCounts",
]

#: What a tenant at its share of a process's event streams is told to wait.
STREAMS_RETRY_S = 5


class SubmitGate:
    """A tenant's settings as one API process uses them (cached ``cache_s`` seconds), and the
    reservations of its submits under its limits (:class:`~producer.admission.Admissions`, which
    raise :class:`~producer.admission.TenantLimited`: the API answers it as it is)."""

    def __init__(
        self,
        store: RunStore,
        tenants: Tenants,
        cache_s: float = 5.0,
        loop: LoopConnections | None = None,
    ) -> None:
        self.store = store
        self.tenants = tenants
        self.cache_s = cache_s
        self.admissions = Admissions(store, loop)
        self._cache: dict[str, tuple[float, TenantSettings]] = {}
        self._lock = threading.Lock()

    @property
    def loop(self) -> LoopConnections | None:
        return self.admissions.loop

    def limits(self, tenant: str) -> TenantLimits:
        return self._settings(tenant).limits

    def default_callback(self, tenant: str) -> str | None:
        """The tenant's default webhook URL (read with its limits, as cached)."""
        return self._settings(tenant).default_callback

    def namespaces(self, tenant: str) -> tuple[str, ...]:
        """The queue namespaces the tenant may name besides the default one (as cached)."""
        return self._settings(tenant).namespaces

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks:
        """The Celery callback tasks and queues the tenant's runs may name (as cached)."""
        return self._settings(tenant).callbacks

    def models(self, tenant: str) -> tuple[str, ...]:
        """The models the tenant's requests may name for a run (as cached)."""
        return self._settings(tenant).models

    @property
    def serves_loop(self) -> bool:
        """Whether :meth:`create_on_loop` can serve (an asyncio client of a single Redis)."""
        return self.admissions.serves_loop

    def cached(self, tenant: str, for_s: float = 0.0) -> TenantSettings | None:
        """The tenant's settings if they are cached and fresh (for ``for_s`` seconds more; no
        read); None: :meth:`limits` and the others read them."""
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is not None and time.monotonic() - cached[0] < self.cache_s - for_s:
            return cached[1]
        return None

    def refresh(self, tenant: str) -> TenantSettings:
        """Read the tenant's settings now (what the others then answer from)."""
        now = time.monotonic()
        settings = self.tenants.settings(tenant)
        with self._lock:
            if len(self._cache) > 10_000:  # bounded: tenants come and go
                self._cache.clear()
            self._cache[tenant] = (now, settings)
        return settings

    def _settings(self, tenant: str) -> TenantSettings:
        cached = self.cached(tenant)
        return cached if cached is not None else self.refresh(tenant)

    def admit(self, tenant: str) -> None:
        """Count one submit of ``tenant`` that creates no run itself (``TenantLimited`` if a limit
        forbids it)."""
        self.release(self.reserve(tenant))

    def reserve(self, tenant: str) -> Reservation:
        """:meth:`Admissions.reserve` under the tenant's limits as cached."""
        return self.admissions.reserve(tenant, self.limits(tenant))

    async def create_on_loop(
        self, tenant: str, limits: TenantLimits, keys: list[str], args: list[Any]
    ) -> Any:
        """:meth:`Admissions.create_on_loop`; ``limits``: the tenant's, as :meth:`cached` has them."""
        return await self.admissions.create_on_loop(tenant, limits, keys, args)

    def release(self, reservation: Reservation | None) -> None:
        self.admissions.release(reservation)

    def released_with_create(self, reservation: Reservation | None) -> Release | None:
        return self.admissions.released_with_create(reservation)

    def release_and_load(self, reservation: Reservation | None, run_id: str) -> RunHead | None:
        return self.admissions.release_and_load(reservation, run_id)


class TenantCounts(dict[str | None, int]):
    """How many of one kind of place each tenant holds in this process: only the tenants holding
    any are kept, so its size is bounded by the tenants active now."""

    def add(self, tenant: str | None) -> None:
        self[tenant] = self.get(tenant, 0) + 1

    def remove(self, tenant: str | None) -> None:
        left = self[tenant] - 1
        if left:
            self[tenant] = left
        else:
            del self[tenant]


class StreamSlots:
    """This process's event streams: ``total`` at most, ``per_tenant`` of them for any one tenant,
    so a tenant that opens streams it never reads leaves other tenants theirs.

    Taken and given back on the event loop's thread only (no awaits in between: no lock needed).
    """

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self.open = 0
        self.by_tenant = TenantCounts()

    def take(self, tenant: str | None) -> StreamSlot:
        """A slot for one stream of ``tenant``; a 503 :class:`ApiError` when the process serves
        its maximum, else a 429 one when the tenant holds its share."""
        if self.open >= self.total:
            raise ApiError(
                503,
                "unavailable",
                f"this API process already serves {self.total} event streams",
                headers={"Retry-After": str(STREAMS_RETRY_S)},
            )
        held = self.by_tenant.get(tenant, 0)
        if held >= self.per_tenant:
            raise ApiError(
                429,
                "too_many_streams",
                f"tenant {tenant} already has {held} event streams open on this API process;"
                f" its share is {self.per_tenant}",
                details={"limit": self.per_tenant, "open": held},
                headers={"Retry-After": str(STREAMS_RETRY_S)},
            )
        self.open += 1
        self.by_tenant.add(tenant)
        return StreamSlot(self, tenant)


class StreamSlot:
    """One stream's place; :meth:`release` gives it back (once, however often it is called)."""

    def __init__(self, slots: StreamSlots, tenant: str | None) -> None:
        self.slots = slots
        self.tenant = tenant
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self.slots.open -= 1
        self.slots.by_tenant.remove(self.tenant)


#: Scans one tenant may run at once in one API process: of long-term memory (a search, a listing of
#: namespaces), and of a run's whole event stream (its timeline). A memory scan reads up to 2,000
#: items (2 MiB) in a script, or 20,000 index entries, on the Redis every tenant and worker shares:
#: eight at once from one tenant made another tenant's reads 40 times slower. A timeline reads up to
#: ``events_maxlen`` events: one of a run of 10,000 events of 7 KB took 0.4 s and 84 MB of the API
#: process, eight at once 4.3 s and 620 MB.
SCANS_PER_TENANT = 2


class ScanShares:
    """Each tenant's share of this process's scans (taken on the API's worker threads)."""

    def __init__(self, per_tenant: int = SCANS_PER_TENANT) -> None:
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._by_tenant = TenantCounts()

    @contextlib.contextmanager
    def hold(self, tenant: str | None) -> Iterator[None]:
        """A place for one scan of ``tenant`` while inside; a 429 :class:`ApiError` when the
        tenant's scans already fill its share."""
        with self._lock:
            held = self._by_tenant.get(tenant, 0)
            if held >= self.per_tenant:
                raise ApiError(
                    429,
                    "too_many_scans",
                    f"tenant {tenant} already runs {held} scans (memory searches and listings, run"
                    f" timelines) on this API process; its share is {self.per_tenant}",
                    details={"limit": self.per_tenant, "running": held},
                    headers={"Retry-After": "1"},
                )
            self._by_tenant.add(tenant)
        try:
            yield
        finally:
            with self._lock:
                self._by_tenant.remove(tenant)
