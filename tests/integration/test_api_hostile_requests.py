"""Requests an attacker would send to a real ``wesichain api`` process: bodies framed to slip past
the size limit, numbers JSON does not have, and an app started by plain uvicorn without
authentication on an address others can reach. Raw sockets where httpx would not send the request;
real uvicorn, real workers, real redis-server."""

from __future__ import annotations

import gzip
import json
import select
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

from tests.api_support import ApiProcess, bearer
from tests.harness import RedisServer, WorkerProcess

MB = 1024 * 1024
#: What an attack streams: far more than the 256 KiB limit, and more than the API process's RSS.
ATTACK_BYTES = 300 * MB
#: How much the API process may grow while one is refused.
RSS_BOUND = 50 * MB
LIMIT = 256 * 1024
#: How long a stalled exchange (nothing read, nothing written) may last before the test fails.
STALL_S = 60.0


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, workers: list[WorkerProcess]) -> Iterator[ApiProcess]:
    # Its own process, so that what it grows by is this module's requests.
    process = ApiProcess(redis_server.url).start()
    yield process
    process.stop()


@dataclass
class Exchange:
    status: int
    headers: dict[str, str]
    body: bytes
    #: Bytes of the request written to the socket before the server answered or closed.
    sent: int
    #: The largest the API process's RSS was while the request was sent, over what it was before.
    rss_growth: int

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = json.loads(self.body)["error"]
        return error


