"""Micro-benchmarks of what one transition is made of, in one process against a real redis-server.

    python -m benchmarks.micro [--n 400] [--probe-sizes 1000,10000,50000] [--out DIR]

Times (wall microseconds per call: the lowest of 5 block medians over ``n`` calls) the store
operations a phase task performs (claims, commit, the fan-in's record), the Celery publish of the
next task with the runtime's configuration, the producer's check of the worker registry, and the
pydantic work around them, at step 1 and at step 50 of a run. Then the sweeper's broker probe
(``worker.broker_probe.RedisQueues.locate``): how long locating 10 task ids takes against a tool
queue holding 1,000, 10,000 and 50,000 messages published by a real Celery app with the runtime's
configuration, and how long each of its scan chunks holds Redis. Writes ``results/micro.json`` and
prints a table. No worker runs: this isolates the runtime's own costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.utils
from celery import Celery

from producer.publishing import MessageBuilder, run_commands
from shared import events as ev
from shared import fsm
from shared.agents import load_registry
from shared.llm.base import Usage
from shared.messages import MESSAGE_ADAPTER, SystemMessage, ToolCall, UserMessage, dump_message
from shared.redis_client import connect
from shared.scripts import register_scripts
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS, Settings, celery_config
from shared.state import Phase, RunHead, ToolResult
from shared.store import CallClaim, Claim, ClaimRef, PhaseClaim, RunStore
from shared.tasks import TASK_TOOL, start_task, task_for
from shared.workers import WorkerDirectory, WorkerRecord, describe_agents
from worker.broker_probe import RedisQueues
from worker.testing.harness import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"
HOLDER = "micro:1"
CALL = ToolCall(id="call_0", name="noop", arguments={})
RESULT = ToolResult(call_id="call_0", name="noop", ok=True, output="ok")
#: Queue depths the broker probe is timed against.
PROBE_SIZES = (1_000, 10_000, 50_000)


def _time(fn: Callable[[], Any], n: int, blocks: int = 5) -> float:
    """Microseconds per call of ``fn``: the lowest of ``blocks`` block medians (``n`` calls in all).

    The lowest block is the one least disturbed by other load on the machine, as timeit advises.
    """
    for _ in range(min(20, n)):
        fn()
    best = float("inf")
    for _ in range(blocks):
        samples = []
        for _ in range(max(1, n // blocks)):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e6)
        best = min(best, statistics.median(samples))
    return round(best, 1)


# -- runs built through the real protocol: claim, then commit as the claim's holder


def _claim(store: RunStore, head: RunHead, **read: bool) -> Claim:
    outcome = store.claim_phase(
        PhaseClaim(head.run_id, head.version, head.phase, head.epoch, head.step, **read), HOLDER
    )
    assert isinstance(outcome, Claim), outcome
    return outcome


def _commit(store: RunStore, current: fsm.PhaseView, t: fsm.Transition[Any], ref: ClaimRef) -> None:
    result = store.commit(current.head, t.head, ref, t.messages, t.events, task_for(t.head))
    assert result.status == "committed", result


def _record(store: RunStore, acting: fsm.Acting, ref: ClaimRef) -> fsm.Observing:
    """The tool task's fan-in: record the step's only result, which commits OBSERVING."""
    observing = acting.observe().head
    (observe,) = task_for(observing)
    completed = ev.ToolCompleted(
        run_id=observing.run_id, step=observing.step, call_id=CALL.id, tool=CALL.name, ok=True, output="ok"
    )
    recorded = store.record_result(acting.head, ref, RESULT, completed, observing, observe)
    assert recorded.status == "complete", recorded
    return fsm.Observing(observing)


def _claim_call(store: RunStore, head: RunHead) -> Claim:
    outcome = store.claim_call(CallClaim(head.run_id, head.version, head.epoch, head.step, CALL.id), HOLDER)
    assert isinstance(outcome, Claim), outcome
    return outcome


def new_run(store: RunStore, steps: int) -> fsm.Thinking:
    """A run created and committed through ``steps - 1`` one-tool steps, left THINKING at ``steps``."""
    head = RunHead.new_idle(uuid.uuid4().hex, "long", f"steps={steps}")
    assert store.create(head, [start_task(head.run_id)])
    idle = fsm.Idle(head)
    t = idle.start(
        [SystemMessage(content="benchmark agent long"), UserMessage(content=f"steps={steps}")],
        agent_version="1",
        model="scripted:long",
        max_steps=1000,
    )
    _commit(store, idle, t, _claim(store, head).ref)
    thinking = t.to
    for _ in range(1, steps):
        acting = thinking.act(None, [CALL], Usage())
        _commit(store, thinking, acting, _claim(store, thinking.head, read_messages=True).ref)
        observing = _record(store, acting.to, _claim_call(store, acting.head).ref)
        nxt = observing.next_step([RESULT])
        _commit(store, observing, nxt, _claim(store, observing.head, read_results=True).ref)
        thinking = nxt.to
    return thinking


def acting_run(store: RunStore) -> fsm.Acting:
    thinking = new_run(store, 1)
    acting = thinking.act(None, [CALL], Usage())
    _commit(store, thinking, acting, _claim(store, thinking.head).ref)
    return acting.to


def observing_run(store: RunStore) -> fsm.Observing:
    acting = acting_run(store)
    return _record(store, acting, _claim_call(store, acting.head).ref)


# -- the measurements


def _per_step_costs(store: RunStore, retaking: RunStore, steps: int, n: int) -> dict[str, float]:
    r = store.redis
    thinking = new_run(store, steps)
    head, run_id = thinking.head, thinking.head.run_id
    key = store.keys.messages(run_id)
    count = r.llen(key)
    tag = f"step {steps} ({count} messages)"
    want = PhaseClaim(run_id, head.version, Phase.THINKING, head.epoch, head.step, read_messages=True)
    raw = r.lrange(key, 0, -1)
    msgs = [MESSAGE_ADAPTER.validate_json(m) for m in raw]
    return {
        f"RunStore.claim_phase think (conversation cached), {tag}": _time(
            lambda: retaking.claim_phase(want, HOLDER), n
        ),
        f"LRANGE messages, {tag}": _time(lambda: r.lrange(key, 0, -1), n),
        f"parse messages (pydantic), {tag}": _time(
            lambda: [MESSAGE_ADAPTER.validate_json(m) for m in raw], n
        ),
        f"dump messages (pydantic), {tag}": _time(lambda: [dump_message(m) for m in msgs], n),
    }


def _claim_costs(retaking: RunStore, n: int) -> dict[str, float]:
    """Claims on a store whose lease is 0 ms: each timed claim takes the last one over.

    That is the claim script's full path (fence check, claim, attempt count, lease, the data the
    phase reads) plus noting the expired prior claim; a live claim would answer "busy" instead.
    """
    acting = acting_run(retaking)
    observing = observing_run(retaking)
    a, o = acting.head, observing.head
    call = CallClaim(a.run_id, a.version, a.epoch, a.step, CALL.id)
    observe = PhaseClaim(o.run_id, o.version, Phase.OBSERVING, o.epoch, o.step, read_results=True)
    return {
        "RunStore.claim_call (tool)": _time(lambda: retaking.claim_call(call, HOLDER), n),
        "RunStore.claim_phase observe (reads the step's results)": _time(
            lambda: retaking.claim_phase(observe, HOLDER), n
        ),
    }


def _write_costs(store: RunStore, n: int) -> dict[str, float]:
    """A commit (think -> act) and a fan-in record, each on a fresh, claimed run so they succeed."""
    thinking_runs = []
    for _ in range(n + 20):
        thinking = new_run(store, 1)
        thinking_runs.append((thinking, _claim(store, thinking.head, read_messages=True).ref))
    commits = iter(thinking_runs)

    def commit_act() -> None:
        thinking, ref = next(commits)
        _commit(store, thinking, thinking.act(None, [CALL], Usage()), ref)

    acting_runs = []
    for _ in range(n + 20):
        acting = acting_run(store)
        acting_runs.append((acting, _claim_call(store, acting.head).ref))
    records = iter(acting_runs)

    def record() -> None:
        acting, ref = next(records)
        _record(store, acting, ref)

    return {
        "fsm act + RunStore.commit (think -> act)": _time(commit_act, n),
        "ToolCompleted + RunStore.record_result (fan-in commits OBSERVING)": _time(record, n),
    }


def _publish_costs(store: RunStore, app: Celery, n: int) -> dict[str, float]:
    """The next phase's publish, three ways, and a commit that publishes in its own script against
    a commit followed by that publish (each commit on a fresh, claimed run)."""
    builder = MessageBuilder(app)
    spec = task_for(new_run(store, 1).head)[0]
    out = {
        "publish: Celery send_task (a Redis client and a bindings read per publish)": _time(
            lambda: app.send_task(spec.name, kwargs=spec.arguments, task_id=spec.task_id, queue=spec.queue), n
        ),
        "publish: MessageBuilder.build (Celery's message, no I/O)": _time(lambda: builder.build([spec]), n),
        "publish: build + run on the store's client (the fallback publish)": _time(
            lambda: run_commands(store.redis, builder.build([spec])), n
        ),
    }
    # The two commits alternate, each on a fresh claimed run, so that load coming and going on the
    # machine falls on both alike; each figure is the median of its n calls.
    timings: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * n + 40):
        in_script = i % 2 == 0
        thinking = new_run(store, 1)
        ref = _claim(store, thinking.head, read_messages=True).ref
        t = thinking.act(None, [CALL], Usage())
        outbox = task_for(t.head)
        started = time.perf_counter()
        push = builder.build(outbox)
        result = store.commit(
            thinking.head, t.head, ref, t.messages, t.events, outbox, push if in_script else ()
        )
        if not in_script:
            run_commands(store.redis, push)
        elapsed = (time.perf_counter() - started) * 1e6
        assert result.status == "committed" and result.pushed is in_script, result
        if i >= 40:
            timings[in_script].append(elapsed)
    out["commit, then publish (two round trips; alternating, median)"] = round(
        statistics.median(timings[False]), 1
    )
    out["commit publishing in its script (one round trip; alternating, median)"] = round(
        statistics.median(timings[True]), 1
    )
    builder.close()
    for queue in (QUEUE_MODEL, QUEUE_TOOLS):
        store.redis.delete(queue)
    return out


def _registry_cost(store: RunStore, settings: Settings, n: int) -> float:
    """``Client.submit``'s check that a live worker serves the agent, with two workers listed."""
    beat = register_scripts(store.redis)["worker_beat"]
    agents = describe_agents(load_registry(settings.agents_module))
    for i in (1, 2):
        record = WorkerRecord(
            id=f"w{i}@micro",
            host="micro",
            pid=i,
            queues=[QUEUE_MODEL, QUEUE_TOOLS],
            pool="prefork",
            concurrency=1,
            agents=agents,
            started_at=time.time(),
            consuming=True,
            consumer_state="consuming",
        )
        beat(
            keys=[store.keys.worker(record.id), store.keys.workers()],
            args=[record.id, record.model_dump_json(), 3_600_000],
        )
    directory = WorkerDirectory(store.redis, store.keys, settings.registry_interval_s)
    assert "long" in directory.agents()
    return _time(lambda: "long" in directory.agents(), n)


