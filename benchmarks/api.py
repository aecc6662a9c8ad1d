"""The HTTP API's costs: what it adds to a run, how many submits one process takes, SSE fan-out.

* ``overhead``: submit -> terminal of the ``direct`` agent over HTTP (POST, then the run's event
  stream until its end event) against the Python client on Redis (submit, then XREAD until the
  end event), interleaved run by run; goal: at most 1.5 ms added at p50. Interleaved with them, the
  same run submitted and followed in one request (``POST /v1/runs`` with ``Accept:
  text/event-stream``), reported beside it (``submit_and_follow_*``).
* ``submits``: new runs per second one API process takes from concurrent clients (scripted model;
  its worker consumes no queue, so the runs stay queued and only the submit path is measured, on
  a database of its own); goal: at least 1,000 a second.
* ``sse_fanout``: 100 followers of one run (``long``, 10 steps of a 200 ms model) on one API
  process; every follower must get every event, in order, once; lag = when a follower parsed the
  event minus when Redis appended it to the run's stream (the millisecond part of its stream id;
  Redis and the followers share the host's clock); goal: p95 at most 50 ms. ``live_lag_ms`` is the
  same over the events appended once every follower's stream was open (the run starts before its
  followers connect, and its first events wait for the last of them).

``submits`` also reports the API process's CPU and the Redis commands (scripts' own included) per
submit, and ``overhead`` the API's CPU and the Redis connections it opened per submitted and
followed run: figures the machine's load moves far less than the rate and the latency.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from benchmarks.harness import check, new_prefix, run_and_wait, summary
from shared.keys import Keys
from shared.tenants import TenantLimits, Tenants
from worker.testing.api import ApiProcess, bearer

__all__ = ["FANOUT_FOLLOWERS", "OVERHEAD_GOAL_MS", "SSE_LAG_GOAL_MS", "SUBMITS_GOAL", "scenario_api"]

OVERHEAD_GOAL_MS = 1.5
SUBMITS_GOAL = 1000.0
SSE_LAG_GOAL_MS = 50.0
FANOUT_FOLLOWERS = 100
#: The throughput phase's database (its queued runs must not reach the other phases' workers).
SUBMITS_DB = 5
_UNLIMITED = TenantLimits(max_inflight=10_000_000, submits_per_minute=10_000_000)


def _key(redis_client: Any, prefix: str) -> str:
    tenants = Tenants(redis_client, Keys(prefix))
    key, record = tenants.create_key("bench")
    tenants.set_limits(record.tenant, _UNLIMITED)
    tenants.set_models(record.tenant, ["scripted:*"])  # the fan-out's run names its scripted model
    return key


def _follow_http(http: httpx.Client, run_id: str) -> None:
    """Read the run's event stream until the server closes it after the end event."""
    with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"accept": "text/event-stream"}) as r:
        for _ in r.iter_lines():
            pass


def _submit_and_follow(http: httpx.Client) -> None:
    """Submit a run and read its event stream to its end in one request (``Accept: text/event-stream``)."""
    body = {"agent": "direct", "input": "What is the answer?"}
    with http.stream("POST", "/v1/runs", json=body, headers={"accept": "text/event-stream"}) as r:
        assert r.status_code == 200, r.status_code
        for _ in r.iter_lines():
            pass


