"""Redis at ``maxmemory`` (``noeviction``) under the HTTP API: followed runs, and writes refused.

Runs are followed over SSE (several followers per run, some resuming with ``Last-Event-ID``, one of
them while Redis is full) when Redis fills up, and their tools end meanwhile. Every write a client
sends while Redis is full (a submit into a thread, an approval, a cancel, a message, a state
update, a schedule and its changes) is answered ``503 store_full`` with a ``Retry-After``, never a
500, and leaves nothing behind; reads are served. Once memory is freed the results the workers held
are recorded, every follower gets every event after its cursor once, in order, through the run's
end, the tenant has its whole share of streams again, and the same writes succeed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.keys import Keys
from shared.tenants import Tenants
from tests.agents_fixture import GATE_DIR_ENV, gated_count
from tests.api_support import END, SSE, ApiProcess, bearer, frames, wait_status
from tests.chaos.support import (
    RUN_TIMEOUT_S,
    Cluster,
    fill_redis,
    free_redis,
    idem,
    refuses_writes,
)
from tests.harness import RedisServer, wait_until

pytestmark = pytest.mark.standalone_redis  # sets the one Redis's maxmemory

#: Event streams the tenant may hold in the API process: every follower's, and one to spare.
SHARE = 10
#: A run's statuses once it has ended.
END_STATUSES = {"completed", "failed", "interrupted"}


@pytest.fixture
def api(server: RedisServer) -> Iterator[ApiProcess]:
    env = {"WESICHAIN_API_KEEPALIVE_S": "1", "WESICHAIN_API_MAX_STREAMS_PER_TENANT": str(SHARE)}
    process = ApiProcess(server.url, env=env).start()
    yield process
    process.stop()


class Follower:
    """One client following a run's events over SSE, resuming with ``Last-Event-ID`` whenever its
    stream ends before the run's end event; ``drop_after`` events in, it drops its stream and
    resumes once ``resume`` is set."""

    def __init__(
        self,
        api: ApiProcess,
        key: str,
        run_id: str,
        cursor: str | None = None,
        drop_after: int | None = None,
        resume: threading.Event | None = None,
    ) -> None:
        self.api, self.key, self.run_id = api, key, run_id
        self.start_cursor = self.cursor = cursor
        self.drop_after, self.resume = drop_after, resume
        self.seen: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.streams = 0
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        try:
            with httpx.Client(base_url=self.api.url, headers=bearer(self.key), timeout=30) as http:
                while not self._stream(http):
                    if self.drop_after is not None and len(self.seen) >= self.drop_after:
                        self.drop_after = None
                        assert self.resume is not None
                        self.resume.wait(RUN_TIMEOUT_S)
        except Exception as exc:  # reported by the test, not lost in the thread
            self.errors.append(repr(exc))

    def _stream(self, http: httpx.Client) -> bool:
        """One stream, until it ends; whether it ended with the run's end."""
        headers = {**SSE, **({"Last-Event-ID": self.cursor} if self.cursor else {})}
        with http.stream("GET", f"/v1/runs/{self.run_id}/events", headers=headers) as answer:
            self.streams += 1
            if answer.status_code == 204:
                return True
            if answer.status_code != 200:
                self.errors.append(f"{answer.status_code}: {answer.read()[:300]!r}")
                return True
            for frame in frames(answer):
                if not frame.data:
                    continue
                assert frame.id is not None
                kind = frame.event["kind"]
                self.seen.append((frame.id, kind))
                self.cursor = frame.id
                if kind in END:
                    return True
                if self.drop_after is not None and len(self.seen) >= self.drop_after:
                    return False
        return False

    def has(self, kind: str) -> bool:
        return any(k == kind for _, k in self.seen)


def _refused_full(answer: httpx.Response) -> None:
    assert answer.status_code == 503, (answer.request.method, answer.request.url.path, answer.text)
    assert answer.json()["error"]["kind"] == "store_full", answer.text
    assert int(answer.headers["retry-after"]) > 0