def measure(url: str, n: int) -> dict[str, Any]:
    settings = Settings(redis_url=url, prefix="micro:", agents_module="benchmarks.agents")
    store = RunStore(connect(settings), settings)
    retaking = RunStore(store.redis, settings.with_(lease_s=1e-4))  # a 0 ms lease, see _claim_costs
    app = Celery("micro", set_as_current=False)
    app.conf.update(celery_config(settings))
    r = store.redis
    out: dict[str, Any] = {"n": n}
    out["redis PING round trip"] = _time(r.ping, n)
    out["redis HEXISTS"] = _time(lambda: r.hexists("micro:x", "y"), n)
    out["celery send_task (next phase publish)"] = _time(
        lambda: app.send_task(
            "wesichain.noop",
            kwargs={"run_id": "x", "step": 1, "version": 2, "epoch": 0},
            task_id=uuid.uuid4().hex,
        ),
        n,
    )
    app_events = Celery("micro-events", set_as_current=False)
    app_events.conf.update(celery_config(settings.with_(task_events=True)))
    out["celery send_task, task events on (WESICHAIN_TASK_EVENTS=1)"] = _time(
        lambda: app_events.send_task("wesichain.noop", kwargs={"run_id": "x"}, task_id=uuid.uuid4().hex), n
    )
    r.delete(QUEUE_MODEL)
    out["Client.submit agent check (WorkerDirectory.agents, 2 workers)"] = _registry_cost(store, settings, n)
    for steps in (1, 50):
        out.update(_per_step_costs(store, retaking, steps, n))
    out.update(_claim_costs(retaking, n))
    out.update(_write_costs(store, n))
    out.update(_publish_costs(store, app, n))
    h = new_run(store, 1).head
    out["RunHead.dump_body"] = _time(h.dump_body, n)
    out["RunHead.compose (body + request)"] = _time(
        lambda: RunHead.compose(h.dump_body(), h.dump_request(), 0), n
    )
    out["task_for + TaskSpec.model_dump_json"] = _time(lambda: [t.model_dump_json() for t in task_for(h)], n)
    store.redis.close()
    return out


