"""What a claim script writes and returns besides the claim itself, against a real redis-server: the
holder's last-claim key (found by a sweeper burying a dead worker start) and the count of signals
sent into the run (a think's inbox check without a round trip of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from shared import protocol
from shared.liveness import POOL_MARK, HeldClaim, Lives, dump_held, parse_held, parse_pool
from shared.llm.base import Usage
from shared.signals import new_signal
from shared.state import RunHead
from shared.store import Claim, RunStore
from tests.harness import RedisServer
from tests.store_support import make_store
from worker.testing.runs import CALLS, HOLDER, call_claim, claim, commit, started


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def store(rds: redis.Redis) -> RunStore:
    return make_store(rds)


def test_a_phase_claim_keeps_itself_under_its_holder_s_last_claim_key(store: RunStore) -> None:
    thinking = started(store)
    held = claim(store, thinking.head)
    lives = Lives(store.redis, store.keys, store.settings.lease_s)

    assert lives.last_claims([HOLDER]) == [
        HeldClaim(thinking.head.run_id, protocol.RUNNING, HOLDER, thinking.head.version)
    ]
    ttl_ms = int(store.redis.pttl(store.keys.last_claim_of(thinking.head.run_id, HOLDER)))
    assert 0 < ttl_ms <= int(store.settings.lease_s * 1000), "the key lives as long as the claim's lease"
    assert held.field == protocol.RUNNING
    assert lives.last_claims(["another-host:1"]) == []
    assert lives.last_claims([]) == []


def test_a_call_claim_replaces_the_holder_s_last_claim_in_its_shard(store: RunStore) -> None:
    thinking = started(store)
    t = thinking.act("calling", CALLS, Usage(input_tokens=1))
    commit(store, thinking, t)
    acting = t.to.head
    assert isinstance(call_claim(store, acting, CALLS[0].id), Claim)
    lives = Lives(store.redis, store.keys, store.settings.lease_s)

    assert lives.last_claims([HOLDER]) == [
        HeldClaim(acting.run_id, protocol.call_claim(acting.step, CALLS[0].id), HOLDER, acting.version)
    ]


def test_a_think_s_claim_says_how_many_signals_were_sent_and_only_when_asked(store: RunStore) -> None:
    assert claim(store, started(store).head).signals_sent is None
    assert claim(store, started(store).head, read_inbox=True).signals_sent == 0

    signalled = started(store)
    for text in ("first", "second"):
        signal = new_signal("message", text, key=None, by="", at=1.0, max_message_chars=100)
        assert store.send_signal(signalled.head.run_id, signal).status == "stored"

    assert claim(store, signalled.head, read_inbox=True).signals_sent == 2


def test_a_held_list_names_the_pool_beside_the_claims_and_older_readers_skip_it() -> None:
    claims = [HeldClaim("r2", protocol.RUNNING, "h:2", 3), HeldClaim("r1", "c:1:call_0", "h:1", 4)]
    text = dump_held(claims, ["h:2", "h:1"])

    assert parse_held(text) == sorted(claims, key=HeldClaim.dump)
    assert parse_pool(text) == ("h:1", "h:2")
    assert text.count(POOL_MARK) == 2
    assert parse_pool(dump_held(claims)) == ()
    assert parse_pool(None) == () and parse_held(None) == []


def test_a_stored_body_leaves_out_defaults_and_composes_back_to_the_same_head(store: RunStore) -> None:
    thinking = started(store)
    t = thinking.act("calling", CALLS, Usage(input_tokens=3, output_tokens=2))
    commit(store, thinking, t)
    for head in (thinking.head, t.to.head):
        body = head.dump_body()
        assert '"pending_calls":[]' not in body and '"error":null' not in body, body
        assert RunHead.compose(body, head.dump_request(), head.epoch) == head
    stored = store.load(t.to.head.run_id)
    assert stored is not None and stored.model_dump(exclude={"updated_at"}) == t.to.head.model_dump(
        exclude={"updated_at"}
    )
    assert [c.version for c in store.checkpoints(t.to.head.run_id)] == [1, 2, 3]
