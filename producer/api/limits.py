"""Per-tenant limits: runs in flight and submits per minute (429 with Retry-After), checked the
same way by every API process; and each tenant's share of one process's event streams.

Submits per minute is a sliding window in Redis (one sorted-set entry per admitted submit, by
Redis's clock). Runs in flight are the counts the create and commit scripts keep, one hash per
shard; on Redis Cluster the shards live in different slots, so no one script can read them all
and create a run too. A submit therefore *reserves* its place before it reads them:

1. one script counts the submit in the window and adds a reservation (an entry of the tenant's
   reservation set, expiring after ``RESERVE_TTL_MS`` by Redis's clock), answering how many live
   reservations the tenant has, its own included;
2. the submit reads the in-flight counts, and goes on only if runs in flight plus reservations fit
   the limit;
3. it drops its reservation once its run is created (or its create failed); on a single Redis the
   create script drops it itself, in the step that counts the run.

This cannot admit one run too many. Take any runs in flight at the same moment, and among their
submits the last to reserve: every other one reserved before it, and at that moment either still
held its reservation (counted in step 1), or had dropped it, which it does only after its run was
created, so that run was in the counts read in step 2 (runs that end only lower them, and an
ended run is not in flight). That submit counted all the others and itself, so they fit the limit.
The one assumption: a submit creates its run within ``RESERVE_TTL_MS`` of reserving (it does in
milliseconds; a process that dies holding a reservation leaves it to expire).

A created run whose reservation is not dropped yet is counted twice, which only errs towards
waiting: a submit is refused ``too_many_in_flight`` only when the counts alone reach the limit;
when reservations tip it over, it withdraws (its window entry too) and tries again after a few
milliseconds, and answers ``503 unavailable`` (Retry-After) if that lasts ``ADMIT_WAIT_S``.
Admitting costs one round trip more than creating the run: on a single Redis the script reads the
counts itself once it has reserved (steps 1 and 2 in one command; on Redis Cluster the counts are
in other slots and the read waits for the script, two round trips), while the delete rides the
create script (on Redis Cluster, a round trip of its own after it; a resubmit that finds its run
already there shares it with the read of that run for the answer). No lock is held, so one tenant's
submits still run side by side.

A tenant's limits, default webhook and allow-lists (queue namespaces, Celery callbacks, models)
are read at most every
``cache_s`` seconds.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from dataclasses import dataclass

from redis.crc import key_slot

from producer.api.errors import ApiError
from shared.errors import ConfigError
from shared.protocol import lua_prelude
from shared.scripts import LoopConnections, ScriptSpec, is_cluster, script_body
from shared.state import RunHead
from shared.store import RunStore
from shared.store.runs import Release, loaded_head
from shared.tenants import CeleryCallbacks, TenantLimits, Tenants, TenantSettings

__all__ = [
    "ADMIT_WAIT_S",
    "INFLIGHT_RETRY_S",
    "RESERVE_TTL_MS",
    "STREAMS_RETRY_S",
    "Reservation",
    "StreamSlot",
    "StreamSlots",
    "SubmitGate",
    "WINDOW_MS",
    "reservations_key",
]

WINDOW_MS = 60_000
#: What a tenant at its in-flight limit is told to wait: runs end at their own pace.
INFLIGHT_RETRY_S = 5
#: How long a reservation outlives a submit that died holding it. Far above the time a submit
#: takes to create its run, which is all the exactness of the in-flight limit assumes.
RESERVE_TTL_MS = 30_000
#: How long a submit retries while other submits' reservations tip the tenant over its limit
#: (they are created or withdrawn within milliseconds) before it answers 503.
ADMIT_WAIT_S = 3.0
#: What a tenant at its share of a process's event streams is told to wait.
STREAMS_RETRY_S = 5

# The window script as it is, run as a function, then the reservation, then (on a single Redis:
# KEYS[3..], the in-flight hashes of every shard, ARGV[5] the tenant's field) the in-flight counts:
# one command. The window's and the reservation's keys are in one slot (``reservations_key``).
_RESERVE_BODY = """
local clock = now_ms()
-- One TIME for the window and the reservation: the window's script reads the clock through this.
local function now_ms()
  return clock
end
local function count_in_window()
--WINDOW--
end
local function inflight()
  local total = 0
  for i = 3, #KEYS do
    total = total + (tonumber(redis.call('HGET', KEYS[i], ARGV[5])) or 0)
  end
  return total
end
local verdict = count_in_window()
if verdict[1] == 0 then
  return {0, verdict[2], inflight()}
