"""The platform services through ``ApiClient`` and ``AsyncClient`` and the CLI's ``--api``, on a real
redis-server, a real worker and a real ``wesichain api``: assistants, search, fork, bulk jobs and
memory (semantic search with a toy embedding configured on both processes), each attacked from
another tenant's key, and errors raised as the Redis client raises them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from producer.api_client import ApiClient, AsyncClient
from producer.client import BulkJobNotFound, RunNotFound
from shared.assistants import AssistantConflict, AssistantExists, AssistantInvalid, UnknownAssistant
from shared.errors import InvalidRequest
from shared.keys import Keys
from shared.search import SearchQuery
from shared.tenants import Tenants
from tests.api_support import ApiProcess
from tests.conftest import InProcessCli, own_store
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.redis_cluster import RedisCluster

AGENTS = "tests.agents_assistants"
EMBEDDING = {"WESICHAIN_MEMORY_EMBEDDING": "tests.toy_embedding:letters"}
TIMEOUT = 60
V1 = {"model": "scripted:concierge-a", "template_values": {"hotel": "the Ritz"}, "tools": ["lookup"]}
V2 = {"model": "scripted:concierge-b", "system_prompt": "You are the night porter.", "tools": ["lookup"]}


@pytest.fixture(scope="module")
def server(redis_cluster: RedisCluster | None) -> Iterator[RedisServer]:
    with own_store(redis_cluster) as s:
        yield s


@pytest.fixture(scope="module")
def api(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiProcess]:
    worker = WorkerProcess(
        "plat1",
        server.url,
        agents=AGENTS,
        concurrency=2,
        log_dir=str(tmp_path_factory.mktemp("w")),
        env=EMBEDDING,
    ).start()
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": AGENTS, **EMBEDDING}).start()
    yield process
    process.stop()
    worker.stop()


def _key(server: RedisServer) -> str:
    """A new tenant's key; the tenant may name the scripted models its assistants configure."""
    tenants = Tenants(server.client(), Keys())
    key, record = tenants.create_key(f"t-{uuid.uuid4().hex[:8]}", "test")
    tenants.set_models(record.tenant, ["scripted:*"])
    return key


@pytest.fixture
def client(api: ApiProcess, server: RedisServer) -> Iterator[ApiClient]:
    with ApiClient(api.url, _key(server)) as c:
        yield c


@pytest.fixture
def attacker(api: ApiProcess, server: RedisServer) -> Iterator[ApiClient]:
    with ApiClient(api.url, _key(server)) as c:
        yield c


def test_assistants_over_the_api_client(client: ApiClient, attacker: ApiClient) -> None:
    name = f"ritz-{uuid.uuid4().hex[:6]}"
    created = client.assistants.create(name, "concierge", V1)
    assert (created.version, created.agent) == (1, "concierge")
    with pytest.raises(AssistantExists):
        client.assistants.create(name, "concierge", V1)
    with pytest.raises(AssistantInvalid) as bad:
        client.assistants.create(f"x-{name}", "concierge", {"max_steps": 50})
    assert bad.value.field == "max_steps"
    assert client.assistants.update(name, V2, if_version=1).version == 2
    with pytest.raises(AssistantConflict):
        client.assistants.update(name, V1, if_version=1)
    first = client.submit("concierge", "hello", assistant=name, assistant_version=1).wait(TIMEOUT)
    second = client.submit("concierge", "hello", assistant=name).wait(TIMEOUT)
    assert (first.status, first.assistant_version, first.model) == ("completed", 1, "scripted:concierge-a")
    assert (second.status, second.assistant_version, second.model) == ("completed", 2, "scripted:concierge-b")
    assert [c.field for c in client.assistants.diff(name, 1, 2)] == [
        "model",
        "system_prompt",
        "template_values.hotel",
    ]
    back = client.assistants.rollback(name, 1)
    assert (back.version, back.restored_from) == (3, 1)
    assert [v.version for v in client.assistants.versions(name)] == [3, 2, 1]
    assert [(a.name, a.version) for a in client.assistants.list()] == [(name, 3)]
    assert client.assistants.get(name, version=2).config.model == "scripted:concierge-b"

    # Another tenant: the assistant does not exist for it, and nothing of it changes.
    for attempt in (
        lambda: attacker.assistants.get(name),
        lambda: attacker.assistants.versions(name),
        lambda: attacker.assistants.diff(name, 1, 2),
        lambda: attacker.assistants.update(name, V1),
        lambda: attacker.assistants.rollback(name, 2),
        lambda: attacker.assistants.delete(name),
    ):
        with pytest.raises(UnknownAssistant):
            attempt()
    # A run's request naming it is refused as invalid (422), as any unknown assistant is.
    with pytest.raises(InvalidRequest, match="no assistant"):
        attacker.submit("concierge", "hi", assistant=name)
    assert attacker.assistants.list() == []
    assert client.assistants.get(name).version == 3
    with pytest.raises(UnknownAssistant):
        client.assistants.get("../runs")  # not a name: refused before any request
    # Deleted: gone for the client as for a name never created, the second delete included.
    client.assistants.delete(name)
    for gone in (lambda: client.assistants.get(name), lambda: client.assistants.delete(name)):
        with pytest.raises(UnknownAssistant):
            gone()
    assert client.assistants.list() == []


