"""The benchmark scenarios. Each returns a dict: settings, metrics, targets and gated metrics.

Every target is a ratio of two figures measured in the same scenario, interleaved round by round
(this machine's speed drifts 20-35 % between runs, and other load comes and goes within one).

Timing sources:

* client latency: ``time.perf_counter`` around submit and the end event (read with XREAD BLOCK);
* transition times: ``updated_at`` of the committed checkpoints (``RunStore.checkpoints``), stamped
  by the worker when it computes each transition; one step of a one-tool run is three Celery tasks
  (think, tool, observe), so the time from one step's THINKING head to the next is three transitions;
* bare hops: the first hop of a chain stamps its start, the last its end.
"""

from __future__ import annotations

import functools
import re
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from benchmarks import bare
from benchmarks.agents import SLOW_LATENCY_S, SLOW_SUFFIX
from benchmarks.compare import LATENCY_UNIT
from benchmarks.harness import (
    Cluster,
    PeakRss,
    PersistentRedisServer,
    bare_chain,
    check,
    new_prefix,
    pid_cpu_s,
    process_cpu_s,
    ratio,
    run_and_wait,
    settled_rss,
    summary,
    wait_all_terminal,
    worker_rss,
)
from producer.client import Client
from shared import protocol
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS
from shared.state import Phase, RunHead
from worker.testing.harness import wait_until

#: Tasks per step of a one-tool step: think, tool, observe.
TASKS_PER_TOOL_STEP = 3
#: The unit of a latency gate: a scenario's latency over its floor in the same run, the model's
#: time plus one bare Celery hop per transition (``compare.py`` reads results in it).
LATENCY_NORM_UNIT = LATENCY_UNIT
#: Celery's task_received probe loaded into the backlog's workers (``--include``), and the hash
#: it counts deliveries in. The benchmark process itself does not import it: it would connect the
#: signal receiver here too.
DELIVERY_PROBE = "tests.delivery_probe"
DELIVERIES_KEY = "test:deliveries"
#: The backlog scenario: queued lease of its workers, its tool's duration, tasks per run.
BACKLOG_QUEUED_LEASE_S = 2
BACKLOG_TOOL_S = 0.05
TASKS_PER_BACKLOG_RUN = 5


@dataclass
class Sizes:
    scenario_runs: int
    scenario_slow_runs: int
    transition_rounds: int
    long_steps: int
    bare_hops: int
    fanout_rounds: int
    throughput_runs: int
    throughput_steps: int
    throughput_rounds: int
    memory_runs: int
    peer_reps: int
    durability_rounds: int
    backlog_runs: int


QUICK = Sizes(
    scenario_runs=12,
    scenario_slow_runs=3,
    transition_rounds=3,
    long_steps=50,
    bare_hops=150,
    fanout_rounds=2,
    throughput_runs=12,
    throughput_steps=10,
    throughput_rounds=2,
    memory_runs=1_000,
    peer_reps=5,
    durability_rounds=2,
    backlog_runs=120,
)
FULL = Sizes(
    scenario_runs=40,
    scenario_slow_runs=10,
    transition_rounds=8,
    long_steps=50,
    bare_hops=150,
    fanout_rounds=5,
    throughput_runs=24,
    throughput_steps=10,
    throughput_rounds=6,
    memory_runs=10_000,
    peer_reps=20,
    durability_rounds=6,
    backlog_runs=600,
)


@dataclass
class Context:
    cluster: Cluster
    sizes: Sizes
    quick: bool
    cache: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = print


def _ms(seconds: float) -> float:
    return seconds * 1000


def _gate(
    gid: str,
    kind: str,
    value: float,
    unit: str,
    *,
    better: str = "lower",
    normalized: float | None = None,
    norm_unit: str | None = None,
) -> dict[str, Any]:
    """A metric compare.py gates on: kind p50/p95 (latency), memory, or ratio (a target)."""
    g: dict[str, Any] = {"id": gid, "kind": kind, "value": round(value, 3), "unit": unit, "better": better}
    if normalized is not None:
        g["normalized"] = round(normalized, 4)
        g["normalized_unit"] = norm_unit
    return g


def _bare_reference(floor: Any, app: Any, n: int, hops: int) -> list[float]:
    return [bare_chain(floor, app, bare.TASK_HOP, hops) for _ in range(n)]


def _checkpoints(client: Client, run_id: str) -> list[RunHead]:
    return client.store.checkpoints(run_id)


def step_intervals_ms(cps: list[RunHead]) -> dict[int, float]:
    """Milliseconds from step k's THINKING head to step k+1's: one think, one tool, one observe."""
    thinking: dict[int, float] = {}
    for cp in cps:
        if cp.phase is Phase.THINKING and cp.step not in thinking:
            thinking[cp.step] = cp.updated_at
    return {k: _ms(thinking[k + 1] - t) for k, t in thinking.items() if k + 1 in thinking}


# -- 1. the four scenarios

#: agent -> (input, model calls a completed run makes)
SCENARIOS: dict[str, tuple[str, int]] = {
    "direct": ("What is the answer?", 1),
    "one_hop": ("Add 1 and 2.", 2),
    "chain": ("Add three pairs, one after the other.", 4),
    "recover": ("Add 1 and 1 (the first reply is malformed).", 3),
}