def chunked(total: int) -> Iterator[bytes]:
    """A chunked body of ``total`` bytes, made as it is sent (never whole in the test's memory)."""
    data = b"x" * 65536
    for _ in range(total // len(data)):
        yield b"10000\r\n" + data + b"\r\n"
    yield b"0\r\n\r\n"


def plain(total: int) -> Iterator[bytes]:
    data = b"x" * 65536
    for _ in range(total // len(data)):
        yield data


def _response(received: bytes) -> tuple[int, dict[str, str], bytes] | None:
    """The first complete response in ``received`` (it carries a Content-Length), or None."""
    head, sep, rest = received.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if len(rest) < length:
        return None
    return int(lines[0].split()[1]), headers, rest[:length]


def exchange(api: ApiProcess, head: bytes, body: Iterator[bytes]) -> Exchange:
    """Send ``head`` then ``body`` as fast as the API reads it; stop once it answers or closes."""
    assert api.proc is not None
    process = psutil.Process(api.proc.pid)
    before = peak = process.memory_info().rss
    received = bytearray()
    sent = 0
    sampled_at = 0
    pending = head
    sending = True
    with socket.create_connection(("127.0.0.1", api.port), timeout=STALL_S) as sock:
        sock.setblocking(False)
        while _response(bytes(received)) is None:
            readable, writable, _ = select.select([sock], [sock] if sending else [], [], STALL_S)
            if not readable and not writable:
                raise TimeoutError(f"the API neither answered nor read for {STALL_S} s ({sent} bytes sent)")
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    break  # closed: what was received is all there is
                received += data
            if writable and sending:
                if not pending:
                    pending = next(body, b"")
                    if not pending:
                        sending = False
                        continue
                try:
                    written = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    sending = False  # the server closed: read what it answered
                    continue
                sent += written
                pending = pending[written:]
                if sent - sampled_at >= MB:
                    sampled_at = sent
                    peak = max(peak, process.memory_info().rss)
    peak = max(peak, process.memory_info().rss)
    response = _response(bytes(received))
    assert response is not None, f"no complete response; received {bytes(received)[:300]!r}"
    status, headers, answer = response
    return Exchange(status, headers, answer, sent, peak - before)


def post_head(*headers: str, path: str = "/v1/runs") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: api", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_chunked_body_that_also_declares_a_small_length_is_refused_unread(api: ApiProcess) -> None:
    # No key: before anything else reads it, the body must be refused for its framing.
    done = exchange(api, post_head("Content-Length: 10", "Transfer-Encoding: chunked"), chunked(ATTACK_BYTES))
    assert done.rss_growth < RSS_BOUND, f"the API grew by {done.rss_growth // MB} MB"
    assert done.sent < ATTACK_BYTES
    assert done.status == 400, done.body
    error = done.error()
    assert error["kind"] == "bad_request"
    assert "Content-Length and Transfer-Encoding" in error["message"]
    assert done.headers["connection"] == "close"


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(api: ApiProcess) -> None:
    done = exchange(api, post_head("Transfer-Encoding: chunked"), chunked(ATTACK_BYTES))
    assert done.rss_growth < RSS_BOUND, f"the API grew by {done.rss_growth // MB} MB"
    assert done.sent < ATTACK_BYTES
    assert done.status == 413, done.body
    assert done.error() == {
        "kind": "body_too_large",
        "message": f"the request body is over {LIMIT} bytes",
        "details": {"max_bytes": LIMIT},
    }
    assert done.headers["connection"] == "close"


def test_a_declared_body_over_the_limit_is_refused_before_it_is_read(api: ApiProcess) -> None:
    done = exchange(api, post_head(f"Content-Length: {ATTACK_BYTES}"), plain(ATTACK_BYTES))
    assert done.rss_growth < RSS_BOUND, f"the API grew by {done.rss_growth // MB} MB"
    assert done.sent < ATTACK_BYTES
    assert done.status == 413, done.body
    assert done.error()["kind"] == "body_too_large"
    assert done.headers["connection"] == "close"


@pytest.mark.parametrize(
    "lengths",
    [("10x",), ("-1",), ("+10",), ("0x10",), ("1e3",), ("10", "12"), ("10, 12",), ("1" * 23,)],
    ids=[
        "not-a-number",
        "negative",
        "plus",
        "hex",
        "exponent",
        "two-headers-differ",
        "one-header-two-values",
        "23-digits",
    ],
)
def test_malformed_content_lengths_are_refused(api: ApiProcess, lengths: tuple[str, ...]) -> None:
    # Whether uvicorn's parser or the app refuses it, the body is never taken, and the answer is in
    # the API's error shape (uvicorn's own was plain text).
    head = post_head(*(f"Content-Length: {n}" for n in lengths))
    done = exchange(api, head, iter([b'{"agent": "direct", "input": "x"}']))
    assert done.status == 400, done.body
    assert done.headers["content-type"] == "application/json" and done.error()["kind"] == "bad_request"
    assert done.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("Authorization: Bearer wsk_not-to-be-repeated\x00", "illegal header line"),
        ("X-Note: what the user said, not to be repeated\r", "illegal header line"),
        ("Bad Name wsk_not-to-be-repeated: x", "illegal header line"),
    ],
    ids=["key-with-nul", "text-with-control", "name-with-space"],
)
def test_a_refused_head_is_named_without_repeating_its_bytes(
    api: ApiProcess, line: str, problem: str
) -> None:
    # The answer named h11's reason with the refused line in it: a key, or anything else sent.
    done = exchange(api, post_head("Content-Length: 2", line), iter([b"{}"]))
    assert done.status == 400, done.body
    assert done.error() == {
        "kind": "bad_request",
        "message": f"the request's head is not valid HTTP/1.1: {problem}",
        "details": {},
    }
    assert b"not to be repeated" not in done.body and b"not-to-be-repeated" not in done.body
    assert done.headers["connection"] == "close"


@pytest.mark.parametrize("head", ["huge-header", "many-headers"])
def test_a_head_too_long_is_refused_in_the_apis_error_shape(api: ApiProcess, head: str) -> None:
    headers = [f"X-Big: {'a' * 200_000}"] if head == "huge-header" else [f"X-H{i}: v" for i in range(20_000)]
    done = exchange(api, post_head(*headers, "Content-Length: 2"), iter([b"{}"]))
    assert done.status == 431, done.body
    assert done.error()["kind"] == "headers_too_large" and done.headers["connection"] == "close"
    # The server goes on serving others.
    assert httpx.get(f"{api.url}/healthz", timeout=30).status_code == 200


