"""Following runs over HTTP: Server-Sent Events live, dropped and resumed, keep-alives, JSON pages,
and the OpenAPI document exercised against what the real server answers."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import SSE, ApiProcess, Frame, bearer, frames, wait_status
from tests.broker import is_cluster
from tests.harness import ROOT, RedisServer, WorkerProcess, wait_until

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "0.3"}).start()
    yield process
    process.stop()


@pytest.fixture
def http(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"ev-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as client:
        yield client


def all_events(http: httpx.Client, run_id: str, limit: int) -> list[dict[str, Any]]:
    """Every event of the run through the JSON pages, ``limit`` at a time."""
    events: list[dict[str, Any]] = []
    after = "0-0"
    for _ in range(1000):
        page = http.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": limit}).json()
        events.extend(page["events"])
        after = page["next_after"]
        if page["ended"]:
            return events
    raise AssertionError("the pages did not end")


def test_stream_dropped_mid_run_and_resumed_loses_and_repeats_nothing(http: httpx.Client) -> None:
    run_id = http.post("/v1/runs", json={"agent": "chain", "input": "three hops"}).json()["run_id"]
    first: list[Frame] = []
    with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        for frame in frames(response):
            if frame.data:
                first.append(frame)
                # Drop the connection mid-run: after the first tool result.
                if frame.event["kind"] == "ToolCompleted":
                    break
    assert first and first[-1].event["kind"] == "ToolCompleted"
    rest: list[Frame] = []
    with http.stream(
        "GET", f"/v1/runs/{run_id}/events", headers={**SSE, "Last-Event-ID": str(first[-1].id)}
    ) as response:
        assert response.status_code == 200
        rest.extend(f for f in frames(response) if f.data)
    # The server closed the stream after the end event.
    assert rest[-1].event["kind"] == "Completed"
    streamed = [str(f.id) for f in first + rest]
    assert all(f.id == f.event["id"] for f in first + rest)
    paged = all_events(http, run_id, limit=3)
    assert streamed == [e["id"] for e in paged] and len(set(streamed)) == len(streamed)
    assert [f.event["kind"] for f in first + rest] == [e["kind"] for e in paged]
    assert sum(1 for e in paged if e["kind"] == "ToolCompleted") == 3
    # Resuming after the end: 204, which tells a browser's EventSource to stop reconnecting.
    after_end = http.get(f"/v1/runs/{run_id}/events", headers={**SSE, "Last-Event-ID": streamed[-1]})
    assert after_end.status_code == 204
    page = http.get(f"/v1/runs/{run_id}/events", params={"after": streamed[-1]}).json()
    assert page == {"events": [], "next_after": streamed[-1], "ended": True}


def test_idle_stream_keeps_alive_then_follows_the_decision_to_the_end(http: httpx.Client) -> None:
    run_id = http.post("/v1/runs", json={"agent": "needs_approval", "input": "refund"}).json()["run_id"]
    wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
    kinds: list[str] = []
    keepalives = 0
    with http.stream("GET", f"/v1/runs/{run_id}/events", headers=SSE) as response:
        for frame in frames(response):
            if frame.data:
                kinds.append(frame.event["kind"])
            keepalives += frame.comments.count("keep-alive")
            if keepalives == 2 and "AwaitingApproval" in kinds:
                assert http.post(f"/v1/runs/{run_id}/approve").status_code == 202
                keepalives += 1
    assert kinds[0] == "RunStarted" and kinds[-1] == "Completed" and "AwaitingApproval" in kinds
    assert kinds.index("AwaitingApproval") < kinds.index("ToolDispatched")


def test_the_accept_header_is_read_as_media_ranges(http: httpx.Client) -> None:
    run_id = http.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
    wait_status(http, run_id, {"completed"}, TIMEOUT)
    ids = [e["id"] for e in all_events(http, run_id, limit=100)]
    # Media types are case-insensitive (RFC 9110 §8.3.1): a stream, to the end event.
    for accept in ["Text/Event-Stream", "application/json;q=0.5, TEXT/EVENT-STREAM; charset=utf-8"]:
        with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": accept}) as response:
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8", accept
            assert [f.id for f in frames(response) if f.data] == ids
    # q=0 says "not this type": the JSON page.
    for accept in ["text/event-stream;q=0, application/json", "text/event-stream; q=0.000"]:
        page = http.get(f"/v1/runs/{run_id}/events", headers={"Accept": accept})
        assert page.headers["content-type"] == "application/json", accept
        assert [e["id"] for e in page.json()["events"]] == ids


def test_bad_event_ids_are_refused(http: httpx.Client) -> None:
    run_id = http.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
    bad = http.get(f"/v1/runs/{run_id}/events", headers={**SSE, "Last-Event-ID": "yesterday"})
    assert bad.status_code == 422 and bad.json()["error"]["kind"] == "invalid_request"
    assert http.get(f"/v1/runs/{run_id}/events", params={"after": "1-x"}).status_code == 422
    assert http.get(f"/v1/runs/{run_id}/events", params={"limit": 501}).status_code == 422


def test_streams_per_process_are_bounded(redis_server: RedisServer, workers: list[WorkerProcess]) -> None:
    # One tenant may hold every stream here: this is about the process's own bound.
    small = ApiProcess(
        redis_server.url,
        env={"WESICHAIN_API_MAX_STREAMS": "2", "WESICHAIN_API_MAX_STREAMS_PER_TENANT": "2"},
    ).start()
    try:
        key, _ = Tenants(redis_server.client(), Keys()).create_key(f"cap-{uuid.uuid4().hex[:8]}")
        with httpx.Client(base_url=small.url, headers=bearer(key), timeout=30) as http:
            run_id = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()["run_id"]
            wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
            path = f"/v1/runs/{run_id}/events"
            with http.stream("GET", path, headers=SSE) as one, http.stream("GET", path, headers=SSE) as two:
                # Both are being served: each sent its first event. (The readers are kept: closing
                # one closes its response.)
                readers = [frames(one), frames(two)]
                for reader in readers:
                    assert next(f for f in reader if f.data).event["kind"] == "RunStarted"
                refused = http.get(path, headers=SSE)
                assert refused.status_code == 503 and refused.json()["error"]["kind"] == "unavailable"
                assert refused.headers["retry-after"] == "5"
            # Closed streams give their places back.
            wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)

            def served() -> bool:
                with http.stream("GET", path, headers=SSE) as again:
                    return again.status_code == 200

            from tests.harness import wait_until

            wait_until(served, timeout=TIMEOUT, what="a stream slot to be given back")
    finally:
        small.stop()


def test_followers_that_leave_leave_no_reader_behind(
    redis_server: RedisServer, workers: list[WorkerProcess]
) -> None:
    """A run's reader is cancelled when its last follower leaves, and a cancel can be lost in the
    Redis client when it comes as a command has just been sent: the reader must stop all the same,
    not read for no one for as long as the run lives. (A keep-alive of 5 ms makes the reader send
    a read every 5 ms, so followers leaving at random moments meet such a send.)"""
    if is_cluster(redis_server.url):
        pytest.skip("the XREAD calls of one standalone server")
    busy = ApiProcess(redis_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "0.005"}).start()
    try:
        key, _ = Tenants(redis_server.client(), Keys()).create_key(f"left-{uuid.uuid4().hex[:8]}")
        with httpx.Client(base_url=busy.url, headers=bearer(key), timeout=30) as http:
            runs = [
                http.post("/v1/runs", json={"agent": "needs_approval", "input": f"x{i}"}).json()["run_id"]
                for i in range(3)
            ]
            for run_id in runs:
                wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)

            def follow_and_leave(n: int) -> None:
                # Leaves after its first few frames (events, then keep-alives every 5 ms).
                with http.stream("GET", f"/v1/runs/{runs[n % 3]}/events", headers=SSE) as response:
                    assert response.status_code == 200
                    for seen, _ in enumerate(frames(response)):
                        if seen >= n % 7:
                            break

            with ThreadPoolExecutor(20) as pool:
                list(pool.map(follow_and_leave, range(300)))
            redis = redis_server.client()

            def reads() -> int:
                return int(redis.info("commandstats").get("cmdstat_xread", {}).get("calls", 0))

            def no_reader() -> bool:
                before = reads()
                time.sleep(0.5)  # a hundred of a reader's blocking reads of 5 ms
                return reads() == before

            # Every follower left: no reader reads on, though the runs have not ended.
            wait_until(no_reader, timeout=15, what="the runs' readers to stop")
            assert {http.get(f"/v1/runs/{run_id}").json()["status"] for run_id in runs} == {
                "awaiting_approval"
            }
    finally:
        busy.stop()


# -- the OpenAPI document, exercised against the real server -----------------------------------


def check(document: dict[str, Any], method: str, path: str, response: httpx.Response) -> None:
    """The response's body validates against what the document declares for it."""
    answers = document["paths"][path][method]["responses"]
    declared = answers.get(str(response.status_code)) or answers[f"{str(response.status_code)[0]}XX"]
    schema = declared["content"]["application/json"]["schema"]
    Draft202012Validator({**schema, "components": document["components"]}).validate(response.json())