def test_followers_and_writes_while_redis_is_full(
    cluster: Cluster, server: RedisServer, api: ApiProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    cluster.start(1, concurrency=3, env={GATE_DIR_ENV: str(gate)})
    r = server.client()
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    key, _ = Tenants(r, Keys()).create_key(tenant)
    http = httpx.Client(base_url=api.url, headers=bearer(key), timeout=30)
    charges = [
        http.post("/v1/runs", json={"agent": "charge_gated", "input": n}).json()["run_id"] for n in "ab"
    ]
    parked = http.post("/v1/runs", json={"agent": "needs_approval", "input": "x"}).json()["run_id"]
    schedule_body = {"agent": "direct", "input": "hi", "timing": {"every_s": 3600}}
    schedule = http.post("/v1/schedules", json=schedule_body).json()["schedule_id"]
    wait_until(
        lambda: all(gated_count(gate, f"{idem(c)}.starts") for c in charges), 60, what="the charges to start"
    )
    wait_status(http, parked, {"awaiting_approval"})

    full = threading.Event()
    followers: list[Follower] = []
    for run_id in charges:
        first = http.get(f"/v1/runs/{run_id}/events").json()["events"][0]["id"]
        followers += [
            Follower(api, key, run_id),
            Follower(api, key, run_id),
            Follower(api, key, run_id, cursor=first),
            Follower(api, key, run_id, drop_after=2, resume=full),  # resumes while Redis is full
        ]
    wait_until(
        lambda: all(f.has("ToolDispatched") for f in followers if f.resume is None),
        30,
        what="every follower to be streaming",
    )

    ballast = fill_redis(r)
    assert ballast > 0 and refuses_writes(r)
    full.set()
    # Every charge ends while Redis is full: its result waits in the worker.
    (gate / "open").touch()
    wait_until(
        lambda: all(gated_count(gate, f"{idem(c)}.effects") for c in charges), 30, what="the charges to end"
    )
    resumed = followers[3::4]
    wait_until(lambda: all(f.streams == 2 for f in resumed), 30, what="the dropped followers to resume")

    writes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("POST", "/v1/runs", {"agent": "one_hop", "input": "x"}),
        ("POST", "/v1/runs", {"agent": "one_hop", "input": "x", "thread_id": "th"}),
        ("POST", f"/v1/runs/{parked}/approve", None),
        ("POST", f"/v1/runs/{charges[0]}/cancel", None),
        ("POST", f"/v1/runs/{charges[1]}/messages", {"text": "hello"}),
        ("POST", f"/v1/runs/{charges[1]}/updates", {"patch": {"n": 1}}),
        ("POST", "/v1/schedules", schedule_body),
        ("POST", f"/v1/schedules/{schedule}/pause", None),
        ("PATCH", f"/v1/schedules/{schedule}", {"input": "changed"}),
    ]
    for method, path, body in writes:
        _refused_full(http.request(method, path, json=body))
        # Reads are served meanwhile, on the same connection.
        assert http.get(f"/v1/runs/{charges[0]}").status_code == 200
    assert refuses_writes(r)
    # Nothing of a refused write was kept.
    assert http.get(f"/v1/runs/{parked}").json()["status"] == "awaiting_approval"
    assert [s["schedule_id"] for s in http.get("/v1/schedules").json()["schedules"]] == [schedule]
    assert http.get(f"/v1/schedules/{schedule}").json()["input"] == "hi"
    assert http.get("/v1/runs", params={"thread_id": "th"}).json()["runs"] == []
    for run_id in charges:
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "running"

    free_redis(r, ballast)
    for f in followers:
        f.thread.join(RUN_TIMEOUT_S)
    assert not any(f.thread.is_alive() for f in followers), "a follower never saw its run end"
    assert [f.errors for f in followers if f.errors] == []
    for run_id in charges:
        assert wait_status(http, run_id, END_STATUSES)["status"] == "completed"
        stored = [(e["id"], e["kind"]) for e in http.get(f"/v1/runs/{run_id}/events").json()["events"]]
        assert stored[-1][1] == "Completed" and [k for _, k in stored].count("ToolCompleted") == 1
        for f in followers:
            if f.run_id == run_id:
                skipped = 0 if f.start_cursor is None else [i for i, _ in stored].index(f.start_cursor) + 1
                assert f.seen == stored[skipped:], (f.start_cursor, f.seen, stored)

    # Every stream's place was given back: the tenant opens its whole share again.
    def whole_share() -> bool:
        with ExitStack() as held:
            path = f"/v1/runs/{parked}/events"
            opened = [held.enter_context(http.stream("GET", path, headers=SSE)) for _ in range(SHARE)]
            return all(s.status_code == 200 for s in opened)

    wait_until(whole_share, 30, what="every stream's place back")

    # The writes refused while Redis was full are served now.
    assert http.post(f"/v1/runs/{parked}/approve").status_code == 202
    assert http.post(f"/v1/schedules/{schedule}/pause").status_code == 200
    assert http.post("/v1/schedules", json=schedule_body).status_code == 201

    # A submit reads Redis's memory at most once a second: just after the free it may still be
    # refused as full (nothing stored), as a client sending it again after Retry-After finds.
    def threaded_submit() -> httpx.Response | None:
        body = {"agent": "one_hop", "input": "x", "thread_id": "th"}
        answer = http.post("/v1/runs", json=body, headers={"Idempotency-Key": "threaded-after-the-free"})
        if answer.status_code == 503 and answer.json()["error"]["kind"] == "store_full":
            return None
        return answer

    threaded: httpx.Response = wait_until(threaded_submit, 30, interval=0.2, what="a submit taken")
    assert threaded.status_code == 202, threaded.text
    for run_id in (parked, threaded.json()["run_id"]):
        assert wait_status(http, run_id, END_STATUSES, RUN_TIMEOUT_S)["status"] == "completed"
    http.close()
    assert "Traceback" not in api.log()