def scenario_latency(ctx: Context) -> dict[str, Any]:
    """Short answer, one tool hop, a three-hop chain and a malformed reply recovered by a reprompt."""
    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("latency")
    w = cl.wesichain_worker("lat-w", prefix)
    b = cl.bare_worker("lat-b")
    cl.up(w, b)
    client = cl.client(prefix)
    bare_app = bare.make_app(cl.floor_url)
    floor = cl.floor_redis()
    try:
        hops_ref = _bare_reference(floor, bare_app, 3, 100)
        for agent, (text, _) in SCENARIOS.items():  # warm-up: imports, connections, scripts
            run_and_wait(client, agent, text)
        results: dict[str, Any] = {}
        gated: list[dict[str, Any]] = []
        for variant, suffix, n in (
            ("0ms", "", sz.scenario_runs),
            ("200ms", SLOW_SUFFIX, sz.scenario_slow_runs),
        ):
            for agent, (text, calls) in SCENARIOS.items():
                latencies: list[float] = []
                server: list[float] = []
                heads: list[RunHead] = []
                with PeakRss([w]) as peak:
                    for _ in range(n):
                        head, ms = run_and_wait(client, agent, text, model=f"scripted:{agent}{suffix}")
                        if head.phase is not Phase.COMPLETED:
                            raise RuntimeError(f"{agent} ended {head.phase}: {head.error}")
                        latencies.append(ms)
                        server.append(_ms(head.updated_at - head.created_at))
                        heads.append(head)
                hops_ref.extend(_bare_reference(floor, bare_app, 1, 100))
                model_ms = calls * _ms(SLOW_LATENCY_S) if suffix else 0.0
                lat = summary(latencies)
                key = f"{agent}@{variant}"
                results[key] = {
                    "agent": agent,
                    "model_latency_ms": _ms(SLOW_LATENCY_S) if suffix else 0,
                    "latency_ms": lat,
                    "server_latency_ms": summary(server),
                    "overhead_p50_ms": round(lat["p50"] - model_ms, 3),
                    "peak_worker_rss_mib": round(peak.peak, 1),
                    "steps": heads[-1].step,
                    "model_calls": calls,
                    "transitions": heads[-1].version - 1,
                    "reprompts": heads[-1].reprompts,
                }
                ctx.log(
                    f"  {key:<18} p50 {lat['p50']:8.2f} ms  p95 {lat['p95']:8.2f} ms"
                    f"  peak {peak.peak:6.1f} MiB  steps {heads[-1].step}"
                )
        hop = statistics.median(hops_ref)
        bare_rss = settled_rss(b)["total_mib"]
        for key, r in results.items():
            model_ms = r["model_calls"] * r["model_latency_ms"]
            # A run's floor in the same run: its model's time plus one bare hop per transition.
            # Gating the overhead alone in bare hops held for the 0 ms model (its floor is the
            # hops), but not for the 200 ms one: its overhead holds a per-call part that does not
            # scale with the hop (the worker waking from 200 ms idle, the sleep's own overshoot),
            # so a machine with faster hops read as a regression while every latency fell.
            floor_ms = model_ms + r["transitions"] * hop
            for q in ("p50", "p95"):
                gated.append(
                    _gate(
                        f"latency.{key}.{q}",
                        q,
                        r["latency_ms"][q],
                        "ms",
                        normalized=r["latency_ms"][q] / floor_ms,
                        norm_unit=LATENCY_NORM_UNIT,
                    )
                )
            gated.append(
                _gate(
                    f"latency.{key}.peak_rss",
                    "memory",
                    r["peak_worker_rss_mib"],
                    "MiB",
                    normalized=r["peak_worker_rss_mib"] / bare_rss,
                    norm_unit="x bare worker RSS",
                )
            )
        return {
            "settings": {
                "worker": "1 x wesichain worker, prefork, concurrency 1",
                "runs": sz.scenario_runs,
                "runs_200ms": sz.scenario_slow_runs,
                "client": "submit -> end event (XREAD BLOCK)",
            },
            "metrics": {
                "bare_hop_ms": summary(hops_ref),
                "bare_worker_rss_mib": bare_rss,
                "scenarios": results,
            },
            "targets": {},
            "gated": gated,
        }
    finally:
        cl.down(w, b)
        client.close()
        floor.close()


# -- 2 and 3. per-transition overhead and flat cost in run length


#: The database of the commit-then-publish variant of the transition scenario (0: the runtime,
#: 1 and 2: the two floors).
TWO_STEP_DB = 3


def _long_runs(ctx: Context) -> dict[str, Any]:
    """Interleaved rounds of: a bare hop chain under the runtime's Celery configuration, one under
    Celery's defaults, a long run, the same run committing then publishing, and a bare state-hop
    chain (cached)."""
    if "long_runs" in ctx.cache:
        cached: dict[str, Any] = ctx.cache["long_runs"]
        return cached
    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("transition")
    w = cl.wesichain_worker("tr-w", prefix)
    w2 = cl.wesichain_worker("tr-w2", prefix, env={"WESICHAIN_COMMIT_PUBLISH": "0"}, db=TWO_STEP_DB)
    b = cl.bare_worker("tr-b")
    d = cl.bare_worker("tr-d", floor="defaults")
    cl.up(w, w2, b, d)
    client = cl.client(prefix)
    client2 = cl.client(prefix, TWO_STEP_DB)
    bare_app = bare.make_app(cl.floor_url)
    defaults_app = bare.make_app(cl.defaults_url, floor="defaults")
    floor = cl.floor_redis()
    defaults_floor = Redis.from_url(cl.defaults_url, decode_responses=True)
    text = f"steps={sz.long_steps}"
    try:
        run_and_wait(client, "long", "steps=5")  # warm-up
        run_and_wait(client2, "long", "steps=5")
        bare_chain(floor, bare_app, bare.TASK_HOP, 50)
        bare_chain(defaults_floor, defaults_app, bare.TASK_HOP, 50)
        bare_chain(floor, bare_app, bare.TASK_STATE_HOP, 50)
        hop: list[float] = []
        defaults_hop: list[float] = []
        state_hop: list[float] = []
        per_transition: list[float] = []
        run_medians: list[float] = []
        two_step: list[float] = []
        per_step: dict[int, list[float]] = {}
        whole_run: list[float] = []
        round_ratios: list[float] = []
        defaults_ratios: list[float] = []
        two_step_ratios: list[float] = []
        redis_pid = cl.redis.proc.pid if cl.redis.proc else 0
        cpu: dict[str, list[dict[str, float]]] = {
            "hop": [],
            "defaults": [],
            "run": [],
            "two_step": [],
            "state": [],
        }

        def cpu_of(worker: Any, fn: Callable[[], Any], count: Callable[[Any], int], what: str) -> Any:
            before, redis_before = process_cpu_s(worker), pid_cpu_s(redis_pid)
            value = fn()
            after, redis_after = process_cpu_s(worker), pid_cpu_s(redis_pid)
            n = count(value)
            cpu[what].append(
                {
                    "main": 1000 * (after["main"] - before["main"]) / n,
                    "child": 1000 * (after["children"] - before["children"]) / n,
                    "redis": 1000 * (redis_after - redis_before) / n,
                }
            )
            return value

        def long_run(c: Client, worker: Any, what: str) -> tuple[RunHead, dict[int, float]]:
            head, _ = cpu_of(worker, lambda: run_and_wait(c, "long", text), lambda v: v[0].version - 1, what)
            assert head.phase is Phase.COMPLETED, head
            return head, step_intervals_ms(_checkpoints(c, head.run_id))

        with PeakRss([w]) as peak_w, PeakRss([b]) as peak_b:
            for r in range(sz.transition_rounds):
                order = ["hop", "defaults", "run", "two_step", "state"]
                if r % 2:
                    order.reverse()
                got: dict[str, float] = {}
                for what in order:
                    if what in ("hop", "defaults"):
                        worker, r_, app_ = (
                            (b, floor, bare_app) if what == "hop" else (d, defaults_floor, defaults_app)
                        )
                        got[what] = cpu_of(
                            worker,
                            functools.partial(bare_chain, r_, app_, bare.TASK_HOP, sz.bare_hops),
                            lambda _: sz.bare_hops,
                            what,
                        )
                        (hop if what == "hop" else defaults_hop).append(got[what])
                    elif what == "state":
                        state_hop.append(
                            cpu_of(
                                b,
                                lambda: bare_chain(floor, bare_app, bare.TASK_STATE_HOP, sz.bare_hops),
                                lambda _: sz.bare_hops,
                                "state",
                            )
                        )
                    elif what == "two_step":
                        _, steps = long_run(client2, w2, "two_step")
                        got["two_step"] = statistics.median(v / TASKS_PER_TOOL_STEP for v in steps.values())
                        two_step.append(got["two_step"])
                    else:
                        head, steps = long_run(client, w, "run")
                        values = [v / TASKS_PER_TOOL_STEP for v in steps.values()]
                        per_transition.extend(values)
                        run_medians.append(statistics.median(values))
                        got["run"] = run_medians[-1]
                        for k, v in steps.items():
                            per_step.setdefault(k, []).append(v / TASKS_PER_TOOL_STEP)
                        cps = _checkpoints(client, head.run_id)
                        first = next(cp for cp in cps if cp.phase is Phase.THINKING)
                        whole_run.append(
                            _ms(head.updated_at - first.updated_at) / (head.version - first.version)
                        )
                round_ratios.append(got["run"] / got["hop"])
                defaults_ratios.append(got["run"] / got["defaults"])
                two_step_ratios.append(got["two_step"] / got["hop"])
                ctx.log(
                    f"  round {r + 1}: bare hop {got['hop']:.3f} ms (Celery defaults {got['defaults']:.3f}),"
                    f" transition {got['run']:.3f} ms ({round_ratios[-1]:.2f}x, {defaults_ratios[-1]:.2f}x"
                    f" defaults), commit-then-publish {got['two_step']:.3f} ms ({two_step_ratios[-1]:.2f}x)"
                )
        data = {
            "hop": hop,
            "defaults_hop": defaults_hop,
            "state_hop": state_hop,
            "per_transition": per_transition,
            "run_medians": run_medians,
            "two_step": two_step,
            "whole_run": whole_run,
            "per_step": per_step,
            "round_ratios": round_ratios,
            "defaults_ratios": defaults_ratios,
            "two_step_ratios": two_step_ratios,
            "peak_w": peak_w.peak,
            "peak_b": peak_b.peak,
            "rss_w": worker_rss(w),
            "rss_b": worker_rss(b),
            "cpu": {
                k: {p: round(statistics.median(x[p] for x in v), 3) for p in ("main", "child", "redis")}
                for k, v in cpu.items()
                if v
            },
        }
        ctx.cache["long_runs"] = data
        return data
    finally:
        cl.down(w, w2, b, d)
        client.close()
        client2.close()
        floor.close()
        defaults_floor.close()