# -- the sweeper's broker probe


def _publish(app: Celery, count: int, into: list[str]) -> None:
    """Publish ``count`` tool tasks the way a worker does (``send_task``, routed to the tool queue)."""
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            run_id = uuid.uuid4().hex
            task_id = f"{run_id}:v3:tool:call_0"
            app.send_task(
                TASK_TOOL,
                kwargs={"run_id": run_id, "step": 1, "version": 3, "epoch": 0, "call_id": "call_0"},
                task_id=task_id,
                producer=producer,
            )
            into.append(task_id)


def _locate_stats(r: redis.Redis, probe: RedisQueues, ids: Sequence[str], calls: int) -> dict[str, Any]:
    """Wall time of ``locate(ids)`` over ``calls`` calls, and how long its scan chunks held Redis.

    Redis runs one script at a time, so a scan chunk's execution time is how long it keeps every
    other client waiting: the slow log (threshold 0) gives the longest, command statistics the sum.
    """
    probe.locate(ids)  # warm: scripts loaded, connection open
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    r.config_resetstat()
    samples = []
    located = None
    for _ in range(calls):
        started = time.perf_counter()
        located = probe.locate(ids)
        samples.append((time.perf_counter() - started) * 1000)
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    # Chunks of the tool queue's list (the others are empty: one LRANGE of nothing each).
    chunk_us = [int(e["duration"]) for e in r.slowlog_get(100_000) if _scans(e, QUEUE_TOOLS)]
    r.config_set("slowlog-log-slower-than", 10_000)
    return {
        "ms_p50": round(statistics.median(samples), 3),
        "ms_min": round(min(samples), 3),
        "ms_max": round(max(samples), 3),
        "scan_chunks_per_locate": round(int(stats.get("calls", 0)) / calls, 1),
        "redis_ms_per_locate": round(int(stats.get("usec", 0)) / calls / 1000, 3),
        "tool_queue_chunk_us_p50": round(statistics.median(chunk_us)) if chunk_us else 0,
        "tool_queue_chunk_us_max": max(chunk_us, default=0),
        "found_queued": len(located.queued) if located else 0,
    }


