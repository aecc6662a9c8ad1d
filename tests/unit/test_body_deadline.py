"""The body's read deadline (``BodyLimit``): a body that stops half-way, or keeps coming a byte at a
time, is answered 408 once the deadline passes, and the app behind never sees it. No server."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.types import Message, Receive, Scope, Send

from producer.api.body_limit import BodyLimit
from producer.api.config import ApiConfig
from shared.errors import ConfigError
from shared.settings import Settings

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/runs",
    "headers": [(b"transfer-encoding", b"chunked")],
}


async def _never_called(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the app behind the limit was handed a body that never arrived")


def _answer(receive: Receive) -> tuple[int, dict[str, str], dict[str, object]]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(BodyLimit(_never_called, max_bytes=4096, timeout_s=0.2)(SCOPE, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    return sent[0]["status"], headers, body["error"]


def test_a_body_that_stops_half_way_is_answered_408_and_closed() -> None:
    given = 0

    async def receive() -> Message:
        nonlocal given
        if given == 0:
            given += 1
            return {"type": "http.request", "body": b'{"agent":', "more_body": True}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    status, headers, error = _answer(receive)
    assert (status, headers["connection"], error["kind"]) == (408, "close", "request_timeout")
    assert error["details"] == {"timeout_s": 0.2, "received_bytes": 9}


def test_a_body_trickled_a_byte_at_a_time_meets_the_same_deadline() -> None:
    # Never idle for long: a wait-between-chunks timeout would never fire.
    given = 0

    async def receive() -> Message:
        nonlocal given
        await asyncio.sleep(0.01)
        given += 1
        return {"type": "http.request", "body": b" ", "more_body": True}

    status, _, error = _answer(receive)
    assert (status, error["kind"]) == (408, "request_timeout")
    assert error["details"]["received_bytes"] == given  # type: ignore[index]


@pytest.mark.parametrize("seconds", [0.0, -1.0, 3601.0])
def test_the_body_timeout_must_be_positive_and_bounded(seconds: float) -> None:
    with pytest.raises(ConfigError, match="body_timeout_s"):
        ApiConfig(settings=Settings(redis_url="redis://127.0.0.1:1/0"), body_timeout_s=seconds)
