"""JSON log lines of a real worker carry the run, step, phase, task, worker and tenant of the phase
that wrote them, whichever logger wrote them (here: a tool's own)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from producer.client import Client
from shared.settings import ENV_BROKER_URL
from shared.state import Phase
from tests.broker import Settings, broker_for, vhost
from tests.harness import RedisServer, WorkerProcess

FIELDS = {"run_id", "step", "phase", "task_id", "worker", "tenant"}


def _lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))  # a line that is not valid JSON fails the test here
    return lines


def test_every_line_of_a_phase_names_its_run(redis_server: RedisServer, tmp_path: Any) -> None:
    # Its own broker key prefix keeps the session's workers off its messages; on RabbitMQ, where
    # the prefix means nothing, a virtual host of its own does.
    with vhost() if broker_for(redis_server.url) else contextlib.nullcontext("") as broker:
        _every_line_of_a_phase_names_its_run(redis_server, tmp_path, broker)


def _every_line_of_a_phase_names_its_run(redis_server: RedisServer, tmp_path: Any, broker: str) -> None:
    worker = WorkerProcess(
        "jsonlog",
        redis_server.url,
        agents="tests.agents_ops",
        pool="prefork",
        concurrency=1,
        queues="wesichain.model,wesichain.tools",
        env={
            "WESICHAIN_LOG_FORMAT": "json",
            "WESICHAIN_PREFIX": "jsonlog:",
            "WESICHAIN_BROKER_PREFIX": "jsonlog:",
            **({ENV_BROKER_URL: broker} if broker else {}),
        },
        log_dir=str(tmp_path),
    )
    worker.start()
    client = Client(
        Settings(
            redis_url=redis_server.url,
            agents_module="tests.agents_ops",
            prefix="jsonlog:",
            broker_prefix="jsonlog:",
            broker_url=broker,
        )
    )
    try:
        handle = client.submit("noting", "note hello", tenant="acme")
        assert handle.wait(timeout=30).phase is Phase.COMPLETED
    finally:
        worker.stop()
        client.close()
    lines = _lines(worker.log())
    assert lines, "the worker wrote no JSON lines"
    mine = [line for line in lines if line.get("run_id") == handle.run_id]
    tool_lines = [line for line in mine if line["logger"] == "tests.ops"]
    assert [line["message"] for line in tool_lines] == ["noting hello"]
    assert tool_lines[0]["phase"] == "acting" and tool_lines[0]["step"] == 1
    for line in mine:
        assert FIELDS <= set(line), line
        assert line["tenant"] == "acme" and line["worker"] == "jsonlog"
        assert line["task_id"].startswith(handle.run_id)
    assert {"ts", "level", "logger", "message"} <= set(lines[0])
