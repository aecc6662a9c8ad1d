"""MCP tools through the official SDK: a real MCP server over stdio and streamable HTTP, real workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from producer.client import Client
from shared.protocol import call_claim
from shared.settings import Settings
from shared.state import Phase, RunHead
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, free_port, running, wait_until

AGENTS = "tests.agents_mcp"
TIMEOUT = 90


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_server", "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 60, interval=0.2, what="the MCP server")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:  # still serving a call a test gave up on
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def mcp_cluster(
    mcp_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Client, list[WorkerProcess]]]:
    _need_redis()
    server = RedisServer().start()
    env = {"WESICHAIN_TEST_MCP_URL": mcp_server, "WESICHAIN_LEASE_S": "2", "WESICHAIN_QUEUED_LEASE_S": "4"}
    log_dir = str(tmp_path_factory.mktemp("mcp-workers"))
    workers = [
        WorkerProcess(f"mcp{i}", server.url, agents=AGENTS, concurrency=2, env=env, log_dir=log_dir)
        for i in (1, 2)
    ]
    client = Client(Settings(redis_url=server.url, agents_module=AGENTS))
    try:
        with running(workers, timeout=120):
            yield client, workers
    finally:
        client.close()
        server.cleanup()


def _run(client: Client, calls: list[dict[str, Any]]) -> RunHead:
    return client.submit("mcp", json.dumps(calls)).wait(TIMEOUT)


def test_tools_over_stdio_and_http_are_listed_validated_and_called(
    mcp_cluster: tuple[Client, list[WorkerProcess]],
) -> None:
    client, _ = mcp_cluster
    (info,) = [a for name, a in client.workers.agents().items() if name == "mcp"]
    tools = {t.name: t for t in info.tools}
    assert {"local_add", "local_explode", "local_count", "add", "shout", "explode", "sleep", "count"} <= set(
        tools
    )
    assert tools["add"].parameters["required"] == ["a", "b"] and not tools["add"].retry_safe
    head = _run(
        client,
        [
            {"name": "local_add", "arguments": {"a": 2, "b": 3}},
            {"name": "shout", "arguments": {"text": "hi"}},
            {"name": "explode", "arguments": {"reason": "boom"}},
        ],
    )
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer == (
        "local_add:ok:5 | shout:ok:HI | explode:err:Error: McpCallError: remote/explode failed:"
        " Error executing tool explode: exploded: boom"
    )


def test_arguments_failing_the_schema_are_refused_before_any_call(
    mcp_cluster: tuple[Client, list[WorkerProcess]],
) -> None:
    client, _ = mcp_cluster
    head = _run(client, [{"name": "add", "arguments": {"a": "two"}}])
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer is not None and head.answer.startswith("corrected after: Your previous reply")
    assert "'b' is a required property" in head.answer and '"required": ["a", "b"]' in head.answer


def test_a_call_past_its_timeout_fails_as_a_tool_error(
    mcp_cluster: tuple[Client, list[WorkerProcess]],
) -> None:
    client, _ = mcp_cluster
    started = time.monotonic()
    head = _run(client, [{"name": "quick_sleep", "arguments": {"seconds": 20}}])
    assert head.phase is Phase.COMPLETED, head.error
    assert head.answer is not None and head.answer.startswith("quick_sleep:err:Error: ")
    assert time.monotonic() - started < 15


def test_cancelling_the_run_gives_the_call_up(mcp_cluster: tuple[Client, list[WorkerProcess]]) -> None:
    client, _ = mcp_cluster
    handle = client.submit("mcp", json.dumps([{"name": "sleep", "arguments": {"seconds": 25}}]))
    wait_until(lambda: handle.status().phase is Phase.ACTING, TIMEOUT, what="the call to start")
    time.sleep(1.0)  # let the session open and the call reach the server
    started = time.monotonic()
    handle.cancel()
    assert handle.wait(TIMEOUT).phase is Phase.INTERRUPTED
    assert time.monotonic() - started < 15


def test_a_worker_killed_mid_call_leaves_an_unknown_outcome(
    mcp_cluster: tuple[Client, list[WorkerProcess]],
) -> None:
    client, workers = mcp_cluster
    handle = client.submit("mcp", json.dumps([{"name": "sleep", "arguments": {"seconds": 8}}]))
    wait_until(lambda: handle.status().phase is Phase.ACTING, TIMEOUT, what="the call to start")
    call_field = call_claim(1, handle.status().pending_calls[0].id)

    def holder_pid() -> int | None:
        raw = client.store.redis.hget(client.store.keys.run(handle.run_id), call_field)
        return int(str(raw).rsplit(":", 1)[-1]) if raw else None

    pid = wait_until(holder_pid, TIMEOUT, what="the call's claim")
    assert any(pid in w.children() for w in workers)
    os.kill(pid, signal.SIGKILL)
    head = handle.wait(TIMEOUT)
    # Not retry-safe (MCP does not say): the policy fails the run rather than call it again.
    assert head.phase is Phase.FAILED
    assert head.error is not None and head.error.kind == "ToolOutcomeUnknown"