def _overhead(ctx: Any, prefix: str, api: ApiProcess, key: str, n: int) -> dict[str, Any]:
    client = ctx.cluster.client(prefix)
    http_ms: list[float] = []
    one_ms: list[float] = []
    redis_ms: list[float] = []
    redis = ctx.cluster.redis.client()
    assert api.proc is not None
    server = psutil.Process(api.proc.pid)
    cpu_s = cpu_one_s = connections = 0.0

    def api_cpu_s() -> float:
        return float(sum(server.cpu_times()[:2]))

    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=60) as http:
        for i in range(n + 3):
            if i == 3:  # the first runs warm connections and caches
                connections = _connections(redis)
            cpu_before = api_cpu_s()
            started = time.perf_counter()
            run_id = http.post("/v1/runs", json={"agent": "direct", "input": "What is the answer?"}).json()[
                "run_id"
            ]
            _follow_http(http, run_id)
            elapsed = (time.perf_counter() - started) * 1000
            cpu_between = api_cpu_s()
            started = time.perf_counter()
            _submit_and_follow(http)
            one = (time.perf_counter() - started) * 1000
            cpu_after = api_cpu_s()
            _, direct = run_and_wait(client, "direct", "What is the answer?")
            if i >= 3:
                http_ms.append(elapsed)
                one_ms.append(one)
                redis_ms.append(direct)
                cpu_s += cpu_between - cpu_before
                cpu_one_s += cpu_after - cpu_between
    # Connections Redis accepted meanwhile: the API's (the worker and the Python client keep theirs).
    connections = _connections(redis) - connections
    redis.close()
    client.close()
    over = summary(http_ms)["p50"] - summary(redis_ms)["p50"]
    return {
        "api_ms": summary(http_ms),
        "submit_and_follow_ms": summary(one_ms),
        "python_client_ms": summary(redis_ms),
        "added_p50_ms": round(over, 3),
        # The same run submitted and followed in one request (the answer to the submit is the run's
        # event stream): a request, its key's read and the run's read fewer.
        "submit_and_follow_added_p50_ms": round(summary(one_ms)["p50"] - summary(redis_ms)["p50"], 3),
        # Counts the machine's load moves less than the latency: the API process's CPU per submit
        # and its followed stream, and the Redis connections opened per followed run (a stream
        # ended by cancelling its reader once cost a new one each).
        "api_cpu_ms_per_run": round(cpu_s * 1000 / n, 3),
        "submit_and_follow_api_cpu_ms_per_run": round(cpu_one_s * 1000 / n, 3),
        "redis_connections_per_run": round(connections / (2 * n), 3),
    }


def _connections(redis: Any) -> int:
    """The connections the server has accepted so far."""
    return int(redis.info("stats")["total_connections_received"])


def _submits(ctx: Any, n: int, threads: int) -> dict[str, Any]:
    cl = ctx.cluster
    prefix = new_prefix("api-submits")
    # Serves the agent (so submits are accepted) but consumes a queue nobody sends to.
    idle = cl.wesichain_worker("api-idle", prefix, queues="bench.nobody", db=SUBMITS_DB)
    cl.up(idle)
    api = ApiProcess(cl.db_url(SUBMITS_DB), env={"WESICHAIN_PREFIX": prefix}).start()
    try:
        key = _key(cl.redis.client(db=SUBMITS_DB), prefix)
        local = threading.local()
        clients: list[httpx.Client] = []
        lock = threading.Lock()

        def submit(_: int) -> int:
            http = getattr(local, "http", None)
            if http is None:
                http = local.http = httpx.Client(base_url=api.url, headers=bearer(key), timeout=60)
                with lock:
                    clients.append(http)
            return http.post("/v1/runs", json={"agent": "direct", "input": "x"}).status_code

        redis = cl.redis.client(db=SUBMITS_DB)
        assert api.proc is not None
        server = psutil.Process(api.proc.pid)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(submit, range(threads * 4)))  # warm-up: connections, caches
            commands, cpu_s = _commands(redis), sum(server.cpu_times()[:2])
            started = time.perf_counter()
            statuses = list(pool.map(submit, range(n)))
            elapsed = time.perf_counter() - started
            cpu_s = sum(server.cpu_times()[:2]) - cpu_s
            commands = _commands(redis) - commands
        redis.close()
        for http in clients:
            http.close()
    finally:
        api.stop()
        cl.down(idle)
    accepted = statuses.count(202)
    return {
        "submits": n,
        "accepted": accepted,
        "threads": threads,
        "per_s": round(accepted / elapsed, 1),
        # Less moved by the machine's load than the rate: the API process's CPU per submit, and
        # the commands Redis ran per submit (those inside scripts included; the idle worker's
        # heartbeats too, a few a second).
        "api_cpu_ms_per_submit": round(cpu_s * 1000 / n, 3),
        "redis_commands_per_submit": round(commands / n, 2),
    }


def _commands(redis: Any) -> int:
    """Every command the server has run so far (``INFO commandstats``)."""
    return sum(int(stat["calls"]) for stat in redis.info("commandstats").values())


