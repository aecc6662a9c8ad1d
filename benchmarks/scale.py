"""The scale curve: the same load on a Redis Cluster of 1, 2 and 3 primaries, workers on separate hosts.

    python -m benchmarks.scale [--shards 1,2,3] [--hosts 3] [--runs 300] [--out DIR]

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
import time
from pathlib import Path
from typing import Any

from benchmarks.capacity import run_all
from benchmarks.harness import environment, process_cpu_s
from producer.client import Client
from shared.settings import ENV_BROKER_URL, ENV_PREFIX, ENV_REDIS_CLUSTER, ENV_SHARDS, Settings
from worker.testing.cluster import RedisCluster
from worker.testing.harness import RedisServer, WorkerProcess, start_all, stop_all
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default="1,2,3", help="numbers of primaries to measure, comma-separated")
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
