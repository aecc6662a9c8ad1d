"""Fixtures of the browser tests, one set per module (module scope): a redis-server, a chromium, two
workers, a ``wesichain api`` and a tenant's key with an HTTP client (and another tenant's, the
attacker's). A module says what its workers run with module constants, read here:

* ``AGENTS``: the agents module of the workers (default ``tests.agents_fixture``);
* ``WORKER_ENV``: more environment for the workers (default none);
* ``TENANT``: the prefix of the tenant whose key signs in (default ``console``).

``page`` is a :class:`~tests.console.support.Console` tab signed in with that key, checked when
the test ends.

A module that needs other processes (a scheduler, a single worker) defines its own ``api``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.api_support import ApiProcess, bearer
from tests.chaos.support import Cluster
from tests.console.support import CHROMIUM, CHROMIUM_ARGS, new_key, signed_in
from tests.harness import RedisServer

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if CHROMIUM is not None:
        return
    skip = pytest.mark.skip(reason="Debian's chromium is not installed (.ci/run installs it)")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    agents = getattr(request.module, "AGENTS", "tests.agents_fixture")
    env = getattr(request.module, "WORKER_ENV", None)
    c = Cluster(server, tmp_path_factory.mktemp("workers"))
    c.start(2, concurrency=2, agents=agents, env=env)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def api(server: RedisServer, cluster: Cluster) -> Iterator[ApiProcess]:
    process = ApiProcess(server.url, env={"WESICHAIN_API_KEEPALIVE_S": "0.5"}).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def key(request: pytest.FixtureRequest, server: RedisServer) -> str:
    return new_key(server, getattr(request.module, "TENANT", "console"))


@pytest.fixture(scope="module")
def http(api: ApiProcess, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, headers=bearer(new_key(server, "attacker")), timeout=30) as client:
        yield client


@pytest.fixture
def page(browser: Browser, api: ApiProcess, key: str) -> Iterator[Page]:
    with signed_in(browser, api.url, key) as tab:
        yield tab