@pytest.fixture
def tenant(api: ApiProcess, redis_server: RedisServer) -> Iterator[httpx.Client]:
    from shared.keys import Keys
    from shared.tenants import Tenants

    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"nan-{uuid.uuid4().hex[:6]}")
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        yield http


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    ("template", "where"),
    [
        ('{"agent": "direct", "input": %s}', "body.input"),
        ('{"agent": "direct", "input": "x", "metadata": {"a": {"b": [1, %s]}}}', "body.metadata.a.b.1"),
        ('{"agent": "direct", "input": "x", "state": {"count": %s}}', "body.state.count"),
    ],
    ids=["input", "nested-metadata", "state"],
)
def test_numbers_json_does_not_have_are_refused(
    tenant: httpx.Client, token: str, template: str, where: str
) -> None:
    response = tenant.post(
        "/v1/runs", content=(template % token).encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["kind"] == "invalid_request"
    assert error["details"]["problems"] == [
        {"where": where, "problem": f"{token} is not a JSON number; send a finite number, a string or null"}
    ]
    assert error["message"] == f"{where}: {error['details']['problems'][0]['problem']}"
    assert tenant.get("/v1/runs").json()["runs"] == []


def test_a_number_too_large_for_a_double_is_refused(tenant: httpx.Client) -> None:
    # Python reads 1e400 as infinity, which would be stored as null like NaN.
    body = b'{"agent": "direct", "input": "x", "metadata": {"big": 1e400}}'
    response = tenant.post("/v1/runs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"]["problems"] == [
        {"where": "body.metadata.big", "problem": "1e400 is too large for a JSON number (a double)"}
    ]


def test_every_json_body_is_checked_and_strings_are_left_alone(tenant: httpx.Client) -> None:
    for path, body in [
        ("/v1/runs/no-such-run/deny", b'{"note": "x", "n": NaN}'),
        ("/v1/runs/no-such-run/approve", b'{"always": Infinity}'),
        ("/v1/pipelines", b'{"pipeline": "p", "input": {"x": -Infinity}}'),
    ]:
        # Checked before any route reads it, whatever its Content-Type says (here none).
        response = tenant.post(path, content=body)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["error"]["kind"] == "invalid_request"
        assert "is not a JSON number" in response.json()["error"]["message"]
    words = {"note": "NaN and -Infinity are words here", "n": 1.5e300}
    accepted = tenant.post("/v1/runs", json={"agent": "direct", "input": "x", "metadata": words})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["metadata"] == words


def test_a_body_not_declared_as_json_is_415_whether_declared_otherwise_or_not_at_all(
    tenant: httpx.Client,
) -> None:
    # What clients send without saying JSON: requests' data=, curl's -d (a form) and text/plain.
    body = json.dumps({"agent": "direct", "input": "x", "metadata": {"n": 1}}).encode()
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "text/plain; charset=utf-8"]:
        response = tenant.post("/v1/runs", content=body, headers={"content-type": content_type})
        assert response.status_code == 415, (content_type, response.text)
        assert response.json() == {
            "error": {
                "kind": "unsupported_media_type",
                "message": "the request body must be JSON, sent as Content-Type: application/json,"
                f" not {content_type!r}",
                "details": {"content_type": content_type},
            }
        }
    # No Content-Type at all (a browser sends a Blob so to another site without a preflight).
    untyped = tenant.post("/v1/runs", content=body)
    assert untyped.status_code == 415, untyped.text
    assert untyped.json() == {
        "error": {
            "kind": "unsupported_media_type",
            "message": "the request body must be JSON, sent as Content-Type: application/json,"
            " and it had no Content-Type",
            "details": {"content_type": ""},
        }
    }
    assert tenant.get("/v1/runs").json()["runs"] == []
    for content_type in ["application/json; charset=UTF-8", "Application/JSON", "application/x+json"]:
        typed = tenant.post("/v1/runs", content=body, headers={"content-type": content_type})
        assert typed.status_code == 202, (content_type, typed.text)


