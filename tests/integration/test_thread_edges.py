"""Thread policies at their edges, on real workers, a real ``wesichain api`` and a real redis-server:
an agent whose default policy is ``reject`` (submitted without a policy over the Python client, the
HTTP API, the CLI and a bare start message), and a cancel of a run parked waiting for its thread.

The busy run is ``thread_look``: its retry-safe call waits for the test's gate (a file).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from producer.cli import EXIT_THREAD_BUSY, main
from producer.client import Client, RunHandle
from shared.errors import ThreadBusy
from shared.keys import Keys
from shared.messages import UserMessage
from shared.settings import ENV_AGENTS, ENV_PREFIX, ENV_REDIS_URL
from shared.state import Phase
from shared.tenants import Tenants
from tests.agents_fixture import GATE_DIR_ENV
from tests.api_support import ApiProcess, bearer, wait_status
from tests.broker import Settings
from tests.harness import RedisServer, WorkerProcess, wait_thread_free, wait_until

AGENTS = "tests.agents_threads"
TIMEOUT = 60


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """This module's own redis-server: workers of the session's other modules, which serve other
    agents, must not take (and fail) this module's runs."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def api(
    redis_server: RedisServer, gate: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiProcess]:
    log_dir = str(tmp_path_factory.mktemp("w"))
    worker = WorkerProcess(
        "te1", redis_server.url, agents=AGENTS, concurrency=3, log_dir=log_dir, env={GATE_DIR_ENV: str(gate)}
    ).start()
    process = ApiProcess(redis_server.url, env={"WESICHAIN_AGENTS": AGENTS}).start()
    yield process
    process.stop()
    worker.stop()


@pytest.fixture
def threads_client(api: ApiProcess, redis_server: RedisServer) -> Iterator[Client]:
    c = Client(Settings(redis_url=redis_server.url, agents_module=AGENTS))
    yield c
    c.close()


@pytest.fixture
def closed_gate(gate: Path) -> Iterator[Path]:
    """The gate closed for the test, and opened after it so nothing it started is left waiting."""
    (gate / "open").unlink(missing_ok=True)
    yield gate
    (gate / "open").touch()


def _busy(client: Client, thread: str) -> RunHandle:
    busy = client.submit("thread_look", "look", thread_id=thread)
    wait_until(lambda: busy.status().phase is Phase.ACTING, TIMEOUT, what="the busy run's call")
    return busy


