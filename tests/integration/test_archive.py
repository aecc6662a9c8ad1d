"""Archiving finished runs from Redis to PostgreSQL and SQLite, and reading them back unchanged.

Real parts: a redis-server and a `wesichain worker` of this module's own (archiving takes every
ended run of a Redis), a PostgreSQL database created and dropped per test, a SQLite file.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.cli import main
from producer.client import Client, RequestConflict, RunHandle, RunNotFound
from producer.evals.client import EvalClient
from shared import fsm
from shared.archive import ListingFilter, StoredRun, open_archive
from shared.archive.retention import ArchivePruner
from shared.archive.sql import SqlArchive
from shared.archiver import Archiver
from shared.export import RunExport
from shared.llm.base import Usage
from shared.messages import SystemMessage, UserMessage
from shared.retention import GarbageCollector
from shared.state import Callback, CallbackState, ForkOrigin, Phase, RunHead
from shared.tasks import TASK_ARCHIVE, start_task
from shared.tenants import Tenants
from tests.api_support import SSE, ApiProcess, bearer, frames, wait_status
from tests.archive_support import BACKENDS, FullRead, archive_url, eval_keys, full_read, sample_record
from tests.broker import Settings, broker_env
from tests.harness import RedisServer, WorkerProcess, wait_until
from worker.testing.runs import commit, ended_run

TIMEOUT = 60


@dataclass(frozen=True)
class Pool:
    server: RedisServer
    #: The archive the worker and the test's client share (as every process of a deployment must).
    url: str


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A redis-server, an archive and one worker archiving to it when its task is sent."""
    directory = tmp_path_factory.mktemp("archive")
    with archive_url(request.param, directory) as url:
        server = RedisServer().start()
        worker = WorkerProcess(
            "archive",
            server.url,
            concurrency=2,
            log_dir=str(directory),
            env={"WESICHAIN_ARCHIVE_URL": url, "WESICHAIN_ARCHIVE_AFTER_S": "0"},
        )
        worker.start()
        yield Pool(server, url)
        worker.stop()
        server.cleanup()


@pytest.fixture
def client(pool: Pool) -> Iterator[Client]:
    c = Client(
        Settings(redis_url=pool.server.url, agents_module="tests.agents_fixture", archive_url=pool.url)
    )
    # Runs an earlier test left in this Redis go first, so a test counts only its own.
    Archiver(c.store).run_once(after_s=0)
    yield c
    c.close()


def _keys_naming(client: Client, run_id: str) -> list[str]:
    """Redis keys whose name holds the run id, and index entries naming it."""
    r = client.store.redis
    keys = [k for k in r.scan_iter(match=f"*{run_id}*", count=1000)]
    for key in r.scan_iter(match="*", count=1000, _type="zset"):
        if r.zscore(key, run_id) is not None:
            keys.append(f"{key} (entry)")
    return keys


def _runs_of_every_kind(client: Client) -> list[str]:
    """A run of each terminal kind: completed (with and without tools, with a delivered callback,
    in a thread), failed, interrupted."""
    handles = [
        client.submit("direct", "hi", tenant="acme"),
        client.submit("one_hop", "add", tenant="acme", metadata={"ticket": "T-1"}),
        client.submit("chain", "three hops", tenant="acme", thread_id="th-1"),
        client.submit("bad_json", "fail", tenant="acme"),
        client.submit(
            "direct", "call me", tenant="acme", callback={"task": "billing.done", "queue": "billing"}
        ),
    ]
    long = client.submit("long_tool", "stop me", tenant="acme")
    wait_until(lambda: long.status().phase is Phase.ACTING, TIMEOUT, what="the long tool to start")
    long.cancel()
    handles.append(long)
    for handle in handles:
        handle.wait(TIMEOUT)
    callback = handles[4]
    wait_until(
        lambda: (state := callback.callback()) is not None and state.status == "delivered",
        TIMEOUT,
        what="the Celery callback to be sent",
    )
    phases = [h.status().phase for h in handles]
    assert phases == [Phase.COMPLETED] * 3 + [Phase.FAILED, Phase.COMPLETED, Phase.INTERRUPTED]
    return [h.run_id for h in handles]


def _assert_same(before: FullRead, after: FullRead) -> None:
    for field in fields(FullRead):
        assert getattr(after, field.name) == getattr(before, field.name), field.name