def test_search_fork_and_bulk_over_the_api_client(client: ApiClient, attacker: ApiClient) -> None:
    runs = [client.submit("plain", f"search {i}") for i in range(3)]
    heads = [r.wait(TIMEOUT) for r in runs]
    assert {h.status for h in heads} == {"completed"}
    ids = {r.run_id for r in runs}
    seen: list[str] = []
    cursor = None
    while True:  # pages of 2 cross a page boundary
        page = client.search(agent="plain", cursor=cursor, limit=2)
        seen += [v.run_id for v in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert set(seen) == ids and len(seen) == 3
    assert [v.run_id for v in client.search(SearchQuery(agent="plain", status="failed")).runs] == []
    assert attacker.search(agent="plain").runs == []

    # Between the three runs and the fork, on the clock the indexes are kept by (this host's: the
    # store stamps a run's creation when it writes it, a little after the request's created_at).
    before_fork = time.time()
    fork = runs[0].fork(version=1, input="forked input")
    forked = fork.wait(TIMEOUT)
    assert forked.fork is not None and (forked.fork.run_id, forked.fork.version) == (runs[0].run_id, 1)
    assert forked.input == "forked input" and forked.status == "completed"
    with pytest.raises(RunNotFound):
        attacker.handle(runs[0].run_id).fork()

    job = client.bulk("retry", agent="plain", until=before_fork, rate_per_s=50)
    assert job.action == "retry" and job.status == "running"
    done = wait_until(
        lambda: (j := client.bulk_job(job.job_id)).status != "running" and j,
        TIMEOUT,
        interval=0.1,
        what="the bulk job to end",
    )
    assert done.status == "done" and done.acted == 3
    outcomes = client.bulk_outcomes(job.job_id)
    assert set(outcomes) == ids and all(o.new_run_id for o in outcomes.values())
    assert client.cancel_bulk(job.job_id).status == "done"  # ended: answered as it is
    assert [j.job_id for j in client.bulk_jobs()] == [job.job_id]
    for attempt in (
        lambda: attacker.bulk_job(job.job_id),
        lambda: attacker.bulk_outcomes(job.job_id),
        lambda: attacker.cancel_bulk(job.job_id),
        lambda: client.bulk_job("not-hex"),
    ):
        with pytest.raises(BulkJobNotFound):
            attempt()
    assert attacker.bulk_jobs() == []


def test_async_client_memory_with_semantic_search(api: ApiProcess, server: RedisServer) -> None:
    mine, theirs = _key(server), _key(server)

    async def scenario() -> None:
        async with AsyncClient(api.url, mine) as client, AsyncClient(api.url, theirs) as attacker:
            await client.memory.put(["notes"], "z", {"text": "zzzz"})
            await client.memory.put(["notes"], "a", {"text": "apple"})
            await client.memory.put(["notes"], "p", {"text": "apples and pears"})
            ranked = await client.memory.search(["notes"], query="apple", semantic=True)
            assert [(i.key, i.score is not None) for i in ranked.items] == [
                ("a", True),
                ("p", True),
                ("z", True),
            ]
            text = await client.memory.search(["notes"], query="pears")
            assert [i.key for i in text.items] == ["p"]
            assert (await client.memory.list_namespaces()) == [("notes",)]
            got = await client.memory.get(["notes"], "a")
            assert got is not None and got.value == {"text": "apple"}
            # Another tenant sees none of it and deletes nothing.
            assert await attacker.memory.get(["notes"], "a") is None
            assert (await attacker.memory.search(["notes"], query="apple", semantic=True)).items == []
            assert await attacker.memory.delete(["notes"], "a") is False
            assert await client.memory.delete(["notes"], "a") is True
            assert await client.memory.get(["notes"], "a") is None

    asyncio.run(scenario())


def test_the_cli_over_the_api(api: ApiProcess, server: RedisServer, cli_in_process: InProcessCli) -> None:
    key, other = _key(server), _key(server)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    # The installed entry point, once, in a process of its own; the other commands in this process.
    made = subprocess.run(
        [sys.executable, "-m", "producer.cli", "assistants", "--json", "create", name]
        + ["--agent", "concierge", "--config", json.dumps(V1)],
        env={**os.environ, "WESICHAIN_API_URL": api.url, "WESICHAIN_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["version"] == 1

    def _cli(api: ApiProcess, key: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return cli_in_process(*argv, env={"WESICHAIN_API_URL": api.url, "WESICHAIN_API_KEY": key})

    listed = _cli(api, key, "assistants", "ls")
    assert listed.stdout.split("\t")[:2] == [name, "v1"]
    missing = _cli(api, other, "assistants", "show", name)
    assert missing.returncode == 2 and f"no assistant {name!r}" in missing.stderr
    tenant_flag = _cli(api, key, "assistants", "--tenant", "x", "ls")
    assert tenant_flag.returncode == 2 and "--tenant is for Redis" in tenant_flag.stderr

    submitted = _cli(api, key, "submit", "concierge", "hi", "--assistant", f"{name}@1", "--wait", "--json")
    assert submitted.returncode == 0, submitted.stderr
    found = _cli(api, key, "runs", "search", "--agent", "concierge", "--json")
    assert found.returncode == 0, found.stderr
    lines = [json.loads(line) for line in found.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["agent"] == "concierge" and lines[-1] == {"next_cursor": None}
    assert _cli(api, other, "runs", "search", "--json").stdout.splitlines() == ['{"next_cursor": null}']

    started = _cli(api, key, "bulk", "cancel", "--agent", "concierge", "--json")
    assert started.returncode == 0, started.stderr
    job_id = json.loads(started.stdout)["job_id"]
    assert job_id in _cli(api, key, "bulk", "list").stdout
    assert _cli(api, other, "bulk", "list").stdout == ""
    refused = _cli(api, other, "bulk", "status", job_id)
    assert refused.returncode != 0 and "no bulk job" in refused.stderr
