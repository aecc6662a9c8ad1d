"""Event streams cut where a real network cuts them, and resumed as a browser's ``EventSource`` does.

A TCP forwarder between the client and the API (:class:`tests.tcp_proxy.TcpProxy`) ends a
stream's connection at a chosen byte of its answer: after the head alone, half-way through an
event's frame, between two events, right after the run's end event, or on a keep-alive while the
run is parked. After each cut the client resumes with ``Last-Event-ID`` set to the id of the last
whole event it parsed (none if it parsed none). Across all its requests it must get every event of
the run once, in order, to the end event, and a resume after that end is answered 204.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import END, SSE, ApiProcess, Frame, bearer, frames, wait_status
from tests.harness import RedisServer, WorkerProcess
from tests.tcp_proxy import TcpProxy

TIMEOUT = 60


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(redis_server.url, env={"WESICHAIN_API_KEEPALIVE_S": "0.3"}).start()
    yield process
    process.stop()


@pytest.fixture
def proxy(api: ApiProcess) -> Iterator[TcpProxy]:
    forwarder = TcpProxy(("127.0.0.1", api.port))
    yield forwarder
    forwarder.close()


def tenant_key(redis_server: RedisServer, prefix: str) -> str:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"{prefix}-{uuid.uuid4().hex[:8]}")
    return key


@pytest.fixture
def key(redis_server: RedisServer) -> str:
    return tenant_key(redis_server, "drop")


@pytest.fixture
def direct(api: ApiProcess, key: str) -> Iterator[httpx.Client]:
    """The tenant's client straight to the API: what the test does beside the stream it cuts."""
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as client:
        yield client


@pytest.fixture
def through(proxy: TcpProxy, key: str) -> Iterator[httpx.Client]:
    """The tenant's client through the forwarder that cuts its streams."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{proxy.port}", headers=bearer(key), timeout=TIMEOUT
    ) as client:
        yield client


@dataclass
class Leg:
    """One request of a resuming follower: its answer's status and head, the whole events it
    parsed, the keep-alives, and whether its connection failed before the answer ended."""

    status: int = 0
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    events: list[Frame] = field(default_factory=list)
    keepalives: int = 0
    dropped: bool = False

    @property
    def kinds(self) -> list[str]:
        return [f.event["kind"] for f in self.events]


def leg(
    client: httpx.Client,
    method: str,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any] | None = None,
    on_frame: Callable[[Leg], None] | None = None,
) -> Leg:
    """Send one request and read its answer as an event stream until it ends or its connection
    fails, as ``EventSource`` reads it: an event counts once its frame is whole."""
    got = Leg()
    try:
        with client.stream(method, url, headers=headers, json=body) as answer:
            got.status, got.headers = answer.status_code, answer.headers
            if answer.status_code != 200:
                answer.read()
                return got
            for frame in frames(answer):
                if frame.data:
                    assert frame.id is not None and frame.id == frame.event["id"], frame
                    got.events.append(frame)
                got.keepalives += frame.comments.count("keep-alive")
                if on_frame is not None:
                    on_frame(got)
    except httpx.TransportError:
        got.dropped = True
    return got


def resuming(last: list[Frame]) -> dict[str, str]:
    """The headers of a follower's next request: ``Last-Event-ID`` of the last whole event it got."""
    return {**SSE, "Last-Event-ID": str(last[-1].id)} if last else dict(SSE)


def stored(client: httpx.Client, run_id: str) -> list[tuple[str, str]]:
    """The run's every event as stored (ids and kinds), through the JSON pages."""
    events: list[tuple[str, str]] = []
    after = "0-0"
    while True:
        page = client.get(f"/v1/runs/{run_id}/events", params={"after": after, "limit": 500}).json()
        events += [(e["id"], e["kind"]) for e in page["events"]]
        after = page["next_after"]
        if page["ended"]:
            return events