def test_every_terminal_kind_reads_the_same_after_archiving(client: Client) -> None:
    run_ids = _runs_of_every_kind(client)
    before = {run_id: full_read(client, run_id) for run_id in run_ids}
    assert before[run_ids[1]].results[1][0].output == "3.0"
    assert before[run_ids[1]].listed is not None and before[run_ids[3]].listed_by_status is not None

    report = Archiver(client.store).run_once(after_s=0)

    assert (report.archived, report.already_archived, report.mismatched, report.error) == (6, 0, 0, "")
    for run_id in run_ids:
        assert _keys_naming(client, run_id) == [], run_id
        _assert_same(before[run_id], full_read(client, run_id))
    assert client.handle(run_ids[0]).cancel() is Phase.COMPLETED  # nothing to cancel: it ended
    assert client.handle(run_ids[4]).callback() == CallbackState.model_validate_json(
        client.store.callback_state(run_ids[4]) or "{}"
    )
    with pytest.raises(RunNotFound):
        client.handle("never-was").status()
    again_run = client.submit("direct", "hi", tenant="acme", idempotency_key="archived-key")
    again_run.wait(TIMEOUT)
    assert Archiver(client.store).run_once(after_s=0).archived == 1
    # The key's run is archived: submitting again is still the same run, not a second one.
    assert client.submit("direct", "hi", tenant="acme", idempotency_key="archived-key").run_id == (
        again_run.run_id
    )
    assert client.store.redis.exists(client.store.keys.run(again_run.run_id)) == 0
    with pytest.raises(RequestConflict):
        client.submit("direct", "another", tenant="acme", idempotency_key="archived-key")
    again = Archiver(client.store).run_once(after_s=0)  # nothing left to move
    assert (again.archived, again.already_archived) == (0, 0)


def test_listing_pages_through_redis_and_the_archive_alike(client: Client) -> None:
    tenant = f"pages-{uuid.uuid4().hex[:8]}"
    old = [client.submit("direct", f"old {i}", tenant=tenant) for i in range(5)]
    created: dict[str, int] = {}

    def finish(handle: RunHandle) -> None:
        handle.wait(TIMEOUT)
        created[handle.run_id] = int(
            client.store.redis.hget(client.store.keys.run(handle.run_id), "created") or 0
        )

    for handle in old:
        finish(handle)
    assert Archiver(client.store).run_once(after_s=0).archived == 5
    new = [client.submit("direct", f"new {i}", tenant=tenant) for i in range(4)]
    for handle in new:
        finish(handle)
    # Newest first by creation (Redis ms), then run id: runs created in one millisecond included.
    expected = sorted(created, key=lambda run_id: (created[run_id], run_id), reverse=True)

    for limit in (1, 2, 3, 4, 100):
        seen, cursor = [], None
        while True:
            page = client.list_runs(tenant=tenant, cursor=cursor, limit=limit)
            assert len(page.runs) <= limit
            seen += [h.run_id for h in page.runs]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == expected, limit
    completed = client.list_runs(tenant=tenant, status="completed", limit=100)
    assert [h.run_id for h in completed.runs] == expected
    assert client.list_runs(tenant="someone-else", limit=100).runs == []


def test_a_thread_continues_from_archived_history(client: Client) -> None:
    thread = f"continued-{uuid.uuid4().hex[:8]}"
    first = client.submit("one_hop", "add", tenant="acme", thread_id=thread)
    first.wait(TIMEOUT)
    assert Archiver(client.store).run_once(after_s=0).archived == 1
    assert client.store.redis.exists(client.store.keys.run(first.run_id)) == 0

    second = client.submit("echo", "and now?", tenant="acme", thread_id=thread)
    head = second.wait(TIMEOUT)
    # The archived run's exchange (user, assistant with the call, tool, answer) came along.
    assert head.answer == "seen 1 tool results in 6 messages"

    # Past the Redis retention the thread's list is gone; the archive still knows the thread.
    assert Archiver(client.store).run_once(after_s=0).archived == 1
    client.store.redis.delete(client.store.keys.thread("acme", thread))
    assert client.store.join_thread("acme", thread, "a-later-run") == [
        first.run_id,
        second.run_id,
        "a-later-run",
    ]


