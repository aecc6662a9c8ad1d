"""Provider limits: configuration, which limit a think counts against, and the throttle of a think
(its claim given back, its attempt uncounted, its queued time pushed past the countdown)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
import redis

from shared import protocol
from shared.agents import Agent
from shared.errors import ConfigError
from shared.keys import Keys
from shared.limits import (
    MAX_COUNTDOWN_S,
    ProviderLimit,
    RateLimiter,
    Throttled,
    find_limit,
    parse_limits,
    scope_of,
)
from shared.llm.base import ModelRequest
from shared.messages import UserMessage
from shared.settings import Settings
from shared.state import RunHead
from tests.harness import RedisServer
from tests.store_support import make_store, redis_ms
from worker.testing.runs import claim, started
from worker.throttle import ModelGate, estimate_tokens


@pytest.fixture
def rds(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def test_limits_come_from_the_environment_and_bad_ones_say_what_to_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "WESICHAIN_PROVIDER_LIMITS",
        json.dumps({"openai:gpt-4o": {"concurrency": 5, "requests_per_minute": 60}}),
    )
    settings = Settings.from_env()
    assert settings.provider_limits == {"openai:gpt-4o": ProviderLimit(concurrency=5, requests_per_minute=60)}
    monkeypatch.setenv("WESICHAIN_PROVIDER_LIMITS", json.dumps({"openai:gpt-4o": {"concurrency": 0}}))
    with pytest.raises(ConfigError, match="WESICHAIN_PROVIDER_LIMITS.*concurrency"):
        Settings.from_env()
    with pytest.raises(ConfigError, match="provider:model"):
        parse_limits({"gpt-4o": {}}, "here")
    with pytest.raises(ConfigError, match="rpm"):
        parse_limits({"*": {"rpm": 3}}, "here")  # unknown field: a typo is not silently ignored


def test_the_most_specific_pattern_wins() -> None:
    limits = parse_limits(
        {"openai:gpt-4o": {"concurrency": 1}, "openai:*": {"concurrency": 2}, "*": {"concurrency": 3}}, "x"
    )
    assert find_limit(limits, "openai:gpt-4o") == ("openai:gpt-4o", ProviderLimit(concurrency=1))
    assert find_limit(limits, "react+openai:gpt-4o-mini") == (
        "openai:gpt-4o-mini",
        ProviderLimit(concurrency=2),
    )
    assert find_limit(limits, "ollama:llama3:8b") == ("ollama:llama3:8b", ProviderLimit(concurrency=3))
    assert find_limit({}, "openai:gpt-4o") is None


def test_a_per_tenant_limit_gives_each_tenant_buckets_of_its_own() -> None:
    shared, own = ProviderLimit(concurrency=1), ProviderLimit(concurrency=1, per_tenant=True)
    assert scope_of("openai:m", shared, "acme") == "openai:m"
    assert scope_of("openai:m", own, "acme") == "openai:m@acme"
    assert scope_of("openai:m", own, None) == "openai:m@-"
    assert "{" not in scope_of("openai:{evil}", shared, None)  # the scope is a Cluster hash tag


def _head(model: str, tenant: str | None = None) -> RunHead:
    return RunHead.new_idle("r1", "a", "hi", model=model, tenant=tenant)


def test_an_agents_own_limit_applies_to_its_own_model_only(rds: redis.Redis) -> None:
    agent = Agent(name="a", model="openai:agent-model", system_prompt="", limits=ProviderLimit(concurrency=2))
    gate = ModelGate(RateLimiter(rds, Keys(), 10), {}, 1.0)
    found = gate.limit_for(_head("openai:agent-model"), agent)
    assert found is not None and found.scope == "openai:agent-model" and found.limit.concurrency == 2
    assert gate.limit_for(_head("openai:another"), agent) is None  # a producer's own model choice
    settings_first = ModelGate(RateLimiter(rds, Keys(), 10), {"openai:*": ProviderLimit(concurrency=9)}, 1.0)
    found = settings_first.limit_for(_head("openai:agent-model"), agent)
    assert found is not None and found.limit.concurrency == 9


def test_countdowns_spread_out_and_stay_bounded() -> None:
    rng = random.Random(7)
    slot = [Throttled("s", "concurrency", 0).countdown(rng) for _ in range(200)]
    assert min(slot) >= 0.2 and max(slot) <= 1.0 and len(set(slot)) > 100
    bucket = [Throttled("s", "rpm", 2.0).countdown(rng) for _ in range(200)]
    assert min(bucket) >= 2.0 and max(bucket) <= 3.0
    assert Throttled("s", "retry_after", 10_000).countdown(rng) == MAX_COUNTDOWN_S


def test_tokens_are_estimated_from_what_is_sent() -> None:
    request = ModelRequest(model="m", messages=[UserMessage(content="x" * 400)])
    assert estimate_tokens(request) == 101


def test_a_throttled_think_gives_its_claim_back_uncounted_and_is_not_due_before_its_countdown(
    rds: redis.Redis,
) -> None:
    store = make_store(rds)
    thinking = started(store)
    head = thinking.head
    held = claim(store, head, read_messages=True)
    attempts = protocol.attempts_field(head.version, protocol.RUNNING)
    assert store.attempts(head.run_id)[attempts] == "1"
    before = redis_ms(store)
    why = json.dumps({"version": head.version, "limit": "openai:m", "reason": "rpm"})
    assert store.throttle(head.run_id, head.version, held.token, 5.0, why) == 1
    assert store.throttle(head.run_id, head.version, held.token, 5.0, why) == 1  # a replay: once
    raw = store.load_raw(head.run_id)
    assert protocol.RUNNING not in raw
    assert store.attempts(head.run_id)[attempts] == "0"
    # Not due for the sweeper before the countdown and a whole queued lease have passed.
    queued_until = int(raw[protocol.QUEUED_UNTIL])
    assert queued_until >= before + 5000 + int(store.settings.queued_lease_s * 1000)
    assert store.due(store.keys.shard(head.run_id)) == []
    info, count = store.throttled(head.run_id) or ({}, 0)
    assert count == 1 and info["reason"] == "rpm" and info["until"] >= before + 5000
    # The next delivery claims it afresh: attempt 1 again, nothing "expired" before it.
    again = claim(store, head, read_messages=True)
    assert again.attempts == 1 and again.prior == "none"
    # Only the claim's holder can throttle it.
    assert store.throttle(head.run_id, head.version, "not-the-token", 1.0, why) == 0
