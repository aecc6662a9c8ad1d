"""Each tenant's share of one process's event streams and memory scans, and where a tenant's
reservations live."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from producer.admission import reservations_key
from producer.api.config import ApiConfig
from producer.api.errors import ApiError
from producer.api.limits import SCANS_PER_TENANT, ScanShares, StreamSlots
from shared.errors import ConfigError
from shared.keys import Keys
from shared.settings import Settings


def config(**fields: int) -> ApiConfig:
    return ApiConfig(settings=Settings(), **fields)  # type: ignore[arg-type]


def test_a_tenants_share_is_a_quarter_of_the_streams_unless_set() -> None:
    assert config().streams_per_tenant == 250
    assert config(max_streams=2).streams_per_tenant == 1
    assert config(max_streams=8, max_streams_per_tenant=3).streams_per_tenant == 3
    assert config(max_streams=8, max_streams_per_tenant=50).streams_per_tenant == 8
    with pytest.raises(ConfigError):
        config(max_streams_per_tenant=0)


def test_the_share_and_the_total_are_each_enforced_and_given_back_once() -> None:
    slots = StreamSlots(total=3, per_tenant=2)
    a = [slots.take("a"), slots.take("a")]
    with pytest.raises(ApiError) as at_share:
        slots.take("a")
    assert at_share.value.status == 429 and at_share.value.kind == "too_many_streams"
    assert at_share.value.details == {"limit": 2, "open": 2}
    b = slots.take("b")
    with pytest.raises(ApiError) as full:
        slots.take("c")
    assert full.value.status == 503 and full.value.kind == "unavailable"
    a[0].release()
    a[0].release()  # the response and its body both give it back: counted once
    assert slots.open == 2 and slots.by_tenant == {"a": 1, "b": 1}
    slots.take("a")
    b.release()
    assert slots.by_tenant == {"a": 2}


@pytest.mark.parametrize("prefix", ["wesichain:", "{app}:", "app{:", "a{b}c:"])
def test_a_tenants_reservations_share_the_slot_of_its_submits_window(prefix: str) -> None:
    window = Keys(prefix=prefix).submits("billing")
    assert key_slot(reservations_key(window).encode()) == key_slot(window.encode())


def test_a_tenants_memory_scans_at_once_are_its_share_and_no_more() -> None:
    """Eight searches at once from one tenant made another tenant's reads 40 times slower: each
    scans up to 2,000 items in a script on the Redis everyone shares."""
    scans = ScanShares()
    with scans.hold("a"), scans.hold("a"):
        assert SCANS_PER_TENANT == 2
        with pytest.raises(ApiError) as refused:
            with scans.hold("a"):
                pass
        assert (refused.value.status, refused.value.kind) == (429, "too_many_scans")
        assert refused.value.details == {"limit": 2, "running": 2}
        with scans.hold("b"):  # another tenant's share is its own
            pass
    # Given back on the way out, a failed scan's too.
    with pytest.raises(RuntimeError):
        with scans.hold("a"):
            raise RuntimeError("the scan failed")
    with scans.hold("a"), scans.hold("a"):
        pass