def position(event_id: str) -> tuple[int, int]:
    """An event id as the order of events goes (``ms-seq``, compared as numbers)."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq)


def seen(got: list[Frame]) -> list[tuple[str, str]]:
    return [(str(f.id), f.event["kind"]) for f in got]


#: Where a cut falls in an answer: the bytes it follows (and then the first of these after them).
HEAD_ONLY = (b"\r\n\r\n", b"")


def half_of(kind: str) -> tuple[bytes, bytes]:
    """Half-way through the frame of the first event of ``kind``."""
    return (f'"kind":"{kind}"'.encode(), b"")


def right_after(kind: str) -> tuple[bytes, bytes]:
    """Right after the whole frame of the first event of ``kind``."""
    return (f'"kind":"{kind}"'.encode(), b"\n\n")


def test_a_parked_run_followed_through_cuts_anywhere_comes_whole_and_once(
    proxy: TcpProxy, direct: httpx.Client, through: httpx.Client
) -> None:
    run_id = direct.post("/v1/runs", json={"agent": "needs_approval", "input": "refund"}).json()["run_id"]
    path = f"/v1/runs/{run_id}/events"
    got: list[Frame] = []

    def cut_leg(where: tuple[bytes, bytes], on_frame: Callable[[Leg], None] | None = None) -> Leg:
        cut = proxy.cut_answer(*where)
        part = leg(through, "GET", path, resuming(got), on_frame=on_frame)
        assert cut.is_set() and part.dropped and part.status == 200, (where, part)
        got.extend(part.events)
        return part

    # Cut after the head alone, then half-way through the first event: nothing whole arrived.
    assert cut_leg(HEAD_ONLY).events == []
    assert cut_leg(half_of("RunStarted")).events == []
    # Between two events: the first arrived whole.
    assert cut_leg(right_after("RunStarted")).kinds == ["RunStarted"]
    # Parked: every event up to the wait for approval, then a keep-alive, then the cut.
    wait_status(direct, run_id, {"awaiting_approval"}, TIMEOUT)
    parked = cut_leg((b": keep-alive\n\n", b""))
    assert parked.kinds[-1] == "AwaitingApproval" and parked.keepalives == 1

    def approve_when_idle(part: Leg) -> None:
        if part.keepalives == 1 and not part.events:
            assert direct.post(f"/v1/runs/{run_id}/approve").status_code == 202
            part.keepalives += 1  # approved once

    # Resumed after the wait, approved on the first keep-alive, cut half-way through the tool's result.
    decided = cut_leg(half_of("ToolCompleted"), on_frame=approve_when_idle)
    assert decided.kinds[0] == "ApprovalDecided" and decided.kinds[-1] == "ToolDispatched"
    # Cut right after the end event: the client has it, and a resume after it is told 204.
    assert cut_leg(right_after("Completed")).kinds[-1] == "Completed"
    after_end = leg(through, "GET", path, resuming(got))
    assert (after_end.status, after_end.events, after_end.dropped) == (204, [], False)
    assert seen(got) == stored(direct, run_id)
    assert got[0].event["kind"] == "RunStarted" and got[-1].event["kind"] == "Completed"


def test_a_streaming_model_s_deltas_cut_mid_frame_come_whole_and_once(
    proxy: TcpProxy, direct: httpx.Client, through: httpx.Client
) -> None:
    run_id = direct.post("/v1/runs", json={"agent": "drip_short", "input": "drip"}).json()["run_id"]
    path = f"/v1/runs/{run_id}/events"
    got: list[Frame] = []
    cuts = [
        (b"piece 20. ", b""),  # half-way through the delta holding piece 20
        (b"piece 80. ", b"\n\n"),  # right after it
        (b"piece 150.", b""),
    ]
    for where in cuts:
        cut = proxy.cut_answer(*where)
        part = leg(through, "GET", path, resuming(got))
        assert cut.is_set() and part.dropped, (where, part)
        got.extend(part.events)
    last = leg(through, "GET", path, resuming(got))
    assert last.status == 200 and not last.dropped and last.kinds[-1] == "Completed"
    got.extend(last.events)
    assert leg(through, "GET", path, resuming(got)).status == 204
    assert seen(got) == stored(direct, run_id)
    text = "".join(f.event["text"] for f in got if f.event["kind"] == "TokenDelta")
    assert text == "".join(f"piece {i}. " for i in range(200))


def test_a_submit_and_follow_cut_before_it_named_its_run_is_sent_again_and_starts_no_other(
    proxy: TcpProxy, direct: httpx.Client, through: httpx.Client
) -> None:
    """A submit-and-follow whose answer is lost before its head: the client cannot know the run;
    the same request again (its ``Idempotency-Key``) answers the same run's stream from its first
    event. A cut after the head leaves the client the run's ``Location``, to resume from."""
    body = {"agent": "drip_short", "input": "follow me"}
    once = {**SSE, "Idempotency-Key": f"follow-{uuid.uuid4().hex}"}
    cut = proxy.cut_answer(b"")
    lost = leg(through, "POST", "/v1/runs", once, body)
    assert cut.is_set() and (lost.status, lost.dropped) == (0, True)
    # Sent again, cut after its head: the head names the run before any event.
    cut = proxy.cut_answer(*HEAD_ONLY)
    named = leg(through, "POST", "/v1/runs", once, body)
    assert cut.is_set() and named.status == 200 and named.dropped and named.events == []
    run_id = named.headers["location"].removeprefix("/v1/runs/")
    assert [r["run_id"] for r in direct.get("/v1/runs").json()["runs"]] == [run_id]
    # Sent again, cut between its first two events: the stream starts over from the first.
    cut = proxy.cut_answer(*right_after("RunStarted"))
    first = leg(through, "POST", "/v1/runs", once, body)
    assert cut.is_set() and first.dropped and first.kinds == ["RunStarted"]
    assert first.headers["location"] == f"/v1/runs/{run_id}"
    got = list(first.events)
    rest = leg(through, "GET", f"/v1/runs/{run_id}/events", resuming(got))
    assert rest.status == 200 and not rest.dropped and rest.kinds[-1] == "Completed"
    got += rest.events
    assert seen(got) == stored(direct, run_id)
    # Sent again once the run ended: the same run's events, whole, from the first.
    again = leg(through, "POST", "/v1/runs", once, body)
    assert again.headers["location"] == f"/v1/runs/{run_id}" and seen(again.events) == seen(got)
    assert [r["run_id"] for r in direct.get("/v1/runs").json()["runs"]] == [run_id]


