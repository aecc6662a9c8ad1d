"""Places under a tenant's limits (``producer/admission.py``) on a real redis-server: a caller that
holds several places itself is refused at once when they fill the room, not after a wait for
reservations that are its own; a submit admitted and created in one command (the API's event loop)
creates exactly the runs the limits leave room for, and a refused one writes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio

from producer.admission import Admissions, TenantLimited, reservations_key
from shared.scripts import LoopConnections
from shared.settings import Settings
from shared.state import RunHead
from shared.store import RunStore
from shared.store.runs import NewRun, creation_of
from shared.tasks import start_task
from shared.tenants import TenantLimits
from tests.harness import RedisServer


@pytest.fixture
def admissions(redis_server: RedisServer) -> Iterator[Admissions]:
    client = redis_server.client()
    yield Admissions(RunStore(client, Settings(prefix=f"adm-{uuid.uuid4().hex[:8]}:", shards=4)))
    client.close()


def test_places_that_fill_the_room_refuse_the_next_at_once_without_waiting(admissions: Admissions) -> None:
    limits = TenantLimits(max_inflight=2)
    held = [admissions.reserve("t", limits, wait=False) for _ in range(2)]
    with pytest.raises(TenantLimited) as refused:
        admissions.reserve("t", limits, wait=False)
    # Refused on the first answer: a wait would last ADMIT_WAIT_S (3 s) and end in a 503.
    assert (refused.value.status, refused.value.kind) == (429, "too_many_in_flight")
    for reservation in held:
        admissions.release(reservation)
    # The places given back are room again, and a refused place left nothing behind.
    again = [admissions.reserve("t", limits, wait=False) for _ in range(2)]
    for reservation in again:
        admissions.release(reservation)


def test_a_waiting_caller_is_told_unavailable_once_others_places_stay_taken(admissions: Admissions) -> None:
    limits = TenantLimits(max_inflight=1)
    held = admissions.reserve("t", limits)
    with pytest.raises(TenantLimited) as refused:
        admissions.reserve("t", limits)
    assert (refused.value.status, refused.value.kind) == (503, "unavailable")
    admissions.release(held)


def _admitted_creates(
    redis_server: RedisServer, admissions: Admissions, limits: TenantLimits, n: int
) -> list[str | TenantLimited]:
    """``n`` submits of tenant ``t`` admitted and created at once on the event loop: what each did
    (the create's outcome, or its refusal)."""
    store = admissions.store

    async def submits() -> list[str | TenantLimited]:
        client = redis.asyncio.from_url(redis_server.url)
        admissions.loop = LoopConnections(client)

        async def one() -> str | TenantLimited:
            head = RunHead.new_idle(uuid.uuid4().hex, "a", "q", tenant="t")
            keys, args = store.create_call(NewRun(head, [start_task(head.run_id)]))
            try:
                return creation_of(await admissions.create_on_loop("t", limits, keys, args))
            except TenantLimited as refused:
                return refused

        try:
            return await asyncio.gather(*(one() for _ in range(n)))
        finally:
            await admissions.loop.close()
            await client.aclose()

    return asyncio.run(submits())


def test_submits_admitted_with_their_create_make_exactly_the_runs_the_limit_has_room_for(
    redis_server: RedisServer, admissions: Admissions
) -> None:
    limits = TenantLimits(max_inflight=5)
    outcomes = _admitted_creates(redis_server, admissions, limits, 12)
    created = [o for o in outcomes if o == "created"]
    refused = [o for o in outcomes if isinstance(o, TenantLimited)]
    assert len(created) == 5 and len(refused) == 7
    assert {(r.status, r.kind) for r in refused} == {(429, "too_many_in_flight")}
    store = admissions.store
    assert store.inflight("t") == 5
    # Each refused submit withdrew its window entry; no reservation was ever left behind.
    window = store.keys.submits("t")
    assert store.redis.zcard(window) == 5
    assert store.redis.zcard(reservations_key(window)) == 0


def test_a_submit_admitted_with_its_create_waits_for_others_reservations_then_is_unavailable(
    redis_server: RedisServer, admissions: Admissions
) -> None:
    limits = TenantLimits(max_inflight=1)
    held = admissions.reserve("t", limits)  # a submit on another path, still creating its run
    (outcome,) = _admitted_creates(redis_server, admissions, limits, 1)
    assert isinstance(outcome, TenantLimited) and (outcome.status, outcome.kind) == (503, "unavailable")
    admissions.release(held)
    assert _admitted_creates(redis_server, admissions, limits, 1) == ["created"]


def test_a_submit_over_the_window_is_refused_and_writes_nothing(
    redis_server: RedisServer, admissions: Admissions
) -> None:
    limits = TenantLimits(max_inflight=100, submits_per_minute=2)
    outcomes = _admitted_creates(redis_server, admissions, limits, 3)
    refused = [o for o in outcomes if isinstance(o, TenantLimited)]
    assert outcomes.count("created") == 2
    assert [(r.status, r.kind) for r in refused] == [(429, "rate_limited")]
    store = admissions.store
    assert store.inflight("t") == 2 and store.redis.zcard(store.keys.submits("t")) == 2


def test_a_reservation_sent_again_after_its_reply_was_lost_holds_its_place_once(
    admissions: Admissions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's client sends a script again when its reply is lost. The reservation's second run
    finds its own window entry and answers as the first did: at the tenant's last free submit of
    the minute it is admitted (it was refused ``rate_limited``, and its place held 30 s), and it
    counts once in the window and among the reservations."""
    limits = TenantLimits(max_inflight=10, submits_per_minute=2)
    admissions.release(admissions.reserve("t", limits))  # one of the two submits spent
    script = admissions._reserve

    class Twice:
        spec, name = script.spec, script.name

        def __call__(self, *, keys: list[str], args: list[str]) -> object:
            script(keys=keys, args=args)  # its reply lost
            return script(keys=keys, args=args)

    monkeypatch.setattr(admissions, "_reserve", Twice())
    reservation = admissions.reserve("t", limits)
    window = admissions.store.keys.submits("t")
    assert admissions.store.redis.zcard(window) == 2
    assert admissions.store.redis.zrange(reservations_key(window), 0, -1) == [reservation.token]
    admissions.release(reservation)
