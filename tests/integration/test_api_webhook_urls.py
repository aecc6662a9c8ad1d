"""A submitted webhook URL that is malformed, or that names a non-public address in any spelling,
is answered 422 with the structured error, and starts no run. Real uvicorn process, real
redis-server; every host here is an IP literal or refused before resolution, so nothing is looked
up or connected to."""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterator

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.api_support import ApiProcess, bearer
from tests.harness import RedisServer

FORM = "callback: a webhook url must be http(s)://host[:port]/..., got "
BAD_HOST = "callback: a webhook url's host is not a valid host name or IP address, got "

MALFORMED = {
    "http://hooks.example.test:99999/x": FORM
    + "'http://hooks.example.test:99999/x' (Port out of range 0-65535)",
    "http://hooks.example.test:-1/x": FORM
    + "'http://hooks.example.test:-1/x' (Port could not be cast to integer value as '-1')",
    "http://hooks.example.test:abc/x": FORM
    + "'http://hooks.example.test:abc/x' (Port could not be cast to integer value as 'abc')",
    "http://hooks.example.test:0/x": "callback: a webhook url's port must be 1-65535, got 'http://hooks.example.test:0/x'",
    "http://hooks exam.example.test/x": BAD_HOST + "'http://hooks exam.example.test/x'",
    "http://[fe80::1%25eth0]/x": BAD_HOST + "'http://[fe80::1%25eth0]/x'",
    "http:///x": FORM + "'http:///x'",
    "http://:8080/x": FORM + "'http://:8080/x'",
    "http://user:secret@hooks.example.test/x": "callback: a webhook url may not carry user info (user@host),"
    " got 'http://user:secret@hooks.example.test/x'",
}

#: Each spelling of an address no webhook may reach.
NOT_PUBLIC = [
    "127.0.0.1",
    "0.0.0.0",
    "10.0.0.1",
    "100.64.0.1",
    "169.254.169.254",
    "172.16.0.1",
    "192.0.0.8",
    "192.0.2.1",
    "192.168.0.1",
    "198.18.0.1",
    "224.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::127.0.0.1",
    "::a9fe:a9fe",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b::7f00:1",
    "64:ff9b:1::808:808",
    "64:ff9b:1::a9fe:a9fe",
    "2002:7f00:1::",
    "2002:a9fe:a9fe::",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:db8::1",
    "fc00::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
]


@pytest.fixture(scope="module")
def http(redis_server: RedisServer) -> Iterator[httpx.Client]:
    process = ApiProcess(redis_server.url).start()
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"hooks-{uuid.uuid4().hex[:6]}")
    try:
        with httpx.Client(base_url=process.url, headers=bearer(key), timeout=30) as client:
            yield client
    finally:
        process.stop()


def _submit(http: httpx.Client, url: str) -> httpx.Response:
    return http.post("/v1/runs", json={"agent": "direct", "input": "x", "callback": {"url": url}})


@pytest.mark.parametrize("url", list(MALFORMED))
def test_a_malformed_webhook_url_is_a_422(http: httpx.Client, url: str) -> None:
    response = _submit(http, url)
    assert response.status_code == 422, response.text
    assert response.json() == {"error": {"kind": "invalid_request", "message": MALFORMED[url], "details": {}}}


def test_an_unparsable_webhook_url_is_a_422(http: httpx.Client) -> None:
    response = _submit(http, "http://[::1/x")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["kind"] == "invalid_request"
    assert error["details"]["problems"] == [
        {"where": "body.callback", "problem": "Value error, Invalid IPv6 URL"}
    ]


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_a_webhook_url_naming_a_non_public_address_is_a_422(http: httpx.Client, address: str) -> None:
    literal = f"[{address}]" if ":" in address else address
    response = _submit(http, f"https://{literal}:8443/hooks/runs")
    assert response.status_code == 422, response.text
    shown = str(ipaddress.ip_address(address))
    message = (
        f"callback: webhook host {shown!r} reaches {shown}, which is not a public address"
        " (allow private webhook addresses in the deployment's settings to use it)"
    )
    assert response.json() == {"error": {"kind": "invalid_request", "message": message, "details": {}}}


def test_no_refused_submit_started_a_run(http: httpx.Client) -> None:
    for url in [*MALFORMED, "https://[64:ff9b::a9fe:a9fe]/x"]:
        assert _submit(http, url).status_code == 422
    listing = http.get("/v1/runs")
    assert listing.status_code == 200 and listing.json()["runs"] == []
