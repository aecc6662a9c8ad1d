"""A run's key names, built once per run: the same names the per-name methods give."""

from __future__ import annotations

import fakeredis
import pytest

from shared import keys as keys_module
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants


def test_a_runs_cached_names_are_the_per_name_methods_names() -> None:
    k = Keys("p:", 16)
    run = "0123abcd"
    shard = k.shard(run)
    of = k.of(run)
    assert of.run == f"p:{{s{shard}}}:run:{run}" == k.run(run)
    assert (of.messages, of.checkpoints, of.events, of.inbox, of.attempts) == (
        k.messages(run),
        k.checkpoints(run),
        k.events(run),
        k.inbox(run),
        k.attempts(run),
    )
    assert (of.leases, of.indexes, of.inflight, of.ended) == (
        k.leases(shard),
        k.indexes(shard),
        k.inflight(shard),
        k.ended(shard),
    )
    assert of.results(3) == k.results(run, 3) == f"{of.run}:step:3:results"
    assert of.last_claim("h:1") == k.last_claim(shard, "h:1") == k.last_claim_of(run, "h:1")
    assert of.index("t", "status", "running") == k.index(shard, "t", "status", "running")
    assert k.of(run) is of


def test_the_cache_is_bounded_and_not_part_of_the_layouts_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    k = Keys("p:", 4)
    monkeypatch.setattr(keys_module, "_CACHED_RUNS", 3)
    names = [k.of(f"run-{i}").run for i in range(10)]
    assert len(k._runs) <= 3
    assert names == [k.run(f"run-{i}") for i in range(10)]
    assert k == Keys("p:", 4) and hash(k) == hash(Keys("p:", 4))


def test_a_listing_index_names_one_tenant() -> None:
    keys = Keys()
    # Thread ids hold ':': without escaping, tenant org's index of thread "eu:all:" was tenant
    # org:eu's index of all its runs, and org's runs would fill it.
    made = {keys.index(3, "org", "thread", "eu:all:"), keys.index(3, "org:eu", "all", "")}
    assert len(made) == 2
    assert keys.index(3, "acme", "thread", "t:1") == "wesichain:{s3}:idx:acme:thread:t:1"
    assert keys.index(3, None) == "wesichain:{s3}:idx:-:all:"


def test_a_threads_keys_name_one_tenant_and_one_thread() -> None:
    keys = Keys()
    # Tenant names and thread ids may both hold ':': no split of one pair names another's keys.
    pairs = [("org", "eu:t1"), ("org:eu", "t1"), (None, "org:eu:t1"), ("org:eu:t1", "x")]
    for name in ("thread", "thread_state", "thread_waiting", "thread_rolled_back"):
        made = [getattr(keys, name)(tenant, thread) for tenant, thread in pairs]
        assert len(set(made)) == len(pairs), made
    # A tenant without ':' keeps the keys it had.
    assert keys.thread("acme", "t:1") == "wesichain:{thread:acme:t:1}"


def test_no_tenant_is_named_as_another_tenants_records_are_keyed() -> None:
    tenants = Tenants(fakeredis.FakeRedis(decode_responses=True), Keys())
    # The settings hash of tenant "acme:keys" would be the set of tenant acme's API keys.
    assert Keys().tenant("acme:keys") == Keys().api_keys("acme")
    for name in ("acme:keys", "acme:submits", "acme:rate"):
        # Whichever record would be written first under the name.
        for write, args in (
            (tenants.create_key, ()),
            (tenants.set_limits, (TenantLimits(max_inflight=5),)),
            (tenants.set_default_callback, ("https://hooks.example.com/x",)),
            (tenants.webhook_secret, ()),
            (tenants.set_operator, (True,)),
        ):
            with pytest.raises(InvalidRequest, match="as the keys of another tenant's own records do"):
                write(name, *args)
    for name in ("acme:eu", "keys", "acme:keys-eu"):
        assert tenants.create_key(name)[1].tenant == name