def test_openapi_document_is_served_and_describes_every_answer(api: ApiProcess, http: httpx.Client) -> None:
    document = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert http.get("/openapi.json").json() == document
    assert Path(ROOT / "docs" / "openapi.json").exists()
    submitted = http.post("/v1/runs", json={"agent": "one_hop", "input": "1+2", "thread_id": "oa"})
    check(document, "post", "/v1/runs", submitted)
    run_id = submitted.json()["run_id"]
    wait_status(http, run_id, {"completed"}, TIMEOUT)
    item = "/v1/runs/{run_id}"
    check(document, "get", item, http.get(f"/v1/runs/{run_id}"))
    check(document, "get", "/v1/runs", http.get("/v1/runs", params={"thread_id": "oa", "limit": 1}))
    check(document, "get", item + "/checkpoints", http.get(f"/v1/runs/{run_id}/checkpoints"))
    check(document, "get", item + "/events", http.get(f"/v1/runs/{run_id}/events"))
    check(document, "get", "/v1/agents", http.get("/v1/agents"))
    check(document, "get", "/healthz", http.get("/healthz"))
    check(document, "get", "/readyz", http.get("/readyz"))
    # Errors, too, are what the document says.
    check(document, "post", item + "/approve", http.post(f"/v1/runs/{run_id}/approve"))
    check(document, "post", item + "/cancel", http.post(f"/v1/runs/{run_id}/cancel"))
    check(document, "post", item + "/deny", http.post("/v1/runs/nope/deny"))
    check(document, "post", "/v1/runs", http.post("/v1/runs", json={"agent": 3}))
    check(document, "get", "/v1/runs", httpx.get(api.url + "/v1/runs"))


