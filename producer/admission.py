"""Per-tenant limits on starting runs: runs in flight and submits per minute, checked the same way
by every process that starts a run in a tenant's name (the API, bulk jobs, schedules).

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

On a single Redis, a submit that has its run's create ready (the API's common submit, on its event
loop) needs no reservation: :meth:`Admissions.create_on_loop` sends one script that checks the
window, reads the counts and the tenant's live reservations (submits on the other paths, still
creating their runs), and creates the run in the same atomic step, admitted only if the runs in
flight, those reservations and this run fit the limit. The argument above holds with that submit
as one that reserved and created at the same instant; it is one round trip where the reservation
took two, and a process that dies around it leaves nothing held. Sent again after its reply was
lost, it finds its run and answers it, admitting nothing a second time.

Bulk jobs and schedules start runs through the same reservation as the API's submits (``worker/bulk.py``,
``producer/schedules.py``): a tenant's limits hold for every run started in its name.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from redis.crc import key_slot

from shared.errors import ConfigError
from shared.protocol import lua_prelude
from shared.scripts import SPECS, LoopConnections, ScriptSpec, is_cluster, script_body
from shared.state import RunHead
from shared.store import RunStore
from shared.store.runs import Release, loaded_head
from shared.tenants import TenantLimits

__all__ = [
    "ADMIT_WAIT_S",
    "INFLIGHT_RETRY_S",
    "RESERVE_TTL_MS",
    "Admission",
    "Admissions",
    "Reservation",
    "TenantLimited",
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


# A submit admitted and its run created in one command, on a single Redis: the window script and
# the create script (shared/lua/create.lua) each run as a function of its own KEYS (the create's
# ARGV lead the call's, so its broker commands are where it reads them), with the in-flight counts
# and the tenant's live reservations (its submits on other paths, still creating their runs)
# between them. Admitted only when the runs in flight, those reservations and this run fit the
# limit, and then created in the same step: no reservation of its own, nothing to drop after.
# Not admitted, it withdraws its window entry and answers {'limited', admitted, value, inflight}
# as the reservation script would (value: the window's wait, or the places taken with its own).
# A run already there answers first: sent again after a lost reply (``LoopConnections`` does), the
# script would count its own run against its limits and refuse it, and withdraw the window entry
# of a run it had created.
_ADMIT_CREATE_BODY = """
local clock = now_ms()
local function now_ms()
  return clock
end
local function count_in_window(KEYS, ARGV)
--WINDOW--
end
local function create(KEYS)
--CREATE--
end
local n = #ARGV
local n_create, tenant, max_inflight = tonumber(ARGV[n]), ARGV[n - 1], tonumber(ARGV[n - 2])
local window, reserved, member = KEYS[n_create + 1], KEYS[n_create + 2], ARGV[n - 3]
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- This very call sent again after its reply was lost: the run it created is its answer, not
  -- admitted twice (the create answers its own replay, by the request it stored, or 'exists').
  return create({unpack(KEYS, 1, n_create)})
end
local function inflight()
  local total = 0
  for i = n_create + 3, #KEYS do
    total = total + (tonumber(redis.call('HGET', KEYS[i], tenant)) or 0)
  end
  return total
end
local verdict = count_in_window({window}, {ARGV[n - 5], ARGV[n - 4], member})
if verdict[1] == 0 then
  return {'limited', 0, verdict[2], inflight()}
end
redis.call('ZREMRANGEBYSCORE', reserved, '-inf', clock)
local taken, total = redis.call('ZCARD', reserved) + 1, inflight()
if total + taken > max_inflight then
  redis.call('ZREM', window, member)
  return {'limited', 1, taken, total}