def scenario_transition(ctx: Context) -> dict[str, Any]:
    """Median time per committed transition of a long run vs one bare Celery hop, same app config."""
    d = _long_runs(ctx)
    sz = ctx.sizes
    hop = statistics.median(d["hop"])
    state = statistics.median(d["state_hop"])
    tr = statistics.median(d["per_transition"])
    # The verdict: the median of per-round ratios (each round runs both back to back, so load that
    # comes and goes between rounds cancels); the ratio of the pooled medians is reported beside it.
    value = statistics.median(d["round_ratios"])
    defaults_value = statistics.median(d["defaults_ratios"])
    return {
        "settings": {
            "worker": "wesichain and bare workers side by side, prefork, concurrency 1 each",
            "floor_defaults": "bare hop under Celery's defaults with only acks_late and prefetch 1",
            "commit_then_publish": "the same runs with WESICHAIN_COMMIT_PUBLISH=0, own database",
            "rounds": sz.transition_rounds,
            "long_run_steps": sz.long_steps,
            "bare_chain_hops": sz.bare_hops,
            "transition": "median over every step of (THINKING head k -> k+1) / 3",
            "verdict": "median of per-round ratios (run median / chain in the same round)",
        },
        "metrics": {
            "transition_ms": summary(d["per_transition"]),
            "transition_run_medians_ms": summary(d["run_medians"]),
            "transition_whole_run_mean_ms": summary(d["whole_run"]),
            "bare_hop_ms": summary(d["hop"]),
            "bare_hop_celery_defaults_ms": summary(d["defaults_hop"]),
            "bare_state_hop_ms": summary(d["state_hop"]),
            "per_round_ratio": summary(d["round_ratios"]),
            "per_round_ratio_celery_defaults": summary(d["defaults_ratios"]),
            "commit_then_publish_ms": summary(d["two_step"]),
            "commit_then_publish_per_round_ratio": summary(d["two_step_ratios"]),
            "runtime_hop_over_defaults_hop": ratio(hop, statistics.median(d["defaults_hop"])),
            "ratio_of_medians": ratio(tr, hop),
            "state_hop_over_hop": ratio(state, hop),
            "transition_over_state_hop": ratio(tr, state),
            "cpu_ms_per_transition": {
                "wesichain": d["cpu"].get("run"),
                "wesichain_commit_then_publish": d["cpu"].get("two_step"),
                "bare_hop": d["cpu"].get("hop"),
                "bare_hop_celery_defaults": d["cpu"].get("defaults"),
                "bare_state_hop": d["cpu"].get("state"),
            },
        },
        "targets": {
            "transition_over_bare_hop": check(value, 1.15, "<="),
            "transition_over_bare_hop_celery_defaults": check(defaults_value, 1.3, "<="),
        },
        "gated": [
            _gate("transition.ratio", "ratio", value, "x bare hop"),
            _gate(
                "transition.p95",
                "p95",
                summary(d["per_transition"])["p95"],
                "ms",
                normalized=summary(d["per_transition"])["p95"] / hop,
                norm_unit="bare hops",
            ),
        ],
    }


