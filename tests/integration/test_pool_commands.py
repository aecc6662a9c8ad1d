"""Workers started as a new user starts them: the README's worker commands on one host make a
healthy pool, and ``--agents`` finds a module in the working directory or a file by its path."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from shared.agents import load_registry
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS
from shared.versions import version_queues_of
from tests.api_support import ApiProcess
from tests.broker import broker_env
from tests.conftest import InProcessCli
from tests.harness import ROOT, RedisServer, wait_until

pytestmark = pytest.mark.standalone_redis

TIMEOUT = 60
#: The console script pip installed beside the interpreter: what a user's shell runs.
WESICHAIN = str(Path(sys.executable).parent / "wesichain")
README = ROOT / "README.md"


def readme_pool_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The environment the README exports and its `wesichain worker` commands, read from the
    block after the ``<!-- pool-commands -->`` marker."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- pool-commands -->\n```bash\n(.*?)\n```", text, re.S)
    assert block is not None, "README.md has no <!-- pool-commands --> block"
    env: dict[str, str] = {}
    commands = []
    for line in block[1].splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
        elif words[:2] == ["wesichain", "worker"]:
            commands.append(words)
    return env, commands


def _clean_env(**more: str) -> dict[str, str]:
    """This environment without the suite's settings or PYTHONPATH: a user's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WESICHAIN_") and k != "PYTHONPATH"}
    return {**env, **more}


class Started:
    """A command started in its own process group, logging to a file."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log_path = log
        self._log: IO[bytes] = open(log, "ab")
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return "ready." in self.log()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()


@contextmanager
def started(commands: list[list[str]], env: dict[str, str], cwd: Path, logs: Path) -> Iterator[list[Started]]:
    procs: list[Started] = []
    try:
        for i, words in enumerate(commands):
            procs.append(Started([WESICHAIN, *words[1:]], env, cwd, logs / f"worker-{i}.log"))
        for p in procs:
            wait_until(p.ready, timeout=TIMEOUT, interval=0.1, what=f"worker {p.log_path.name} to be ready")
        yield procs
    finally:
        for p in procs:
            p.stop()


def wesichain(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WESICHAIN, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    # Its own: the pool listed and probed must be these workers and no other.
    server = RedisServer().start()
    yield server
    server.cleanup()


def test_the_readme_s_worker_commands_make_a_healthy_pool(
    redis_server: RedisServer, tmp_path: Path, cli_in_process: InProcessCli
) -> None:
    exported, commands = readme_pool_commands()
    assert len(commands) == 2 and all("--name" not in c and "-n" not in c for c in commands)
    settings = {**exported, "WESICHAIN_REDIS_URL": redis_server.url, **broker_env(redis_server.url)}
    env = _clean_env(**settings)
    api = ApiProcess(redis_server.url)
    with started(commands, env, tmp_path, tmp_path) as procs:

        def listed() -> list[dict[str, Any]] | None:
            # Polled in this process: a new interpreter each poll would spend a second importing.
            done = cli_in_process("workers", "--json", env=settings)
            assert done.returncode == 0, done.stderr
            workers: list[dict[str, Any]] = json.loads(done.stdout)
            return workers if len(workers) == len(procs) else None

        workers = wait_until(listed, TIMEOUT, interval=0.2, what="both workers in the registry")
        host = socket.gethostname()
        by_pid = {w["pid"]: w for w in workers}
        assert sorted(by_pid) == sorted(p.proc.pid for p in procs)
        model, tools = (by_pid[p.proc.pid] for p in procs)
        assert model["id"] == f"model-callbacks-{procs[0].proc.pid}@{host}"
        assert tools["id"] == f"tools-{procs[1].proc.pid}@{host}"
        # The kind queues each was given, and beside them the version queue of every agent version
        # its module defines for those kinds, where a started run's phases go.
        agents = load_registry(exported["WESICHAIN_AGENTS"])
        policies = [agents.get(name).versions for name in agents.names]
        assert version_queues_of([QUEUE_CALLBACKS], policies) == []  # a callback runs no agent code
        model_versions = version_queues_of([QUEUE_MODEL], policies)
        tool_versions = version_queues_of([QUEUE_TOOLS], policies)
        assert (
            f"{QUEUE_MODEL}.research-v1" in model_versions and f"{QUEUE_TOOLS}.research-v1" in tool_versions
        )
        assert sorted(model["queues"]) == sorted([QUEUE_MODEL, QUEUE_CALLBACKS, *model_versions])
        assert sorted(tools["queues"]) == sorted([QUEUE_TOOLS, *tool_versions])

        health = wesichain(env, tmp_path, "health")
        assert health.returncode == 0, health.stdout + health.stderr
        assert sorted(health.stdout.splitlines()) == sorted(f"{w['id']}: consuming" for w in workers)

        api.start()
        try:
            ready = httpx.get(api.url + "/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            assert ready.json()["queues"] == {QUEUE_MODEL: 1, QUEUE_TOOLS: 1, QUEUE_CALLBACKS: 1}
        finally:
            api.stop()


AGENTS_MODULE = textwrap.dedent(
    """
    from greeting import GREETING
    from shared.agents import Agent, AgentRegistry
    from shared.llm.scripted import ScriptedModel, reply
    from shared.pipeline.definition import Pipeline

    registry = AgentRegistry()
    registry.add_model("hello", ScriptedModel(lambda messages: reply(GREETING)))
    registry.add(Agent(name="hello", model="scripted:hello", system_prompt="Greet."))
    registry.add_pipeline(Pipeline("greet").then("hello"))
    """
)


@pytest.mark.parametrize("agents", ["myagents", "./myagents.py"])
def test_agents_from_the_working_directory(agents: str, redis_server: RedisServer, tmp_path: Path) -> None:
    (tmp_path / "myagents.py").write_text(AGENTS_MODULE)
    # Beside it, imported by it: the module's own directory is where its imports are found too.
    (tmp_path / "greeting.py").write_text('GREETING = "hello from myagents"\n')
    env = _clean_env(**{"WESICHAIN_REDIS_URL": redis_server.url, **broker_env(redis_server.url)})
    worker = ["wesichain", "worker", "--agents", agents, "--pool", "prefork", "-c", "1"]
    with started([worker], env, tmp_path, tmp_path):
        done = wesichain(env, tmp_path, "submit", "hello", "hi", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1])["answer"] == "hello from myagents"
    # A command that imports the module itself, in this process.
    embedded = wesichain(
        _clean_env(), tmp_path, "pipeline", "run", "greet", "hi", "--embedded", "--json", "--agents", agents
    )
    assert embedded.returncode == 0, embedded.stderr
    assert json.loads(embedded.stdout)["output"] == "hello from myagents"


def test_agents_by_a_path_from_elsewhere(redis_server: RedisServer, tmp_path: Path) -> None:
    home = tmp_path / "project" / "agents"
    home.mkdir(parents=True)
    (home / "myagents.py").write_text(AGENTS_MODULE)
    (home / "greeting.py").write_text('GREETING = "hello from myagents"\n')
    env = _clean_env(**{"WESICHAIN_REDIS_URL": redis_server.url, **broker_env(redis_server.url)})
    worker = ["wesichain", "worker", "--agents", "project/agents/myagents.py", "--pool", "threads", "-c", "2"]
    with started([worker], env, tmp_path, tmp_path):
        done = wesichain(env, tmp_path, "submit", "hello", "hi", "--wait", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1])["answer"] == "hello from myagents"