end
return create({unpack(KEYS, 1, n_create)})
"""

#: What the admitting create takes: the create script's KEYS and ARGV, then its own.
_ADMIT_CREATE_SPEC = ScriptSpec(
    keys=SPECS["create"].keys,
    args=SPECS["create"].args,
    more_keys="the create's index keys, then the tenant's submit window, its reservations and the"
    " in-flight hash of every shard",
    more_args="the create's broker commands, then limit, window ms, member, max_inflight, tenant and"
    " the number of the create's KEYS",
    words=SPECS["create"].words | {"limited"},
)


def _admit_create_source() -> str:
    body = _ADMIT_CREATE_BODY.replace("--WINDOW--", script_body("submit_window"))
    body = body.replace("--CREATE--", script_body("create"))
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


@dataclass
class TenantLimited(Exception):
    """A run the tenant may not start now: ``status`` 429 (a limit: ``too_many_in_flight``,
    ``rate_limited``) or 503 (``unavailable``: too many of its submits at once near its in-flight
    limit), with the message, details and headers (``Retry-After``) the API answers with."""

    status: int
    kind: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)


class Admissions:
    """Reservations under the tenants' limits on one store (see the module's docstring)."""

    def __init__(self, store: RunStore, loop: LoopConnections | None = None) -> None:
        self.store = store
        #: The event loop's connections to the same (single) Redis, for :meth:`create_on_loop`.
        self.loop = loop
        # On the store's kept connections: a submit's script skips redis-py's pool, retry wrapper
        # and hooks, as the create script does (``shared.scripts.ScriptConnections``).
        self._reserve = store.register_script("submit_reserve", _reserve_source(), _RESERVE_SPEC)
        self._admit_create = store.register_script(
            "submit_create", _admit_create_source(), _ADMIT_CREATE_SPEC
        )
        self._cluster = is_cluster(store.redis)
        #: Every shard's in-flight hash, the reservation script's KEYS after its own two.
        self._inflight_keys = [store.keys.inflight(shard) for shard in range(store.keys.shards)]
        window = store.keys.submits("tenant")  # tenants' names hold no braces: one check for all
        if self._cluster and key_slot(reservations_key(window).encode()) != key_slot(window.encode()):
            raise ConfigError(f"the key prefix {store.keys.prefix!r} puts a tenant's keys in different slots")

    @property
    def serves_loop(self) -> bool:
        """Whether :meth:`create_on_loop` can serve (an asyncio client of a single Redis)."""
        return self.loop is not None and not self._cluster

    def reserve(self, tenant: str, limits: TenantLimits, *, wait: bool = True) -> Reservation:
        """Count one submit of ``tenant`` and hold its place under the in-flight limit until
        :meth:`release` (call it once the run is created, or its create failed); raise
        :class:`TenantLimited` if a limit forbids it (429), or the answer stays open too long (503).

        ``wait=False``: when reservations fill the room the counts leave, refuse at once (429)
        rather than wait for them to be created or withdrawn. For a caller that holds several
        places itself (a pipeline's pump): the reservations it would wait for are its own."""
        admission = Admission(tenant, limits, self.store.keys.submits(tenant))
        while True:
            if admission.holds(*self._reserve_and_count(tenant, admission.keys, admission.args)):
                return admission.reservation
            with self.store.redis.pipeline(transaction=False) as pipe:
                for key in admission.keys:
                    pipe.zrem(key, admission.token)
                pipe.execute()
            if not wait:
                raise admission.no_room()
            time.sleep(admission.pause())

    async def create_on_loop(
        self, tenant: str, limits: TenantLimits, keys: list[str], args: list[Any]
    ) -> Any:
        """Admit one submit of ``tenant`` under ``limits`` and create its run, ``keys`` and ``args``
        being the create script's (``RunStore.create_call``, with nothing to release): one command
        on the event loop's connections to a single Redis, its reply the create script's.
        :class:`TenantLimited` as :meth:`reserve` raises it; while other submits' reservations fill
        the room the counts leave, it tries again as :meth:`reserve` does."""
        loop = self.loop
        if loop is None or self._cluster:
            raise ConfigError("an admitted create on the event loop needs the connections of a single Redis")
        admission = Admission(tenant, limits, self.store.keys.submits(tenant))
        more_keys = [*admission.keys, *self._inflight_keys]
        more_args = [
            *admission.args[:3],  # the window's limit and length, and this submit's member
            limits.max_inflight,
            tenant,
            len(keys),
        ]
        while True:
            reply = await loop.run(self._admit_create, [*keys, *more_keys], [*args, *more_args])
            if reply[0] not in ("limited", b"limited") or admission.holds(*reply[1:]):
                return reply
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


class Admission:
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
        again after :meth:`pause`); raises :class:`TenantLimited` (429) when a limit forbids it."""
        limits, self._inflight = self.limits, int(inflight)
        if not int(admitted):
            _refuse_inflight(self.tenant, limits, self._inflight)  # the older limit is named first
            retry_s = max(1, math.ceil(int(value) / 1000))
            raise TenantLimited(
                429,
                "rate_limited",
                f"tenant {self.tenant} may start {limits.submits_per_minute} runs a minute;"
                f" retry in {retry_s}s",
                details={"limit": limits.submits_per_minute, "retry_after_s": retry_s},
                headers={"Retry-After": str(retry_s)},
            )
        return self._inflight + int(value) <= limits.max_inflight

    def no_room(self) -> TenantLimited:
        """The refusal of a place the counts and the reservations together leave no room for."""
        _refuse_inflight(self.tenant, self.limits, self._inflight)
        return _inflight_refusal(
            self.limits,
            self._inflight,
            f"tenant {self.tenant}'s runs in flight and places being taken fill its limit of"
            f" {self.limits.max_inflight}",
        )

    def pause(self) -> float:
        """How long to wait before trying again, once the place is withdrawn; :class:`TenantLimited`
        (429) when the counts alone reach the limit, (503) once the answer has stayed open
        ``ADMIT_WAIT_S``."""
        _refuse_inflight(self.tenant, self.limits, self._inflight)
        # The counts have room: other submits' reservations filled it, and each is created or
        # withdrawn within milliseconds. Jitter keeps the contenders from meeting again.
        if time.monotonic() >= self._deadline:
            raise TenantLimited(
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
        raise _inflight_refusal(
            limits,
            inflight,
            f"tenant {tenant} has {inflight} runs in flight; its limit is {limits.max_inflight}",
        )


def _inflight_refusal(limits: TenantLimits, inflight: int, message: str) -> TenantLimited:
    """The 429 of a tenant whose in-flight limit leaves no room: ``message`` says why."""
    return TenantLimited(
        429,
        "too_many_in_flight",
        message,
        details={"limit": limits.max_inflight, "in_flight": inflight},
        headers={"Retry-After": str(INFLIGHT_RETRY_S)},
    )