def _unread_stream(port: int, key: str, run_id: str) -> socket.socket:
    """A raw event stream of ``run_id`` whose client never reads: its receive buffer as small as
    the kernel allows, so the server's writes to it stall."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        (
            f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    # Its status line read (the server took its stream place), and nothing more.
    status = b""
    while len(status) < 12:
        data = sock.recv(12 - len(status))
        assert data, f"the stream closed: {status!r}"
        status += data
    assert status == b"HTTP/1.1 200", status
    return sock


def _drain(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes the stream (its last chunk)."""
    received = b""
    while not received.endswith(b"\r\n0\r\n\r\n"):
        data = sock.recv(65536)
        if not data:
            break
        received += data
    return received


def _whole_events(raw: bytes) -> list[tuple[str, str]]:
    """The whole events of a raw chunked SSE answer after its status line (ids and kinds)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: text/event-stream" in head, head[:300]
    text = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        text, body = text + body[:n], body[n + 2 :]
    events = []
    for message in text.decode().split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in message.split("\n") if not line.startswith(":"))
        if "data" in fields:
            events.append((fields["id"], json.loads(fields["data"])["kind"]))
    return events


def test_readers_that_stall_hold_no_one_back_and_a_tenant_at_its_share_leaves_others_theirs(
    redis_server: RedisServer, workers: list[WorkerProcess]
) -> None:
    """Followers that stop reading (their connections open, their receive windows full) while a run
    streams about a megabyte of deltas: a follower that reads gets the run whole all the same, and
    each stalled one, read at last, got it whole or had its stream ended (it fell behind) and
    resumes. A tenant holding its every stream place is refused another (429) while another tenant
    is served."""
    share = 3
    small = ApiProcess(redis_server.url, env={"WESICHAIN_API_MAX_STREAMS_PER_TENANT": str(share)}).start()
    stalled: list[socket.socket] = []
    try:
        hostile, other = tenant_key(redis_server, "stall"), tenant_key(redis_server, "served")
        with (
            httpx.Client(base_url=small.url, headers=bearer(hostile), timeout=TIMEOUT) as http,
            httpx.Client(base_url=small.url, headers=bearer(other), timeout=TIMEOUT) as served,
        ):
            run_id = http.post("/v1/runs", json={"agent": "drip_wide", "input": "x"}).json()["run_id"]
            path = f"/v1/runs/{run_id}/events"
            stalled = [_unread_stream(small.port, hostile, run_id) for _ in range(share - 1)]

            checked: list[bool] = []

            def refused_at_the_share(part: Leg) -> None:
                if part.events and not checked:  # every place of the tenant held: the stalled and this one
                    checked.append(True)
                    refused = http.get(path, headers=SSE)
                    assert refused.status_code == 429, refused.text
                    assert refused.json()["error"]["kind"] == "too_many_streams"
                    theirs = leg(served, "POST", "/v1/runs", SSE, {"agent": "one_hop", "input": "1+2"})
                    assert theirs.status == 200 and theirs.kinds[-1] == "Completed"
                    their_run = theirs.headers["location"].removeprefix("/v1/runs/")
                    assert seen(theirs.events) == stored(served, their_run)

            follower = leg(http, "GET", path, SSE, on_frame=refused_at_the_share)
            assert follower.status == 200 and not follower.dropped and checked
            everything = stored(http, run_id)
            assert seen(follower.events) == everything and everything[-1][1] == "Completed"
            # The stalled followers read at last: each got the run whole, or its stream was ended
            # (it fell behind) and a resume after its last whole event brings the rest.
            for sock in stalled:
                got = _whole_events(_drain(sock))
                if not got or got[-1][1] not in END:
                    rest = leg(http, "GET", path, {**SSE, "Last-Event-ID": got[-1][0]} if got else SSE)
                    got += seen(rest.events)
                assert got == everything
    finally:
        for sock in stalled:
            sock.close()
        small.stop()


def test_an_event_id_in_the_future_is_refused_and_another_run_s_is_a_position(
    direct: httpx.Client,
) -> None:
    """An id later than the server's clock names no event, ever: refused (422) on a parked run, whose
    stream would otherwise send only keep-alives until the run ended, then end without its end
    event, and on an ended one. A well-formed id of the past is a position in the run's events,
    whichever run it came from: the events after it come (a run written again after a failover
    has events after an id it lost)."""
    parked = direct.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()["run_id"]
    wait_status(direct, parked, {"awaiting_approval"}, TIMEOUT)
    ended = direct.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
    wait_status(direct, ended, {"completed"}, TIMEOUT)
    future = "9999999999999-0"
    for run_id in (parked, ended):
        path = f"/v1/runs/{run_id}/events"
        asked: list[tuple[dict[str, str], dict[str, str]]] = [
            ({**SSE, "Last-Event-ID": future}, {}),
            (SSE, {"after": future}),
            ({}, {"after": future}),
        ]
        for headers, params in asked:
            # Streamed: an answer that is a stream is seen at its head, not waited on to its end.
            with direct.stream("GET", path, headers=headers, params=params) as answer:
                assert answer.status_code == 422, (headers, params, answer.status_code)
                error = json.loads(answer.read())["error"]
            assert (error["kind"], error["details"]) == ("invalid_request", {"event_id": future})
    # The ended run's last event came after every event of the parked run so far.
    foreign = stored(direct, ended)[-1][0]
    path = f"/v1/runs/{parked}/events"

    def approve_when_idle(part: Leg) -> None:
        if part.keepalives == 1:
            assert direct.post(f"/v1/runs/{parked}/approve").status_code == 202
            part.keepalives += 1

    after_foreign = leg(direct, "GET", path, {**SSE, "Last-Event-ID": foreign}, on_frame=approve_when_idle)
    assert after_foreign.status == 200 and not after_foreign.dropped
    everything = stored(direct, parked)
    assert seen(after_foreign.events) == [e for e in everything if position(e[0]) > position(foreign)]
    assert after_foreign.kinds[0] == "ApprovalDecided" and after_foreign.kinds[-1] == "Completed"


@pytest.mark.parametrize(
    "bad",
    [
        "yesterday",
        "1-x",
        "-1",
        "1-",
        "1700000000000-0-0",
        "1700000000000-0 1",
        "18446744073709551615-0",
        "1" * 46,
    ],
)
def test_malformed_event_ids_are_refused_with_the_api_s_error(direct: httpx.Client, bad: str) -> None:
    run_id = direct.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
    for answer in (
        direct.get(f"/v1/runs/{run_id}/events", headers={**SSE, "Last-Event-ID": bad}),
        direct.get(f"/v1/runs/{run_id}/events", params={"after": bad}, headers=SSE),
        direct.get(f"/v1/runs/{run_id}/events", params={"after": bad}),
    ):
        assert answer.status_code == 422, (bad, answer.status_code, answer.text)
        assert answer.json()["error"]["kind"] == "invalid_request", answer.text