end
local now, ttl = clock, tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[2], ttl)
return {1, redis.call('ZCARD', KEYS[2]), inflight()}
"""


#: What the reservation script takes: the submit window script's KEYS and ARGV, then its own.
_RESERVE_SPEC = ScriptSpec(
    keys=("window", "reserved"),
    args=("limit", "window", "member", "ttl_ms", "tenant"),
    more_keys="(single Redis) the in-flight hash of every shard",
)


def _reserve_source() -> str:
    window = script_body("submit_window")
    body = _RESERVE_BODY.replace("--WINDOW--", window)
    return lua_prelude(body) + body


def reservations_key(window_key: str) -> str:
    """The tenant's reservation set: a key Redis Cluster keeps in the slot of its window's key,
    so that one script can update both (whatever the prefix, unless it holds a ``}`` that closes
    no hash tag, such as ``{}``: refused on a cluster)."""
    start = window_key.find("{")
    end = window_key.find("}", start + 1) if start >= 0 else -1
    # A key with a hash tag keeps it when suffixed; one without is its own tag.
    return window_key + ":reserved" if 0 <= start < end - 1 else "{" + window_key + "}:reserved"


@dataclass(frozen=True)
class Reservation:
    """A submit's place under its tenant's in-flight limit, held until its run is created."""

    tenant: str
    token: str


class SubmitGate:
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
        #: The event loop's connections to the same (single) Redis, for :meth:`reserve_on_loop`
        #: and :meth:`release_on_loop`.
        self.loop = loop
        # On the store's kept connections: a submit's script skips redis-py's pool, retry wrapper
        # and hooks, as the create script does (``shared.scripts.ScriptConnections``).
        self._reserve = store.register_script("submit_reserve", _reserve_source(), _RESERVE_SPEC)
        self._cluster = is_cluster(store.redis)
        #: Every shard's in-flight hash, the reservation script's KEYS after its own two.
        self._inflight_keys = [store.keys.inflight(shard) for shard in range(store.keys.shards)]
        window = store.keys.submits("tenant")  # tenants' names hold no braces: one check for all
        if self._cluster and key_slot(reservations_key(window).encode()) != key_slot(window.encode()):
            raise ConfigError(f"the key prefix {store.keys.prefix!r} puts a tenant's keys in different slots")
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

    def celery_callbacks(self, tenant: str) -> CeleryCallbacks:
        """The Celery callback tasks and queues the tenant's runs may name (as cached)."""
        return self._settings(tenant).callbacks

    def models(self, tenant: str) -> tuple[str, ...]:
        """The models the tenant's requests may name for a run (as cached)."""
        return self._settings(tenant).models

    @property
    def serves_loop(self) -> bool:
        """Whether :meth:`reserve_on_loop` can serve (an asyncio client of a single Redis)."""
        return self.loop is not None and not self._cluster

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
        """Count one submit of ``tenant`` that creates no run itself; raise a 429 :class:`ApiError`
        if a limit forbids it."""
        self.release(self.reserve(tenant))

    def reserve(self, tenant: str) -> Reservation:
        """Count one submit of ``tenant`` and hold its place under the in-flight limit until
        :meth:`release` (call it once the run is created, or its create failed); raise a 429
        :class:`ApiError` if a limit forbids it, a 503 one if the answer stays open too long."""
        admission = _Admission(tenant, self.limits(tenant), self.store.keys.submits(tenant))
        while True:
            if admission.holds(*self._reserve_and_count(tenant, admission.keys, admission.args)):
                return admission.reservation
            with self.store.redis.pipeline(transaction=False) as pipe:
                for key in admission.keys:
                    pipe.zrem(key, admission.token)
                pipe.execute()
            time.sleep(admission.pause())

    async def reserve_on_loop(self, tenant: str, limits: TenantLimits) -> Reservation:
        """:meth:`reserve` on the event loop's asyncio client, for a single Redis (on a cluster the
        in-flight counts are a read of their own: :attr:`serves_loop` is False); ``limits``: the
        tenant's, as :meth:`cached` has them."""
        loop = self.loop
        if loop is None or self._cluster:
            raise ConfigError("a reservation on the event loop needs the connections of a single Redis")
        admission = _Admission(tenant, limits, self.store.keys.submits(tenant))
        while True:
            reply = await loop.run(
                self._reserve, [*admission.keys, *self._inflight_keys], [*admission.args, tenant]
            )
            if admission.holds(*reply):
                return admission.reservation
            for key in admission.keys:  # rare (near the limit): a round trip each
                await loop.execute("ZREM", key, admission.token)
            await asyncio.sleep(admission.pause())

    def _reserve_and_count(self, tenant: str, keys: list[str], args: list[int | str]) -> tuple[int, int, int]:
        """Step 1 (the reservation), then step 2 (the in-flight counts). On a single Redis the
        script reads the counts itself after reserving: one command, atomic, where a pipeline of a
        read per shard cost this process a command to write and a reply to parse each. On a cluster
        the counts live in other slots, so the read follows the script's answer."""
        if self._cluster:
            admitted, value, _ = self._reserve(keys=keys, args=[*args, ""])
            return int(admitted), int(value), self.store.inflight(tenant)
        admitted, value, inflight = self._reserve(keys=[*keys, *self._inflight_keys], args=[*args, tenant])
        return int(admitted), int(value), int(inflight)

    def release(self, reservation: Reservation | None) -> None:
        """Drop a reservation: its run is in the in-flight counts now (or was never created)."""
        if reservation is not None:
            window = self.store.keys.submits(reservation.tenant)
            self.store.redis.zrem(reservations_key(window), reservation.token)

    async def release_on_loop(self, reservation: Reservation | None) -> None:
        """:meth:`release` on the event loop's connections."""
        if reservation is not None and self.loop is not None:
            window = self.store.keys.submits(reservation.tenant)
            await self.loop.execute("ZREM", reservations_key(window), reservation.token)

    def released_with_create(self, reservation: Reservation | None) -> Release | None:
        """What the create script drops as it creates the run (``RunStore.create_run``): the
        reservation's entry, on a single Redis (on Redis Cluster it is in another slot than the
        run: None, and :meth:`release` drops it once the run is created)."""
        if reservation is None or self._cluster:
            return None
        return Release(reservations_key(self.store.keys.submits(reservation.tenant)), reservation.token)

    def release_and_load(self, reservation: Reservation | None, run_id: str) -> RunHead | None:
        """:meth:`release` once the run is created, and read its head (the submit's answer) in the
        same round trip; None if the run is not in Redis (the caller reads the archive)."""
        with self.store.redis.pipeline(transaction=False) as pipe:
            if reservation is not None:
                pipe.zrem(reservations_key(self.store.keys.submits(reservation.tenant)), reservation.token)
            self.store.queue_load(pipe, run_id)
            replies = pipe.execute()
        return loaded_head(replies[-1])