def test_a_memory_item_and_a_new_assistant_are_refused_while_redis_is_full(
    cluster: Cluster, server: RedisServer
) -> None:
    # Both scripts write a purge first (expired items, old write ids, expired kept names): the
    # refusal must come before it, or the item and the assistant are stored past maxmemory.
    cluster.start(1, agents="tests.agents_assistants")  # an assistant names an agent a worker serves
    process = ApiProcess(server.url, env={"WESICHAIN_AGENTS": "tests.agents_assistants"}).start()
    try:
        r = server.client()
        key, _ = Tenants(r, Keys()).create_key(f"t-{uuid.uuid4().hex[:8]}")
        http = httpx.Client(base_url=process.url, headers=bearer(key), timeout=30)
        item = {"namespace": ["notes"], "key": "k", "value": {"text": "kept"}}
        where = {"namespace": ["notes"], "key": "k"}
        assistant = {"name": "helper", "agent": "concierge", "config": {"max_steps": 5}}
        first = {**assistant, "name": "first"}
        wait_until(
            lambda: http.post("/v1/assistants", json=first).status_code == 201, 60, what="a worker to serve"
        )
        ballast = fill_redis(r)
        try:
            assert ballast > 0 and refuses_writes(r)
            _refused_full(http.put("/v1/memory/items", json=item))
            _refused_full(http.post("/v1/assistants", json=assistant))
            # Nothing was stored, and reads are served meanwhile.
            assert http.get("/v1/memory/items", params=where).status_code == 404
            assert http.get("/v1/assistants/helper").status_code == 404
            assert [a["name"] for a in http.get("/v1/assistants").json()["assistants"]] == ["first"]
            assert refuses_writes(r)
        finally:
            free_redis(r, ballast)
        stored = http.put("/v1/memory/items", json=item)
        assert stored.status_code == 200, stored.text
        assert stored.json()["version"] == 1
        assert http.get("/v1/memory/items", params=where).json()["value"] == {"text": "kept"}
        created = http.post("/v1/assistants", json=assistant)
        assert created.status_code == 201, created.text
        assert created.json()["version"] == 1
        http.close()
        assert "Traceback" not in process.log()
    finally:
        process.stop()
