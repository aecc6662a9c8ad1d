"""Operators watch Wesichain in Flower: phase tasks appear by readable name, searchable by run id,
behind authentication, and carrying only ids (no conversation content) in their arguments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest

from producer.client import Client
from tests.broker import broker_env
from tests.harness import ROOT, RedisServer, WorkerProcess, free_port, wait_until

AUTH = ("ops", "s3cret-flower")


@pytest.fixture(scope="module")
def flower(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path_factory.mktemp("flower") / "flower.log", "wb")  # closed below
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WESICHAIN_REDIS_URL": redis_server.url,
        **broker_env(redis_server.url),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "flower",
            "--address=127.0.0.1",
            f"--port={port}",
            f"--basic-auth={AUTH[0]}:{AUTH[1]}",
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 30, interval=0.2, what="flower to serve")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
        log.close()


def test_flower_shows_phase_tasks_by_run_id(
    flower: str, workers: list[WorkerProcess], client: Client
) -> None:
    assert httpx.get(f"{flower}/api/workers", timeout=5).status_code == 401
    # Flower only sees what happens while it listens: wait until it knows the workers.
    wait_until(
        lambda: len(httpx.get(f"{flower}/api/workers?refresh=1", auth=AUTH, timeout=10).json()) >= 2,
        30,
        interval=0.5,
        what="flower to see both workers",
    )

    def tasks_of(run_id: str) -> list[dict[str, object]]:
        reply = httpx.get(
            f"{flower}/api/tasks", params={"search": f"kwargs:run_id={run_id}"}, auth=AUTH, timeout=10
        )
        reply.raise_for_status()
        return list(reply.json().values())

    def tasks_of_run() -> list[dict[str, object]]:
        return tasks_of(handle.run_id)

    # Workers send task events only while a monitor asks for them (Flower's periodic
    # enable_events); wait until a probe run shows up before the run under test.
    def probe_seen() -> bool:
        probe = client.submit("direct", "probe")
        probe.wait(30)
        return bool(tasks_of(probe.run_id))

    wait_until(probe_seen, 45, interval=0.5, what="flower to receive task events")
    secret_text = "my confidential question 7f3a"
    handle = client.submit("one_hop", secret_text)
    handle.wait(30)

    names = wait_until(
        lambda: (
            {t["name"] for t in tasks_of_run()}
            >= {"wesichain.start", "wesichain.think", "wesichain.tool", "wesichain.observe"}
            and tasks_of_run()
        ),
        30,
        interval=0.5,
        what="flower to list the run's phase tasks",
    )
    for task in names:
        shown = f"{task.get('args')} {task.get('kwargs')} {task.get('result')}"
        assert handle.run_id in shown
        assert secret_text not in shown
        assert task["state"] == "SUCCESS"


def flower_tasks(flower: str) -> Callable[[str], list[dict[str, object]]]:
    """The tasks Flower lists for a run (by the ``run_id`` in their arguments)."""

    def tasks_of(run_id: str) -> list[dict[str, object]]:
        reply = httpx.get(
            f"{flower}/api/tasks", params={"search": f"kwargs:run_id={run_id}"}, auth=AUTH, timeout=10
        )
        reply.raise_for_status()
        return list(reply.json().values())

    return tasks_of


def wait_until_flower_sees_tasks(flower: str, client: Client) -> None:
    """Flower receives task events from the workers: a probe run's tasks show up in it."""
    tasks_of = flower_tasks(flower)

    def probe_seen() -> bool:
        probe = client.submit("direct", "probe")
        probe.wait(30)
        return bool(tasks_of(probe.run_id))

    wait_until(probe_seen, 45, interval=0.5, what="flower to receive task events")


def test_flower_shows_a_failed_run_as_a_failed_task(
    flower: str, workers: list[WorkerProcess], client: Client
) -> None:
    """The delivery that ends a run FAILED ends its task in FAILURE, with the run's error; the
    message is acknowledged (the task is never retried or delivered again)."""

    tasks_of = flower_tasks(flower)
    wait_until_flower_sees_tasks(flower, client)
    handle = client.submit("tool_error_fail", "go")  # the tool raises; fail_fast fails the run
    head = handle.wait(30)
    assert head.error is not None and head.error.kind == "ToolDispatch"

    def failed() -> list[dict[str, object]]:
        return [t for t in tasks_of(handle.run_id) if t["state"] == "FAILURE"]

    (task,) = wait_until(failed, 30, interval=0.5, what="flower to show the failed task")
    assert task["name"] == "wesichain.observe"
    assert f"run {handle.run_id} failed at step 1: ToolDispatch" in str(task["exception"])
    # The tool's message stays in the run's state, out of Flower.
    assert "boom" not in f"{task['exception']} {task['traceback']}"
    # The other phase tasks of the run succeeded, and none was retried.
    states = sorted(str(t["state"]) for t in tasks_of(handle.run_id))
    assert states.count("FAILURE") == 1 and "RETRY" not in states


def test_flower_never_shows_a_provider_error_that_quotes_the_prompt(
    flower: str, workers: list[WorkerProcess], client: Client
) -> None:
    """A provider's 400 that echoes the prompt fails the run; its task fails in Flower with the
    error's kind and the run's ids only, in the exception and in the traceback alike."""

    tasks_of = flower_tasks(flower)
    wait_until_flower_sees_tasks(flower, client)
    prompt = "the secret merger with Initech closes on 2031-05-04"
    handle = client.submit("echoing_400", prompt)
    head = handle.wait(30)
    assert head.error is not None and head.error.kind == "ModelTransport"
    assert prompt in head.error.message  # the run itself keeps the whole message

    def failed() -> list[dict[str, object]]:
        return [t for t in tasks_of(handle.run_id) if t["state"] == "FAILURE"]

    (task,) = wait_until(failed, 30, interval=0.5, what="flower to show the failed task")
    assert task["name"] == "wesichain.think"
    assert task["exception"] == f"RunEnded('run {handle.run_id} failed at step 1: ModelTransport')"
    shown = f"{task['exception']} {task['traceback']} {task.get('result')}"
    assert "RunEnded" in str(task["traceback"])
    for secret in (prompt, "Initech", "could not process", "400 invalid request"):
        assert secret not in shown
