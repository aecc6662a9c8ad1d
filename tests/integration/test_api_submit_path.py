"""The API's submit path in fewer round trips, and one rendering of each event for every follower
of a run: what they must keep. A submit leaves no reservation behind and answers the run it
created; on one Redis the reservation's script reads the in-flight counts itself; the reservation
survives Redis losing its scripts; another tenant can neither read, follow nor steer the run;
followers of one run asking for different kinds share one feed and each gets exactly its own
frames. Real uvicorn, real workers, real redis-server."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
import pytest

from producer.admission import _admit_create_source, reservations_key
from shared.keys import Keys
from shared.tasks import TASK_START
from shared.tenants import TenantLimits, Tenants
from tests.api_support import SSE, ApiProcess, Frame, bearer, frames, wait_status
from tests.broker import commit_publishes, is_cluster
from tests.harness import RedisServer, WorkerProcess
from tests.tcp_proxy import TcpProxy

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url).start()
    yield process
    process.stop()


def _tenant(redis_server: RedisServer, limits: TenantLimits | None = None) -> tuple[str, str]:
    tenant = f"path-{uuid.uuid4().hex[:8]}"
    tenants = Tenants(redis_server.client(), Keys())
    if limits is not None:
        tenants.set_limits(tenant, limits)
    key, _ = tenants.create_key(tenant)
    return tenant, key


def test_concurrent_submits_leave_no_reservation_and_answer_the_runs_they_created(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    start = threading.Barrier(12)

    def submit(i: int) -> httpx.Response:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
            start.wait(timeout=TIMEOUT)
            return http.post("/v1/runs", json={"agent": "direct", "input": f"hello {i}"})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(submit, range(12)))
    assert [a.status_code for a in answers] == [202] * 12
    runs = [a.json() for a in answers]
    assert len({r["run_id"] for r in runs}) == 12
    # The answer is the run as its submit created it (the create script dropped the reservation and
    # pushed the start); its workers were live, so it waits for nothing.
    assert {(r["agent"], r["waiting_for"], r["status"], r["version"]) for r in runs} == {
        ("direct", None, "queued", 1)
    }
    assert sorted(r["input"] for r in runs) == sorted(f"hello {i}" for i in range(12))
    # Every reservation was dropped once its run was created.
    redis = redis_server.client()
    assert redis.zcard(reservations_key(Keys().submits(tenant))) == 0
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        for run in runs:
            assert wait_status(http, run["run_id"], {"completed"})["input"] == run["input"]


def test_the_reservation_is_loaded_again_after_redis_lost_its_scripts(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    if is_cluster(redis_server.url):
        pytest.skip("SCRIPT FLUSH of one standalone server")
    _, key = _tenant(redis_server, TenantLimits(submits_per_minute=2))
    redis_server.client().script_flush()
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        assert http.post("/v1/runs", json={"agent": "direct", "input": "one"}).status_code == 202
        redis_server.client().script_flush()
        assert http.post("/v1/runs", json={"agent": "direct", "input": "two"}).status_code == 202
        # The window still counts: the reloaded script is the same script.
        third = http.post("/v1/runs", json={"agent": "direct", "input": "three"})
    assert third.status_code == 429, third.text
    assert third.json()["error"]["kind"] == "rate_limited"


def _monitored_submit(
    api: ApiProcess, redis_server: RedisServer, key: str
) -> tuple[str, list[dict[str, str]]]:
    """One submit, and every command Redis ran while it was served (MONITOR): its run id and them."""
    marker = f"end-of-submit-{uuid.uuid4().hex}"
    seen: list[dict[str, str]] = []
    listening = threading.Event()

    def monitor() -> None:
        with redis_server.client().monitor() as m:
            listening.set()
            while True:
                command = m.next_command()
                if marker in command["command"]:
                    return
                seen.append(command)

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    assert listening.wait(TIMEOUT)
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        # MONITOR starts streaming once the server has taken it: wait until a command shows.
        while not seen:
            redis_server.client().ping()
        answer = http.post("/v1/runs", json={"agent": "direct", "input": "counted"})
        assert answer.status_code == 202, answer.text
    redis_server.client().get(marker)
    watcher.join(TIMEOUT)
    assert not watcher.is_alive()
    return answer.json()["run_id"], seen


def test_on_one_redis_the_reservation_script_reads_the_in_flight_counts_itself(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """Steps 1 and 2 of the admission (producer/api/limits.py) in one command: the API sends no
    read of a shard's in-flight hash of its own, the script reads every shard's after reserving."""
    if is_cluster(redis_server.url):
        pytest.skip("on Redis Cluster the counts are read after the script, on their own nodes")
    _, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    _, seen = _monitored_submit(api, redis_server, key)
    hashes = {Keys().inflight(shard) for shard in range(Keys().shards)}
    reads = [c for c in seen if c["command"].startswith("HGET ") and c["command"].split()[1] in hashes]
    assert reads and all(c["client_type"] == "lua" for c in reads), reads
    assert len(reads) == Keys().shards


def test_a_submit_is_two_scripts_of_the_api_the_create_dropping_the_reservation_and_pushing_the_start(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """On one Redis, with the broker on it: the API sends the reservation's script and the create
    script, which drops the reservation and pushes the start's Celery message in the step that
    creates the run; no drop, read-back or publish of the API's own."""
    if not commit_publishes(redis_server.url):
        pytest.skip("the broker is not the run state's Redis (RabbitMQ, or Redis Cluster's own broker)")
    # Another tenant's submit first: Redis then knows both scripts (the first ever sent is answered
    # NOSCRIPT, and loaded), and this tenant's first submit still takes the thread's path.
    _, other = _tenant(redis_server, TenantLimits(max_inflight=1000))
    with httpx.Client(base_url=api.url, headers=bearer(other), timeout=TIMEOUT) as http:
        assert http.post("/v1/runs", json={"agent": "direct", "input": "first"}).status_code == 202
    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    run_id, seen = _monitored_submit(api, redis_server, key)
    reserved = reservations_key(Keys().submits(tenant))
    assert api.proc is not None
    # The API's own commands: those sent on its process's connections to Redis (the workers, which
    # run the new run at once, have theirs).
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    api_ports = {
        str(c.laddr.port)
        for c in psutil.Process(api.proc.pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == redis_port
    }
    own = [c["command"] for c in seen if c["client_type"] != "lua" and c["client_port"] in api_ports]
    # Those naming the run or the reservation (the others are reads a process caches for a few
    # seconds: the tenant's settings, Redis's memory, the worker registry).
    submit_path = [c.split()[0] for c in own if run_id in c or reserved in c]
    assert submit_path == ["EVALSHA", "EVALSHA"], own
    assert not [c for c in own if c.startswith(("LPUSH ", "ZREM "))], own
    drops = [c["client_type"] for c in seen if c["command"].startswith(f"ZREM {reserved} ")]
    assert drops == ["lua"], seen
    starts = [c["client_type"] for c in seen if _starts(c["command"], run_id)]
    assert starts == ["lua"], seen


def test_on_one_redis_the_common_submit_is_one_script_that_admits_and_creates_its_run(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """A submit the event loop serves (its process's caches fresh: the submit just before read
    them) sends one script naming its run: the admission under the tenant's limits and the create
    in one step, with no reservation taken or dropped, and the start pushed inside it."""
    if not commit_publishes(redis_server.url):
        pytest.skip("the broker is not the run state's Redis (RabbitMQ, or Redis Cluster's own broker)")
    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    reserved = reservations_key(Keys().submits(tenant))
    assert api.proc is not None
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    shapes = []
    for _ in range(5):  # a loaded machine may let the caches expire between the two submits
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
            assert http.post("/v1/runs", json={"agent": "direct", "input": "warm"}).status_code == 202
        run_id, seen = _monitored_submit(api, redis_server, key)
        api_ports = {  # after the submit: the connections it was sent on are kept open
            str(c.laddr.port)
            for c in psutil.Process(api.proc.pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == redis_port
        }
        own = [c["command"] for c in seen if c["client_type"] != "lua" and c["client_port"] in api_ports]
        shapes.append([c.split()[0] for c in own if run_id in c])
        if shapes[-1] == ["EVALSHA"]:
            (script,) = [c for c in own if run_id in c]
            assert Keys().submits(tenant) in script and reserved in script  # the admission's keys
            assert not [
                c for c in seen if c["command"].startswith((f"ZADD {reserved} ", f"ZREM {reserved} "))
            ]
            assert [c["client_type"] for c in seen if _starts(c["command"], run_id)] == ["lua"]
            break
    # The other shapes: the thread's path (two scripts), taken only while a cache was stale, and a
    # script Redis has not loaded yet, sent whole after its NOSCRIPT.
    others = (["EVALSHA", "EVALSHA"], ["EVALSHA", "EVAL"], ["EVALSHA", "EVALSHA", "EVAL"])
    assert shapes[-1] == ["EVALSHA"] and all(s == ["EVALSHA"] or s in others for s in shapes), shapes


def _starts(command: str, run_id: str) -> bool:
    """Whether a command of MONITOR's output is the push of run ``run_id``'s start task."""
    if not command.startswith("LPUSH "):
        return False
    message = json.loads(command.split(" ", 2)[2].encode().decode("unicode_escape").strip('"'))
    return message["headers"]["task"] == TASK_START and run_id in base64.b64decode(message["body"]).decode()


def test_another_tenant_can_neither_read_nor_follow_nor_steer_a_submitted_run(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    _, owner_key = _tenant(redis_server)
    _, attacker_key = _tenant(redis_server)
    with httpx.Client(base_url=api.url, headers=bearer(owner_key), timeout=TIMEOUT) as owner:
        run_id = owner.post("/v1/runs", json={"agent": "needs_approval", "input": "mine"}).json()["run_id"]
        wait_status(owner, run_id, {"awaiting_approval"})
    with httpx.Client(base_url=api.url, headers=bearer(attacker_key), timeout=TIMEOUT) as attacker:
        answers = [
            attacker.get(f"/v1/runs/{run_id}"),
            attacker.get(f"/v1/runs/{run_id}/events"),
            attacker.get(f"/v1/runs/{run_id}/events", headers=SSE),
            attacker.post(f"/v1/runs/{run_id}/approve"),
            attacker.post(f"/v1/runs/{run_id}/cancel"),
        ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["kind"] == "not_found"
    with httpx.Client(base_url=api.url, headers=bearer(owner_key), timeout=TIMEOUT) as owner:
        # Still parked, undecided: the attacker's approve and cancel did nothing.
        assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "awaiting_approval"
        assert owner.post(f"/v1/runs/{run_id}/cancel").status_code == 202


def _follow(api: ApiProcess, key: str, run_id: str, kinds: str | None) -> list[Frame]:
    params = {"kinds": kinds} if kinds else {}
    with (
        httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http,
        http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE, params=params) as response,
    ):
        assert response.status_code == 200
        return [f for f in frames(response) if f.data]


def test_followers_asking_for_different_kinds_each_get_their_own_frames(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    _, key = _tenant(redis_server)
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        run_id = http.post("/v1/runs", json={"agent": "chain", "input": "three hops"}).json()["run_id"]
        asked = [None, "ToolCompleted", "ToolCompleted,ToolDispatched", None, "ToolCompleted"]
        # Five followers of one run at once: one feed of this process serves them all.
        with ThreadPoolExecutor(len(asked)) as pool:
            got = list(pool.map(lambda kinds: _follow(api, key, run_id, kinds), asked))
        every = http.get(f"/v1/runs/{run_id}/events", params={"limit": 500}).json()["events"]
    assert every[-1]["kind"] == "Completed"
    for kinds, followed in zip(asked, got, strict=True):
        wanted = None if kinds is None else {*kinds.split(","), "Completed"}
        expected = [e for e in every if wanted is None or e["kind"] in wanted]
        assert [f.event for f in followed] == expected, kinds
        assert all(f.id == f.event["id"] for f in followed)


def _api_connections(api: ApiProcess, redis_server: RedisServer) -> list[str]:
    """The ids Redis gives the API process's connections to it (CLIENT LIST)."""
    assert api.proc is not None
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    ports = {
        c.laddr.port
        for c in psutil.Process(api.proc.pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == redis_port
    }
    return [
        str(c["id"]) for c in redis_server.client().client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports
    ]


def test_submits_go_on_after_redis_dropped_the_api_s_connections(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """Every connection the API process holds to Redis closed by Redis at once (as after a restart,
    or its idle timeout): the connections a submit's scripts keep (on the event loop, and on the
    worker threads) and those of the asyncio client's pool (the key's read, the followers' feeds)
    are connected again as they are next used. Every submit is accepted, none leaves a reservation,
    and a run followed over plain HTTP (no client that resumes) gets every event to its end."""
    if is_cluster(redis_server.url):
        pytest.skip("CLIENT KILL of one standalone server's clients")
    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        for round_ in range(3):
            before = [http.post("/v1/runs", json={"agent": "direct", "input": f"b{i}"}) for i in range(3)]
            assert [a.status_code for a in before] == [202] * 3, [a.text for a in before]
            followed = _follow(api, key, before[0].json()["run_id"], None)  # a feed, on the pool
            assert followed[-1].event["kind"] == "Completed"
            killed = _api_connections(api, redis_server)
            assert killed
            for client_id in killed:
                redis_server.client().client_kill_filter(_id=client_id)
            after = [http.post("/v1/runs", json={"agent": "direct", "input": f"a{i}"}) for i in range(3)]
            assert [a.status_code for a in after] == [202] * 3, (round_, [a.text for a in after])
            with http.stream(
                "POST", "/v1/runs", json={"agent": "direct", "input": "followed"}, headers=SSE
            ) as streamed:
                assert streamed.status_code == 200
                kinds = [frame.event["kind"] for frame in frames(streamed) if frame.data]
            assert kinds[0] == "RunStarted" and kinds[-1] == "Completed", (round_, kinds)
            for answer in after:
                assert wait_status(http, answer.json()["run_id"], {"completed"})["input"].startswith("a")
    assert redis_server.client().zcard(reservations_key(Keys().submits(tenant))) == 0


def test_a_submit_answers_alike_whatever_serves_it(api: ApiProcess, redis_server: RedisServer) -> None:
    """The common submit (no idempotency key, thread, assistant nor webhook) and those the API
    serves with reads of their own (here an idempotency key, a thread) answer the same view of a
    new queued run; an idempotency key's replay is the same run, and its reuse for another request
    a 409."""
    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    idem = {"idempotency-key": f"k-{uuid.uuid4().hex}"}
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        plain = http.post("/v1/runs", json={"agent": "direct", "input": "plain"})
        keyed = http.post("/v1/runs", json={"agent": "direct", "input": "keyed"}, headers=idem)
        threaded = http.post(
            "/v1/runs", json={"agent": "direct", "input": "threaded", "thread_id": f"t-{uuid.uuid4().hex}"}
        )
        again = http.post("/v1/runs", json={"agent": "direct", "input": "keyed"}, headers=idem)
        other = http.post("/v1/runs", json={"agent": "direct", "input": "not the same"}, headers=idem)
        answers = [plain, keyed, threaded]
        assert [a.status_code for a in answers] == [202] * 3, [a.text for a in answers]
        views = [a.json() for a in answers]
        assert {v["status"] for v in views} == {"queued"} and {v["version"] for v in views} == {1}
        assert len({frozenset(v) for v in views}) == 1  # the same fields
        assert again.status_code == 202 and again.json()["run_id"] == keyed.json()["run_id"]
        assert other.status_code == 409 and other.json()["error"]["kind"] == "conflict"
        for view in views:
            assert wait_status(http, view["run_id"], {"completed"})["input"] == view["input"]
    assert redis_server.client().zcard(reservations_key(Keys().submits(tenant))) == 0


def test_a_run_s_first_follower_reads_its_events_without_catching_up(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """The stream of a run nobody follows in the API process yet is served by the feed's own
    reads after the follower's cursor: no read of the stream's last id, no catch-up reads; every
    event arrives once, in order."""
    if is_cluster(redis_server.url):
        pytest.skip("MONITOR of one standalone server")
    _, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    events_key = ""
    seen: list[dict[str, str]] = []
    listening = threading.Event()
    done = threading.Event()

    def monitor() -> None:
        with redis_server.client().monitor() as m:
            listening.set()
            while not done.is_set():
                seen.append(m.next_command())

    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        run = http.post("/v1/runs", json={"agent": "direct", "input": "followed"}).json()
        events_key = Keys().events(run["run_id"])
        wait_status(http, run["run_id"], {"completed"})
        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()
        assert listening.wait(TIMEOUT)
        while not seen:
            redis_server.client().ping()
        with http.stream("GET", f"/v1/runs/{run['run_id']}/events", headers=SSE) as response:
            got = [f.event for f in frames(response) if f.data]
        done.set()
        redis_server.client().ping()  # the monitor's last command
        watcher.join(TIMEOUT)
        page = http.get(f"/v1/runs/{run['run_id']}/events").json()
    assert [e["id"] for e in got] == [e["id"] for e in page["events"]] and got[-1]["kind"] == "Completed"
    reads = [c["command"].split()[0] for c in seen if events_key in c["command"]]
    # The ended run's check that it has events left to send (else 204), then the feed's reads
    # only (the first brings every event; the next waits until the stream is closed).
    assert reads[0] == "XRANGE" and set(reads[1:]) == {"XREAD"}, reads


def test_following_runs_to_their_end_opens_no_connection_to_redis(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """A run's stream ends at its end event, and the run's reader with it, without being cancelled
    in a blocked read: redis-py drops a connection whose reply was cancelled, and every stream
    would then cost a new connection and its handshake before its first event."""
    if is_cluster(redis_server.url):
        pytest.skip("CLIENT LIST of one standalone server's clients")
    _, key = _tenant(redis_server, TenantLimits(max_inflight=1000))

    def follow_one(http: httpx.Client) -> list[str]:
        run_id = http.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
        with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as response:
            assert response.status_code == 200
            return [f.event["kind"] for f in frames(response) if f.data]

    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        follow_one(http)  # the first stream of the process may open the pool's connection
        before = set(_api_connections(api, redis_server))
        followed = [follow_one(http) for _ in range(10)]
        opened = set(_api_connections(api, redis_server)) - before
    assert all(kinds[-1] == "Completed" for kinds in followed), followed
    assert opened == set(), f"{len(opened)} connections opened for 10 streams"


#: How the differential test below sends a submit to the route: a Content-Type the route reads as
#: JSON and the shortcut leaves to it (asserted in the test).
_TO_THE_ROUTE = "application/json;charset=utf-8"
_RUN_MADE = {"run_id", "created_at", "updated_at"}


def _answer(response: httpx.Response) -> tuple[int, dict[str, str], object]:
    """What a submit's answer says, without what differs between two runs (ids, times)."""
    headers = {
        name: value
        for name, value in response.headers.items()
        if name in {"content-type", "www-authenticate", "retry-after", "allow", "connection"}
    }
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        kinds = [frame.event["kind"] for frame in frames(response) if frame.data]
        return response.status_code, {**headers, "location": "/v1/runs/<id>"}, kinds
    body = response.json()
    if response.status_code == 202:
        body = {name: value for name, value in body.items() if name not in _RUN_MADE}
    return response.status_code, headers, body


def test_the_submit_shortcut_answers_every_request_as_the_route_does(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    """``POST /v1/runs`` as clients send it is served beside FastAPI's routing (runs.SubmitShortcut).
    Each request here is sent twice, once as the shortcut serves it and once as only the route
    does (another spelling of the JSON Content-Type), and the two answers must be the same:
    accepted runs, a stream, and every refusal the submit or its key can meet."""
    from producer.api.runs import _plain_submit

    def scope(content_type: str) -> dict[str, object]:
        headers = [(b"content-type", content_type.encode()), (b"authorization", b"Bearer k")]
        return {"type": "http", "method": "POST", "path": "/v1/runs", "headers": headers}

    assert _plain_submit(scope("application/json")) == ("Bearer k", "")
    assert _plain_submit(scope(_TO_THE_ROUTE)) is None

    tenant, key = _tenant(redis_server, TenantLimits(max_inflight=1000))
    tenants = Tenants(redis_server.client(), Keys())
    tenants.set_models(tenant, ["scripted:*"])
    full, full_key = _tenant(redis_server, TenantLimits(max_inflight=1))
    with httpx.Client(base_url=api.url, timeout=TIMEOUT) as http:
        parked = http.post(
            "/v1/runs", json={"agent": "needs_approval", "input": "x"}, headers=bearer(full_key)
        )
        assert parked.status_code == 202, parked.text
        cases: list[tuple[str, int, dict[str, str], object]] = [
            ("accepted", 202, bearer(key), {"agent": "direct", "input": "hi"}),
            (
                "every field",
                202,
                bearer(key),
                {"agent": "direct", "input": "hi", "metadata": {"a": [1, "b"]}},
            ),
            ("streamed", 200, {**bearer(key), **SSE}, {"agent": "direct", "input": "hi"}),
            ("no key", 401, {}, {"agent": "direct", "input": "hi"}),
            ("unknown key", 401, bearer("wsk_nobody"), {"agent": "direct", "input": "hi"}),
            ("another scheme", 401, {"authorization": f"Basic {key}"}, {"agent": "direct", "input": "hi"}),
            (
                "model not allowed",
                403,
                bearer(key),
                {"agent": "direct", "input": "hi", "model": "openai:gpt-4o"},
            ),
            ("unknown agent", 422, bearer(key), {"agent": "nobody-serves-this", "input": "hi"}),
            (
                "reserved callback",
                422,
                bearer(key),
                {"agent": "direct", "input": "hi", "callback": {"task": "wesichain.start"}},
            ),
            (
                "private webhook",
                422,
                bearer(key),
                {"agent": "direct", "input": "hi", "callback": {"url": "http://127.0.0.1/x"}},
            ),
            ("unknown field", 422, bearer(key), {"agent": "direct", "input": "hi", "tenant": "other"}),
            ("not an object", 422, bearer(key), ["direct"]),
            ("no input", 422, bearer(key), {"agent": "direct"}),
            ("in flight", 429, bearer(full_key), {"agent": "direct", "input": "hi"}),
        ]
        for name, status, headers, body in cases:
            content = json.dumps(body).encode()
            shortcut = http.post(
                "/v1/runs", content=content, headers={**headers, "content-type": "application/json"}
            )
            route = http.post("/v1/runs", content=content, headers={**headers, "content-type": _TO_THE_ROUTE})
            assert shortcut.status_code == status, (name, shortcut.text)
            assert _answer(shortcut) == _answer(route), name
        for raw, status in ((b"{", 400), (b"\xff\xfe{}", 400), (b"", 422)):
            shortcut = http.post(
                "/v1/runs", content=raw, headers={**bearer(key), "content-type": "application/json"}
            )
            route = http.post("/v1/runs", content=raw, headers={**bearer(key), "content-type": _TO_THE_ROUTE})
            assert shortcut.status_code == status, (raw, shortcut.text)
            assert _answer(shortcut) == _answer(route), raw


def test_a_common_submit_whose_reply_was_lost_is_answered_the_run_its_script_created(
    redis_server: RedisServer, workers: list[WorkerProcess]
) -> None:
    """The event loop's submit is one script that admits the run and creates it: when the
    connection drops after Redis ran it and before its reply came back, the API sends it again.
    That second run must recognise the run the first created (as the create script alone does),
    not admit it again: counted once more, a tenant one run short of its in-flight limit was
    refused 429 for a run that had been created and was running, and its submit window lost the
    entry of that run."""
    if not commit_publishes(redis_server.url):
        pytest.skip("the admitting create serves only a single Redis that is the broker too")
    upstream = urlsplit(redis_server.url)
    proxy = TcpProxy((upstream.hostname or "127.0.0.1", upstream.port or 6379))
    through = urlunsplit(upstream._replace(netloc=f"{upstream.hostname}:{proxy.port}"))
    admit_create = hashlib.sha1(_admit_create_source().encode()).hexdigest().encode()
    # Loaded: the request whose reply is lost runs the script (a NOSCRIPT runs nothing).
    assert redis_server.client().script_load(_admit_create_source()).encode() == admit_create
    process = ApiProcess(through).start()
    try:
        for _ in range(5):  # until a submit is served on the event loop (its caches warm)
            tenant, key = _tenant(redis_server, TenantLimits(max_inflight=2))
            marker = f"lost-reply-{uuid.uuid4().hex}"
            with httpx.Client(base_url=process.url, headers=bearer(key), timeout=TIMEOUT) as http:
                first = http.post("/v1/runs", json={"agent": "needs_approval", "input": "first"})
                assert first.status_code == 202, first.text
                lost = proxy.drop_reply_to(admit_create, marker.encode())
                answer = http.post("/v1/runs", json={"agent": "needs_approval", "input": marker})
                proxy.drop_reply_to()  # no other request loses its reply
                if not lost.is_set():
                    continue  # served by a worker thread (a cache was stale): another tenant
                assert answer.status_code == 202, answer.text
                run = answer.json()
                assert run["input"] == marker
                listed = http.get("/v1/runs", params={"limit": 10}).json()["runs"]
                assert sorted(r["input"] for r in listed) == sorted(["first", marker])
                assert run["run_id"] in {r["run_id"] for r in listed}
            redis = redis_server.client()
            keys = Keys()
            assert redis.zcard(keys.submits(tenant)) == 2  # each run's entry, once
            assert sum(int(redis.hget(keys.inflight(s), tenant) or 0) for s in range(keys.shards)) == 2
            return
        pytest.fail("no submit was served on the event loop in 5 tries")
    finally:
        process.stop()
        proxy.close()
