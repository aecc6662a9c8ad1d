"""Places under a tenant's limits (``producer/admission.py``) on a real redis-server: a caller that
holds several places itself is refused at once when they fill the room, not after a wait for
reservations that are its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from producer.admission import Admissions, TenantLimited
from shared.settings import Settings
from shared.store import RunStore
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
