"""Clients that hold connections the way attackers and broken networks do, against a real
``wesichain api`` process (real uvicorn, real workers, real redis-server), through raw sockets:

- bodies trickled a byte at a time (slowloris), which the body's read deadline ends with a 408 and a
  closed connection, while the process goes on serving everyone else;
- request heads trickled likewise, on a new connection or on a kept-alive one after its first
  answer, which the head's deadline ends with a 408; a connection that sends nothing is closed;
- event streams whose connection is reset (RST, SO_LINGER 0) in the middle of the stream, after
  which the tenant opens its full share of streams again.
"""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import SSE, ApiProcess, bearer, wait_status
from tests.harness import RedisServer, WorkerProcess, wait_until

TIMEOUT = 60
BODY_TIMEOUT_S = 2.0
HEAD_TIMEOUT_S = 1.5
SHARE = 2
#: How many trickling clients at once.
SLOW_CLIENTS = 8
#: Bounds each trickle: far longer than the body timeout, so only the server can end it first.
TRICKLE_BYTES = 4000
TRICKLE_PAUSE_S = 0.05


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    process = ApiProcess(
        redis_server.url,
        env={"WESICHAIN_API_KEEPALIVE_S": "0.3", "WESICHAIN_API_MAX_STREAMS_PER_TENANT": str(SHARE)},
        args=("--body-timeout", str(BODY_TIMEOUT_S), "--head-timeout", str(HEAD_TIMEOUT_S)),
    ).start()
    yield process
    process.stop()


def tenant_key(redis_server: RedisServer, name: str) -> str:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"{name}-{uuid.uuid4().hex[:6]}")
    return key


def _answer(received: bytes) -> tuple[int, dict[str, str], dict[str, object]] | None:
    head, sep, rest = received.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if len(rest) < int(headers.get("content-length", "0")):
        return None
    return int(lines[0].split()[1]), headers, json.loads(rest)


class Trickle:
    """A POST whose headers are sent whole and whose body comes one byte at a time (``length``,
    ``chunked``), or whose head itself does (``head``: a header's value, byte after byte)."""

    def __init__(self, api: ApiProcess, key: str, framing: str, sock: socket.socket | None = None) -> None:
        self.sock = sock or socket.create_connection(("127.0.0.1", api.port), timeout=TIMEOUT)
        self.sock.setblocking(False)
        self.pad = b"a" if framing == "head" else b" "
        if framing == "head":
            start = f"POST /v1/runs HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\nX-Pad: "
        else:
            length = (
                "Transfer-Encoding: chunked" if framing == "chunked" else f"Content-Length: {TRICKLE_BYTES}"
            )
            head = (
                f"POST /v1/runs HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\n{length}\r\n\r\n"
            )
            # A chunk announcing more bytes than will ever come in time.
            start = head + (f"{TRICKLE_BYTES:x}\r\n" if framing == "chunked" else "")
        self.sock.sendall(start.encode())
        self.received = b""
        self.sent = 0
        self.closed = False

    def step(self) -> None:
        """One byte more (unless the server closed), and whatever the server said."""
        try:
            while data := self.sock.recv(65536):
                self.received += data
            self.closed = True  # an empty read: the server closed the connection
        except BlockingIOError:
            pass
        except ConnectionResetError:
            self.closed = True
        if not self.closed and self.sent < TRICKLE_BYTES:
            try:
                self.sent += self.sock.send(self.pad)
            except (BrokenPipeError, ConnectionResetError):
                self.closed = True

    def close(self) -> None:
        self.sock.close()