def scenario_flat(ctx: Context) -> dict[str, Any]:
    """Transition cost late in a long run against early in it (medians over a window and several runs)."""
    d = _long_runs(ctx)
    sz = ctx.sizes
    per_step: dict[int, list[float]] = d["per_step"]
    window = 5
    last = max(per_step)
    early = [v for k in range(1, 1 + window) for v in per_step.get(k, [])]
    late = [v for k in range(last - window + 1, last + 1) for v in per_step.get(k, [])]
    value = statistics.median(late) / statistics.median(early)
    xs = [k for k, vs in per_step.items() for _ in vs]
    ys = [v for vs in per_step.values() for v in vs]
    slope = statistics.linear_regression(xs, ys).slope if len(set(xs)) > 1 else 0.0
    return {
        "settings": {
            "runs": sz.transition_rounds,
            "steps": sz.long_steps,
            "early_steps": [1, window],
            "late_steps": [last - window + 1, last],
        },
        "metrics": {
            "early_transition_ms": summary(early),
            "late_transition_ms": summary(late),
            "slope_us_per_step": round(slope * 1000, 2),
            "median_by_step_ms": {k: round(statistics.median(v), 3) for k, v in sorted(per_step.items())},
        },
        "targets": {"late_over_early": check(value, 1.10, "<=")},
        "gated": [_gate("flat.ratio", "ratio", value, "x step-1 cost")],
    }


# -- 4. fan-out


def scenario_fanout(ctx: Context) -> dict[str, Any]:
    """One step with 8 tool calls of 500 ms on 8 worker slots against the same step with one call."""
    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("fanout")
    w = cl.wesichain_worker("fan-w", prefix, concurrency=8)
    cl.up(w)
    client = cl.client(prefix)
    seconds = 0.5
    try:
        run_and_wait(client, "fanout", "calls=8 seconds=0.05")  # every child imports and connects
        eight: list[float] = []
        one: list[float] = []
        with PeakRss([w]) as peak:
            for r in range(sz.fanout_rounds):
                for calls, into in ((8, eight), (1, one)) if r % 2 == 0 else ((1, one), (8, eight)):
                    head, _ = run_and_wait(client, "fanout", f"calls={calls} seconds={seconds}")
                    assert head.phase is Phase.COMPLETED, head
                    cps = _checkpoints(client, head.run_id)
                    acting = next(cp for cp in cps if cp.phase is Phase.ACTING)
                    after = next(
                        cp for cp in cps if cp.phase is Phase.THINKING and cp.step == acting.step + 1
                    )
                    into.append(_ms(after.updated_at - acting.updated_at))
                ctx.log(f"  round {r + 1}: 8 calls {eight[-1]:.1f} ms, 1 call {one[-1]:.1f} ms")
        m8, m1 = statistics.median(eight), statistics.median(one)
        speedup = 8 * m1 / m8
        return {
            "settings": {
                "worker": "1 x wesichain worker, prefork, concurrency 8",
                "tool_seconds": seconds,
                "rounds": sz.fanout_rounds,
                "measure": "ACTING checkpoint (dispatch) -> next THINKING checkpoint (observe commit)",
            },
            "metrics": {
                "eight_calls_ms": summary(eight),
                "one_call_ms": summary(one),
                "fan_in_overhead_ms": round(m8 - _ms(seconds), 3),
                "speedup_vs_sequential": round(speedup, 3),
                "peak_worker_rss_mib": round(peak.peak, 1),
            },
            "targets": {
                "eight_over_one": check(m8 / m1, 1.15, "<="),
                "speedup_vs_sequential": check(speedup, 7.0, ">="),
            },
            "gated": [
                _gate("fanout.ratio", "ratio", m8 / m1, "x one call"),
                _gate(
                    "fanout.p95",
                    "p95",
                    summary(eight)["p95"],
                    "ms",
                    normalized=summary(eight)["p95"] / m1,
                    norm_unit="x one-call p50",
                ),
                _gate("fanout.peak_rss", "memory", peak.peak, "MiB"),
            ],
        }
    finally:
        cl.down(w)
        client.close()


# -- 5. throughput


def scenario_throughput(ctx: Context) -> dict[str, Any]:
    """Committed transitions per second of many concurrent runs on 2 workers vs bare hop chains.

    Rounds alternate which system goes first; each round gives one paired ratio, and the verdict
    is their median (robust to a round disturbed by other load). CPU seconds of the workers and of
    redis-server per transition are measured too: on a CPU-bound machine they set the throughput.
    """
    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("throughput")
    ws = [cl.wesichain_worker(f"tp-w{i}", prefix) for i in (1, 2)]
    bs = [cl.bare_worker(f"tp-b{i}") for i in (1, 2)]
    cl.up(*ws, *bs)
    client = cl.client(prefix)
    bare_app = bare.make_app(cl.floor_url)
    floor = cl.floor_redis()
    text = f"steps={sz.throughput_steps}"
    redis_pid = cl.redis.proc.pid if cl.redis.proc else 0
    hops = 2 + TASKS_PER_TOOL_STEP * sz.throughput_steps  # as many tasks as one run has transitions

    def cpu(workers: list[Any]) -> float:
        return sum(sum(process_cpu_s(w).values()) for w in workers) + pid_cpu_s(redis_pid)

    def ours_round() -> tuple[float, float, int]:
        cpu0, t0 = cpu(ws), time.time()
        # Workers are known to be up (the registry was waited for): no per-submit check in the window.
        ids = [client.submit("long", text, check_agent=False).run_id for _ in range(sz.throughput_runs)]
        wait_all_terminal(client, ids, timeout=300)
        heads = [client.store.load(i) for i in ids]
        assert all(h is not None and h.phase is Phase.COMPLETED for h in heads)
        transitions = sum(h.version - 1 for h in heads if h)
        end = max(h.updated_at for h in heads if h)
        return transitions / (end - t0), 1000 * (cpu(ws) - cpu0) / transitions, transitions

    def bare_round() -> tuple[float, float]:
        chains = [uuid.uuid4().hex for _ in range(sz.throughput_runs)]
        cpu0, t0 = cpu(bs), time.time()
        for c in chains:
            bare_app.send_task(bare.TASK_HOP, kwargs={"chain": c, "hop": 0, "total": hops}, task_id=f"{c}:h0")
        keys = [bare.end_key(c) for c in chains]
        wait_until(lambda: floor.exists(*keys) == len(keys), timeout=300, interval=0.02, what="bare chains")
        end = max(float(v or 0) for v in floor.mget(keys))
        return hops * len(chains) / (end - t0), 1000 * (cpu(bs) - cpu0) / (hops * len(chains))

    try:
        run_and_wait(client, "long", "steps=2")
        bare_chain(floor, bare_app, bare.TASK_HOP, 20)
        ours, theirs, paired, cpu_ours, cpu_bare = [], [], [], [], []
        transitions = 0
        for rnd in range(sz.throughput_rounds):
            got: dict[str, float] = {}
            for what in ("bare", "ours") if rnd % 2 == 0 else ("ours", "bare"):
                if what == "ours":
                    got["ours"], c, transitions = ours_round()
                    ours.append(got["ours"])
                    cpu_ours.append(c)
                else:
                    got["bare"], c = bare_round()
                    theirs.append(got["bare"])
                    cpu_bare.append(c)
            paired.append(got["ours"] / got["bare"])
            ctx.log(
                f"  round {rnd + 1}: {got['ours']:.0f} transitions/s vs bare {got['bare']:.0f} hops/s"
                f" ({paired[-1]:.2f}x); CPU {cpu_ours[-1]:.2f} vs {cpu_bare[-1]:.2f} ms per transition"
            )
        value = statistics.median(paired)
        return {
            "settings": {
                "workers": "2 x wesichain worker vs 2 x bare worker, prefork, concurrency 1 each",
                "concurrent_runs": sz.throughput_runs,
                "steps_per_run": sz.throughput_steps,
                "transitions_per_run": transitions // max(1, sz.throughput_runs),
                "bare_hops_per_chain": hops,
                "rounds": sz.throughput_rounds,
                "verdict": "median of per-round paired ratios",
            },
            "metrics": {
                "transitions_per_s": summary(ours, 1),
                "bare_hops_per_s": summary(theirs, 1),
                "paired_ratio": summary(paired),
                "ratio_of_medians": ratio(statistics.median(ours), statistics.median(theirs)),
                "cpu_ms_per_transition": summary(cpu_ours),
                "bare_cpu_ms_per_hop": summary(cpu_bare),
                "cpu_ratio": ratio(statistics.median(cpu_ours), statistics.median(cpu_bare)),
            },
            "targets": {"throughput_over_bare": check(value, 0.85, ">=")},
            "gated": [_gate("throughput.ratio", "ratio", value, "x bare throughput", better="higher")],
        }
    finally:
        cl.down(*ws, *bs)
        client.close()
        floor.close()