def test_a_compressed_body_is_415_and_one_not_in_utf8_is_bad_json(tenant: httpx.Client) -> None:
    body = json.dumps({"agent": "direct", "input": "x"}).encode()
    packed = gzip.compress(body)
    for coding, sent in [("gzip", packed), ("br", body), ("identity, gzip", packed)]:
        response = tenant.post(
            "/v1/runs", content=sent, headers={"content-type": "application/json", "content-encoding": coding}
        )
        assert response.status_code == 415, (coding, response.text)
        assert response.headers["accept-encoding"] == "identity"
        shown = coding.removeprefix("identity, ")
        assert response.json() == {
            "error": {
                "kind": "unsupported_media_type",
                "message": "the API takes request bodies without a content coding,"
                f" not Content-Encoding: {shown}",
                "details": {"content_encoding": shown},
            }
        }
    # Latin-1 text sent as JSON (which is UTF-8): the body is not JSON, as documented.
    latin1 = '{"agent": "direct", "input": "caf\u00e9"}'.encode("latin-1")
    response = tenant.post("/v1/runs", content=latin1, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json() == {
        "error": {
            "kind": "bad_json",
            "message": "the request body is not valid JSON",
            "details": {"problems": [{"where": "body.33", "problem": "not UTF-8 text"}]},
        }
    }
    assert tenant.get("/v1/runs").json()["runs"] == []
    plain = tenant.post(
        "/v1/runs", content=body, headers={"content-type": "application/json", "content-encoding": "identity"}
    )
    assert plain.status_code == 202, plain.text


# -- Methods -----------------------------------------------------------------------------------


def test_head_is_served_as_get_and_a_405_names_every_method_of_the_resource(tenant: httpx.Client) -> None:
    for path in ["/healthz", "/v1/runs", "/v1/whoami"]:
        got, head = tenant.get(path), tenant.head(path)
        assert (head.status_code, head.content) == (200, b""), (path, head.text)
        assert head.headers["content-type"] == got.headers["content-type"] == "application/json"
        assert head.headers["content-length"] == got.headers["content-length"]
    # A HEAD of a live run's event stream ends with its head; the connection serves on.
    run_id = tenant.post("/v1/runs", json={"agent": "needs_approval", "input": "refund"}).json()["run_id"]
    stream = tenant.head(f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"})
    assert (stream.status_code, stream.content) == (200, b"")
    assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert tenant.get(f"/v1/runs/{run_id}").json()["run_id"] == run_id
    # RFC 9110 §15.5.6: a 405's Allow lists the methods of the resource, not one route's.
    for method, path, allowed in [
        ("OPTIONS", "/v1/runs", "GET, HEAD, POST"),
        ("DELETE", "/v1/runs", "GET, HEAD, POST"),
        ("PATCH", "/v1/assistants/some-name", "DELETE, GET, HEAD, PUT"),
        ("POST", "/healthz", "GET, HEAD"),
        ("PUT", "/v1/runs/search", "GET, HEAD, POST"),  # GET is /v1/runs/{run_id}'s
    ]:
        response = tenant.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allowed, (method, path)
        assert response.json() == {
            "error": {"kind": "method_not_allowed", "message": "Method Not Allowed", "details": {}}
        }
    tenant.post(f"/v1/runs/{run_id}/cancel")


# -- Authentication off under plain uvicorn ---------------------------------------------------


def public_address() -> str:
    """An IPv4 address of this host that is not loopback (others on its network reach it)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    pytest.skip("this host has no IPv4 address besides loopback")


class PlainUvicorn(ApiProcess):
    """The app started by ``uvicorn`` itself (not ``wesichain api``), authentication off.
    ``WESICHAIN_API_HOST`` claims loopback whatever the bind: the app must not believe it."""

    def __init__(self, redis_url: str, host: str, reach: str) -> None:
        super().__init__(
            redis_url,
            env={"WESICHAIN_API_AUTH": "off", "WESICHAIN_API_HOST": "127.0.0.1"},
            # Trust X-Forwarded-For from anyone: a spoofed client address must not let one in.
            args=("--forwarded-allow-ips", "*"),
        )
        self.host = host
        self.reach = reach

    def _args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "producer.api.app:create_app",
            "--factory",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *self.extra_args,
        ]

    @property
    def url(self) -> str:
        return f"http://{self.reach}:{self.port}"

    def _up(self) -> bool:
        return self._answers((200, 403))


def refused(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["kind"] == "forbidden"
    assert "authentication is off" in error["message"]


def test_auth_off_on_a_public_bind_under_plain_uvicorn_serves_nobody(redis_server: RedisServer) -> None:
    address = public_address()
    server = PlainUvicorn(redis_server.url, address, address).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            refused(http.get("/healthz"))
            refused(http.get("/v1/runs"))
            refused(http.post("/v1/runs", json={"agent": "direct", "input": "x"}))
            refused(http.get("/v1/runs", headers={"X-Forwarded-For": "127.0.0.1"}))
    finally:
        server.stop()


def test_auth_off_on_all_addresses_under_plain_uvicorn_serves_loopback_callers_only(
    redis_server: RedisServer,
) -> None:
    address = public_address()
    server = PlainUvicorn(redis_server.url, "0.0.0.0", "127.0.0.1").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as local:
            first = local.get("/v1/runs")
            assert first.status_code == 200, (first.text, server.log()[-3000:])
            # A proxy on this host forwarding someone else's request is someone else.
            refused(local.get("/v1/runs", headers={"X-Forwarded-For": "203.0.113.9"}))
            # A page whose name was rebound to 127.0.0.1 (DNS rebinding) asks from and to loopback,
            # from the developer's browser, under its own name: refused.
            for host in (f"rebind.example:{server.port}", "attacker.example", f"10.0.0.1:{server.port}"):
                refused(local.get("/v1/runs", headers={"Host": host}))
                refused(local.get("/console/", headers={"Host": host}))
            for host in (f"localhost:{server.port}", "LOCALHOST", f"127.0.0.1:{server.port}", "[::1]"):
                assert local.get("/v1/runs", headers={"Host": host}).status_code == 200, host
            # A target in absolute-form names the request's host: the Host beside it does not count.
            for target, status in [
                (f"http://localhost:{server.port}/v1/runs", 200),
                (f"http://rebind.example:{server.port}/v1/runs", 403),
                ("http://attacker.example/console/", 403),
            ]:
                done = exchange(server, get_head(target, host=f"127.0.0.1:{server.port}"), iter(()))
                assert done.status == status, (target, done.body)
        with httpx.Client(base_url=f"http://{address}:{server.port}", timeout=30) as remote:
            refused(remote.get("/v1/runs"))
            refused(remote.get("/v1/runs", headers={"X-Forwarded-For": "127.0.0.1"}))
            refused(remote.get("/console/"))
    finally:
        server.stop()


def test_plain_uvicorn_serves_the_redis_it_is_given_whatever_this_process_left_in_its_environment(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``wesichain --redis URL`` run in this process (as the CLI's tests run it) leaves URL in the
    # environment; an app started by plain uvicorn read that Redis, long gone, and answered 503.
    monkeypatch.setenv("WESICHAIN_REDIS_URL", "redis://127.0.0.1:1/0")
    server = PlainUvicorn(redis_server.url, "127.0.0.1", "127.0.0.1").start()
    try:
        answer = httpx.get(f"{server.url}/v1/runs", timeout=30)
        assert answer.status_code == 200, answer.text
    finally:
        server.stop()


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_json_nested_past_its_bound_is_refused_before_anything_is_stored(tenant: httpx.Client) -> None:
    # Each was once stored, and then no reader could parse it back: a run no one could load or
    # cancel that the sweeper handed on for ever, a memory item no read could return.
    for path, body, method in [
        ("/v1/runs", {"agent": "direct", "input": "x", "metadata": _nested(33)}, "POST"),
        ("/v1/runs", {"agent": "direct", "input": "x", "state": _nested(33)}, "POST"),
        ("/v1/memory/items", {"namespace": ["n"], "key": "k", "value": _nested(33)}, "PUT"),
    ]:
        response = tenant.request(method, path, json=body)
        assert response.status_code == 422, (path, response.text)
        assert "nests deeper than 32 levels" in response.json()["error"]["message"], response.text
    # Far deeper (the depths pydantic's parser or serializer refuse): the body itself is refused.
    for depth in (220, 300):
        response = tenant.post("/v1/runs", json={"agent": "direct", "input": "x", "metadata": _nested(depth)})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["details"]["problems"] == [
            {"where": "body", "problem": "the request body nests deeper than 36 levels of objects and arrays"}
        ]
    # At the bound it is a run like any other.
    fine = tenant.post("/v1/runs", json={"agent": "direct", "input": "x", "metadata": _nested(32)})
    assert fine.status_code == 202, fine.text
    assert [r["run_id"] for r in tenant.get("/v1/runs").json()["runs"]] == [fine.json()["run_id"]]
    assert tenant.get(f"/v1/runs/{fine.json()['run_id']}").json()["metadata"] == _nested(32)


LONE = "holds an unpaired UTF-16 surrogate (\\ud800 to \\udfff), which is not a Unicode character"


def invalid_body(problems: list[dict[str, str]]) -> dict[str, Any]:
    """The answer to a body the API's JSON check refused for these problems (all of them listed in
    the details, the first five in the message)."""
    return {
        "error": {
            "kind": "invalid_request",
            "message": "; ".join(f"{p['where']}: {p['problem']}" for p in problems[:5]),
            "details": {"problems": problems},
        }
    }


def test_lone_surrogates_are_refused_before_anything_is_stored(tenant: httpx.Client) -> None:
    # Python's json reads "\ud800" into a string no UTF-8 encoder takes: such a value failed the
    # submit with a 500 when it was stored, and such a key was stored altered.
    nan = "NaN is not a JSON number; send a finite number, a string or null"
    for path, body, problems in [
        (
            "/v1/runs",
            b'{"agent": "direct", "input": "x", "metadata": {"note": "\\ud800"}}',
            [{"where": "body.metadata.note", "problem": f"the string {LONE}"}],
        ),
        (
            "/v1/runs",
            b'{"agent": "direct", "input": "x", "state": {"a": ["ok", "\\udfff"]}}',
            [{"where": "body.state.a.1", "problem": f"the string {LONE}"}],
        ),
        (
            "/v1/runs",
            b'{"agent": "direct", "input": "x", "metadata": {"\\udc00": 1}}',
            [{"where": "body.metadata.\\udc00", "problem": f"the key {LONE}"}],
        ),
        (
            "/v1/runs",
            b'{"agent": "direct", "input": "x", "metadata": {"\\udc00": NaN}}',
            [
                {"where": "body.metadata.\\udc00", "problem": f"the key {LONE}"},
                {"where": "body.metadata.\\udc00", "problem": nan},
            ],
        ),
        (
            "/v1/runs/no-such-run/messages",
            b'{"text": "\\ud83d"}',
            [{"where": "body.text", "problem": f"the string {LONE}"}],
        ),
    ]:
        response = tenant.post(path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (body, response.text)
        assert response.json() == invalid_body(problems)
    assert tenant.get("/v1/runs").json()["runs"] == []
    # A pair is one character, taken and given back as sent.
    pair = b'{"agent": "direct", "input": "x", "metadata": {"\\ud83d\\ude00": "\\ud83d\\ude00"}}'
    accepted = tenant.post("/v1/runs", content=pair, headers={"content-type": "application/json"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["metadata"] == {"\U0001f600": "\U0001f600"}


def test_numbers_and_depths_past_what_pythons_parser_reads_are_invalid_requests(
    tenant: httpx.Client,
) -> None:
    # Each was answered 400 bad_request "There was an error parsing the body", or stored.
    too_large = "is too large for a JSON number (a double)"
    for body, where, problem in [
        (
            b'{"agent": "direct", "input": "x", "metadata": {"big": 1%s}}' % (b"0" * 400),
            "body.metadata.big",
            f"100000000000... (401 digits) {too_large}",
        ),
        (
            b'{"agent": "direct", "input": "x", "metadata": {"big": -1%s}}' % (b"0" * 5000),
            "body.metadata.big",
            f"-10000000000... (5001 digits) {too_large}",
        ),
        (
            b'{"agent": "direct", "input": "x", "metadata": {"a": %s%s}}' % (b"[" * 5000, b"]" * 5000),
            "body",
            "the request body nests deeper than 36 levels of objects and arrays",
        ),
    ]:
        response = tenant.post("/v1/runs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json() == invalid_body([{"where": where, "problem": problem}])
    assert tenant.get("/v1/runs").json()["runs"] == []
    # The largest a double holds is a number like any other.
    fine = b'{"agent": "direct", "input": "x", "metadata": {"big": 1%s}}' % (b"0" * 308)
    accepted = tenant.post("/v1/runs", content=fine, headers={"content-type": "application/json"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["metadata"] == {"big": 10**308}


def test_numbers_past_what_redis_reads_are_refused(tenant: httpx.Client) -> None:
    run_id = tenant.post("/v1/runs", json={"agent": "direct", "input": "x"}).json()["run_id"]
    for response in [
        tenant.get(f"/v1/runs/{run_id}/events", params={"after": "99999999999999999999-0"}),
        tenant.get(
            f"/v1/runs/{run_id}/events",
            headers={"Last-Event-ID": "1-99999999999999999999", "Accept": "text/event-stream"},
        ),
        # The largest id Redis has leaves none after it: Redis refuses to read after it.
        tenant.get(f"/v1/runs/{run_id}/events", params={"after": f"{2**64 - 1}-{2**64 - 1}"}),
        tenant.get(
            f"/v1/runs/{run_id}/events",
            headers={"Last-Event-ID": f"{2**64 - 1}-{2**64 - 1}", "Accept": "text/event-stream"},
        ),
        tenant.get(f"/v1/runs/{run_id}/checkpoints", params={"after_version": 2**63 - 1}),
        tenant.get("/v1/assistants/none", params={"version": 2**63}),
    ]:
        assert response.status_code == 422, response.text
        assert response.json()["error"]["kind"] == "invalid_request"


def test_a_key_twice_in_one_object_is_refused_before_anything_is_stored(tenant: httpx.Client) -> None:
    # Python's json keeps a repeated key's last value; a gateway in front of the API may have
    # checked its first (here: an allowed agent, then another; a harmless note, then another).
    twice = "the key is in its object more than once"
    for body, problems in [
        (
            b'{"agent": "direct", "input": "x", "agent": "chain"}',
            [{"where": "body.agent", "problem": twice}],
        ),
        (
            b'{"agent": "direct", "input": "x", "metadata": {"a": 1, "b": {"c": 1, "c": 2}, "a": 2}}',
            [
                {"where": "body.metadata.a", "problem": twice},
                {"where": "body.metadata.b.c", "problem": twice},
            ],
        ),
    ]:
        response = tenant.post("/v1/runs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (body, response.text)
        assert response.json() == invalid_body(problems)
    assert tenant.get("/v1/runs").json()["runs"] == []
    # The same key in different objects is no repeat.
    fine = b'{"agent": "direct", "input": "x", "metadata": {"a": {"a": 1}, "b": {"a": 2}}}'
    accepted = tenant.post("/v1/runs", content=fine, headers={"content-type": "application/json"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["metadata"] == {"a": {"a": 1}, "b": {"a": 2}}


def _cpu_s(api: ApiProcess) -> float:
    """The CPU time the API's processes have used so far (user and system)."""
    assert api.proc is not None
    process = psutil.Process(api.proc.pid)
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def test_a_body_repeating_thousands_of_keys_is_refused_as_cheaply_as_one_repeating_none(
    api: ApiProcess,
) -> None:
    # 12,000 keys each twice in one object (240 KB, no key needed): the repeats must be found in
    # one pass, not each compared with every repeat before it (72 million comparisons, over a
    # second of the event loop that serves every other request).
    once = ",".join(f'"k{i}":0' for i in range(12000))
    other = ",".join(f'"j{i}":0' for i in range(12000))
    repeats = f"{{{once},{once}}}".encode()
    # As long, as many keys, none repeated: refused by the same check (for its NaN).
    unrepeated = f'{{{once},{other},"z":NaN}}'.encode()
    assert len(repeats) < LIMIT and len(unrepeated) < LIMIT
    twice = "the key is in its object more than once"
    problems = [{"where": f"body.k{i}", "problem": twice} for i in range(20)]
    spent = {}
    with httpx.Client(base_url=api.url, headers={"content-type": "application/json"}, timeout=60) as http:
        for name, body in [("unrepeated", unrepeated), ("repeats", repeats)]:
            before = _cpu_s(api)
            for _ in range(3):
                response = http.post("/v1/runs", content=body)
                assert response.status_code == 422, response.text[:300]
                if body is repeats:
                    assert response.json() == invalid_body(problems)
            spent[name] = _cpu_s(api) - before
    assert spent["repeats"] < 3 * spent["unrepeated"] + 0.3, spent


def test_places_under_a_long_key_are_named_cut_and_without_a_copy_per_item(api: ApiProcess) -> None:
    # A 100,000-character key over 10,000 objects that each repeat a key (240 KB, no key needed):
    # the answer named each of 20 places with the whole key (2 MB), and the check made the place
    # of every item before looking at any (1 GB).
    assert api.proc is not None
    key = "q" * 100_000
    items = ",".join(['{"a":0,"a":1}'] * 10_000)
    body = f'{{"agent": "direct", "input": "x", "metadata": {{"{key}": [{items}]}}}}'.encode()
    assert len(body) < LIMIT
    process = psutil.Process(api.proc.pid)
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], process.memory_info().rss)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        response = httpx.post(
            f"{api.url}/v1/runs", content=body, headers={"content-type": "application/json"}, timeout=60
        )
    finally:
        done.set()
        watcher.join()
    assert peak[0] - before < RSS_BOUND, f"the API grew by {(peak[0] - before) // MB} MB"
    assert response.status_code == 422
    where = f"body.metadata.{key}"[:200] + "..."
    problems = [{"where": where, "problem": "the key is in its object more than once"}] * 20
    assert response.json() == invalid_body(problems)
    assert len(response.content) < 8000
    # A number too large for a double is named by its start, as long as it is.
    digits = "1" * 200_000
    response = httpx.post(
        f"{api.url}/v1/runs",
        content=f'{{"agent": "direct", "input": "x", "metadata": {{"n": {digits}.5}}}}'.encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    problem = "111111111111... (200002 characters) is too large for a JSON number (a double)"
    assert response.json() == invalid_body([{"where": "body.metadata.n", "problem": problem}])


def test_fields_the_api_does_not_have_are_named_cut(tenant: httpx.Client) -> None:
    # Twenty unexpected fields under long names: each was named whole, the answer larger than the body.
    fields = {f"{i:02d}{'k' * 10_000}": 1 for i in range(20)}
    response = tenant.post("/v1/runs", json={"agent": "direct", "input": "x", **fields})
    assert response.status_code == 422, response.text[:300]
    problems = response.json()["error"]["details"]["problems"]
    assert [p["where"] for p in problems] == [f"body.{i:02d}{'k' * 193}..." for i in range(20)]
    assert len(response.content) < 8000


# -- Request targets ---------------------------------------------------------------------------


def get_head(target: str, *headers: str, host: str = "api") -> bytes:
    return ("\r\n".join([f"GET {target} HTTP/1.1", f"Host: {host}", *headers]) + "\r\n\r\n").encode()


def test_a_target_in_absolute_form_is_served_as_its_path(api: ApiProcess, tenant: httpx.Client) -> None:
    # RFC 9112 §3.2.2: a server accepts it (a proxy, or an older client, sends it); it was a 404.
    key = tenant.headers["authorization"]
    tenant_name = tenant.get("/v1/whoami").json()["tenant"]
    for target in [f"http://127.0.0.1:{api.port}/v1/whoami", "HTTPS://api.example/v1/whoami?x=1"]:
        done = exchange(api, get_head(target, f"Authorization: {key}"), iter(()))
        assert done.status == 200, (target, done.body)
        assert json.loads(done.body)["tenant"] == tenant_name
    # A target with no path is the root's; one naming user information names no host: no route.
    done = exchange(api, get_head(f"http://127.0.0.1:{api.port}"), iter(()))
    assert done.status == 200 and b"<html" in done.body.lower()
    done = exchange(api, get_head("http://user@api.example/v1/whoami", f"Authorization: {key}"), iter(()))
    assert (done.status, done.error()["kind"]) == (404, "not_found")


def test_a_slash_too_many_or_too_few_is_redirected_to_the_path_alone(api: ApiProcess) -> None:
    # The Location named the host of the request's Host header: one a cache may keep for others.
    for target, location in [
        ("/v1/runs/?limit=3", "/v1/runs?limit=3"),
        ("/v1/whoami/", "/v1/whoami"),
        ("/console", "/console/"),
    ]:
        done = exchange(api, get_head(target, host="attacker.example"), iter(()))
        assert (done.status, done.headers["location"]) == (307, location), target
    for target in [
        "/v1/nothing-here/",
        "/console/no-such-file/",
        "//attacker.example/",
        "//attacker.example",
    ]:
        done = exchange(api, get_head(target, host="attacker.example"), iter(()))
        assert (done.status, done.error()["kind"]) == (404, "not_found"), target
        assert "location" not in done.headers


def test_a_transfer_coding_other_than_chunked_is_not_implemented(api: ApiProcess) -> None:
    done = exchange(api, post_head("Transfer-Encoding: gzip, chunked"), iter([b"0\r\n\r\n"]))
    assert done.status == 501, done.body
    assert done.error() == {
        "kind": "not_implemented",
        "message": "a request body is taken with a Content-Length or as one Transfer-Encoding: chunked",
        "details": {},
    }
    assert done.headers["connection"] == "close"