def test_a_tenants_timelines_at_once_are_its_share_of_the_process(
    api: ApiProcess, redis_server: RedisServer, http: httpx.Client
) -> None:
    """A timeline reads the run's every event (up to ``events_maxlen``): eight at once of one long
    run took 4.3 s and 620 MB of the API process. One tenant runs at most its share of scans at
    once; the rest are refused at once, and another tenant's timeline is served meanwhile."""
    run_id = http.post("/v1/runs", json={"agent": "direct", "input": "long"}).json()["run_id"]
    wait_status(http, run_id, {"completed"}, TIMEOUT)
    # The run made long: 6,000 more streamed-text events of 7 KB before its end event, as a long
    # chatty run leaves (written here rather than run for minutes).
    client = redis_server.client()
    stream = Keys().events(run_id)
    raw: list[Any] = client.xrange(stream) or []
    entries = [(str(eid), json.loads(fields["e"])) for eid, fields in raw]
    (end_id, end), delta = entries[-1], next(e for _, e in entries if e["kind"] == "TokenDelta")
    client.xdel(stream, end_id)
    pipe = client.pipeline(transaction=False)
    for _ in range(6000):
        pipe.xadd(stream, {"e": json.dumps({**delta, "text": "x" * 7000})})
    pipe.xadd(stream, {"e": json.dumps(end)})
    pipe.execute()
    other_key, _ = Tenants(client, Keys()).create_key(f"ev-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=api.url, headers=bearer(other_key), timeout=TIMEOUT) as other:
        other_run = other.post("/v1/runs", json={"agent": "direct", "input": "short"}).json()["run_id"]
        wait_status(other, other_run, {"completed"}, TIMEOUT)
        barrier = threading.Barrier(9)

        def timeline(key: str, run: str) -> httpx.Response:
            with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as caller:
                barrier.wait()
                return caller.get(f"/v1/runs/{run}/timeline")

        owner_key = http.headers["Authorization"].removeprefix("Bearer ")
        with ThreadPoolExecutor(9) as pool:
            floods = [pool.submit(timeline, owner_key, run_id) for _ in range(8)]
            others = pool.submit(timeline, other_key, other_run)
            answers = [f.result() for f in floods]
            assert others.result().status_code == 200
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(served) + len(refused) == 8, [a.text[:200] for a in answers]
    # Eight at once, each reading 42 MB of events: they overlap, and two at most ran.
    assert len(served) >= 1 and refused, [a.status_code for a in answers]
    for answer in refused:
        error = answer.json()["error"]
        assert (error["kind"], error["details"]["limit"]) == ("too_many_scans", 2)
        assert answer.headers["retry-after"] == "1"
    assert all(a.json()["run_id"] == run_id for a in served)


def test_a_submit_asking_for_an_event_stream_answers_the_new_runs_events(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/runs", json={"agent": "chain", "input": "three hops"}, headers=SSE) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        run_id = r.headers["location"].removeprefix("/v1/runs/")
        streamed = [f for f in frames(r) if f.data]
    # From the run's first event to its end event, each once, as the run stored them.
    assert streamed[0].event["kind"] == "RunStarted" and streamed[-1].event["kind"] == "Completed"
    assert {f.event["run_id"] for f in streamed} == {run_id}
    assert [str(f.id) for f in streamed] == [e["id"] for e in all_events(http, run_id, limit=50)]
    assert http.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    # The same request sent again with its Idempotency-Key streams the same run, not a new one.
    again = {**SSE, "Idempotency-Key": f"follow-{uuid.uuid4().hex}"}
    body = {"agent": "one_hop", "input": "1+2"}
    runs = []
    for _ in range(2):
        with http.stream("POST", "/v1/runs", json=body, headers=again) as r:
            assert r.status_code == 200
            runs.append(r.headers["location"])
            assert [f.event["kind"] for f in frames(r) if f.data][-1] == "Completed"
    assert runs[0] == runs[1]


def test_a_submit_and_follow_takes_its_stream_place_before_it_creates_the_run(
    redis_server: RedisServer, workers: list[WorkerProcess]
) -> None:
    small = ApiProcess(redis_server.url, env={"WESICHAIN_API_MAX_STREAMS_PER_TENANT": "1"}).start()
    try:
        tenant = f"sf-{uuid.uuid4().hex[:8]}"
        key, _ = Tenants(redis_server.client(), Keys()).create_key(tenant)
        with httpx.Client(base_url=small.url, headers=bearer(key), timeout=30) as http:
            submit = {"agent": "needs_approval", "input": "x"}
            with http.stream("POST", "/v1/runs", json=submit, headers=SSE) as held:
                reader = frames(held)  # kept: closing it closes the answer, and gives its place back
                assert next(f for f in reader if f.data).event["kind"] == "RunStarted"
                run_id = held.headers["location"].removeprefix("/v1/runs/")
                # The tenant's one stream is held: a second submit-and-follow is refused whole.
                refused = http.post("/v1/runs", json=submit, headers=SSE)
                assert refused.status_code == 429
                assert refused.json()["error"]["kind"] == "too_many_streams"
                assert [r["run_id"] for r in http.get("/v1/runs").json()["runs"]] == [run_id]
            # A submit refused after its place was taken gives the place back.
            bad = http.post("/v1/runs", json={"agent": "no-such-agent", "input": "x"}, headers=SSE)
            assert bad.status_code == 422 and bad.json()["error"]["kind"] == "unknown_agent"
            wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
            http.post(f"/v1/runs/{run_id}/approve").raise_for_status()

            def followed() -> bool:
                with http.stream(
                    "POST", "/v1/runs", json={"agent": "one_hop", "input": "1"}, headers=SSE
                ) as r:
                    return r.status_code == 200 and [f.event["kind"] for f in frames(r) if f.data][-1] == (
                        "Completed"
                    )

            wait_until(followed, timeout=TIMEOUT, what="the tenant's stream place to be given back")
    finally:
        small.stop()


def test_a_submit_and_follow_refused_or_left_at_once_holds_no_stream_place(
    redis_server: RedisServer, workers: list[WorkerProcess]
) -> None:
    """A process serving its one stream refuses another tenant's submit-and-follow whole (503,
    nothing started); a submit refused after its place was taken (thread busy, a key's other
    request, a namespace not allowed), or whose client left without reading its stream, gives it
    back."""
    one = ApiProcess(redis_server.url, env={"WESICHAIN_API_MAX_STREAMS": "1"}).start()
    try:
        tenants = Tenants(redis_server.client(), Keys())
        key, other_key = (tenants.create_key(f"sf-{uuid.uuid4().hex[:8]}")[0] for _ in range(2))
        with (
            httpx.Client(base_url=one.url, headers=bearer(key), timeout=30) as http,
            httpx.Client(base_url=one.url, headers=bearer(other_key), timeout=30) as other,
        ):

            def followed(body: dict[str, Any]) -> bool:
                with http.stream("POST", "/v1/runs", json=body, headers=SSE) as r:
                    return r.status_code == 200 and [f.event["kind"] for f in frames(r) if f.data][-1] == (
                        "Completed"
                    )

            parked = {"agent": "needs_approval", "input": "x", "thread_id": "t-1"}
            with http.stream("POST", "/v1/runs", json=parked, headers=SSE) as held:
                assert held.status_code == 200
                refused = other.post("/v1/runs", json={"agent": "direct", "input": "x"}, headers=SSE)
                assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
                assert refused.json()["error"]["kind"] == "unavailable"
            assert other.get("/v1/runs").json()["runs"] == []
            http.post("/v1/runs", json={"agent": "direct", "input": "x"}, headers={"Idempotency-Key": "k"})
            refusals = [
                ({"agent": "direct", "input": "x", "thread_id": "t-1", "thread_policy": "reject"}, {}, 409),
                ({"agent": "direct", "input": "other"}, {"Idempotency-Key": "k"}, 409),
                ({"agent": "direct", "input": "x", "namespace": "not-mine"}, {}, 403),
            ]
            for body, headers, status in refusals:
                wait_until(lambda: followed({"agent": "direct", "input": "x"}), timeout=TIMEOUT)
                assert http.post("/v1/runs", json=body, headers={**SSE, **headers}).status_code == status
            wait_until(lambda: followed({"agent": "direct", "input": "x"}), timeout=TIMEOUT)
            # Left once its answer began, the stream unread.
            content = json.dumps({"agent": "needs_approval", "input": "left"}).encode()
            with socket.create_connection(("127.0.0.1", one.port)) as left:
                left.sendall(
                    b"POST /v1/runs HTTP/1.1\r\nHost: api\r\nAccept: text/event-stream\r\n"
                    + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
                    + f"Content-Length: {len(content)}\r\n\r\n".encode()
                    + content
                )
                assert left.recv(12) == b"HTTP/1.1 200"
            wait_until(lambda: followed({"agent": "direct", "input": "x"}), timeout=TIMEOUT)
            kinds = sorted(r["agent"] for r in http.get("/v1/runs").json()["runs"])
            # Each refused submit started nothing; the one left started its run.
            assert kinds == ["direct"] * 6 + ["needs_approval"] * 2
    finally:
        one.stop()
