"""Every Redis command and round trip one worker makes per transition, ours against the bare hop.

    python -m benchmarks.round_trips [--runs 6] [--steps 10]

One ``wesichain worker`` and one bare Celery worker (prefork, concurrency 1 each, the same Celery
settings: ``benchmarks/bare.py``) on one dedicated redis-server. After a warm-up, ``redis-cli
MONITOR`` records every command while ``--runs`` runs of ``long`` (``--steps`` tool steps) and then
as many bare chains of as many hops go through. Each command is attributed to the process whose
TCP connection sent it (the worker's main process, its pool child, or the benchmark itself), and
commands a script ran (MONITOR's ``lua`` client) to the script. Commands of one connection that
follow each other with no other command between them and less than :data:`SAME_TRIP_US` apart
are counted as one round trip (a pipeline reaches Redis as one read), and so is a transaction
(``MULTI`` to ``EXEC``). Counts do not depend on the
machine's load; the only timing used is that gap, far below a round trip's cost.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from benchmarks import bare
from benchmarks.harness import Cluster, new_prefix, wait_all_terminal
from benchmarks.scenarios import TASKS_PER_TOOL_STEP
from shared.state import Phase
from worker.testing.harness import WorkerProcess, wait_until

#: Two commands of one connection closer than this (µs), with nothing between them, are one trip.
SAME_TRIP_US = 40.0

_LINE = re.compile(r'^(\d+\.\d+) \[(\d+) ([^\]]+)\] "([^"]+)"(.*)$')


def _ports(pids: dict[int, str]) -> dict[int, str]:
    """Local TCP port -> the role of the process that holds the connection."""
    ports: dict[int, str] = {}
    for pid, role in pids.items():
        try:
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.laddr:
                    ports[conn.laddr.port] = role
        except psutil.NoSuchProcess:
            continue
    return ports


def _roles(worker: WorkerProcess, idle: WorkerProcess) -> dict[int, str]:
    roles = {idle.pid: "idle worker", **{child: "idle worker" for child in idle.children()}}
    roles.update({worker.pid: "main", **{child: "child" for child in worker.children()}})
    roles[psutil.Process().pid] = "benchmark"
    return roles


class Monitor:
    """``redis-cli MONITOR`` into a file, parsed once it stops."""

    def __init__(self, port: int, path: Path) -> None:
        self.path = path
        self._out = open(path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=self._out)

    def stop(self) -> list[tuple[float, str, str, str]]:
        time.sleep(0.2)  # let the last replies' commands reach the file
        self.proc.terminate()
        self.proc.wait(10)
        self._out.close()
        rows = []
        for line in self.path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if m:
                ts, _db, addr, cmd, rest = m.groups()
                rows.append((float(ts), addr, cmd.upper(), rest))
        return rows


def account(
    rows: list[tuple[float, str, str, str]], ports: dict[int, str], transitions: int
) -> dict[str, Any]:
    """Per transition: round trips and commands by process, commands by name, script inner commands."""
    trips: collections.Counter[str] = collections.Counter()
    commands: collections.Counter[tuple[str, str]] = collections.Counter()
    inner: collections.Counter[str] = collections.Counter()
    last: tuple[str, float] | None = None
    previous: tuple[str, float] | None = None
    opened: dict[str, bool] = {}
    gaps: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    sample: list[str] = []
    for ts, addr, cmd, _rest in rows:
        if len(sample) < 120 and addr != "lua":
            gap = (ts - last[1]) * 1e6 if last is not None and last[0] == addr else -1
            sample.append(f"{ports.get(int(addr.rsplit(':', 1)[1]), 'other'):12s} {cmd:14s} +{gap:.0f}us")
        if addr == "lua":
            inner[cmd] += 1
            last = None
            continue
        port = int(addr.rsplit(":", 1)[1]) if ":" in addr else -1
        role = ports.get(port, "other")
        commands[(role, cmd)] += 1
        in_transaction = opened.get(addr, False) and cmd != "MULTI"
        if not in_transaction and (last is None or last[0] != addr or (ts - last[1]) * 1e6 > SAME_TRIP_US):
            trips[role] += 1
        opened[addr] = cmd == "MULTI" or (opened.get(addr, False) and cmd != "EXEC")
        label = f"{role} {cmd}"
        if previous is not None:
            gaps[(previous[0], label)].append((ts - previous[1]) * 1e6)
        previous = (label, ts)
        last = (addr, ts)
    per = 1.0 / transitions
    return {
        "transitions": transitions,
        "round_trips": {r: round(n * per, 3) for r, n in sorted(trips.items())},
        "commands": {f"{r} {c}": round(n * per, 3) for (r, c), n in sorted(commands.items())},
        "script_commands": {c: round(n * per, 3) for c, n in inner.most_common()},
        "sample": sample,
        # Wall-clock, so load-dependent: only to see where a transition waits, never to decide.
        "median_gap_us": {
            f"{a} -> {b}": round(statistics.median(v))
            for (a, b), v in gaps.items()
            if len(v) * 4 >= transitions
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--keep", metavar="DIR", help="write MONITOR's output to DIR and keep it")
    parser.add_argument("--sample", action="store_true", help="print the first commands seen, in order")
    args = parser.parse_args()
    cl = Cluster.start()
    prefix = new_prefix("trips")
    client = cl.client(prefix)
    ours = cl.wesichain_worker("trips-w", prefix)
    theirs = cl.bare_worker("trips-b")
    floor = cl.floor_redis()
    app = bare.make_app(cl.floor_url)
    hops = 2 + TASKS_PER_TOOL_STEP * args.steps
    try:
        cl.up(ours, theirs)

        def submit(n: int) -> int:
            ids = [client.submit("long", f"steps={args.steps}", check_agent=False).run_id for _ in range(n)]
            wait_all_terminal(client, ids, timeout=600)
            heads = [client.store.load(i) for i in ids]
            assert all(h is not None and h.phase is Phase.COMPLETED for h in heads)
            return sum(h.version - 1 for h in heads if h)

        def chains(n: int) -> int:
            ids = [uuid.uuid4().hex for _ in range(n)]
            for c in ids:
                app.send_task(bare.TASK_HOP, kwargs={"chain": c, "hop": 0, "total": hops}, task_id=f"{c}:h0")
            keys = [bare.end_key(c) for c in ids]
            wait_until(lambda: floor.exists(*keys) == len(keys), timeout=600, interval=0.05, what="chains")
            return int(hops * n)

        submit(1)
        chains(1)
        result: dict[str, Any] = {}
        for name, worker, idle, go in (("ours", ours, theirs, submit), ("bare", theirs, ours, chains)):
            monitor = Monitor(cl.redis.port, Path(args.keep or cl.log_dir) / f"monitor-{name}.log")
            time.sleep(0.3)
            ports = _ports(_roles(worker, idle))
            done = go(args.runs)
            ports.update(_ports(_roles(worker, idle)))
            result[name] = account(monitor.stop(), ports, done)
        for name, figures in result.items():
            print(f"== {name}: {figures['transitions']} transitions; per transition:")
            if args.sample:
                print("\n".join(figures["sample"]))
            for key in ("round_trips", "commands", "script_commands", "median_gap_us"):
                print(f"  {key}:")
                for k, v in figures[key].items():
                    print(f"    {k:40s} {v:8.3f}")
    finally:
        client.close()
        floor.close()
        cl.close()


if __name__ == "__main__":
    main()
