"""Provider limits shared by the pool, on a real redis-server with real workers.

The limiter's scripts are checked directly against Redis (buckets, slots whose holder died, a
back-off), then the whole path: real ``wesichain worker`` processes call a loopback fake of the
OpenAI API that counts the requests it is answering at once and answers 429 past its own limits,
for the thinks of runs and for the judge of an eval alike.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.evals.client import EvalClient
from shared.evals.dataset import Case
from shared.evals.spec import parse_spec
from shared.keys import Keys
from shared.limits import Denied, Grant, ProviderLimit, RateLimiter
from shared.state import Phase
from shared.store import RunStore
from tests.broker import Settings
from tests.conftest import own_store
from tests.fakeproviders import FakeProvider, FakeToolCall, Reply
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_limits"


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:  # the shared cluster with --store cluster
        yield s


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    client.flushall()
    yield client
    client.close()


def _limiter(r: redis.Redis, lease_s: float = 10.0) -> RateLimiter:
    return RateLimiter(r, Keys(), lease_s)


# -- the limiter's scripts --------------------------------------------------------------------------


def test_requests_per_minute_is_a_bucket_refilled_by_redis_time(r: redis.Redis) -> None:
    limiter = _limiter(r)
    limit = ProviderLimit(requests_per_minute=3)
    grants = [limiter.acquire("p:m", limit, 10) for _ in range(3)]
    assert all(isinstance(g, Grant) for g in grants)
    denied = limiter.acquire("p:m", limit, 10)
    assert isinstance(denied, Denied) and denied.reason == "rpm"
    assert 0 < denied.wait_s <= 20.0  # one request every 20 s
    # Another scope has a bucket of its own.
    assert isinstance(limiter.acquire("p:other", limit, 10), Grant)


def test_a_slot_comes_back_when_released_or_when_its_holder_stops_renewing(r: redis.Redis) -> None:
    limiter = _limiter(r, lease_s=0.5)
    limit = ProviderLimit(concurrency=2)
    first, second = limiter.acquire("p:m", limit, 1), limiter.acquire("p:m", limit, 1)
    assert isinstance(first, Grant) and isinstance(second, Grant)
    full = limiter.acquire("p:m", limit, 1)
    assert isinstance(full, Denied) and full.reason == "concurrency"
    limiter.release(first, used_tokens=1)
    third = limiter.acquire("p:m", limit, 1)
    assert isinstance(third, Grant)
    assert limiter.in_use("p:m") == 2
    # The holder of `second` dies (stops renewing); `third`'s is renewed: only its slot stays.
    deadline = time.monotonic() + 5
    while limiter.in_use("p:m") == 2 and time.monotonic() < deadline:
        assert limiter.renew([third]) == [True]
        time.sleep(0.1)
    assert limiter.in_use("p:m") == 1
    assert limiter.renew([second]) == [False]
    assert isinstance(limiter.acquire("p:m", limit, 1), Grant)


def test_tokens_per_minute_are_charged_what_a_call_really_used(r: redis.Redis) -> None:
    limiter = _limiter(r)
    limit = ProviderLimit(tokens_per_minute=1000)
    grant = limiter.acquire("p:m", limit, 100)
    assert isinstance(grant, Grant)
    limiter.release(grant, used_tokens=1500)  # far more than estimated: the bucket is in debt
    denied = limiter.acquire("p:m", limit, 100)
    assert isinstance(denied, Denied) and denied.reason == "tpm"
    assert denied.wait_s > 30  # 600 tokens of debt and 100 more needed, at 1000 a minute


def test_a_back_off_stops_every_grant_until_it_passes(r: redis.Redis) -> None:
    limiter = _limiter(r)
    limit = ProviderLimit(concurrency=10)
    limiter.back_off("p:m", limit, 1.0)
    denied = limiter.acquire("p:m", limit, 1)
    assert isinstance(denied, Denied) and denied.reason == "retry_after" and 0 < denied.wait_s <= 1.0
    limiter.back_off("p:m", limit, 0.1)  # a shorter one never shortens it
    assert isinstance(limiter.acquire("p:m", limit, 1), Denied)
    wait_until(lambda: isinstance(limiter.acquire("p:m", limit, 1), Grant), timeout=5, what="the back-off")


# -- the pool ----------------------------------------------------------------------------------------


def _by_conversation(body: Any) -> Reply:
    """A tool call first, the answer once the tool's result is in the conversation."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    if any(m.get("role") == "tool" for m in messages):
        return Reply(text="1 + 2 = 3")
    return Reply(tool_calls=[FakeToolCall("add", {"a": 1, "b": 2})])


def _workers(
    server: RedisServer, fake: FakeProvider, limits: dict[str, Any], n: int, log_dir: str
) -> list[WorkerProcess]:
    env = {**fake.env(), "WESICHAIN_PROVIDER_LIMITS": json.dumps(limits)}
    workers = [
        WorkerProcess(
            f"l{i}", server.url, agents=AGENTS, pool="threads", concurrency=16, env=env, log_dir=log_dir
        )
        for i in range(n)
    ]
    for w in workers:
        w.start(wait=False)
    for w in workers:
        w.wait_ready()
    return workers