# -- 6. memory


def _run_many(client: Client, agent: str, text: str, n: int, window: int = 48) -> None:
    """Keep ``window`` runs in flight until ``n`` have finished."""
    r = client.store.redis
    terminal = {p.value for p in Phase if p.terminal}
    in_flight: list[str] = []
    submitted = 0
    deadline = time.monotonic() + 900
    while submitted < n or in_flight:
        while submitted < n and len(in_flight) < window:
            in_flight.append(client.submit(agent, text, check_agent=False).run_id)
            submitted += 1
        time.sleep(0.02)
        pipe = r.pipeline(transaction=False)
        for run_id in in_flight:
            pipe.hget(client.store.keys.run(run_id), protocol.PHASE)
        phases = pipe.execute()
        failed = [p for p in phases if p in terminal and p != Phase.COMPLETED.value]
        if failed:
            raise RuntimeError(f"runs ended {failed[:3]}")
        in_flight = [i for i, p in zip(in_flight, phases, strict=True) if p not in terminal]
        if time.monotonic() > deadline:
            raise TimeoutError("memory soak did not finish")


def _run_bytes(client: Client, run_id: str) -> dict[str, int]:
    """MEMORY USAGE of every key of one run, grouped by kind (per-step keys summed)."""
    r = client.store.redis
    run_key = client.store.keys.run(run_id)
    pattern = run_key.replace("{", "\\{").replace("}", "\\}") + "*"
    sizes: dict[str, int] = {}
    for key in r.scan_iter(match=pattern):
        kind = re.sub(r"step:\d+:", "step:*:", key[len(run_key) :].lstrip(":")) or "head"
        sizes[kind] = sizes.get(kind, 0) + int(r.memory_usage(key, samples=0) or 0)
    sizes = dict(sorted(sizes.items()))
    sizes["total"] = sum(sizes.values())
    return sizes


