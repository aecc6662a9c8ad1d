"""Shared pieces of the chaos suite: a cluster of real worker processes, fault settings and run checks.

Every check here reads what the runtime really wrote to Redis: the run head, its event stream, its
results, and the counters the test tools keep (``test:starts`` / ``test:effects`` / ``test:pids``,
keyed by the call's idempotency key ``run_id:step:call_id``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from producer.client import Client, RunHandle
from shared.events import Event, read_all_events
from shared.state import Phase, RunHead
from tests.agents_fixture import EFFECTS_KEY, PIDS_KEY, STARTS_KEY
from tests.broker import on_rabbitmq
from tests.chaos.faults import pid_key
from tests.harness import RedisServer, WorkerProcess, wait_until
from tests.invariants import assert_event_invariants, committed, kinds

PREFIX = "wesichain:"
#: Short leases so a dead worker's phase is handed on within seconds.
LEASE_S = 2.0
QUEUED_LEASE_S = 4.0
CHAOS_ENV = {
    "WESICHAIN_LEASE_S": str(LEASE_S),
    "WESICHAIN_QUEUED_LEASE_S": str(QUEUED_LEASE_S),
    # A paused phase waits far longer than any test: it only ends because the test kills it.
    "WESICHAIN_FAULT_PAUSE_S": "120",
    "WESICHAIN_HOOKS": "tests.chaos.faults:ChaosHooks",
}
#: How long a whole run may take, chaos included.
RUN_TIMEOUT_S = 60.0

#: (case, seconds) for every recovery a test measured; printed in the terminal summary.
RECOVERIES: list[tuple[str, float]] = []
#: What each soak did and saw; printed in the terminal summary.
SOAK_REPORT: list[dict[str, Any]] = []
#: The names under which a test's report carries them to the summary (see tests/conftest.py).
RECOVERY_PROPERTY = "chaos_recovery"
SOAK_PROPERTY = "chaos_soak"


def note_recovery(case: str, seconds: float) -> float:
    RECOVERIES.append((case, round(seconds, 3)))
    if path := os.environ.get("WESICHAIN_CHAOS_REPORT"):
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, "recovery_s": round(seconds, 3)}) + "\n")
    return seconds


# -- workers ------------------------------------------------------------------------------------


class Cluster:
    """The worker processes of one test, all on that test's own redis-server."""

    def __init__(self, server: RedisServer, log_dir: Path) -> None:
        self.server = server
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def start(
        self,
        n: int = 2,
        *,
        env: dict[str, str] | None = None,
        concurrency: int = 1,
        pool: str = "prefork",
        include: tuple[str, ...] = (),
        queues: str | None = None,
        agents: str = "tests.agents_fixture",
    ) -> list[WorkerProcess]:
        new = [
            WorkerProcess(
                f"w{len(self.workers) + i + 1}",
                self.server.url,
                agents=agents,
                concurrency=concurrency,
                pool=pool,
                env={**CHAOS_ENV, **(env or {})},
                log_dir=str(self.log_dir),
                include=include,
                queues=queues,
            )
            for i in range(n)
        ]
        for w in new:
            w.start(wait=False)
        for w in new:
            w.wait_ready(timeout=60)
        self.workers += new
        return new

    def owner(self, pid: int) -> WorkerProcess:
        """The worker whose process tree holds ``pid``."""
        for w in self.workers:
            if w.alive and pid in w.pids():
                return w
        raise AssertionError(
            f"pid {pid} belongs to no live worker: {[(w.name, w.pids()) for w in self.workers]}"
        )

    def revive(self, wait: bool = False) -> list[WorkerProcess]:
        """Start again every worker whose main process died; returns those restarted."""
        dead = [w for w in self.workers if not w.alive]
        for w in dead:
            w.stop()  # closes its log; the process is already gone
            w.start(wait=False)
        if wait:
            for w in dead:
                w.wait_ready(timeout=60)
        return dead

    def stop(self) -> None:
        for w in self.workers:
            w.kill()
            w.stop()

    def log_tails(self, chars: int = 6000) -> str:
        parts = []
        for w in self.workers:
            try:
                text = w.log()
            except OSError:
                continue
            parts.append(f"===== {w.name} ({w.log_path}) =====\n{text[-chars:]}")
        return "\n".join(parts)


def kill_child(pid: int, worker: WorkerProcess) -> None:
    """SIGKILL one prefork child, leaving the worker's main process running."""
    assert pid != worker.pid, "that is the worker's main process, not a pool child"
    assert pid in worker.children(), f"pid {pid} is not a child of {worker.name}"
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not is_running(pid), timeout=10, what=f"child {pid} to die")