async def _fanout(api: ApiProcess, key: str, followers: int, steps: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=followers + 10, max_keepalive_connections=followers + 10)
    async with httpx.AsyncClient(base_url=api.url, headers=bearer(key), timeout=120, limits=limits) as http:
        run = (
            await http.post(
                "/v1/runs",
                json={"agent": "long", "input": f"steps={steps}", "model": "scripted:long-200ms"},
            )
        ).json()
        path = f"/v1/runs/{run['run_id']}/events"

        opened: list[float] = []

        async def follow() -> list[tuple[str, float, float]]:
            got: list[tuple[str, float, float]] = []
            async with http.stream("GET", path, headers={"accept": "text/event-stream"}) as response:
                opened.append(time.time())
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        now = time.time()
                        event_id = line[len('data: {"id":"') :].split('"', 1)[0]
                        got.append((event_id, now, int(event_id.split("-")[0]) / 1000))
            return got

        seen = await asyncio.gather(*(follow() for _ in range(followers)))
        page = (await http.get(path, params={"limit": 500})).json()
    expected = [e["id"] for e in page["events"]]
    complete = sum(1 for got in seen if [eid for eid, _, _ in got] == expected)
    lags = [(now - ts) * 1000 for got in seen for _, now, ts in got]
    # Events appended once every stream was open: the fan-out alone, without the time 100 clients
    # take to connect (the run starts before they do, and its first events wait for them).
    all_open = max(opened)
    live = [(now - ts) * 1000 for got in seen for _, now, ts in got if ts > all_open]
    return {
        "followers": followers,
        "events_per_run": len(expected),
        "followers_with_every_event": complete,
        "lag_ms": summary(lags),
        "live_lag_ms": summary(live) if live else None,
        "connect_spread_ms": round((max(opened) - min(opened)) * 1000, 1),
    }


def scenario_api(ctx: Any) -> dict[str, Any]:
    """The API's added latency, one process's submits per second, and SSE fan-out to 100 followers."""
    cl, quick = ctx.cluster, ctx.quick
    submits = _submits(ctx, n=1500 if quick else 10_000, threads=16)
    ctx.log(
        f"    submits: {submits['per_s']}/s ({submits['accepted']}/{submits['submits']} accepted),"
        f" API CPU {submits['api_cpu_ms_per_submit']} ms and {submits['redis_commands_per_submit']}"
        " Redis commands per submit"
    )
    prefix = new_prefix("api")
    worker = cl.wesichain_worker("api-w", prefix, concurrency=2)
    cl.up(worker)
    api = ApiProcess(cl.url, env={"WESICHAIN_PREFIX": prefix}).start()
    try:
        key = _key(cl.redis.client(), prefix)
        overhead = _overhead(ctx, prefix, api, key, n=20 if quick else 200)
        ctx.log(
            f"    overhead: {overhead['added_p50_ms']} ms added at p50; API CPU"
            f" {overhead['api_cpu_ms_per_run']} ms and {overhead['redis_connections_per_run']} Redis"
            " connections opened per submitted and followed run; in one request:"
            f" {overhead['submit_and_follow_added_p50_ms']} ms added,"
            f" API CPU {overhead['submit_and_follow_api_cpu_ms_per_run']} ms"
        )
        fanout = asyncio.run(_fanout(api, key, FANOUT_FOLLOWERS, steps=5 if quick else 10))
        ctx.log(f"    fan-out: lag {fanout['lag_ms']}, live lag {fanout['live_lag_ms']}")
    finally:
        api.stop()
        cl.down(worker)
    every = fanout["followers_with_every_event"] == fanout["followers"]
    return {
        "overhead": overhead,
        "submits": submits,
        "sse_fanout": fanout,
        "targets": {
            "api_added_p50_ms": check(overhead["added_p50_ms"], OVERHEAD_GOAL_MS, "<="),
            # The same goal for the API's one request that submits a run and follows it to its end.
            "api_submit_and_follow_added_p50_ms": check(
                overhead["submit_and_follow_added_p50_ms"], OVERHEAD_GOAL_MS, "<="
            ),
            "api_submits_per_s": check(submits["per_s"], SUBMITS_GOAL, ">="),
            "sse_lag_p95_ms": check(fanout["lag_ms"]["p95"], SSE_LAG_GOAL_MS, "<="),
            # The same goal on the events appended once every follower's stream was open.
            "sse_live_lag_p95_ms": check(
                fanout["live_lag_ms"]["p95"] if fanout["live_lag_ms"] else math.inf, SSE_LAG_GOAL_MS, "<="
            ),
            "sse_every_follower_every_event": check(1.0 if every else 0.0, 1.0, ">="),
        },
    }
