"""Parts of the HTTP API that need no Redis: configuration, the error shape, body limits, SSE
frames and stream id order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from producer.api.app import create_app
from producer.api.config import ApiConfig, is_loopback
from producer.api.feeds import Entry, after, sse_frame
from shared.errors import ConfigError
from shared.settings import Settings

SETTINGS = Settings(redis_url="redis://127.0.0.1:1/0")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_auth_may_be_off_on_loopback(host: str) -> None:
    assert is_loopback(host)
    assert not ApiConfig(settings=SETTINGS, auth=False, host=host).auth


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "api.internal", ""])
def test_auth_stays_on_anywhere_else(host: str) -> None:
    with pytest.raises(ConfigError, match="only on a loopback address"):
        ApiConfig(settings=SETTINGS, auth=False, host=host)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WESICHAIN_API_AUTH", "maybe")
    with pytest.raises(ConfigError, match="'on' or 'off'"):
        ApiConfig.from_env()
    monkeypatch.setenv("WESICHAIN_API_AUTH", "off")
    monkeypatch.setenv("WESICHAIN_API_HOST", "0.0.0.0")
    with pytest.raises(ConfigError):
        ApiConfig.from_env()
    monkeypatch.setenv("WESICHAIN_API_HOST", "127.0.0.1")
    monkeypatch.setenv("WESICHAIN_API_MAX_STREAMS", "12")
    config = ApiConfig.from_env()
    assert not config.auth and config.max_streams == 12


def test_stream_ids_order_as_numbers() -> None:
    assert after("10-0", "9-5") and after("9-10", "9-9") and not after("9-9", "9-9")
    assert not after("1700000000000-0", "1700000000000-1")


def test_an_sse_frame_carries_the_stream_id_twice() -> None:
    frame = sse_frame("17-3", '{"kind":"RunStarted","step":0}')
    assert frame == 'id: 17-3\ndata: {"id":"17-3","kind":"RunStarted","step":0}\n\n'
    assert json.loads(frame.split("data: ", 1)[1]) == {"id": "17-3", "kind": "RunStarted", "step": 0}


def test_a_feed_entry_unpacks_as_its_pair_and_renders_its_frame_once() -> None:
    entry = Entry("17-3", '{"kind":"Completed","step":0}')
    event_id, raw = entry
    assert (event_id, raw) == ("17-3", '{"kind":"Completed","step":0}') and entry.id == "17-3"
    assert entry.kind == "Completed"
    assert entry.frame == sse_frame("17-3", raw)
    # Worked out once, then the same string for every follower the feed hands the entry to.
    assert entry.frame is entry.frame
    assert Entry("1-0", '{"kind":7}').kind is None and Entry("1-0", "{}").kind is None


def _call(method: str, path: str, content: Any = None) -> httpx.Response:
    """One request to the app in this process (no server, no lifespan: no Redis is reached)."""
    app = create_app(ApiConfig(settings=SETTINGS, max_body_bytes=2048))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            headers = {"content-type": "application/json"} if content is not None else {}
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(go())


def test_unknown_paths_and_methods_get_the_error_shape() -> None:
    missing = _call("GET", "/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["kind"] == "not_found"
    wrong = _call("PUT", "/v1/runs")
    assert wrong.status_code == 405 and set(wrong.json()["error"]) == {"kind", "message", "details"}
    assert _call("GET", "/healthz").json() == {"status": "ok"}


def test_bodies_over_the_limit_are_refused_declared_or_chunked() -> None:
    body = json.dumps({"agent": "a", "input": "x" * 4000}).encode()
    declared = _call("POST", "/v1/runs", body)
    assert declared.status_code == 413 and declared.json()["error"]["details"] == {"max_bytes": 2048}

    async def chunks() -> AsyncIterator[bytes]:
        yield body[:1500]
        yield body[1500:]

    chunked = _call("POST", "/v1/runs", chunks())
    assert chunked.status_code == 413 and chunked.json()["error"]["kind"] == "body_too_large"
