"""The CLI as a shell user meets it: output piped into a reader that stops early (``| head``),
``--version``, help on every option, a timeline that does not wrap in a pipe, and what ``status``
says about a parked run."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from producer.cli import EXIT_BROKEN_PIPE, _parser
from producer.client import Client
from shared.settings import ENV_ARCHIVE_URL, ENV_REDIS_URL
from shared.state import Phase
from tests.broker import Settings
from tests.harness import ROOT, RedisServer, WorkerProcess, running, wait_until

TIMEOUT = 60
#: The smallest pipe Linux makes: a command whose output is longer blocks on it, so closing the
#: reader after one line always meets a write still to come.
PIPE_SIZE = 4096
WESICHAIN = [sys.executable, "-m", "producer.cli"]


def _env(**more: str) -> dict[str, str]:
    # No terminal size from the test run's own environment either: these commands write to pipes.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("WESICHAIN_") and k not in ("COLUMNS", "LINES")
    }
    return {**env, "PYTHONPATH": str(ROOT), **more}


def first_line_then_close(args: list[str], env: dict[str, str]) -> tuple[str, int, str]:
    """Run ``args`` with stdout a pipe, read one line, close the pipe (what ``| head -1`` does);
    the line, the exit status and stderr."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    proc = subprocess.Popen(args, stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    os.close(write_end)
    line = b""
    try:
        while not line.endswith(b"\n"):
            byte = os.read(read_end, 1)  # one byte at a time: nothing past the line is taken
            if not byte:
                break
            line += byte
    finally:
        os.close(read_end)
    _, err = proc.communicate(timeout=TIMEOUT)
    return line.decode(), proc.returncode, err.decode()


def assert_quiet_stop(line: str, status: int, err: str) -> None:
    assert line.strip(), err
    assert status == EXIT_BROKEN_PIPE, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


# -- without a server --------------------------------------------------------------------------------


def test_every_option_of_every_command_has_help() -> None:
    parser, _ = _parser()
    missing: list[str] = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.option_strings and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings)}")

    walk(parser, "wesichain")
    assert missing == []


def test_version_is_the_installed_package_s() -> None:
    done = subprocess.run(
        [*WESICHAIN, "--version"], env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"wesichain {version('wesichain')}\n", "")


@pytest.fixture(scope="module")
def archived_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A demo run, archived where a process without a Redis reads it back: its id and that env."""
    archive = tmp_path_factory.mktemp("archive") / "archive.db"
    env = _env(**{ENV_ARCHIVE_URL: f"sqlite:///{archive}"})
    done = subprocess.run(
        [*WESICHAIN, "demo", "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout.splitlines()[-1])["run_id"]
    yield run_id, {**env, ENV_REDIS_URL: "memory://"}


def test_demo_json_into_a_reader_that_stops_early(tmp_path: Path) -> None:
    env = _env(**{ENV_ARCHIVE_URL: f"sqlite:///{tmp_path / 'archive.db'}"})
    line, status, err = first_line_then_close([*WESICHAIN, "demo", "--json"], env)
    assert json.loads(line)["kind"] == "RunStarted"
    assert_quiet_stop(line, status, err)


def test_events_into_a_reader_that_stops_early(archived_demo: tuple[str, dict[str, str]]) -> None:
    run_id, env = archived_demo
    line, status, err = first_line_then_close([*WESICHAIN, "events", run_id, "--json"], env)
    assert json.loads(line)["kind"] == "RunStarted"
    assert_quiet_stop(line, status, err)


def test_timeline_into_a_pipe_does_not_wrap(archived_demo: tuple[str, dict[str, str]]) -> None:
    run_id, env = archived_demo
    done = subprocess.run(
        [*WESICHAIN, "timeline", run_id], env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}  agent research  completed") and lines[0].endswith(
        "worker process(es)"
    )
    lanes = [ln for ln in lines if "│" in ln]
    # The queue lane and one lane per worker process, each drawn whole: label, 72 cells, borders.
    assert len(lanes) == 2 and all(len(ln.split("│")) == 3 and len(ln.split("│")[1]) == 72 for ln in lanes)
    assert any(re.match(r"^0\.\d{3}\s+[\d.]+\s+0\s+start\s+\S+\s+v2 -> thinking\s*$", ln) for ln in lines)


# -- against a real redis-server and workers ---------------------------------------------------------


@pytest.mark.integration
def test_status_of_a_parked_run_says_what_it_waits_for(workers: list[WorkerProcess], client: Client) -> None:
    handle = client.submit("needs_approval", "please refund")
    wait_until(lambda: handle.status().phase is Phase.AWAITING_APPROVAL, TIMEOUT, what="the run to park")
    call_id = handle.status().pending_calls[0].id
    done = subprocess.run(
        [*WESICHAIN, "status", handle.run_id, "--redis", client.settings.redis_url],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    tail = done.stdout.splitlines()[-4:]
    assert tail[0].startswith("waiting  for a human to approve 1 tool call(s): ")
    assert tail[1].strip() == f'charge({{"seconds": 0.0, "label": "refund"}}) id={call_id}'
    assert tail[2] == f'approve  wesichain approve {handle.run_id} --note "..."   (run them)'
    assert tail[3] == (
        f'deny     wesichain deny {handle.run_id} --note "..."      (the model is told they were denied)'
    )
    handle.deny("not now")
    assert handle.wait(TIMEOUT).phase is Phase.COMPLETED


PIPELINE_AGENTS = "tests.agents_pipelines"


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # Its own: the session's workers serve other agents and would take the pipeline's tasks.
    server = RedisServer().start()
    worker = WorkerProcess(
        "pipes",
        server.url,
        agents=PIPELINE_AGENTS,
        pool="threads",
        concurrency=8,
        log_dir=str(tmp_path_factory.mktemp("pipe-workers")),
    )
    try:
        with running([worker]):
            yield server
    finally:
        server.cleanup()


@pytest.mark.integration
def test_pipeline_events_into_a_reader_that_stops_early(pipeline_server: RedisServer) -> None:
    client = Client(Settings(redis_url=pipeline_server.url, agents_module=PIPELINE_AGENTS))
    try:
        items = ", ".join(f"item {i}" for i in range(24))
        handle = client.submit_pipeline("fan", items)
        assert handle.wait(timeout=TIMEOUT).status == "completed"
    finally:
        client.close()
    args = [*WESICHAIN, "pipeline", "events", handle.pipeline_id, "--redis", pipeline_server.url]
    line, status, err = first_line_then_close(args, _env(WESICHAIN_AGENTS=PIPELINE_AGENTS))
    assert json.loads(line)["id"]
    assert_quiet_stop(line, status, err)