def test_the_pool_stays_under_the_providers_limits_and_every_run_completes(
    server: RedisServer, r: redis.Redis, tmp_path: Any
) -> None:
    fake = FakeProvider("openai")
    fake.responder = _by_conversation
    fake.latency_s = 0.2
    fake.max_concurrent = 5
    fake.requests_per_minute = 120
    # A grant is made by Redis's clock and reaches the provider a hop later, the hops not all
    # equally long: one request of slack (half a second at 2 a second) absorbs that jitter.
    fake.rate_slack = 1.0
    runs = 80  # 160 model calls: the first 120 as fast as 5 at once allow, then 2 a second
    with fake:
        workers = _workers(
            server,
            fake,
            {"openai:fake-model": {"concurrency": 5, "requests_per_minute": 120}},
            4,
            str(tmp_path),
        )
        client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
        try:
            handles = [client.submit("limited", f"run {i}") for i in range(runs)]
            heads = [h.wait(timeout=240) for h in handles]
        finally:
            for w in workers:
                w.stop()
            client.close()
    assert [h.phase for h in heads] == [Phase.COMPLETED] * runs
    assert fake.peak_in_flight <= 5
    assert fake.rejected == {"concurrency": 0, "rate": 0}
    assert len(fake.requests) == 2 * runs  # no call was made twice
    store = RunStore(r, Settings(redis_url=server.url))
    throttled = [t for h in heads if (t := store.throttled(h.run_id)) is not None]
    assert throttled, "the limits never made a think wait: the test did not test them"
    for head in heads:
        # Waiting for capacity is neither a crash (attempts) nor a lost phase (hand-ons, epochs).
        assert head.epoch == 0
        attempts = {k: v for k, v in store.attempts(head.run_id).items() if k.startswith("v")}
        assert set(attempts.values()) == {"1"}, attempts


def test_a_429_makes_the_whole_pool_back_off(server: RedisServer, r: redis.Redis, tmp_path: Any) -> None:
    # The provider is stricter than the configured limit: it answers 429 with Retry-After: 2. Each
    # call that completes waits out about one back-off (the waiting calls come back together and
    # all but one are refused again), so the window is as short as leaves a second of silence to
    # check, and three runs (six calls) are enough to send the first burst three at once.
    fake = FakeProvider("openai")
    fake.responder = _by_conversation
    fake.latency_s = 0.3
    fake.max_concurrent = 1
    fake.retry_after = "2"
    runs = 3
    with fake:
        workers = _workers(server, fake, {"openai:*": {"concurrency": 4}}, 2, str(tmp_path))
        client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
        try:
            handles = [client.submit("limited", f"run {i}") for i in range(runs)]
            heads = [h.wait(timeout=240) for h in handles]
        finally:
            for w in workers:
                w.stop()
            client.close()
    assert [h.phase for h in heads] == [Phase.COMPLETED] * runs
    assert fake.rejected["concurrency"] > 0
    # The first 429 is answered 0.3 s after it arrived; from then on every worker waits 2 s. Calls
    # granted before that may still arrive, within moments; then nothing until the back-off ends.
    first = fake.rejected_at[0]
    quiet = [req.at - first for req in fake.requests if first + 1.0 <= req.at <= first + 2.0]
    assert quiet == [], f"requests arrived during the pool's back-off: {quiet}"
    store = RunStore(r, Settings(redis_url=server.url))
    reasons = {t[0]["reason"] for h in heads if (t := store.throttled(h.run_id)) is not None}
    assert "retry_after" in reasons


def test_an_evals_judge_takes_the_same_limit_as_the_pools_thinks(
    server: RedisServer, r: redis.Redis, tmp_path: Any
) -> None:
    # The case runs answer without a provider; their judge is the limited model, asked by up to
    # 12 scorings at once across two workers, against a provider that takes only 2 at once.
    fake = FakeProvider("openai")
    fake.responder = lambda body: Reply(text='{"score": 1, "reason": "right"}')
    fake.latency_s = 0.3
    fake.max_concurrent = 2
    cases = 30
    spec = parse_spec(
        {
            "name": "judged",
            "dataset": "d.jsonl",
            "concurrency": 12,
            "variants": [{"agent": "instant"}],
            "scorers": [{"kind": "judge", "model": "openai:fake-judge", "rubric": "Is it 3?"}],
        }
    )
    with fake:
        workers = _workers(server, fake, {"openai:fake-judge": {"concurrency": 2}}, 2, str(tmp_path))
        client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
        evals = EvalClient(client)
        try:
            data = [Case(id=f"c{i}", input=f"case {i}", expected="3") for i in range(cases)]
            eval_id, _ = evals.submit(spec, data, b"", "d.jsonl")
            done = evals.wait(eval_id, timeout=240)
            results = list(evals.results(eval_id))
        finally:
            for w in workers:
                w.stop()
            client.close()
    assert done.meta.status == "completed" and done.counts[0].passed == cases
    assert [(s.value, s.error) for res in results for s in res.scores] == [(1.0, False)] * cases
    assert fake.peak_in_flight <= 2
    assert fake.rejected == {"concurrency": 0, "rate": 0}
    assert len(fake.requests) == cases  # a scoring that waited never reached the provider
    assert done.judge_waits > 0, "the limit never made a judge wait: the test did not test it"