def test_the_archiving_task_and_the_cli_move_ended_runs(
    pool: Pool, client: Client, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = client.submit("direct", "by the task")
    handle.wait(TIMEOUT)
    client.app.send_task(TASK_ARCHIVE)  # as celery beat sends it every archive_interval_s
    gone = client.store.keys.run(handle.run_id)
    wait_until(lambda: client.store.redis.exists(gone) == 0, TIMEOUT, what="the task to archive the run")
    assert handle.status().answer == "The answer is 42."

    by_cli = client.submit("direct", "by the operator")
    by_cli.wait(TIMEOUT)
    monkeypatch.setenv("WESICHAIN_ARCHIVE_URL", pool.url)
    assert main(["archive", "--redis", pool.server.url, "--after", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["archived"] == 1 and report["error"] == ""
    assert client.store.redis.exists(client.store.keys.run(by_cli.run_id)) == 0
    archive = open_archive(pool.url)
    assert set(archive.summaries([by_cli.run_id, handle.run_id])) == {by_cli.run_id, handle.run_id}
    archive.close()


def test_gc_leaves_what_waits_for_the_archive(client: Client) -> None:
    store = client.store
    handle = client.submit("direct", "kept forever?")
    handle.wait(TIMEOUT)
    run_id = handle.run_id
    # An ended run without a TTL, ended long ago, that fell out of the ended set (written by hand).
    for key in [store.keys.run(run_id), *store.redis.scan_iter(match=f"*{run_id}:*")]:
        store.redis.persist(key)
    body = json.loads(store.redis.hget(store.keys.run(run_id), "body") or "{}")
    body["updated_at"] -= 20 * 86400
    store.redis.hset(store.keys.run(run_id), "body", json.dumps(body))
    store.redis.zrem(store.keys.ended_of(run_id), run_id)

    # And one that ended before the archive was configured: its keys expire as usual, and it is in
    # no ended set.
    earlier = client.submit("direct", "before the archive")
    earlier.wait(TIMEOUT)
    store.redis.zrem(store.keys.ended_of(earlier.run_id), earlier.run_id)

    report = GarbageCollector(store.redis, store.settings).collect()

    assert (report.expired_runs, report.runs_awaiting_archive, report.runs_handed_to_archiver) == (0, 1, 2)
    assert store.redis.exists(store.keys.run(run_id)) == 1
    assert Archiver(store).run_once(after_s=0).archived == 2
    assert store.redis.exists(store.keys.run(run_id)) == 0
    assert store.redis.exists(store.keys.run(earlier.run_id)) == 0
    assert earlier.status().answer == "The answer is 42."
    assert handle.status().phase is Phase.COMPLETED
    # gc then finds nothing of it left to clean: the archiver removed its index entries too.
    again = GarbageCollector(store.redis, store.settings).collect(dry_run=True)
    assert again.index_entries_of_gone_runs == 0


def test_an_export_is_the_same_from_redis_and_from_the_archive(
    pool: Pool, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = client.submit("one_hop", "add", tenant="acme", thread_id="exported")
    handle.wait(TIMEOUT)
    monkeypatch.setenv("WESICHAIN_ARCHIVE_URL", pool.url)
    for name, value in broker_env(pool.server.url).items():  # the CLI's topology (a cluster?)
        monkeypatch.setenv(name, value)

    def export(name: str) -> RunExport:
        path = tmp_path / name
        assert main(["export", handle.run_id, "--redis", pool.server.url, "-o", str(path)]) == 0
        return RunExport.model_validate_json(path.read_text())

    from_redis = export("redis.json")
    assert Archiver(client.store).run_once(after_s=0).archived == 1
    from_archive = export("archive.json")

    assert from_archive.model_dump(exclude={"exported_at"}) == from_redis.model_dump(exclude={"exported_at"})
    assert from_redis.run.answer == "1 + 2 = 3" and from_redis.format == "wesichain.run.v1"
    assert [m.role for m in from_redis.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert [(r.step, r.result.output) for r in from_redis.tool_results] == [(1, "3.0")]
    assert from_redis.events[-1].event.kind == "Completed" and from_redis.events[0].stream_id
    assert [c.version for c in from_redis.checkpoints] == list(range(1, from_redis.run.version + 1))
    assert main(["export", "no-such-run", "--redis", pool.server.url]) == 1


def test_the_http_api_reads_archived_runs_as_live_ones(pool: Pool, client: Client) -> None:
    api = ApiProcess(pool.server.url, env={"WESICHAIN_ARCHIVE_URL": pool.url}).start()
    tenant = f"api-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(client.store.redis, client.store.keys).create_key(tenant, "test")
    try:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:
            run_id = http.post("/v1/runs", json={"agent": "one_hop", "input": "add"}).json()["run_id"]
            wait_status(http, run_id, {"completed"}, TIMEOUT)

            def read() -> list[Any]:
                return [
                    http.get(f"/v1/runs/{run_id}").json(),
                    http.get(f"/v1/runs/{run_id}/checkpoints").json(),
                    http.get(f"/v1/runs/{run_id}/events", params={"limit": 500}).json(),
                    http.get("/v1/runs", params={"limit": 10}).json(),
                    http.get("/v1/runs", params={"status": "completed"}).json(),
                ]

            def streamed(
                last_event_id: str | None, kinds: str | None = None
            ) -> tuple[int, list[dict[str, Any]]]:
                headers = {**SSE, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
                params = {"kinds": kinds} if kinds else {}
                path = f"/v1/runs/{run_id}/events"
                with http.stream("GET", path, headers=headers, params=params) as response:
                    return response.status_code, [json.loads(f.data) for f in frames(response) if f.data]

            before = read()
            assert before[0]["status"] == "completed" and before[3]["runs"][0]["run_id"] == run_id
            events = before[2]["events"]
            assert Archiver(client.store).run_once(after_s=0).archived == 1
            assert client.store.redis.exists(client.store.keys.run(run_id)) == 0
            assert read() == before
            # Followed, or resumed mid-run by a client that lost its stream, once the run is in the
            # archive: the events after its cursor, as a live run's stream sends them (it once
            # answered 204 to every stream of an archived run, as if it had nothing more).
            assert streamed(None) == (200, events)
            assert streamed(events[1]["id"]) == (200, events[2:])
            assert streamed(events[-1]["id"]) == (204, [])
            # A made-up id later than the clock names no event (422), and the kinds asked for, as
            # on a live run's stream.
            assert streamed("99999999999999-0") == (422, [])
            wanted = [e for e in events if e["kind"] in ("ToolCompleted", "Completed")]
            assert len(wanted) == 2 and streamed(None, "ToolCompleted") == (200, wanted)
            assert http.get("/v1/runs/not-a-run").status_code == 404
    finally:
        api.stop()


def test_archive_retention_deletes_per_tenant_and_audits_each_deletion(
    client: Client, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, pool: Pool
) -> None:
    store = client.store
    archive = store.archive
    assert archive is not None
    tag = uuid.uuid4().hex[:8]
    forever, short, other = f"forever-{tag}", f"short-{tag}", f"other-{tag}"
    now = time.time()
    day = 86_400.0

    def ended(run_id: str, tenant: str | None, days_ago: float) -> StoredRun:
        record = sample_record(f"{run_id}-{tag}", 1000, tenant=tenant, updated_at=now - days_ago * day)
        return record.stored()

    archive.put(
        [
            ended("kept-forever", forever, 400),  # its tenant keeps everything
            ended("short-old", short, 2),  # its tenant keeps one day
            ended("short-new", short, 0.5),
            ended("other-new", other, 10),  # everyone else: 30 days
            ended("other-old", other, 40),
        ]
    )
    tenants = Tenants(store.redis, store.keys)
    tenants.set_archive_retention(forever, 0)
    tenants.set_archive_retention(short, 1)
    pruner = ArchivePruner(archive, tenants, default_days=30)

    dry = pruner.prune(dry_run=True, now=now)
    assert dry.deleted == 2 and dry.by_tenant == {short: 1, other: 1}
    assert archive.load(f"short-old-{tag}") is not None  # a dry run deletes nothing

    report = pruner.prune(now=now)

    assert report.deleted == 2 and report.by_tenant == {short: 1, other: 1}
    gone = {f"short-old-{tag}", f"other-old-{tag}"}
    left = {f"kept-forever-{tag}", f"short-new-{tag}", f"other-new-{tag}"}
    assert set(archive.summaries([*gone, *left])) == left
    for run_id in gone:
        with pytest.raises(RunNotFound):
            client.handle(run_id).status()
        assert archive.record(run_id) is None
    audit = {d.run_id: d for d in archive.deletions(short) + archive.deletions(other)}
    assert set(audit) == gone
    assert audit[f"short-old-{tag}"].reason == "retention: 1 days"
    assert audit[f"other-old-{tag}"].reason == "retention: 30 days"
    assert audit[f"other-old-{tag}"].status == "completed" and audit[f"other-old-{tag}"].agent == "a"
    assert pruner.prune(now=now).deleted == 0

    # The operator's commands: a tenant's retention, then a pass.
    monkeypatch.setenv("WESICHAIN_ARCHIVE_URL", pool.url)
    redis_args = ["--redis", pool.server.url]
    assert main(["archive-retention", "--tenant", forever, "--days", "300", *redis_args]) == 0
    assert tenants.archive_retention()[forever] == 300
    capsys.readouterr()
    assert main(["prune", "--json", *redis_args]) == 0
    assert json.loads(capsys.readouterr().out)["by_tenant"] == {forever: 1}
    assert archive.load(f"kept-forever-{tag}") is None
    assert [d.reason for d in archive.deletions(forever)] == ["retention: 300 days"]
    assert main(["archive-retention", "--tenant", forever, "--default", *redis_args]) == 0
    assert forever not in tenants.archive_retention()


def test_a_fork_starts_from_an_archived_checkpoint(client: Client) -> None:
    original = client.submit("chain", "three hops", tenant="acme").wait(TIMEOUT)
    assert original.answer == "done after three hops"
    before = (client.store.load_messages(original.run_id), client.store.checkpoints(original.run_id))
    assert Archiver(client.store).run_once(after_s=0).archived == 1
    assert client.store.redis.exists(client.store.keys.run(original.run_id)) == 0
    assert [c.version for c in client.checkpoints(original.run_id)] == [h.version for h in before[1]]

    # v6: step 2's call was sent; the fork (its worker reads the archive) thinks step 2 again.
    fork = client.fork(original.run_id, 6, check_agent=False)
    head = fork.wait(TIMEOUT)

    assert head.phase is Phase.COMPLETED and head.answer == "done after three hops", head.error
    assert head.fork == ForkOrigin(run_id=original.run_id, version=6)
    assert client.store.load_messages(head.run_id)[:4] == before[0][:4]
    assert (client.store.load_messages(original.run_id), client.store.checkpoints(original.run_id)) == before


def test_a_run_whose_callback_is_still_being_delivered_waits(client: Client) -> None:
    store = client.store
    head = RunHead.new_idle(uuid.uuid4().hex, "agent", "q", callback=Callback(url="http://127.0.0.1:9/hook"))
    assert store.create(head, [start_task(head.run_id)])
    idle = fsm.Idle(head)
    start = idle.start(
        [SystemMessage(content="sys"), UserMessage(content="q")],
        agent_version="1",
        model="scripted:x",
        max_steps=10,
    )
    commit(store, idle, start)
    commit(store, start.to, start.to.complete("done", Usage()))
    run_key = store.keys.run(head.run_id)
    assert store.redis.hget(run_key, "callback") == "pending"

    report = Archiver(store).run_once(after_s=0)

    # Other runs of this module's Redis may be waiting on their callbacks too (a webhook of an
    # earlier test still retrying): this one is among the deferred, and nothing was archived.
    assert report.archived == 0 and report.deferred >= 1
    assert store.redis.exists(run_key) == 1
    # Its delivery ended (as the callback task records it): now it goes.
    store.redis.hset(run_key, "callback", "delivered")
    store.redis.zrem(store.keys.leases_of(head.run_id), head.run_id)
    assert Archiver(store).run_once(after_s=0).archived == 1
    assert store.redis.exists(run_key) == 0
    assert client.handle(head.run_id).status().answer == "done"


def test_a_completed_eval_moves_to_the_archive_and_reads_back_unchanged(
    pool: Pool,
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "cases.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}", "input": f"hi {i}", "expected": "42"}) + "\n" for i in range(4))
    )
    (tmp_path / "eval.toml").write_text(
        'name = "archived"\ndataset = "cases.jsonl"\n[[variants]]\nagent = "direct"\n'
        '[[scorers]]\nkind = "contains"\n'
    )
    evals = EvalClient(client)
    eval_id, _ = evals.submit_file(tmp_path / "eval.toml", eval_id=f"archived-{uuid.uuid4().hex[:8]}")
    done = evals.wait(eval_id, timeout=TIMEOUT)
    assert done.meta.status == "completed" and done.counts[0].passed == 4
    rows = sorted(evals.results(eval_id), key=lambda r: r.item)
    report = Archiver(client.store).run_once(after_s=0)
    assert (report.evals_archived, report.evals_already_archived, report.error) == (1, 0, "")
    r, keys = client.store.redis, client.store.keys
    assert eval_keys(evals.store, eval_id) == 0 and r.zscore(keys.evals_index(), eval_id) is None
    # Read back through the archive: the same progress, results, cases; listed; not created again.
    again = EvalClient(client)
    assert again.progress(eval_id) == done
    assert sorted(again.results(eval_id), key=lambda r: r.item) == rows
    assert again.store.case(eval_id, 3).input == "hi 3" and eval_id in again.store.list_evals()
    assert again.submit_file(tmp_path / "eval.toml", eval_id=eval_id) == (eval_id, False)
    # And by the CLI, which reads the archive its settings name.
    monkeypatch.setenv("WESICHAIN_REDIS_URL", pool.server.url)
    monkeypatch.setenv("WESICHAIN_ARCHIVE_URL", pool.url)
    capsys.readouterr()
    assert main(["eval", "results", eval_id, "--format", "jsonl"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["run_id"] for r in listed) == [r.run_id for r in rows]


def test_the_archive_holds_each_part_as_the_json_redis_held(client: Client) -> None:
    """The archiver copies what the runtime wrote: the text Redis held, not a re-dump of it."""
    store, k = client.store, client.store.keys
    run_id = ended_run(store)
    head = store.load(run_id)
    assert head is not None and head.step >= 1
    held = {
        "wesichain_messages": sorted(store.redis.lrange(k.messages(run_id), 0, -1)),
        "wesichain_checkpoints": sorted(store.redis.lrange(k.checkpoints(run_id), 0, -1)),
        "wesichain_events": sorted(
            (entry or {})["e"] for _, entry in store.redis.xrange(k.events(run_id)) or []
        ),
        "wesichain_tool_results": sorted(
            body for step in range(1, head.step + 1) for body in store.redis.hvals(k.results(run_id, step))
        ),
    }

    assert Archiver(store).run_once(after_s=0).archived == 1

    archive = store.archive
    assert archive is not None and isinstance(archive, SqlArchive)
    body = archive.db.json_text("body")
    with archive.db.transaction() as cur:
        for table, texts in held.items():
            cur.execute(archive.db.sql(f"SELECT {body} FROM {table} WHERE run_id = ?"), (run_id,))
            assert sorted(row[0] for row in cur.fetchall()) == texts, table
    versions = [c.version for c in archive.checkpoints(run_id)]
    assert versions == sorted(versions) and versions[-1] == head.version


def test_a_run_the_archive_holds_otherwise_stays_in_redis_and_the_pass_goes_on(client: Client) -> None:
    store = client.store
    assert store.archive is not None
    handles = [client.submit("direct", f"q {i}", tenant="acme") for i in range(3)]
    for handle in handles:
        handle.wait(TIMEOUT)
    odd = handles[1].run_id
    # The archive already holds a different run under that id (a Redis restored from an old
    # snapshot, say): what it reads back after writing will not match what Redis holds.
    other = sample_record(odd, 1, version=99).stored()
    store.archive.put_and_summarize([other])

    report = Archiver(store).run_once(after_s=0)

    assert (report.archived, report.mismatched, report.error) == (2, 1, "")
    assert store.redis.exists(store.keys.run(odd)) == 1  # kept where it is whole
    assert client.handle(odd).status().phase is Phase.COMPLETED
    # The next pass tries it again, reports it again, and still ends.
    assert (Archiver(store).run_once(after_s=0).mismatched, store.redis.exists(store.keys.run(odd))) == (1, 1)
    store.redis.zrem(store.keys.ended_of(odd), odd)  # out of the later tests' passes


def test_text_holding_nul_reads_back_exactly_and_filtered_listings_still_answer(
    pool: Pool, client: Client
) -> None:
    """NUL (U+0000) in a run's input, answer, metadata and tool output is the JSON escape \\u0000,
    which PostgreSQL's jsonb refuses and SQLite's JSON functions cut a string at: once archived,
    the run reads back exactly as it was submitted, and the tenant's listings filtered on values
    inside the JSON (metadata, version, error kind) answer, matching exactly."""
    env = {"WESICHAIN_ARCHIVE_URL": pool.url, "WESICHAIN_SEARCH_ATTRIBUTES": "ticket"}
    api = ApiProcess(pool.server.url, env=env).start()
    tenant = f"nul-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(client.store.redis, client.store.keys).create_key(tenant, "test")
    # A NUL, the text of its escape, and U+0001 (the filter's own escape character).
    text = "before\x00after \\u0000 \\\x00 \x01 \x010"
    try:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:

            def submit(agent: str, input: str, metadata: dict[str, Any]) -> str:
                response = http.post("/v1/runs", json={"agent": agent, "input": input, "metadata": metadata})
                assert response.status_code == 202, response.text
                run_id: str = response.json()["run_id"]
                return run_id

            def read(run_id: str) -> list[Any]:
                return [
                    http.get(f"/v1/runs/{run_id}").json(),
                    http.get(f"/v1/runs/{run_id}/checkpoints").json(),
                    http.get(f"/v1/runs/{run_id}/events", params={"limit": 500}).json(),
                ]

            def search(**query: Any) -> list[str]:
                response = http.post("/v1/runs/search", json={"query": query, "limit": 50})
                assert response.status_code == 200, response.text
                return [run["run_id"] for run in response.json()["runs"]]

            held = submit("repeat_prompt", text, {"ticket": "T\x00-1", "note": text})
            plain = submit("direct", "hi", {"ticket": "T"})
            failed = submit("echoing_400", "fail", {"ticket": "T\x00-1"})
            for run_id in (held, plain, failed):
                wait_status(http, run_id, {"completed", "failed"}, TIMEOUT)
            before = {run_id: read(run_id) for run_id in (held, plain, failed)}
            view, _, events = before[held]
            assert (view["input"], view["metadata"]["note"]) == (text, text)
            assert view["answer"] == f"you said: {text}"
            tool = [e for e in events["events"] if e["kind"] == "ToolCompleted"]
            assert [e["output"] for e in tool] == [text]

            assert Archiver(client.store).run_once(after_s=0).archived == 3
            assert client.store.redis.exists(client.store.keys.run(held)) == 0

            for run_id, was in before.items():
                assert read(run_id) == was, run_id
            order = search()  # the tenant's runs, newest first
            assert sorted(order) == sorted(before)

            def runs(*run_ids: str) -> list[str]:
                return [run_id for run_id in order if run_id in run_ids]

            assert search(metadata={"ticket": "T"}) == [plain]
            assert search(metadata={"ticket": "T\x00-1"}) == runs(held, failed)
            assert search(metadata={"ticket": "T\x010-1"}) == []  # how the filter writes it: no match
            assert search(metadata={"ticket": "T\x00"}) == []
            kind = before[failed][0]["error"]["kind"]
            assert search(error_kind=kind) == [failed]
            version = view["agent_version"]
            assert search(agent="repeat_prompt", version=version) == [held]
            listed = http.get("/v1/runs", params={"thread_id": "a\x00b"})
            assert (listed.status_code, listed.json()["runs"]) == (200, [])
    finally:
        api.stop()


def test_a_filter_matches_exactly_the_runs_holding_its_value_whatever_nul_or_escape_they_hold(
    pool: Pool,
) -> None:
    """Values that differ only by NUL, U+0001 (the filter's escape) or the text of an escape each
    match their own run, on an archive whose every document holds some of them."""
    values = ["a", "a\x00", "a\x00b", "a\x010b", "a\x01", "a\x011", "a\\u0000b", "a\\\x00b", "\x00\x00\x01"]
    tenant = f"values-{uuid.uuid4().hex[:8]}"
    archive = open_archive(pool.url)
    try:
        records = [
            sample_record(
                f"{tenant}-{i}", 1000 + i, tenant=tenant, metadata={"k": value, "all": values}, answer=value
            )
            for i, value in enumerate(values)
        ]
        archive.put([record.stored() for record in records])
        for i, value in enumerate(values):
            listed = archive.list_runs(ListingFilter(tenant, metadata={"k": value}), None, 50)
            assert [head.run_id for _, head in listed] == [f"{tenant}-{i}"], repr(value)
            assert listed[0][1] == records[i].head  # read back as written
        assert archive.list_runs(ListingFilter(tenant, metadata={"k": "b"}), None, 50) == []
    finally:
        archive.close()


def test_another_tenant_finds_nothing_of_an_archived_run_over_the_http_api(
    pool: Pool, client: Client
) -> None:
    """Once a tenant's run is in the archive, another tenant's key gets the answers it would get for
    a run that never existed, on every run route; and its own idempotency key, thread and metadata,
    the same as the owner's, reach only its own runs (the archive is read by tenant too)."""
    api = ApiProcess(pool.server.url, env={"WESICHAIN_ARCHIVE_URL": pool.url}).start()
    tenants = Tenants(client.store.redis, client.store.keys)
    owner_key, _ = tenants.create_key(f"owner-{uuid.uuid4().hex[:8]}", "test")
    other_key, _ = tenants.create_key(f"other-{uuid.uuid4().hex[:8]}", "test")
    request = {"agent": "one_hop", "input": "add", "thread_id": "shared", "metadata": {"order": "4711"}}
    idempotent = {"Idempotency-Key": "order-4711"}
    try:
        with (
            httpx.Client(base_url=api.url, headers=bearer(owner_key), timeout=30) as owner,
            httpx.Client(base_url=api.url, headers=bearer(other_key), timeout=30) as other,
        ):
            run_id = owner.post("/v1/runs", json=request, headers=idempotent).json()["run_id"]
            wait_status(owner, run_id, {"completed"}, TIMEOUT)
            first_event = owner.get(f"/v1/runs/{run_id}/events").json()["events"][0]["id"]
            assert Archiver(client.store).run_once(after_s=0).archived == 1
            assert client.store.redis.exists(client.store.keys.run(run_id)) == 0
            assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "completed"

            def not_found(response: httpx.Response) -> str:
                assert response.status_code == 404, response.text
                assert response.json()["error"]["kind"] == "not_found", response.text
                return str(response.json()["error"]["message"])

            resume = {**SSE, "Last-Event-ID": first_event}
            for run in (run_id, "never-made"):
                messages = [
                    not_found(other.get(f"/v1/runs/{run}")),
                    not_found(other.get(f"/v1/runs/{run}/events")),
                    not_found(other.get(f"/v1/runs/{run}/events", headers=resume)),
                    not_found(other.get(f"/v1/runs/{run}/checkpoints")),
                    not_found(other.get(f"/v1/runs/{run}/timeline")),
                    not_found(other.get(f"/v1/runs/{run}/children")),
                    not_found(other.get(f"/v1/runs/{run}/signals/1")),
                    not_found(other.post(f"/v1/runs/{run}/retry")),
                    not_found(other.post(f"/v1/runs/{run}/fork", json={})),
                    not_found(other.post(f"/v1/runs/{run}/cancel")),
                    not_found(other.post(f"/v1/runs/{run}/approve", json={})),
                    not_found(other.post(f"/v1/runs/{run}/messages", json={"text": "hi"})),
                ]
                assert all(m == f"no run {run!r}" for m in messages), messages
            assert other.head(f"/v1/runs/{run_id}").status_code == 404

            # The same request under the same key is another run of the other tenant's own.
            again = other.post("/v1/runs", json=request, headers=idempotent)
            assert again.status_code == 202, again.text
            own = again.json()["run_id"]
            assert own != run_id
            wait_status(other, own, {"completed"}, TIMEOUT)
            search = {"query": {"thread_id": "shared"}}
            assert [r["run_id"] for r in other.post("/v1/runs/search", json=search).json()["runs"]] == [own]
            listed = other.get("/v1/runs", params={"thread_id": "shared"}).json()["runs"]
            assert [r["run_id"] for r in listed] == [own]
            assert [r["run_id"] for r in other.get("/v1/runs").json()["runs"]] == [own]
            # The owner's cursor names a place in the owner's listing only.
            cursor = owner.post("/v1/runs/search", json={"query": {}, "limit": 1}).json()["next_cursor"]
            if cursor is not None:
                page = other.post("/v1/runs/search", json={"query": {}, "cursor": cursor}).json()
                assert run_id not in [r["run_id"] for r in page["runs"]]
            # And the owner still has its run, under its key, untouched by any of it.
            assert owner.post("/v1/runs", json=request, headers=idempotent).json()["run_id"] == run_id
            assert owner.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    finally:
        api.stop()


def test_a_submit_and_follow_sent_again_once_its_run_is_archived_streams_its_events(
    pool: Pool, client: Client
) -> None:
    """The same submit-and-follow request again (its Idempotency-Key) answers the same run's
    stream from its first event, also once the run has ended and moved to the archive."""
    api = ApiProcess(pool.server.url, env={"WESICHAIN_ARCHIVE_URL": pool.url}).start()
    key, _ = Tenants(client.store.redis, client.store.keys).create_key(f"api-{uuid.uuid4().hex[:8]}")
    submit = {"json": {"agent": "one_hop", "input": "add"}, "headers": {**SSE, "Idempotency-Key": "k-1"}}
    try:
        with httpx.Client(base_url=api.url, headers=bearer(key), timeout=30) as http:

            def streamed() -> tuple[str, list[dict[str, Any]]]:
                with http.stream("POST", "/v1/runs", **submit) as response:  # type: ignore[arg-type]
                    assert response.status_code == 200, response.read()
                    events = [json.loads(f.data) for f in frames(response) if f.data]
                    return response.headers["location"], events

            location, events = streamed()
            assert events[0]["kind"] == "RunStarted" and events[-1]["kind"] == "Completed"
            assert Archiver(client.store).run_once(after_s=0).archived == 1
            assert client.store.redis.exists(client.store.keys.events(location.rsplit("/", 1)[-1])) == 0
            # It once answered an empty stream here (no event; it ended after a keep-alive's wait).
            assert streamed() == (location, events)
            assert [r["run_id"] for r in http.get("/v1/runs").json()["runs"]] == [location.rsplit("/", 1)[-1]]
    finally:
        api.stop()