def _scans(entry: dict[str, Any], key: str) -> bool:
    """Is this slow-log entry a scan chunk of ``key`` (``EVALSHA sha 1 key start count ids...``)?"""
    command = entry.get("command", b"")
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    words = text.split(" ")
    return len(words) > 3 and words[0].lower() == "evalsha" and words[3] == key


def measure_probe(url: str, sizes: Sequence[int], calls: int) -> dict[str, Any]:
    """``RedisQueues.locate`` for 10 task ids against tool queues of growing depth.

    The queue is filled by a Celery app with the runtime's configuration, as workers publish (no
    worker consumes it). Three cases per depth: the 10 oldest messages (a backlog: Celery pushes
    on the left and workers pop on the right, so the scan, which reads from the left, meets them
    last), the 10 newest (met first), and 10 ids the broker does not hold (a lost message: every
    queue list is read to its end, then the ``unacked`` hash, empty here with no worker).
    """
    settings = Settings(redis_url=url)
    r = connect(settings)
    r.flushdb()
    app = Celery("micro-probe", set_as_current=False)
    app.conf.update(celery_config(settings))
    # As the worker builds it (worker.app.RuntimeHolder.probe): both queues, no key prefix.
    probe = RedisQueues(r, [QUEUE_MODEL, QUEUE_TOOLS], prefix="")
    published: list[str] = []
    out: dict[str, Any] = {"calls_per_case": calls, "ids_per_locate": 10}
    for size in sorted(sizes):
        started = time.perf_counter()
        _publish(app, size - len(published), published)
        depth = int(r.llen(QUEUE_TOOLS))
        assert depth == size, (depth, size)
        cases = {
            "oldest": published[:10],
            "newest": published[-10:],
            "absent": [f"{uuid.uuid4().hex}:v3:tool:call_0" for _ in range(10)],
        }
        row: dict[str, Any] = {
            "publish_s": round(time.perf_counter() - started, 1),
            "message_bytes": len(r.lindex(QUEUE_TOOLS, 0) or ""),
        }
        for case, ids in cases.items():
            row[case] = _locate_stats(r, probe, ids, calls)
            expected = 0 if case == "absent" else 10
            assert row[case]["found_queued"] == expected, (case, row[case])
        out[f"queue of {size}"] = row
    r.flushdb()
    r.close()
    return out