def test_trickled_bodies_are_cut_off_and_the_api_serves_others_meanwhile(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    key = tenant_key(redis_server, "slow")
    with ExitStack() as stack, httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        slow = [Trickle(api, key, "chunked" if i % 2 else "length") for i in range(SLOW_CLIENTS)]
        for t in slow:
            stack.callback(t.close)
        served = _trickle_all(slow, http)  # everyone else is served while the trickles hold on
        assert served == 3
        _cut_off(slow, BODY_TIMEOUT_S)
        # Nothing was half-written: the tenant has exactly the runs served in full.
        runs = http.get("/v1/runs", params={"limit": 100}).json()["runs"]
        assert len(runs) == served
        for r in runs:
            assert http.post(f"/v1/runs/{r['run_id']}/cancel").status_code == 202


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer read from a blocking socket (its timeout bounds the wait)."""
    received = b""
    while _answer(received) is None:
        data = sock.recv(65536)
        assert data, f"closed before its answer: {received!r}"
        received += data
    return received


def _cut_off(slow: list[Trickle], timeout_s: float) -> None:
    """Each trickle was answered 408 in the API's error shape and its connection closed."""
    for t in slow:
        answer = _answer(t.received)
        assert answer is not None, f"no answer after {t.sent} bytes: {t.received[:300]!r}"
        status, headers, body = answer
        assert status == 408
        assert headers["connection"] == "close"
        error = body["error"]
        assert isinstance(error, dict)
        assert error["kind"] == "request_timeout"
        assert error["details"]["timeout_s"] == timeout_s
        assert t.closed and t.sent < TRICKLE_BYTES


def _trickle_all(slow: list[Trickle], http: httpx.Client) -> int:
    """Step every trickle until each is closed or has sent its bounded bytes (then the test fails),
    serving a submit of another client meanwhile, three times; returns how many were served."""
    served = 0
    while not all(t.closed for t in slow) and any(t.sent < TRICKLE_BYTES for t in slow):
        for t in slow:
            t.step()
        if served < 3:
            run = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"})
            assert run.status_code == 202, run.text
            served += 1
        time.sleep(TRICKLE_PAUSE_S)
    return served


def test_trickled_request_heads_are_cut_off_on_new_and_kept_alive_connections(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    key = tenant_key(redis_server, "slowhead")
    with ExitStack() as stack, httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        slow = [Trickle(api, key, "head") for _ in range(SLOW_CLIENTS // 2)]
        # Kept alive: a first request answered whole, then the next head trickled on that connection.
        for _ in range(SLOW_CLIENTS // 2):
            sock = socket.create_connection(("127.0.0.1", api.port), timeout=TIMEOUT)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
            first = _read_answer(sock)
            assert first.startswith(b"HTTP/1.1 200"), first[:300]
            slow.append(Trickle(api, key, "head", sock))
        for t in slow:
            stack.callback(t.close)
        served = _trickle_all(slow, http)
        assert served == 3
        _cut_off(slow, HEAD_TIMEOUT_S)
        runs = http.get("/v1/runs", params={"limit": 100}).json()["runs"]
        assert len(runs) == served  # only the submits served in full made runs
        for r in runs:
            assert http.post(f"/v1/runs/{r['run_id']}/cancel").status_code == 202


def test_a_connection_that_sends_nothing_is_closed_and_a_prompt_head_is_served(api: ApiProcess) -> None:
    idle = socket.create_connection(("127.0.0.1", api.port), timeout=TIMEOUT)
    prompt = socket.create_connection(("127.0.0.1", api.port), timeout=TIMEOUT)
    try:
        # A head sent in two parts, well within the deadline, is served as any other.
        prompt.sendall(b"GET /healthz HTTP/1.1\r\n")
        prompt.sendall(b"Host: api\r\n\r\n")
        answer = _read_answer(prompt)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        # Nothing sent: closed without an answer once the head's deadline passed (recv's own
        # timeout, far longer, bounds the wait).
        assert idle.recv(65536) == b""
    finally:
        idle.close()
        prompt.close()


def _open_stream(api: ApiProcess, key: str, run_id: str) -> socket.socket:
    """A raw event stream of ``run_id``, read up to its first event."""
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=TIMEOUT)
    sock.sendall(
        (
            f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    received = b""
    while b"RunStarted" not in received:
        data = sock.recv(65536)
        assert data, f"the stream closed: {received[:300]!r}"
        received += data
    assert received.startswith(b"HTTP/1.1 200"), received[:300]
    return sock


def _reset(sock: socket.socket) -> None:
    """Close with RST, not FIN: what a peer that crashed, or a middlebox, does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_streams_reset_mid_stream_give_the_tenant_its_share_back(
    api: ApiProcess, redis_server: RedisServer
) -> None:
    key = tenant_key(redis_server, "reset")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=TIMEOUT) as http:
        run_id = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()["run_id"]
        wait_status(http, run_id, {"awaiting_approval"}, TIMEOUT)
        path = f"/v1/runs/{run_id}/events"
        for _ in range(3):  # the share comes back every time, not once
            streams = [_open_stream(api, key, run_id) for _ in range(SHARE)]
            refused = http.get(path, headers=SSE)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["kind"] == "too_many_streams"
            for sock in streams:
                _reset(sock)

            def full_share() -> bool:
                with ExitStack() as held:
                    opened = [held.enter_context(http.stream("GET", path, headers=SSE)) for _ in range(SHARE)]
                    return all(s.status_code == 200 for s in opened)

            wait_until(full_share, timeout=TIMEOUT, interval=0.1, what="the reset streams' slots back")
        assert http.post(f"/v1/runs/{run_id}/cancel").status_code == 202