def scenario_memory(ctx: Context) -> dict[str, Any]:
    """Worker RSS vs a bare worker of the same pool; growth across many runs; Redis bytes per run."""
    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("memory")
    w = cl.wesichain_worker("mem-w", prefix)
    b = cl.bare_worker("mem-b")
    cl.up(w, b)
    client = cl.client(prefix)
    bare_app = bare.make_app(cl.floor_url)
    floor = cl.floor_redis()
    r = client.store.redis
    try:
        per_run: dict[str, dict[str, int]] = {}
        for agent, (text, _) in SCENARIOS.items():
            head, _ = run_and_wait(client, agent, text)
            per_run[agent] = _run_bytes(client, head.run_id)
        head, _ = run_and_wait(client, "long", "steps=50")
        per_run["long50"] = _run_bytes(client, head.run_id)
        # 800 tasks: a warm child, well short of worker_max_tasks_per_child (1000).
        bare_chain(floor, bare_app, bare.TASK_HOP, 400)
        bare_chain(floor, bare_app, bare.TASK_STATE_HOP, 400)
        warm_runs = max(100, sz.memory_runs // 10)
        _run_many(client, "direct", "hi", warm_runs)
        rss_w_warm, rss_b = settled_rss(w), settled_rss(b)
        used_before = int(r.info("memory")["used_memory"])
        ctx.log(
            f"  after {warm_runs} runs: worker {rss_w_warm['total_mib']} MiB, bare {rss_b['total_mib']} MiB"
        )
        samples: list[dict[str, Any]] = []
        done = 0
        chunk = max(1, (sz.memory_runs - warm_runs) // 5)
        with PeakRss([w], interval_s=0.2) as peak:
            while done < sz.memory_runs - warm_runs:
                n = min(chunk, sz.memory_runs - warm_runs - done)
                _run_many(client, "direct", "hi", n)
                done += n
                samples.append({"runs": warm_runs + done, **settled_rss(w)})
                ctx.log(
                    f"  after {warm_runs + done} runs: worker {samples[-1]['total_mib']} MiB"
                    f" (main {samples[-1]['main_mib']})"
                )
        used_after = int(r.info("memory")["used_memory"])
        bare_chain(floor, bare_app, bare.TASK_HOP, 100)
        rss_b_end = settled_rss(b)
        end = samples[-1]
        growth = end["total_mib"] - rss_w_warm["total_mib"]
        growth_main = end["main_mib"] - rss_w_warm["main_mib"]
        measured_runs = sz.memory_runs - warm_runs
        rss_ratio = rss_w_warm["total_mib"] / rss_b["total_mib"]
        return {
            "settings": {
                "workers": "1 x wesichain worker vs 1 x bare worker, prefork, concurrency 1",
                "runs": sz.memory_runs,
                "warm_up_runs": warm_runs,
                "agent": "direct",
                "in_flight": 48,
                "worker_max_tasks_per_child": 1000,
                "rss": "sum of main process and pool children (psutil RSS)",
            },
            "metrics": {
                "worker_rss_mib": rss_w_warm,
                "bare_worker_rss_mib": rss_b,
                "bare_worker_rss_end_mib": rss_b_end,
                "worker_rss_samples": samples,
                "peak_worker_rss_mib": round(peak.peak, 1),
                "growth_mib": round(growth, 2),
                "growth_main_mib": round(growth_main, 2),
                "redis_bytes_per_run": round((used_after - used_before) / measured_runs),
                "redis_key_bytes_by_scenario": per_run,
            },
            "targets": {
                "rss_over_bare": check(rss_ratio, 1.10, "<="),
                "growth_mib": check(growth, 5.0, "<="),
            },
            "gated": [
                _gate(
                    "memory.rss",
                    "memory",
                    rss_w_warm["total_mib"],
                    "MiB",
                    normalized=rss_ratio,
                    norm_unit="x bare worker RSS",
                ),
                _gate(
                    "memory.peak_rss",
                    "memory",
                    peak.peak,
                    "MiB",
                    normalized=peak.peak / rss_b["total_mib"],
                    norm_unit="x bare worker RSS",
                ),
                _gate(
                    "memory.redis_bytes_per_run", "memory", (used_after - used_before) / measured_runs, "B"
                ),
            ],
        }
    finally:
        cl.down(w, b)
        client.close()
        floor.close()


# -- 7. peers


def scenario_peers(ctx: Context) -> dict[str, Any]:
    """The multi-hop chain (and the 50-step run) here, on an asyncio loop and on LangGraph."""
    from benchmarks.peers import LangGraphPeer, asyncio_run, langgraph_available

    cl, sz = ctx.cluster, ctx.sizes
    prefix = new_prefix("peers")
    w = cl.wesichain_worker("peer-w", prefix)
    cl.up(w)
    client = cl.client(prefix)
    missing = langgraph_available()
    cases = {"chain": SCENARIOS["chain"][0], "long50": "steps=50"}
    agents = {"chain": "chain", "long50": "long"}
    reps = {"chain": sz.peer_reps, "long50": max(2, sz.peer_reps // 4)}
    peers = ["none", "memory", "sqlite", "sqlite-wal"] if missing is None else []
    lg = {kind: LangGraphPeer(kind) for kind in peers}
    table: dict[str, dict[str, Any]] = {}
    try:
        for case, text in cases.items():
            agent = agents[case]
            run_and_wait(client, agent, text)
            asyncio_run(agent, text)
            for p in lg.values():
                p.run(agent, text)
            ours_tr: list[float] = []
            ours_step: list[float] = []
            aio_step: list[float] = []
            lg_node: dict[str, list[float]] = {k: [] for k in lg}
            lg_step: dict[str, list[float]] = {k: [] for k in lg}
            for _ in range(reps[case]):  # interleaved, so load drifts hit every system alike
                head, _ = run_and_wait(client, agent, text)
                assert head.phase is Phase.COMPLETED
                total = _ms(head.updated_at - head.created_at)
                ours_tr.append(total / (head.version - 1))
                ours_step.append(total / head.step)
                _, calls, seconds = asyncio_run(agent, text)
                aio_step.append(_ms(seconds) / calls)
                for kind, p in lg.items():
                    _, calls, nodes, seconds = p.run(agent, text)
                    lg_node[kind].append(_ms(seconds) / nodes)
                    lg_step[kind].append(_ms(seconds) / calls)
            row: dict[str, Any] = {
                "wesichain_per_transition_ms": summary(ours_tr),
                "wesichain_per_step_ms": summary(ours_step),
                "asyncio_per_step_ms": summary(aio_step),
            }
            for kind in lg:
                row[f"langgraph_{kind}_per_node_ms"] = summary(lg_node[kind])
                row[f"langgraph_{kind}_per_step_ms"] = summary(lg_step[kind])
            table[case] = row
            ctx.log(
                f"  {case}: ours {row['wesichain_per_transition_ms']['p50']:.3f} ms/transition"
                + "".join(
                    f", langgraph[{k}] {row[f'langgraph_{k}_per_node_ms']['p50']:.3f} ms/node" for k in lg
                )
            )
    finally:
        for p in lg.values():
            p.close()
        cl.down(w)
        client.close()
    result: dict[str, Any] = {
        "settings": {
            "worker": "1 x wesichain worker, prefork, concurrency 1 (distributed, every phase a task)",
            "peers": "in the benchmark process: asyncio loop; LangGraph StateGraph + ToolNode",
            "reps": reps,
            "per_transition": "(terminal updated_at - created_at) / transitions",
            "per_node": "invoke() wall time / nodes executed (agent + tools)",
        },
        "metrics": table,
        "targets": {},
        "gated": [],
    }
    if missing is not None:
        result["skipped"] = f"LangGraph not importable: {missing}"
        result["notes"] = ["LangGraph columns skipped; the asyncio loop still ran."]
        return result
    ours = table["chain"]["wesichain_per_transition_ms"]["p50"]
    theirs = table["chain"]["langgraph_sqlite_per_node_ms"]["p50"]
    wal = table["chain"]["langgraph_sqlite-wal_per_node_ms"]["p50"]
    memory = table["chain"]["langgraph_memory_per_node_ms"]["p50"]
    result["targets"] = {"transition_over_langgraph_sqlite_node": check(ours / theirs, 1.0, "<=")}
    result["ratios"] = {
        "transition_over_langgraph_sqlite_node": ratio(ours, theirs),
        "transition_over_langgraph_sqlite_wal_node": ratio(ours, wal),
        "transition_over_langgraph_memory_node": ratio(ours, memory),
    }
    result["notes"] = [
        "LangGraph's SQLite saver with SQLite's defaults waits for an fsync on every checkpoint write;"
        " the Redis here runs without persistence (as the test harness starts it). The sqlite-wal row"
        f" (WAL, synchronous=NORMAL, no fsync per commit) is the like-for-like one: ratio {ratio(ours, wal)}."
    ]
    result["gated"] = [_gate("peers.ratio", "ratio", ours / theirs, "x LangGraph SQLite node")]
    return result


# -- 8. durability: the run-state Redis with and without an fsync'd append-only file

#: mode -> the redis-server's appendfsync (None: no AOF, the harness's default).
DURABILITY_MODES: dict[str, str | None] = {
    "no-aof": None,
    "aof-everysec": "everysec",
    "aof-always": "always",
}


def _transition_ms(client: Client, text: str) -> tuple[float, RunHead]:
    """One long run: the median of its per-step transition times (THINKING k -> k+1, / 3)."""
    head, _ = run_and_wait(client, "long", text)
    if head.phase is not Phase.COMPLETED:
        raise RuntimeError(f"long run ended {head.phase}: {head.error}")
    steps = step_intervals_ms(_checkpoints(client, head.run_id))
    return statistics.median(v / TASKS_PER_TOOL_STEP for v in steps.values()), head


def scenario_durability(ctx: Context) -> dict[str, Any]:
    """Per-transition time with the run-state Redis at appendonly no / everysec / always.

    Three redis-servers side by side, one per persistence mode, each with one wesichain worker
    (run state and broker on that server, as a deployment has them) and one bare Celery worker
    (its own database on the same server: what the fsync costs Celery's own broker traffic). Each
    round runs one long run and one bare hop chain on every server, the order of the servers
    rotating from round to round; every figure is reported as the ratio to the no-AOF server's
    figure of the same round.
    """
    sz = ctx.sizes
    prefix = new_prefix("durability")
    modes = list(DURABILITY_MODES)
    servers: dict[str, PersistentRedisServer] = {}
    clusters: dict[str, Cluster] = {}
    workers: dict[str, list[Any]] = {}
    clients: dict[str, Client] = {}
    floors: dict[str, Any] = {}
    apps: dict[str, Any] = {}
    text = f"steps={sz.long_steps}"
    try:
        for mode, fsync in DURABILITY_MODES.items():
            servers[mode] = PersistentRedisServer(fsync)
            clusters[mode] = Cluster.start(servers[mode])
            workers[mode] = [
                clusters[mode].wesichain_worker(f"dur-{mode}-w", prefix),
                clusters[mode].bare_worker(f"dur-{mode}-b"),
            ]
            clusters[mode].launch(*workers[mode])
        for mode, cl in clusters.items():
            cl.ready(*workers[mode])
            clients[mode] = cl.client(prefix)
            floors[mode] = cl.floor_redis()
            apps[mode] = bare.make_app(cl.floor_url)
            run_and_wait(clients[mode], "long", "steps=5")  # warm-up
            bare_chain(floors[mode], apps[mode], bare.TASK_HOP, 50)
        transition: dict[str, list[float]] = {m: [] for m in modes}
        hop: dict[str, list[float]] = {m: [] for m in modes}
        tr_ratio: dict[str, list[float]] = {m: [] for m in modes}
        hop_ratio: dict[str, list[float]] = {m: [] for m in modes}
        aof_bytes: dict[str, list[float]] = {m: [] for m in modes}
        for rnd in range(sz.durability_rounds):
            order = modes[rnd % len(modes) :] + modes[: rnd % len(modes)]
            for mode in order:
                server = servers[mode]
                size0 = int(server.persistence().get("aof_current_size", 0))
                ms, head = _transition_ms(clients[mode], text)
                size1 = int(server.persistence().get("aof_current_size", 0))
                transition[mode].append(ms)
                aof_bytes[mode].append((size1 - size0) / (head.version - 1))
                hop[mode].append(bare_chain(floors[mode], apps[mode], bare.TASK_HOP, sz.bare_hops))
            for mode in modes:
                tr_ratio[mode].append(transition[mode][-1] / transition["no-aof"][-1])
                hop_ratio[mode].append(hop[mode][-1] / hop["no-aof"][-1])
            ctx.log(
                f"  round {rnd + 1}: "
                + ", ".join(
                    f"{m} {transition[m][-1]:.2f} ms ({tr_ratio[m][-1]:.2f}x; bare hop {hop[m][-1]:.2f} ms)"
                    for m in modes
                )
            )
        persistence = {mode: server.persistence() for mode, server in servers.items()}
    finally:
        for mode, cl in clusters.items():
            if mode in clients:
                clients[mode].close()
            if mode in floors:
                floors[mode].close()
            cl.close()
        for mode, server in servers.items():
            if mode not in clusters:  # it failed to start
                server.cleanup()
    med = {m: statistics.median(transition[m]) for m in modes}
    ratios = {m: round(statistics.median(tr_ratio[m]), 3) for m in modes}
    return {
        "settings": {
            "servers": "one redis-server per mode, side by side; run state and broker on the same server",
            "modes": {
                m: f"appendonly {'yes, appendfsync ' + f if f else 'no'}" for m, f in DURABILITY_MODES.items()
            },
            "aof_dir": "the server's temporary directory (same disk as the other benchmarks' servers)",
            "workers": "per server: 1 x wesichain worker and 1 x bare worker, prefork, concurrency 1",
            "rounds": sz.durability_rounds,
            "long_run_steps": sz.long_steps,
            "bare_chain_hops": sz.bare_hops,
            "verdict": "median over rounds of (mode's run median / no-AOF run median, same round)",
        },
        "metrics": {
            "transition_ms": {m: summary(transition[m]) for m in modes},
            "bare_hop_ms": {m: summary(hop[m]) for m in modes},
            "transition_ratio": {m: summary(tr_ratio[m]) for m in modes},
            "bare_hop_ratio": {m: summary(hop_ratio[m]) for m in modes},
            "fsync_cost_ms_per_transition": {m: round(med[m] - med["no-aof"], 3) for m in modes},
            "aof_bytes_per_transition": {m: round(statistics.median(aof_bytes[m])) for m in modes},
            "persistence": persistence,
        },
        "ratios": {f"transition_{m}_over_no_aof": ratios[m] for m in modes if m != "no-aof"},
        "targets": {},
        "gated": [],
    }


# -- 9. backlog: many runs queued on one tool slot, with a short queued lease


def _broker_empty(r: Any) -> bool:
    """No message waiting in the runtime's queues or delivered and unacknowledged (no key prefix)."""
    return int(r.llen(QUEUE_MODEL)) + int(r.llen(QUEUE_TOOLS)) + int(r.hlen("unacked")) == 0


def scenario_backlog(ctx: Context) -> dict[str, Any]:
    """N one-tool runs on a single tool slot, the queued lease at 2 s: a backlog is not a crash.

    One worker serves the model queue (threads pool, 8 slots) and one the tool queue (solo pool:
    one slot), both with ``WESICHAIN_QUEUED_LEASE_S=2`` and Celery's ``task_received`` probe
    (``tests/delivery_probe.py``), which counts every delivery per task id. Each run is start,
    think, one 50 ms tool call, observe, think: five tasks. The tool calls wait in the queue many
    times the queued lease; the sweeper must see that their messages are still in the broker and
    leave them there. Goal: no run fails, no task is delivered twice, no task is re-published
    (a re-published task's id ends in ``:e<epoch>``).
    """
    cl, sz = ctx.cluster, ctx.sizes
    n = sz.backlog_runs
    prefix = new_prefix("backlog")
    env = {"WESICHAIN_QUEUED_LEASE_S": str(BACKLOG_QUEUED_LEASE_S)}
    probe = (DELIVERY_PROBE,)
    model_w = cl.wesichain_worker(
        "bl-model", prefix, pool="threads", concurrency=8, queues=QUEUE_MODEL, env=env, include=probe
    )
    tool_w = cl.wesichain_worker("bl-tool", prefix, pool="solo", queues=QUEUE_TOOLS, env=env, include=probe)
    cl.up(model_w, tool_w)
    client = cl.client(prefix)
    r = client.store.redis
    text = f"calls=1 seconds={BACKLOG_TOOL_S}"
    terminal = {p.value for p in Phase if p.terminal}
    try:
        r.delete(DELIVERIES_KEY)
        t0 = time.time()
        ids = [client.submit("fanout", text, check_agent=False).run_id for _ in range(n)]
        submitted_s = time.time() - t0
        deepest, pending = 0, list(ids)
        deadline = time.monotonic() + max(240, n // 2)
        while pending:
            deepest = max(deepest, int(r.llen(QUEUE_TOOLS)))
            pipe = r.pipeline(transaction=False)
            for run_id in pending:
                pipe.hget(client.store.keys.run(run_id), protocol.PHASE)
            pending = [i for i, p in zip(pending, pipe.execute(), strict=True) if p not in terminal]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} of {n} backlog runs unfinished")
            time.sleep(0.1)
        heads = [h for h in (client.store.load(i) for i in ids) if h is not None]
        wall = max(h.updated_at for h in heads) - t0
        # Every delivery counted: wait until the broker holds nothing more for these workers.
        wait_until(lambda: _broker_empty(r), timeout=60, interval=0.1, what="the broker to drain")
        time.sleep(1.0)
        deliveries = {str(k): int(v) for k, v in r.hgetall(DELIVERIES_KEY).items()}
        if not deliveries:
            raise RuntimeError(f"{DELIVERY_PROBE} counted no delivery in {DELIVERIES_KEY!r}")
        hand_ons = sum(w.log().count("again under epoch") for w in (model_w, tool_w))
    finally:
        cl.down(model_w, tool_w)
        client.close()
    outcomes = Counter(h.phase.value + (f":{h.error.kind}" if h.error else "") for h in heads)
    failed = len(ids) - outcomes.get(Phase.COMPLETED.value, 0)
    twice = sorted(t for t, c in deliveries.items() if c > 1)
    republished = sorted(t for t in deliveries if re.search(r":e\d+$", t))
    latency = [_ms(h.updated_at - h.created_at) for h in heads]
    ctx.log(
        f"  {n} runs in {wall:.1f} s: {failed} failed, {len(twice)} delivered twice,"
        f" {len(republished)} re-published; deepest tool queue {deepest}"
    )
    return {
        "settings": {
            "runs": n,
            "agent": f"fanout, input {text!r}: start, think, 1 tool call, observe, think (5 tasks)",
            "workers": "model queue: 1 x wesichain worker, threads pool, 8 slots; tool queue: 1 x"
            " wesichain worker, solo pool (one tool slot)",
            "queued_lease_s": BACKLOG_QUEUED_LEASE_S,
            "delivery_count": "task_received signal in each worker (tests/delivery_probe.py)",
        },
        "metrics": {
            "failed_runs": failed,
            "outcomes": dict(outcomes),
            "tasks_delivered": len(deliveries),
            "tasks_expected": TASKS_PER_BACKLOG_RUN * n,
            "deliveries": sum(deliveries.values()),
            "delivered_more_than_once": len(twice),
            "republished_task_ids": len(republished),
            "runs_with_epoch_above_0": sum(1 for h in heads if h.epoch > 0),
            "sweeper_hand_ons_logged": hand_ons,
            "peak_tool_queue_depth": deepest,
            "wall_s": round(wall, 2),
            "submit_s": round(submitted_s, 2),
            "runs_per_s": round(n / wall, 2),
            "run_latency_ms": summary(latency, 1),
            "examples": {"delivered_twice": twice[:5], "republished": republished[:5]},
        },
        "targets": {
            "failed_runs": check(failed, 0, "<="),
            "duplicate_deliveries": check(len(twice), 0, "<="),
            "republished_tasks": check(len(republished), 0, "<="),
        },
        "gated": [],
    }


def _scenario_api(ctx: Context) -> dict[str, Any]:
    from benchmarks.api import scenario_api

    return scenario_api(ctx)


SCENARIO_FUNCS: dict[str, tuple[str, Callable[[Context], dict[str, Any]]]] = {
    "latency": ("Four scenarios: latency, memory, steps (0 ms and 200 ms model)", scenario_latency),
    "transition": ("Per-transition overhead vs a bare Celery hop", scenario_transition),
    "flat": ("Flat cost in run length (step 50 vs step 1)", scenario_flat),
    "fanout": ("Fan-out: 8 x 500 ms tool calls on 8 slots vs 1 call", scenario_fanout),
    "throughput": ("Throughput on 2 workers vs bare hop chains", scenario_throughput),
    "memory": ("Worker memory, growth, Redis bytes per run", scenario_memory),
    "peers": ("Peers: asyncio loop and LangGraph", scenario_peers),
    "durability": (
        "Durability: per-transition time with AOF everysec and always vs no AOF",
        scenario_durability,
    ),
    "backlog": ("Backlog: runs queued on one tool slot with a 2 s queued lease", scenario_backlog),
    "api": ("HTTP API: added latency, submits per second, SSE fan-out to 100 followers", _scenario_api),
}
#: What ``python -m benchmarks.run`` runs without ``--only`` (the backlog is run by name).
DEFAULT_SCENARIOS = [name for name in SCENARIO_FUNCS if name != "backlog"]
