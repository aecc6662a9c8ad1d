"""Fixtures for the provider adapter tests: fake provider servers and adapters pointed at them,
all closed after each test (the suite turns resource warnings into errors)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.unit.llm.support import Harness


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback fakes must be reached directly whatever proxy the machine is configured with."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def free_port() -> Callable[[], int]:
    """A port nothing listens on (bound, then released), for connection-refused tests."""

    def pick() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port

    return pick
