"""The capacity model's inputs, measured: what one run and one transition cost Redis and the workers.

    python -m benchmarks.capacity [--runs 300] [--agent one_hop] [--out DIR] [--cluster N]

Starts its own redis-server and two ``wesichain worker`` processes (prefork, concurrency 1 each),
runs ``--runs`` runs of a one-tool agent through them (24 in flight), and reads, over exactly that
window, Redis's own counters (``INFO commandstats``: calls and microseconds per command, scripts
included; ``used_cpu_sys`` + ``used_cpu_user``; ``total_net_input_bytes`` /
``total_net_output_bytes``) and the CPU time of the worker processes (main + pool children). The
per-run and per-transition figures it writes to ``results/capacity.json`` are the inputs of the
model in ``docs/scaling.md``. Two cores run everything here, Redis included: the figures are
costs, not a throughput ceiling.

``--cluster N`` keeps the run state on a Redis Cluster of ``N`` primaries instead (no replicas,
started with :class:`worker.testing.cluster.RedisCluster`) and the broker on a standalone
redis-server (or ``--broker``); Redis's counters are then summed over the primaries, the broker's
reported apart (``broker_redis_*``), and the runs' spread over the primaries is reported too.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import Cluster, process_cpu_s
from producer.client import Client
from shared import protocol
from shared.settings import ENV_BROKER_URL
from shared.state import Phase, RunHead
from worker.testing.cluster import ClusterStore, RedisCluster
from worker.testing.harness import RedisServer

RESULTS = Path(__file__).resolve().parent / "results"


def _stats(r: Any) -> dict[str, Any]:
    info = r.info("all")
    commands = {
        k.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]}
        for k, v in info.items()
        if k.startswith("cmdstat_")
    }
    return {
        "commands": commands,
        "cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "net_in": int(info["total_net_input_bytes"]),
        "net_out": int(info["total_net_output_bytes"]),
    }


def _stats_of(servers: list[Any]) -> dict[str, Any]:
    """:func:`_stats` summed over several servers (a cluster's primaries), each one's CPU kept too."""
    each = [_stats(r) for r in servers]
    commands: dict[str, dict[str, int]] = {}
    for stats in each:
        for name, figures in stats["commands"].items():
            total = commands.setdefault(name, {"calls": 0, "usec": 0})
            total["calls"] += figures["calls"]
            total["usec"] += figures["usec"]
    return {
        "commands": commands,
        "cpu_s": sum(s["cpu_s"] for s in each),
        "cpu_s_each": [s["cpu_s"] for s in each],
        "net_in": sum(s["net_in"] for s in each),
        "net_out": sum(s["net_out"] for s in each),
    }


def run_all(client: Client, agent: str, text: str, n: int) -> tuple[list[RunHead], int]:
    """Submit ``n`` runs at once and wait until every one ended; returns their heads and how many
    HGET commands the waiting itself sent (subtracted from Redis's counts)."""
    ids = [client.submit(agent, text, check_agent=False).run_id for _ in range(n)]
    r, keys = client.store.redis, client.store.keys
    terminal = {p.value for p in Phase if p.terminal}
    polls = 0
    deadline = time.monotonic() + 600
    pending = list(ids)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} runs did not end")
        time.sleep(0.1)
        polls += 1
        if r.hget(keys.run(pending[-1]), protocol.PHASE) not in terminal:
            continue
        phases = [r.hget(keys.run(i), protocol.PHASE) for i in pending]
        polls += len(pending)
        pending = [i for i, p in zip(pending, phases, strict=True) if p not in terminal]
    heads = [h for i in ids if (h := client.store.load(i)) is not None]
    failed = [h.phase for h in heads if h.phase is not Phase.COMPLETED]
    if failed or len(heads) != n:
        raise RuntimeError(f"runs did not all complete: {failed[:3]}")
    return heads, polls


def _beam() -> psutil.Process | None:
    """RabbitMQ's Erlang VM on this machine, if one runs."""
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "beam.smp":
            return proc
    return None


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    times = proc.cpu_times()
    return float(times.user + times.system)


def measure(runs: int, agent: str, text: str, broker: str = "", masters: int = 0) -> dict[str, Any]:
    """One measurement; ``masters`` > 0 keeps the run state on a cluster of that many primaries."""
    redis_cluster = RedisCluster(masters=masters, replicas=0).start() if masters else None
    store = ClusterStore(redis_cluster) if redis_cluster is not None else RedisServer()
    cluster = Cluster.start(store)
    prefix = "cap:"
    env = {ENV_BROKER_URL: broker} if broker else {}
    workers = [cluster.wesichain_worker(f"cap-{i}", prefix, env=env) for i in (1, 2)]
    settings = cluster.settings(prefix).with_(broker_url=broker)
    if isinstance(store, ClusterStore):
        settings = settings.with_(redis_cluster=True, broker_url=broker or store.broker.url)
    client = Client(settings)
    servers = [n.client() for n in redis_cluster.primaries()] if redis_cluster else [cluster.redis.client()]
    broker_redis = store.broker.client() if isinstance(store, ClusterStore) and not broker else None
    beam = _beam() if broker else None
    try:
        cluster.up(*workers)
        run_all(client, agent, text, 20)  # warm-up: imports, connections, caches
        before, cpu_before = _stats_of(servers), [process_cpu_s(w) for w in workers]
        broker_before = _stats(broker_redis) if broker_redis is not None else None
        beam_before = _cpu(beam)
        started = time.perf_counter()
        heads, polls = run_all(client, agent, text, runs)
        elapsed = time.perf_counter() - started
        after, cpu_after = _stats_of(servers), [process_cpu_s(w) for w in workers]
        broker_after = _stats(broker_redis) if broker_redis is not None else None
        beam_after = _cpu(beam)
    finally:
        client.close()
        for r in servers:
            r.close()
        cluster.close()
        if redis_cluster is not None:
            redis_cluster.cleanup()
    transitions = sum(h.version - 1 for h in heads)
    calls = {
        name: after["commands"][name]["calls"] - before["commands"].get(name, {}).get("calls", 0)
        for name in after["commands"]
    }
    usec = {
        name: after["commands"][name]["usec"] - before["commands"].get(name, {}).get("usec", 0)
        for name in after["commands"]
    }
    calls["hget"] = calls.get("hget", 0) - polls  # the waiting's own reads
    calls.pop("info", None)
    client_calls = {k: v for k, v in calls.items() if v > 0}
    worker_cpu = sum(
        (a["main"] + a["children"]) - (b["main"] + b["children"])
        for a, b in zip(cpu_after, cpu_before, strict=True)
    )
    redis_cpu = after["cpu_s"] - before["cpu_s"]
    per_run = {
        "transitions": transitions / runs,
        "broker_messages": calls.get("lpush", 0) / runs,
        "redis_commands": sum(client_calls.values()) / runs,
        "redis_cpu_ms": 1000 * redis_cpu / runs,
        "redis_bytes_in": (after["net_in"] - before["net_in"]) / runs,
        "redis_bytes_out": (after["net_out"] - before["net_out"]) / runs,
        "worker_cpu_ms": 1000 * worker_cpu / runs,
    }
    if broker:
        # The whole RabbitMQ node's CPU over the window (other users of the node included).
        per_run["rabbitmq_cpu_ms"] = 1000 * (beam_after - beam_before) / runs
    if broker_before is not None and broker_after is not None:
        per_run["broker_messages"] = (
            broker_after["commands"].get("lpush", {}).get("calls", 0)
            - broker_before["commands"].get("lpush", {}).get("calls", 0)
        ) / runs
        per_run["broker_redis_cpu_ms"] = 1000 * (broker_after["cpu_s"] - broker_before["cpu_s"]) / runs
    spread = [
        round(1000 * (a - b) / runs, 3)
        for a, b in zip(after["cpu_s_each"], before["cpu_s_each"], strict=True)
    ]
    return {
        "broker": "rabbitmq" if broker else "redis",
        "store": f"cluster of {masters} primaries" if masters else "redis",
        "redis_cpu_ms_per_run_by_primary": spread,
        "agent": agent,
        "runs": runs,
        "elapsed_s": round(elapsed, 2),
        "runs_per_s": round(runs / elapsed, 1),
        "per_run": {k: round(v, 3) for k, v in per_run.items()},
        "per_transition": {
            k: round(v / per_run["transitions"], 3) for k, v in per_run.items() if k != "transitions"
        },
        "commands_per_run": {k: round(v / runs, 2) for k, v in sorted(client_calls.items())},
        "command_usec_per_run": {k: round(usec[k] / runs, 1) for k in sorted(client_calls)},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--agent", default="one_hop")
    p.add_argument("--text", default="Add 1 and 2.")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="capacity")
    p.add_argument("--broker", default="", help="amqp://... to measure with RabbitMQ as the broker")
    p.add_argument(
        "--cluster",
        type=int,
        default=0,
        metavar="N",
        help="the run state on a Redis Cluster of N primaries (1-3 here), the broker a redis-server",
    )
    args = p.parse_args(argv)
    result = measure(args.runs, args.agent, args.text, args.broker, args.cluster)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