def is_running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


# -- faults -------------------------------------------------------------------------------------


def pause_pid(r: redis.Redis, phase: Phase | str, run_id: str) -> int | None:
    """The pid a ``pause:<phase>`` fault recorded when the run's phase paused there."""
    raw = r.get(pid_key(phase, run_id))
    return int(raw) if raw else None


def wait_paused(r: redis.Redis, phase: Phase | str, run_id: str, timeout: float = 30) -> int:
    return int(wait_until(lambda: pause_pid(r, phase, run_id), timeout, what=f"run to pause in {phase}"))


def wait_tool_started(r: redis.Redis, key: str, timeout: float = 30) -> int:
    """Wait until a test tool entered its body; returns the pid running it."""
    wait_until(lambda: r.hget(STARTS_KEY, key), timeout, what=f"tool {key} to start")
    return int(r.hget(PIDS_KEY, key) or 0)


# -- counters -----------------------------------------------------------------------------------


def idem(run_id: str, step: int = 1, call_id: str = "call_0") -> str:
    return f"{run_id}:{step}:{call_id}"


def starts(r: redis.Redis, key: str) -> int:
    return int(r.hget(STARTS_KEY, key) or 0)


def effects(r: redis.Redis, key: str) -> int:
    return int(r.hget(EFFECTS_KEY, key) or 0)


# -- runs ---------------------------------------------------------------------------------------


def events_of(handle: RunHandle) -> list[Event]:
    return [event for _, event in read_all_events(handle.client.store, handle.run_id)]


def wait_terminal(handle: RunHandle, timeout: float = RUN_TIMEOUT_S) -> RunHead:
    return handle.wait(timeout)


def assert_terminal_matches_events(head: RunHead, events: Sequence[Event]) -> None:
    end = committed(events)[-1]
    expected = {Phase.COMPLETED: "Completed", Phase.FAILED: "Failed", Phase.INTERRUPTED: "Interrupted"}
    assert end.kind == expected[head.phase], f"head is {head.phase} but the last event is {end.kind}"
    if end.kind == "Failed":
        assert end.error == head.error


def assert_completed_with_one_tool_run(
    r: redis.Redis, handles: Iterable[RunHandle], shape: Sequence[str], timeout: float = RUN_TIMEOUT_S
) -> None:
    """Each run completed with events of ``shape``, and its tool started and took effect once."""
    for handle in handles:
        head = handle.wait(timeout)
        events = events_of(handle)
        key = idem(handle.run_id)
        assert head.phase is Phase.COMPLETED, f"{head.agent} {handle.run_id}: {head.phase} {head.error}"
        assert kinds(events) == list(shape)
        assert_event_invariants(events)
        assert_terminal_matches_events(head, events)
        assert starts(r, key) == 1, f"{head.agent}: the tool started {starts(r, key)} times"
        assert effects(r, key) == 1


def first_event_after(events: Sequence[Event], t: float) -> Event:
    """The first committed event after ``t``."""
    later = [e for e in committed(events) if e.ts > t]
    assert later, f"no event after {t}: {kinds(events)}"
    return later[0]


@dataclass
class RunSnapshot:
    """Everything a late or duplicate delivery could change about a run."""

    head: dict[str, Any]
    messages: int
    events: int
    effects: dict[str, str] = field(default_factory=dict)
    starts: dict[str, str] = field(default_factory=dict)


def snapshot(client: Client, run_id: str) -> RunSnapshot:
    r = client.store.redis
    head = client.store.load(run_id)
    assert head is not None
    return RunSnapshot(
        head=head.model_dump(),
        messages=len(client.store.load_messages(run_id)),
        events=int(r.xlen(client.store.keys.events(run_id))),
        effects=_hash_of_run(r, EFFECTS_KEY, run_id),
        starts=_hash_of_run(r, STARTS_KEY, run_id),
    )


def _hash_of_run(r: redis.Redis, key: str, run_id: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in r.hgetall(key).items() if str(k).startswith(run_id)}


# -- broker -------------------------------------------------------------------------------------

QUEUES = ("wesichain.model", "wesichain.tools")
#: The broker's keys: Celery's Redis transport, as the workers configure it (no key prefix).
BROKER_PREFIX = ""


def queue_key(queue: str) -> str:
    """The Redis list holding ``queue``'s waiting messages."""
    return BROKER_PREFIX + queue


