"""The scale curves: workers added against one Redis, and primaries added to a Redis Cluster.

    python -m benchmarks.scale --workers 1,2,4,8,12 [--shards N] [--runs-per-worker 4] [--steps 6]
    python -m benchmarks.scale [--shards 1,2,3] [--hosts 3] [--runs 300] [--out DIR]

**The worker curve** (``--workers``): for each number N, N ``wesichain worker`` processes (prefork,
concurrency 1) run ``--runs-per-worker`` x N concurrent runs of the ``long`` agent (``--steps`` tool
steps each), and N bare Celery workers, same settings, run as many chains of bare hops (as many
hops as a run has transitions), in ``--rounds`` paired rounds that alternate which goes first.
Per N it prints throughput over bare chains (the median of the paired ratios), the scaling
efficiency of both (rate at N over N times the rate of the first N), worker and Redis CPU per
transition (per hop for bare), and the transitions per second at which one Redis core would be
saturated (1 s over its CPU per transition): where the curve flattens, and what each shard would
add. Run state on one Redis by default; with ``--shards N`` on a Redis Cluster of N primaries
(the standalone server then the broker). Writes ``results/scale-workers.json``
(``scale-workers-N-shards.json``). On a machine with fewer cores than workers the curve shows the
cores, not Redis: read the CPU columns there.

**The primaries curve** (without ``--workers``): the same load on a Redis Cluster of 1, 2 and 3
primaries, workers on separate simulated hosts.

For each number of primaries it starts a Redis Cluster of that many (no replicas: replication
doubles the writes and is measured by the failover tests, not here) and a standalone
``redis-server`` as the broker, both listening on the bridge of a :class:`~benchmarks.hosts.HostNetwork`;
puts one ``wesichain worker`` (prefork, concurrency 1) in each simulated host, a network namespace
of its own; submits ``--runs`` runs of the ``one_hop`` benchmark agent at once from the root
namespace (as :mod:`benchmarks.capacity` does) and reads, over exactly the measured window,
every primary's own counters (CPU, commands, keys) and the workers' CPU.

It writes ``results/scale.json``: per number of primaries, runs per second, Redis CPU per run in
all and on the busiest primary, how evenly the runs' keys spread, worker CPU per run, and the
model's ceiling for that cluster (one core per primary, so the busiest primary saturates first:
1 s / its Redis CPU per run). Two cores run every host and every primary here, so the measured
runs per second are bounded by those cores, not by Redis: the curve shows how the Redis work
divides over primaries, and the ceilings follow from that (``docs/scaling.md``). The broker's CPU
per run is reported too: with a Redis broker it is one more server to size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import bare
from benchmarks.capacity import run_all
from benchmarks.harness import (
    Cluster,
    bare_chain,
    environment,
    new_prefix,
    process_cpu_s,
    wait_all_terminal,
)
from benchmarks.scenarios import TASKS_PER_TOOL_STEP
from producer.client import Client
from shared.settings import ENV_BROKER_URL, ENV_PREFIX, ENV_REDIS_CLUSTER, ENV_SHARDS, Settings
from shared.state import Phase
from worker.testing.cluster import RedisCluster
from worker.testing.harness import RedisServer, WorkerProcess, start_all, stop_all, wait_until
from worker.testing.hosts import HostNetwork

RESULTS = Path(__file__).resolve().parent / "results"
AGENTS = "benchmarks.agents"
PREFIX = "scale:"


def _node_stats(cluster: RedisCluster) -> dict[str, dict[str, float]]:
    stats: dict[str, dict[str, float]] = {}
    for node in cluster.primaries():
        cpu = node.info("cpu")
        commands = node.info("commandstats")
        keys = node.info("keyspace").get("db0", {})
        stats[node.address] = {
            "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "calls": float(sum(v["calls"] for k, v in commands.items() if k != "cmdstat_info")),
            "keys": float(keys.get("keys", 0) if isinstance(keys, dict) else 0),
        }
    return stats


def _cpu_s(server: RedisServer) -> float:
    client = server.client()
    try:
        cpu = client.info("cpu")
        return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
    finally:
        client.close()


def measure(
    net: HostNetwork, shards: int, runs: int, agent: str, text: str, key_shards: int
) -> dict[str, Any]:
    cluster = RedisCluster(masters=shards, replicas=0, host=net.server_ip).start()
    broker = RedisServer(bind=net.server_ip).start()
    env = {
        ENV_REDIS_CLUSTER: "1",
        ENV_BROKER_URL: broker.url,
        ENV_PREFIX: PREFIX,
        ENV_SHARDS: str(key_shards),
    }
    workers = [
        host.place(WorkerProcess(f"scale-{shards}-{i}", cluster.url, agents=AGENTS, env=env))
        for i, host in enumerate(net.hosts, 1)
    ]
    settings = Settings(
        redis_url=cluster.url,
        redis_cluster=True,
        broker_url=broker.url,
        prefix=PREFIX,
        agents_module=AGENTS,
        shards=key_shards,
    )
    client = Client(settings)
    try:
        start_all(workers, timeout=90)
        run_all(client, agent, text, 20)  # warm-up: imports, connections, slot maps
        before, cpu_before = _node_stats(cluster), [process_cpu_s(w) for w in workers]
        broker_before = _cpu_s(broker)
        started = time.perf_counter()
        heads, _ = run_all(client, agent, text, runs)
        elapsed = time.perf_counter() - started
        after, cpu_after = _node_stats(cluster), [process_cpu_s(w) for w in workers]
        broker_cpu = _cpu_s(broker) - broker_before
    finally:
        client.close()
        stop_all(workers)
        broker.cleanup()
        cluster.cleanup()
    transitions = sum(h.version - 1 for h in heads) / runs
    per_node = {
        address: {
            "redis_cpu_ms_per_run": round(1000 * (after[address]["cpu_s"] - b["cpu_s"]) / runs, 3),
            "commands_per_run": round((after[address]["calls"] - b["calls"]) / runs, 1),
            "keys": int(after[address]["keys"]),
        }
        for address, b in before.items()
    }
    redis_cpu = sum(n["redis_cpu_ms_per_run"] for n in per_node.values())
    busiest = max(n["redis_cpu_ms_per_run"] for n in per_node.values())
    worker_cpu = sum(
        (a["main"] + a["children"]) - (b["main"] + b["children"])
        for a, b in zip(cpu_after, cpu_before, strict=True)
    )
    keys = [n["keys"] for n in per_node.values()]
    return {
        "primaries": shards,
        "key_shards": key_shards,
        "hosts": len(net.hosts),
        "runs": runs,
        "transitions_per_run": round(transitions, 2),
        "elapsed_s": round(elapsed, 2),
        "runs_per_s": round(runs / elapsed, 1),
        "redis_cpu_ms_per_run": round(redis_cpu, 3),
        "busiest_primary_cpu_ms_per_run": round(busiest, 3),
        "key_spread": round(min(keys) / max(keys), 2) if max(keys) else 1.0,
        "worker_cpu_ms_per_run": round(1000 * worker_cpu / runs, 2),
        # The broker (a standalone Redis here) carries one message per transition.
        "broker_cpu_ms_per_run": round(1000 * broker_cpu / runs, 3),
        # One core per primary: the cluster saturates when its busiest primary does.
        "model_ceiling_runs_per_s": round(1000 / busiest) if busiest else None,
        "per_primary": per_node,
    }


# -- the worker curve: 1..N workers on one Redis, against bare Celery chains on as many workers


def _redis_cpu_s(servers: list[Any]) -> list[float]:
    """CPU seconds (user + system) of each of these Redis servers so far, read from its INFO."""
    seconds = []
    for server in servers:
        cpu = server.info("cpu")
        seconds.append(float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))
    return seconds


def _redis_figures(before: list[float], after: list[float], done: int) -> dict[str, float]:
    """Redis CPU per unit of work (µs) in all, and on the busiest server: the one a core saturates first."""
    spent = [1e6 * (a - b) / done for a, b in zip(after, before, strict=True)]
    return {"redis_cpu_us": sum(spent), "busiest_redis_cpu_us": max(spent)}


def _workers_cpu_s(workers: list[WorkerProcess]) -> float:
    return sum(sum(process_cpu_s(w).values()) for w in workers)


class WorkerCurve:
    """Paired rounds of ``long`` runs on N ``wesichain worker``\\ s and of bare hop chains (as many
    hops as a run has transitions) on N bare Celery workers, for each N: one Redis for the run
    state (standalone, or a Redis Cluster of ``shards`` primaries with the standalone server as
    the broker), prefork, concurrency 1 per worker."""

    def __init__(self, runs_per_worker: int, steps: int, rounds: int, shards: int | None) -> None:
        self.runs_per_worker = runs_per_worker
        self.steps = steps
        self.rounds = rounds
        self.shards = shards
        self.hops = 2 + TASKS_PER_TOOL_STEP * steps  # as many tasks as one run has transitions
        self.cl = Cluster.start()
        self.state: RedisCluster | None = None
        self.prefix = new_prefix("scale")
        if shards:
            self.state = RedisCluster(masters=shards, replicas=0).start()
            settings = Settings(
                redis_url=self.state.url,
                redis_cluster=True,
                broker_url=self.cl.url,
                prefix=self.prefix,
                agents_module=AGENTS,
            )
            self.env = {ENV_REDIS_CLUSTER: "1", ENV_BROKER_URL: self.cl.url}
        else:
            settings = self.cl.settings(self.prefix)
            self.env = {}
        self.client = Client(settings)
        self.bare_app = bare.make_app(self.cl.floor_url)
        self.floor = self.cl.floor_redis()

    def close(self) -> None:
        self.client.close()
        self.floor.close()
        if self.state is not None:
            self.state.cleanup()
        self.cl.close()

    def _servers(self) -> list[Any]:
        """Every Redis the runtime's workers use: the run state's primaries and the broker."""
        broker = self.cl.redis.client()
        return [broker, *(self.state.primaries() if self.state is not None else [])]

    def _ours(self, workers: list[WorkerProcess], runs: int) -> dict[str, float]:
        servers = self._servers()
        cpu0, redis0, t0 = _workers_cpu_s(workers), _redis_cpu_s(servers), time.time()
        text = f"steps={self.steps}"
        ids = [self.client.submit("long", text, check_agent=False).run_id for _ in range(runs)]
        wait_all_terminal(self.client, ids, timeout=600)
        heads = [self.client.store.load(i) for i in ids]
        assert all(h is not None and h.phase is Phase.COMPLETED for h in heads), "a run did not complete"
        done = sum(h.version - 1 for h in heads if h)
        end = max(h.updated_at for h in heads if h)
        return {
            "per_s": done / (end - t0),
            "worker_cpu_ms": 1000 * (_workers_cpu_s(workers) - cpu0) / done,
            **_redis_figures(redis0, _redis_cpu_s(servers), done),
        }

    def _bare(self, workers: list[WorkerProcess], chains: int) -> dict[str, float]:
        servers = [self.cl.redis.client()]
        ids = [uuid.uuid4().hex for _ in range(chains)]
        cpu0, redis0, t0 = _workers_cpu_s(workers), _redis_cpu_s(servers), time.time()
        for c in ids:
            self.bare_app.send_task(
                bare.TASK_HOP, kwargs={"chain": c, "hop": 0, "total": self.hops}, task_id=f"{c}:h0"
            )
        keys = [bare.end_key(c) for c in ids]
        wait_until(lambda: self.floor.exists(*keys) == len(keys), timeout=600, interval=0.02, what="chains")
        end = max(float(v or 0) for v in self.floor.mget(keys))
        done = self.hops * chains
        return {
            "per_s": done / (end - t0),
            "worker_cpu_ms": 1000 * (_workers_cpu_s(workers) - cpu0) / done,
            **_redis_figures(redis0, _redis_cpu_s(servers), done),
        }

    def point(self, n: int, log: Callable[[str], None]) -> dict[str, Any]:
        """The paired rounds on ``n`` workers of each kind."""
        ws = [
            WorkerProcess(
                f"scale-w{i}",
                self.state.url if self.state is not None else self.cl.url,
                agents=AGENTS,
                env={ENV_PREFIX: self.prefix, **self.env},
                log_dir=self.cl.log_dir,
            )
            for i in range(n)
        ]
        bs = [self.cl.bare_worker(f"scale-b{i}") for i in range(n)]
        runs = self.runs_per_worker * n
        try:
            start_all(ws, timeout=120)
            self.cl.up(*bs)
            self._ours(ws, n)  # warm-up: imports, connections, the agent's first replies
            bare_chain(self.floor, self.bare_app, bare.TASK_HOP, 20)
            ours: list[dict[str, float]] = []
            theirs: list[dict[str, float]] = []
            for rnd in range(self.rounds):
                for what in ("bare", "ours") if rnd % 2 == 0 else ("ours", "bare"):
                    if what == "ours":
                        ours.append(self._ours(ws, runs))
                    else:
                        theirs.append(self._bare(bs, runs))
                mine, floor = ours[-1]["per_s"], theirs[-1]["per_s"]
                log(
                    f"  {n} worker(s), round {rnd + 1}: {mine:.0f} transitions/s"
                    f" vs bare {floor:.0f} hops/s ({mine / floor:.2f}x)"
                )
        finally:
            stop_all(ws)
            self.cl.down(*bs)

        def med(rows: list[dict[str, float]], key: str) -> float:
            return statistics.median(r[key] for r in rows)

        return {
            "workers": n,
            "concurrent_runs": runs,
            "transitions_per_s": round(med(ours, "per_s"), 1),
            "bare_hops_per_s": round(med(theirs, "per_s"), 1),
            "throughput_over_bare": round(
                statistics.median(o["per_s"] / b["per_s"] for o, b in zip(ours, theirs, strict=True)), 3
            ),
            "worker_cpu_ms_per_transition": round(med(ours, "worker_cpu_ms"), 3),
            "bare_worker_cpu_ms_per_hop": round(med(theirs, "worker_cpu_ms"), 3),
            "redis_cpu_us_per_transition": round(med(ours, "redis_cpu_us"), 1),
            "bare_redis_cpu_us_per_hop": round(med(theirs, "redis_cpu_us"), 1),
            "busiest_redis_cpu_us_per_transition": round(med(ours, "busiest_redis_cpu_us"), 1),
            # A Redis core saturates at 1 s of its CPU per second, the busiest server's first (with
            # one Redis, the only one): where the curve must flatten.
            "redis_ceiling_transitions_per_s": round(1e6 / med(ours, "busiest_redis_cpu_us")),
            "bare_redis_ceiling_hops_per_s": round(1e6 / med(theirs, "busiest_redis_cpu_us")),
        }


def efficiency(curve: list[dict[str, Any]]) -> None:
    """Add each point's scaling efficiency: its rate over the first point's per worker, times N."""
    first = curve[0]
    for point in curve:
        scale = point["workers"] / first["workers"]
        point["efficiency"] = round(point["transitions_per_s"] / (first["transitions_per_s"] * scale), 3)
        point["bare_efficiency"] = round(point["bare_hops_per_s"] / (first["bare_hops_per_s"] * scale), 3)


def table(curve: list[dict[str, Any]]) -> str:
    """The curve as the text table the command prints."""
    head = (
        "workers  transitions/s  bare hops/s  ratio  efficiency (bare)  worker CPU ms (bare)"
        "  Redis CPU us (bare)  Redis ceiling/s (bare)"
    )
    lines = [head]
    for p in curve:
        lines.append(
            f"{p['workers']:>7}  {p['transitions_per_s']:>13.0f}  {p['bare_hops_per_s']:>11.0f}"
            f"  {p['throughput_over_bare']:>5.2f}  {p['efficiency']:>5.2f} ({p['bare_efficiency']:.2f})"
            f"       {p['worker_cpu_ms_per_transition']:>6.2f} ({p['bare_worker_cpu_ms_per_hop']:.2f})"
            f"       {p['redis_cpu_us_per_transition']:>6.0f} ({p['bare_redis_cpu_us_per_hop']:.0f})"
            f"         {p['redis_ceiling_transitions_per_s']:>6} ({p['bare_redis_ceiling_hops_per_s']})"
        )
    return "\n".join(lines)


def worker_main(args: argparse.Namespace) -> int:
    counts = [int(n) for n in args.workers.split(",")]
    shards = int(args.shards) if args.shards else None
    curve_of = WorkerCurve(args.runs_per_worker, args.steps, args.rounds, shards)
    curve: list[dict[str, Any]] = []
    try:
        for n in counts:
            curve.append(curve_of.point(n, lambda line: print(line, flush=True)))
    finally:
        curve_of.close()
    efficiency(curve)
    print(table(curve), flush=True)
    result = {
        "environment": environment(),
        "state": f"Redis Cluster, {shards} primaries (broker: a standalone Redis)" if shards else "one Redis",
        "agent": "long",
        "steps_per_run": args.steps,
        "rounds": args.rounds,
        "curve": curve,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"scale-workers-{shards}-shards.json" if shards else "scale-workers.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workers",
        help="the worker curve: numbers of workers to measure, comma-separated (e.g. 1,2,4,8,12),"
        " each against as many bare Celery workers",
    )
    p.add_argument(
        "--shards",
        default=None,
        help="numbers of primaries to measure, comma-separated (default 1,2,3); with --workers: run"
        " the run state on a Redis Cluster of this many primaries instead of one Redis",
    )
    p.add_argument("--runs-per-worker", type=int, default=4, help="--workers: concurrent runs per worker")
    p.add_argument("--steps", type=int, default=6, help="--workers: tool steps per run (3N+2 transitions)")
    p.add_argument("--rounds", type=int, default=2, help="--workers: paired rounds per worker count")
    p.add_argument("--hosts", type=int, default=3, help="simulated worker hosts (one worker each)")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument(
        "--key-shards",
        type=int,
        default=64,
        help="WESICHAIN_SHARDS: the run-state shards spread over the primaries (several per primary)",
    )
    p.add_argument("--agent", default="one_hop")
    p.add_argument("--text", default="Add 1 and 2.")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.workers:
        return worker_main(args)
    args.shards = args.shards or "1,2,3"
    curve = []
    with HostNetwork() as net:
        for _ in range(args.hosts):
            net.add_host()
        for shards in (int(s) for s in args.shards.split(",")):
            curve.append(measure(net, shards, args.runs, args.agent, args.text, args.key_shards))
            print(json.dumps(curve[-1]), flush=True)
    result = {"environment": environment(), "agent": args.agent, "curve": curve}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