def test_an_agents_reject_default_refuses_a_submit_without_a_policy_on_every_path(
    threads_client: Client,
    closed_gate: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = threads_client
    thread = f"rej-{uuid.uuid4().hex}"
    busy = _busy(client, thread)

    # The Python client: the agent's policy, from its live workers, refuses at submit.
    with pytest.raises(ThreadBusy) as refused:
        client.submit("echo_reject", "second", thread_id=thread)
    assert (refused.value.thread_id, refused.value.run_id) == (thread, busy.run_id)

    # The CLI: exit code 4, naming the busy run.
    # main() exports --redis and --agents to the environment: the monkeypatch restores it after.
    url = client.settings.redis_url
    monkeypatch.delenv(ENV_PREFIX, raising=False)
    monkeypatch.setenv(ENV_REDIS_URL, url)
    monkeypatch.setenv(ENV_AGENTS, AGENTS)
    assert main(
        ["submit", "echo_reject", "second", "--thread", thread, "--redis", url, "--agents", AGENTS]
    ) == (EXIT_THREAD_BUSY)
    assert busy.run_id in capsys.readouterr().err
    policy = ["--thread-policy", "reject"]
    assert main(
        ["submit", "echo", "second", "--thread", thread, *policy, "--redis", url, "--agents", AGENTS]
    ) == (EXIT_THREAD_BUSY)
    assert busy.run_id in capsys.readouterr().err

    # Where the submitter does not know the agent (no agent check; a bare start message), the
    # worker admits the run with the agent's policy: it is recorded FAILED, ThreadBusy, naming it.
    unchecked = client.submit("echo_reject", "second", thread_id=thread, check_agent=False)
    bare = f"bare-{uuid.uuid4().hex}"
    create = {"agent": "echo_reject", "input": "second", "thread_id": thread}
    client.app.send_task(
        "wesichain.start", kwargs={"run_id": bare, "create": create}, queue="wesichain.model"
    )
    wait_until(lambda: client.store.load(bare) is not None, TIMEOUT, what="the worker to create the bare run")
    for run_id in (unchecked.run_id, bare):
        head = client.handle(run_id).wait(TIMEOUT)
        assert head.phase is Phase.FAILED
        assert head.error is not None and head.error.kind == "ThreadBusy"
        assert busy.run_id in head.error.message
        assert head.message_count == 0
    assert client.store.thread_waiting(None, thread) == []
    assert busy.status().phase is Phase.ACTING  # the busy run goes on, untouched

    (closed_gate / "open").touch()
    assert busy.wait(TIMEOUT).phase is Phase.COMPLETED
    # Free again: the agent's reject admits the next message, on the busy run's whole history.
    after = client.submit("echo_reject", "and now?", thread_id=thread)
    assert after.wait(TIMEOUT).answer == "seen 1 tool results in 6 messages"


def test_an_agents_reject_default_is_a_409_over_the_http_api(
    api: ApiProcess, redis_server: RedisServer, threads_client: Client, closed_gate: Path
) -> None:
    key, _ = Tenants(redis_server.client(), Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    thread = f"rej-http-{uuid.uuid4().hex}"
    with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
        created = http.post("/v1/runs", json={"agent": "thread_look", "input": "look", "thread_id": thread})
        assert created.status_code == 202, created.text
        busy = created.json()["run_id"]
        wait_status(http, busy, {"running"}, TIMEOUT)
        wait_until(
            lambda: threads_client.handle(busy).status().phase is Phase.ACTING,
            TIMEOUT,
            what="the busy run's call",
        )
        refused = http.post("/v1/runs", json={"agent": "echo_reject", "input": "second", "thread_id": thread})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["kind"] == "thread_busy"
        assert error["details"] == {"thread_id": thread, "run_id": busy, "retryable": True}
        (closed_gate / "open").touch()
        wait_status(http, busy, {"completed"}, TIMEOUT)
        again = http.post("/v1/runs", json={"agent": "echo_reject", "input": "second", "thread_id": thread})
        assert again.status_code == 202, again.text
        wait_status(http, again.json()["run_id"], {"completed"}, TIMEOUT)


def test_cancelling_a_run_parked_for_its_thread_ends_it_at_once_and_the_next_one_waits_on(
    threads_client: Client, closed_gate: Path
) -> None:
    client = threads_client
    thread = f"cancel-{uuid.uuid4().hex}"
    busy = _busy(client, thread)
    first = client.submit("echo", "first", thread_id=thread)
    second = client.submit("echo", "second", thread_id=thread)
    wait_until(
        lambda: all(client.store.thread_wait(h.run_id) for h in (first, second)), TIMEOUT, what="both to park"
    )

    assert first.cancel() is Phase.IDLE
    # Ended without running, while the run ahead of it still runs: not when its turn comes.
    stopped = first.wait(TIMEOUT)
    assert (stopped.phase, stopped.message_count) == (Phase.INTERRUPTED, 0)
    assert busy.status().phase is Phase.ACTING
    # It leaves the thread's queue right after its terminal commit (the thread's keys are on
    # another slot: a second step), which the caller may see first.
    wait_until(
        lambda: client.store.thread_waiting(None, thread) == [second.run_id],
        TIMEOUT,
        what="the cancelled run to leave the thread's queue",
    )
    assert client.store.thread_wait(first.run_id) is None

    (closed_gate / "open").touch()
    assert busy.wait(TIMEOUT).phase is Phase.COMPLETED
    head = second.wait(TIMEOUT)
    assert head.phase is Phase.COMPLETED
    users = [m.content for m in client.store.load_messages(second.run_id) if isinstance(m, UserMessage)]
    assert users == ["look", "second"]
    wait_thread_free(client.store, thread, TIMEOUT)
