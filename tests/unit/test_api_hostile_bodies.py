"""The API app's own refusals, called as an ASGI app with the requests a server might hand on
(uvicorn's h11 refuses some of them itself; another server, or httptools, may not): ambiguous
framing, bodies longer than they declare, numbers JSON does not have, and callers off loopback
when authentication is off. No server, no Redis."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message

from producer.api.app import create_app
from producer.api.body_limit import json_body_problems
from producer.api.config import ApiConfig
from shared.settings import Settings

SETTINGS = Settings(redis_url="redis://127.0.0.1:1/0")
LOCAL = ("127.0.0.1", 8000)


def call(
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    *,
    auth: bool = True,
    path: str = "/v1/runs",
    method: str = "POST",
    server: Any = LOCAL,
    client: Any = ("127.0.0.1", 50000),
    kind: str = "http",
) -> tuple[int, dict[str, str], bytes, int]:
    """The status, headers and body the app answers, and how many of ``chunks`` it read."""
    app = create_app(ApiConfig(settings=SETTINGS, auth=auth, max_body_bytes=2048))
    scope = {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "server": server,
        "client": client,
    }
    read = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal read
        if read < len(chunks):
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        await asyncio.Event().wait()  # nothing more: the client waits for the answer
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    async def go() -> None:
        await app(scope, receive, send)

    asyncio.run(go())
    if kind == "websocket":
        return sent[0].get("code", 0), {}, b"", read
    start = sent[0]
    answer = b"".join(m.get("body", b"") for m in sent[1:])
    names = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], names, answer, read


def error(body: bytes) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(body)["error"]
    return found


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (
            [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")],
            "a request may not carry both Content-Length and Transfer-Encoding",
        ),
        (
            [(b"content-length", b"10"), (b"content-length", b"12")],
            "the request carries different Content-Length values",
        ),
        ([(b"content-length", b"10, 12")], "the request carries different Content-Length values"),
        ([(b"content-length", b"1O")], "the Content-Length is not a number"),
        ([(b"content-length", b"-1")], "the Content-Length is not a number"),
        ([(b"content-length", b"")], "the Content-Length is not a number"),
    ],
    ids=["cl-and-te", "two-lengths", "two-values", "letter", "negative", "empty"],
)
def test_ambiguous_framing_is_refused_before_the_body_is_read(
    headers: list[tuple[bytes, bytes]], message: str
) -> None:
    status, names, body, read = call(headers, [b"x" * 1000] * 10)
    assert status == 400 and read == 0
    assert error(body) == {"kind": "bad_request", "message": message, "details": {}}
    assert names["connection"] == "close"


def test_a_body_longer_than_it_declares_is_counted_as_it_arrives() -> None:
    # A server that let more through than Content-Length says: the bytes count, not the header.
    status, names, body, read = call([(b"content-length", b"10")], [b"x" * 1000] * 10)
    assert status == 413 and read == 3
    assert error(body)["details"] == {"max_bytes": 2048}
    assert names["connection"] == "close"


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    for length in (b"2049", b"9" * 40):
        status, _, body, read = call([(b"content-length", length)], [b"x" * 1000])
        assert (status, read, error(body)["kind"]) == (413, 0, "body_too_large")


def test_the_same_length_twice_is_one_length() -> None:
    body = b'{"agent": "direct", "input": "x"}'
    length = str(len(body)).encode()
    headers = [(b"content-length", length), (b"content-length", length)]
    status, _, answer, read = call(headers, [body], path="/v1/nothing")
    # Read whole and handed on: the router answers it.
    assert (status, read, error(answer)["kind"]) == (404, 1, "not_found")


def test_where_numbers_json_does_not_have_are() -> None:
    body = b'{"a": [1, NaN, {"b": -Infinity}], "c": "NaN", "d": 1e999, "e": 2.5, "f": Infinity}'
    assert json_body_problems(body) == [
        {"where": "body.a.1", "problem": "NaN is not a JSON number; send a finite number, a string or null"},
        {
            "where": "body.a.2.b",
            "problem": "-Infinity is not a JSON number; send a finite number, a string or null",
        },
        {"where": "body.d", "problem": "1e999 is too large for a JSON number (a double)"},
        {
            "where": "body.f",
            "problem": "Infinity is not a JSON number; send a finite number, a string or null",
        },
    ]
    # JSON in UTF-16 (json.loads takes it, so FastAPI does) hides the bytes "NaN", not the value.
    assert [p["where"] for p in json_body_problems('{"x": NaN}'.encode("utf-16"))] == ["body.x"]
    assert json_body_problems(b'{"x": 1.5, "y": "Infinity", "z": 10000000000000000000000}') == []
    # Not JSON: left to the route, which answers bad_json.
    assert json_body_problems(b'{"x": NaN') == []
    # Nested past the parser's stack: the depth is the problem, not the JSON.
    assert json_body_problems(b"[" * 100_000 + b"NaN" + b"]" * 100_000) == [
        {"where": "body", "problem": "the request body nests deeper than 36 levels of objects and arrays"}
    ]
    assert json_body_problems(b"") == []


def test_integers_past_a_double_and_lone_surrogates_are_found() -> None:
    fits = b"1" + b"0" * 308  # 1e308, below a double's largest
    body = b'{"a": %s, "b": -%s0, "c": 1%s, "d": "\\ud83d\\ude00", "e": ["\\udc00"], "\\ud800": 1}' % (
        fits,
        fits,
        b"0" * 5000,
    )
    lone = "holds an unpaired UTF-16 surrogate (\\ud800 to \\udfff), which is not a Unicode character"
    too_large = "is too large for a JSON number (a double)"
    assert json_body_problems(body) == [
        {"where": "body.b", "problem": f"-10000000000... (310 digits) {too_large}"},
        {"where": "body.c", "problem": f"100000000000... (5001 digits) {too_large}"},
        {"where": "body.e.0", "problem": f"the string {lone}"},
        {"where": "body.\\ud800", "problem": f"the key {lone}"},
    ]
    # The UTF-8 bytes of a surrogate, which json.loads decodes to one as well.
    assert json_body_problems('{"x": "\ud800"}'.encode("utf-8", "surrogatepass")) == [
        {"where": "body.x", "problem": f"the string {lone}"}
    ]
    # An escaped backslash before "u" is no escape of a surrogate.
    assert json_body_problems(b'{"x": "\\\\ud800"}') == []


@pytest.mark.parametrize(
    ("server", "client"),
    [
        (("10.0.0.7", 8000), ("127.0.0.1", 50000)),  # bound to a public address
        (LOCAL, ("203.0.113.9", 50000)),  # a forwarded client that is not on this host
        (("192.0.2.2", 8000), ("192.0.2.2", 50000)),  # this host, but not over loopback
        (None, None),  # a Unix socket: where it is reachable from is unknown
    ],
    ids=["public-bind", "forwarded", "own-public-address", "no-address"],
)
def test_with_auth_off_only_loopback_to_loopback_is_served(server: Any, client: Any) -> None:
    status, _, body, read = call(
        [], [], auth=False, path="/healthz", method="GET", server=server, client=client
    )
    assert status == 403 and read == 0
    assert error(body)["kind"] == "forbidden"
    assert "authentication is off" in error(body)["message"]
    code, _, _, _ = call([], [], auth=False, path="/ws", server=server, client=client, kind="websocket")
    assert code == 1008


@pytest.mark.parametrize(
    ("server", "client"),
    [(LOCAL, ("127.0.0.1", 50000)), (("::1", 8000), ("::1", 50000)), (LOCAL, ("::ffff:127.0.0.1", 1))],
)
def test_with_auth_off_loopback_callers_are_served(server: Any, client: Any) -> None:
    status, _, body, _ = call(
        [], [b""], auth=False, path="/healthz", method="GET", server=server, client=client
    )
    assert (status, json.loads(body)) == (200, {"status": "ok"})


def test_with_auth_on_the_address_does_not_matter() -> None:
    public = ("10.0.0.7", 8000)
    status, _, body, _ = call([], [b""], path="/healthz", method="GET", server=public, client=public)
    assert (status, json.loads(body)) == (200, {"status": "ok"})