def phase_queues(r: redis.Redis, kinds: Sequence[str] = QUEUES) -> list[str]:
    """The broker's queues of run phases of ``kinds``: each kind queue and every version queue
    beside it (``wesichain.tools.<agent>-v<N>``, where a started run's phases go: see
    ``shared/versions.py``) that holds a message now."""
    found = list(kinds)
    for kind in kinds:
        for key in r.scan_iter(match=queue_key(kind) + ".*", _type="list", count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            found.append(name[len(BROKER_PREFIX) :])
    return sorted(set(found))


def queued_phases(r: redis.Redis, kinds: Sequence[str] = QUEUES) -> int:
    """Messages waiting in the phase queues of ``kinds`` (version queues included)."""
    return sum(int(r.llen(queue_key(q)) or 0) for q in phase_queues(r, kinds))


#: kombu's Redis QoS: the hash of delivered, unacknowledged messages, and its index.
UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


def unacked(r: redis.Redis) -> dict[str, tuple[dict[str, Any], str, str]]:
    """kombu's unacked hash: delivery tag -> (envelope, exchange, routing key)."""
    out = {}
    for tag, raw in r.hgetall(UNACKED).items():
        envelope, exchange, routing_key = json.loads(raw)
        out[str(tag)] = (envelope, str(exchange), str(routing_key))
    return out


def unacked_drained(r: redis.Redis) -> bool:
    """Whether no delivery is left unacknowledged (the hash and its index both empty)."""
    return r.hlen(UNACKED) == 0 and r.zcard(UNACKED_INDEX) == 0


def pending_task_ids(r: redis.Redis) -> set[str]:
    """Task ids still queued (in a kind queue or a version queue) or delivered-but-unacked in the
    broker."""
    raw: list[str] = []
    for q in phase_queues(r):
        raw += [str(m) for m in r.lrange(queue_key(q), 0, -1)]
    raw += [str(m) for m in r.hvals(BROKER_PREFIX + "unacked")]
    ids: set[str] = set()
    for item in raw:
        try:
            message = json.loads(item)
        except ValueError:
            continue
        if isinstance(message, list):  # unacked entries are [message, exchange, routing_key]
            message = message[0]
        task_id = (message.get("headers") or {}).get("id")
        if task_id:
            ids.add(str(task_id))
    return ids


def wait_delivered(r: redis.Redis, task_ids: Iterable[str], timeout: float = 30) -> None:
    """Wait until the broker no longer holds any of ``task_ids`` (each was delivered and acked)."""
    wanted = set(task_ids)
    wait_until(
        lambda: not (wanted & pending_task_ids(r)),
        timeout,
        interval=0.05,
        what=f"tasks {sorted(wanted)} to be delivered and acked",
    )


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


# -- runs of the duplicate-delivery shapes, and a Redis outage ------------------------------------


def hop_kinds(calls_per_step: list[int]) -> list[str]:
    """The committed events of a run whose steps make these many tool calls, then answer."""
    out = ["RunStarted"]
    for n in calls_per_step:
        out += ["StepStarted", "ModelResponded", *["ToolDispatched"] * n, *["ToolCompleted"] * n]
    return [*out, "StepStarted", "ModelResponded", "Completed"]


SHAPES = {"one_hop": [1], "chain": [1, 1, 1], "parallel": [4], "late_delivery": [1, 1]}
ANSWERS = {
    "one_hop": "1 + 2 = 3",
    "chain": "done after three hops",
    "parallel": "all four done",
    "late_delivery": "late deliveries changed nothing",
}


def check_clean_run(client: Client, run_id: str, agent: str) -> None:
    """Completed exactly as a run without faults would: same events, each effect once."""
    r = client.store.redis
    handle = client.handle(run_id)
    head = handle.wait(RUN_TIMEOUT_S)
    events = events_of(handle)
    assert head.phase is Phase.COMPLETED and head.answer == ANSWERS[agent], f"{run_id}: {head.phase}"
    assert kinds(events) == hop_kinds(SHAPES[agent])
    assert_event_invariants(events)
    assert_terminal_matches_events(head, events)
    for step, n in enumerate(SHAPES[agent], start=1):
        for i in range(n):
            key = idem(run_id, step, f"call_{i}")
            assert effects(r, key) == 1, f"{key}: effect recorded {effects(r, key)} times"
            assert starts(r, key) in (0, 1), f"{key}: started {starts(r, key)} times"  # add records no start
        assert len(client.store.load_results(run_id, step)) == n


LOST = "Connection to broker lost"
#: What a worker logs when the run state's Redis does not answer its registry heartbeat.
STATE_LOST = "registry heartbeat failed"


def noticed(text: str) -> bool:
    """Whether a worker's log says it lost Redis: as its broker (Celery's consumer), or, with
    RabbitMQ as the broker, as its run state (its registry heartbeat failed)."""
    return (STATE_LOST if on_rabbitmq() else LOST) in text


def outage(server: RedisServer, workers: list[WorkerProcess]) -> float:
    """Stop Redis, keep it down until every worker noticed (and had its chance to fail), start it again.

    Returns when the server stopped.
    """
    offsets = {w.name: len(w.log()) for w in workers}

    def reacted(w: WorkerProcess) -> bool:
        text = w.log()[offsets[w.name] :]
        if on_rabbitmq():  # its consumer is on RabbitMQ: nothing reconnects, it must stay up
            return noticed(text) or not w.alive
        # Either it is already trying to reconnect, or it died handling the loss.
        return noticed(text) and ("Cannot connect" in text or not w.alive)

    stopped_at = time.time()
    server.stop()
    # A deadline, not a bound: a worker busy in a task on a loaded machine logs the loss late.
    wait_until(lambda: all(reacted(w) for w in workers), 90, what="every worker to notice the outage")
    server.start()
    return stopped_at


# -- evals through pool kills (tests/chaos/test_eval_crash*.py) --------------------------------------

EVAL_AGENTS = "tests.agents_evals"
#: The chaos leases; each doubling takes 0.15 s, so that kills land with cases in flight.
EVAL_ENV = {
    "WESICHAIN_LEASE_S": CHAOS_ENV["WESICHAIN_LEASE_S"],
    "WESICHAIN_QUEUED_LEASE_S": CHAOS_ENV["WESICHAIN_QUEUED_LEASE_S"],
    "EVAL_SLOW_S": "0.15",
}


def start_eval_pool(server: RedisServer, log_dir: Path) -> list[WorkerProcess]:
    """Two prefork workers (three processes each) running the eval agents, started together."""
    workers = [
        WorkerProcess(
            f"e{i}", server.url, agents=EVAL_AGENTS, concurrency=3, env=EVAL_ENV, log_dir=str(log_dir)
        )
        for i in (1, 2)
    ]
    for w in workers:
        w.start(wait=False)
    for w in workers:
        w.wait_ready(timeout=60)
    return workers


def kill_pool(pool: list[WorkerProcess]) -> None:
    """SIGKILL every worker's process group (no shutdown, no acks), then start the pool again."""
    for w in pool:
        w.kill()
    for w in pool:
        w.stop()
        w.start(wait=False)
    for w in pool:
        w.wait_ready(timeout=60)


def write_doubling_eval(directory: Path, name: str, case_prefix: str, cases: int, cap: int) -> Path:
    """``cases.jsonl`` (case ``{prefix}{m}``: "slow double m", expected 2m) and ``eval.toml`` (the
    doubler, scored exactly and by the counting scorer, ``cap`` cases at once); the spec's path."""
    (directory / "cases.jsonl").write_text(
        "".join(
            json.dumps({"id": f"{case_prefix}{m}", "input": f"slow double {m}", "expected": str(2 * m)})
            + "\n"
            for m in range(1, cases + 1)
        )
    )
    spec = directory / "eval.toml"
    spec.write_text(
        f'name = "{name}"\ndataset = "cases.jsonl"\nconcurrency = {cap}\n'
        '[[variants]]\nagent = "doubler"\n'
        '[[scorers]]\nkind = "exact"\n'
        '[[scorers]]\nkind = "custom"\nname = "counted"\nfunction = "tests.eval_scorers:counted"\n'
    )
    return spec


# -- a full Redis ---------------------------------------------------------------------------------

#: The keys :func:`fill_redis` fills Redis with: ``free_redis`` deletes them.
BALLAST = "test:ballast:"


def fill_redis(r: redis.Redis) -> int:
    """Fill Redis up to its maxmemory with ballast keys, then hold it above; returns how many keys."""
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", used + 2 * 2**20)
    n = 0
    try:
        while True:
            r.set(f"{BALLAST}{n}", b"x" * 64 * 1024)
            n += 1
    except redis.exceptions.OutOfMemoryError:
        # Full: now keep it so by a margin, whatever a worker's pop or delete frees meanwhile.
        r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - 2**20)
        return n


def free_redis(r: redis.Redis, ballast: int) -> None:
    """Undo :func:`fill_redis`: its ``ballast`` keys deleted, no maxmemory."""
    r.delete(*[f"{BALLAST}{n}" for n in range(ballast)])
    r.config_set("maxmemory", 0)


def refuses_writes(r: redis.Redis) -> bool:
    """Whether Redis refuses a write that adds data (it is full)."""
    try:
        r.hset("test:probe", "k", "v" * 1024)
    except redis.exceptions.OutOfMemoryError:
        return True
    r.delete("test:probe")
    return False