class _Admission:
    """One submit's way through the reservation (see the module's docstring), whichever client
    sends the script: its keys and arguments, what each answer means, and how long to wait
    before trying again."""

    def __init__(self, tenant: str, limits: TenantLimits, window: str) -> None:
        self.tenant = tenant
        self.limits = limits
        self.keys = [window, reservations_key(window)]
        self.token = uuid.uuid4().hex
        self.args: list[int | str] = [limits.submits_per_minute, WINDOW_MS, self.token, RESERVE_TTL_MS]
        self.reservation = Reservation(tenant, self.token)
        self._deadline = time.monotonic() + ADMIT_WAIT_S
        self._pause = 0.002
        self._inflight = 0

    def holds(self, admitted: int | str, value: int | str, inflight: int | str) -> bool:
        """Whether the script's answer holds the place (False: withdraw it, both entries, and try
        again after :meth:`pause`); raises a 429 :class:`ApiError` when a limit forbids it."""
        limits, self._inflight = self.limits, int(inflight)
        if not int(admitted):
            _refuse_inflight(self.tenant, limits, self._inflight)  # the older limit is named first
            retry_s = max(1, math.ceil(int(value) / 1000))
            raise ApiError(
                429,
                "rate_limited",
                f"tenant {self.tenant} may start {limits.submits_per_minute} runs a minute;"
                f" retry in {retry_s}s",
                details={"limit": limits.submits_per_minute, "retry_after_s": retry_s},
                headers={"Retry-After": str(retry_s)},
            )
        return self._inflight + int(value) <= limits.max_inflight

    def pause(self) -> float:
        """How long to wait before trying again, once the place is withdrawn; a 429 when the
        counts alone reach the limit, a 503 once the answer has stayed open ``ADMIT_WAIT_S``."""
        _refuse_inflight(self.tenant, self.limits, self._inflight)
        # The counts have room: other submits' reservations filled it, and each is created or
        # withdrawn within milliseconds. Jitter keeps the contenders from meeting again.
        if time.monotonic() >= self._deadline:
            raise ApiError(
                503,
                "unavailable",
                f"too many submits of tenant {self.tenant} at once near its in-flight limit; retry",
                headers={"Retry-After": "1"},
            )
        pause = self._pause * (0.5 + random.random())
        self._pause = min(self._pause * 2, 0.05)
        return pause


def _refuse_inflight(tenant: str, limits: TenantLimits, inflight: int) -> None:
    if inflight >= limits.max_inflight:
        raise ApiError(
            429,
            "too_many_in_flight",
            f"tenant {tenant} has {inflight} runs in flight; its limit is {limits.max_inflight}",
            details={"limit": limits.max_inflight, "in_flight": inflight},
            headers={"Retry-After": str(INFLIGHT_RETRY_S)},
        )


class StreamSlots:
    """This process's event streams: ``total`` at most, ``per_tenant`` of them for any one tenant,
    so a tenant that opens streams it never reads leaves other tenants theirs.

    Taken and given back on the event loop's thread only (no awaits in between: no lock needed).
    """

    def __init__(self, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self.open = 0
        self.by_tenant: dict[str | None, int] = {}

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
        self.by_tenant[tenant] = held + 1
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
        slots = self.slots
        slots.open -= 1
        left = slots.by_tenant[self.tenant] - 1
        if left:
            slots.by_tenant[self.tenant] = left
        else:
            del slots.by_tenant[self.tenant]  # bounded by the tenants streaming now