def _print(out: dict[str, Any], probe: dict[str, Any] | None) -> None:
    width = max(len(k) for k in out)
    for k, v in out.items():
        print(f"{k:<{width}}  {v:>9} {'µs' if k != 'n' else ''}")
    if not probe:
        return
    print()
    print(
        "RedisQueues.locate, 10 ids: wall ms per call (p50 / max), scan chunks per call, Redis busy"
        " ms per call, µs one chunk of the tool queue holds Redis (p50 / max)"
    )
    for key, row in probe.items():
        if not isinstance(row, dict):
            continue
        cells = [
            f"{case} {row[case]['ms_p50']:.2f} / {row[case]['ms_max']:.2f} ms,"
            f" {row[case]['scan_chunks_per_locate']:.0f} chunks, {row[case]['redis_ms_per_locate']:.2f} ms,"
            f" {row[case]['tool_queue_chunk_us_p50']} / {row[case]['tool_queue_chunk_us_max']} µs"
            for case in ("oldest", "newest", "absent")
        ]
        print(f"  {key}:")
        for cell in cells:
            print(f"    {cell}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=400)
    p.add_argument(
        "--probe-sizes",
        default=",".join(str(s) for s in PROBE_SIZES),
        help="comma-separated tool-queue depths for the broker probe ('' skips it)",
    )
    p.add_argument("--probe-calls", type=int, default=20, help="timed locate calls per case")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="micro", help="base name of the JSON file")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.probe_sizes.split(",") if s.strip()]
    server = RedisServer().start()
    try:
        out = measure(server.url, args.n)
        probe = measure_probe(server.url, sizes, args.probe_calls) if sizes else None
    finally:
        server.cleanup()
    _print(out, probe)
    args.out.mkdir(parents=True, exist_ok=True)
    out["hiredis"] = bool(redis.utils.HIREDIS_AVAILABLE)
    if probe is not None:
        out["broker_probe"] = probe
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
