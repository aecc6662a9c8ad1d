"""CPU per transition of the phase tasks, run one after another in this process: a figure that
another process's load on the machine barely moves.

    python -m benchmarks.inprocess [--steps 10] [--runs 5] [--system wesichain|bare] [--profile FILE]

Starts its own redis-server, then runs ``--runs`` runs of the ``long`` agent (``steps=N``: N one-tool
steps, 3N+1 transitions) the way a worker would, but with no worker: each Celery message the
runtime pushes (commit and publish in one script, as on the Redis broker) is popped from its queue
list and its task run eagerly with ``Task.apply``, until the run has ended. ``--system bare`` does
the same with the bare Celery hop of ``benchmarks/bare.py`` (3N+1 hops), the floor the
per-transition target is measured against. Prints process CPU time and wall time per transition
(one warm-up run first, not counted).

What it leaves out: the prefork pool (the parent's receive, acknowledgement and pipe to the child),
Celery's worker-side request handling and redis-server's CPU; what it keeps is everything a pool
child does for a transition. Wall time still waits on redis-server; CPU time is this process's only.

For a figure independent of the machine's load, count instructions with valgrind and difference
two run counts (the start-up cancels out)::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.inprocess --runs 1
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m benchmarks.inprocess --runs 4

(instructions per transition = difference of the two totals / difference of the transitions).

``--redis-stats`` also reads redis-server's own figures over the counted runs (``CONFIG
RESETSTAT`` after the warm-up, ``INFO commandstats`` and ``INFO cpu`` after): the scripts' time in
the server (``usec`` of ``evalsha``) and the server's main-thread CPU per transition, and the calls
per transition of every command, the scripts' inner ones included. The calls are counts; the
microseconds are timings, which another process's load moves somewhat.
``--redis-instructions`` runs redis-server under valgrind's callgrind, counting only over the
counted runs, and reports the instructions it executed per transition: in all, in the scripts
(``EVALSHA``, the Lua interpreter and the commands the scripts call), and in those inner commands
alone (``redis.call``'s dispatch included). A count, the same on a loaded machine as on a quiet one
for the same code; what a script costs Redis is read from it, change by change.
``--system direct|eval|pipeline|pipeline-cap8`` measures per item (``--items`` per round, one
warm-up round): N one-think runs submitted directly, as the cases of an eval, or as the items of a
one-map pipeline run (``pipeline-cap8``: whose map keeps at most 8 children live, so that each
child's end starts the next one); it adds the tasks run per item, and with ``--redis-stats`` the
round trips this process made to Redis per item (a pipeline of commands is one).
``--profile FILE`` writes a cProfile of the counted runs (CPU time) for ``python -m pstats FILE``.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import importlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import redis

from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings
from shared.versions import version_queues_of
from worker.testing.harness import RedisServer

if TYPE_CHECKING:
    from producer.client import Client

AGENTS = "benchmarks.agents"
#: The systems measured per item rather than per transition (``fanin_runs``).
FANIN = ("direct", "eval", "pipeline", "pipeline-cap8")


def decode(raw: bytes) -> tuple[str, str, list[Any], dict[str, Any]]:
    """Task name, id, args and kwargs of a Celery message as kombu's Redis channel stores it."""
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _ = json.loads(body)
    return message["headers"]["task"], message["headers"]["id"], args, kwargs


def drain(
    r: redis.Redis, queues: list[str], run_task: Callable[[str, str, list[Any], dict[str, Any]], None]
) -> int:
    """Run every message on ``queues`` (and what they publish) until they are empty; returns how many."""
    done = 0
    while True:
        # One command per delivery whatever the number of queues, as a worker's one ``BRPOP`` over
        # all its queues: an ``RPOP`` per queue in turn made the benchmark's own polling (several
        # round trips per transition, one per hop for the bare floor's single queue) part of the
        # transition's figures.
        popped = cast(list[Any] | None, r.lmpop(len(queues), *queues, direction="RIGHT"))
        if popped is None:
            return done
        run_task(*decode(popped[1][0]))
        done += 1


def in_process(url: str) -> tuple[Any, Client, redis.Redis, list[str]]:
    """A worker's app and a client on ``url`` in this process (no sweeper), a plain Redis client,
    and the queues a worker of the benchmark agents consumes."""
    from producer.client import Client
    from worker.app import create_app

    os.environ.update({"WESICHAIN_REDIS_URL": url, "WESICHAIN_AGENTS": AGENTS, "WESICHAIN_SWEEPER": "0"})
    settings = Settings.from_env()
    app = create_app(settings)
    kinds = [QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS]
    # A run's phases go to its agent version's queues (``wesichain.model.long-v1``), as a worker
    # serving that version consumes them.
    agents = app.wesichain_runtime.get().agents
    queues = kinds + version_queues_of(kinds, (agents.get(n).versions for n in agents.names))
    return app, Client(settings, app=app), redis.Redis.from_url(url), queues


def wesichain_runs(url: str, steps: int) -> Callable[[], int]:
    """A function doing one run of ``long`` in this process; returns its transitions."""
    app, client, r, queues = in_process(url)

    def run_task(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        app.tasks[name].apply(args=args, kwargs=kwargs, task_id=task_id, throw=True)

    def one() -> int:
        handle = client.submit("long", f"steps={steps}", check_agent=False)
        drain(r, queues, run_task)
        head = client.store.load(handle.run_id)
        if head is None or head.phase.value != "completed":
            raise SystemExit(f"run {handle.run_id} did not complete: {head.phase if head else 'missing'}")
        return head.version - 1

    return one


def fanin_runs(url: str, system: str, items: int, tasks: list[str]) -> Callable[[], int]:
    """A function doing ``items`` one-think ``direct`` runs in this process, the way ``system``
    makes them: ``direct`` (submitted one by one from a client), ``eval`` (an eval of that many
    cases, pumped, called back, scored and recorded) or ``pipeline`` (a one-map pipeline run over
    that many items); returns the items done. Each task run is appended to ``tasks``. The per-item
    figures of ``eval`` and ``pipeline`` over ``direct``'s are what the machinery adds per item."""
    from benchmarks.evals import bench_eval
    from producer.evals.client import EvalClient

    app, client, r, queues = in_process(url)

    def run_task(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        tasks.append(name)
        app.tasks[name].apply(args=args, kwargs=kwargs, task_id=task_id, throw=True)

    rounds = iter(range(1_000_000))

    def one() -> int:
        round_ = next(rounds)
        if system == "direct":
            handles = [client.submit("direct", f"item {round_}:{i}", check_agent=False) for i in range(items)]
            drain(r, queues, run_task)
            heads = [client.store.load(h.run_id) for h in handles]
            done = sum(1 for head in heads if head is not None and head.phase.value == "completed")
        elif system == "eval":
            spec, cases = bench_eval(items, round_)
            eval_id, _ = EvalClient(client).submit(spec, cases, b"", "cases.jsonl", check_agents=False)
            drain(r, queues, run_task)
            progress = EvalClient(client).progress(eval_id)
            done = progress.counts[0].passed if progress.meta.status == "completed" else 0
        else:
            text = "\n".join(f"item {round_}:{i}" for i in range(items))
            name = "bench-map-8" if system == "pipeline-cap8" else "bench-map"
            handle = client.submit_pipeline(name, text, check=False)
            drain(r, queues, run_task)
            status = handle.status()
            done = len(status.output) if status.status == "completed" else 0
        if done != items:
            raise SystemExit(f"{system}: {done} of {items} items completed")
        return items

    return one


def count_round_trips() -> Callable[[], int]:
    """Count every write of a command (or of a pipeline's commands) to Redis from this process
    from now on; returns a function giving the count so far."""
    from redis.connection import AbstractConnection

    sent = [0]
    send = cast(Callable[..., None], AbstractConnection.send_packed_command)

    def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        send(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    return lambda: sent[0]


def bare_runs(url: str, steps: int) -> Callable[[], int]:
    """One chain of 3 x ``steps`` + 1 bare hops in this process; returns its hops."""
    from benchmarks import bare

    # The bare module's app (whose hops publish the next) reads the floor's URL when the module
    # runs: run it again with this server's.
    os.environ[bare.ENV_URL] = bare.floor_url(url)
    bare = importlib.reload(bare)
    app = bare.app
    r = redis.Redis.from_url(bare.floor_url(url))
    hops = 3 * steps + 1
    queues: list[str] = []

    def run_task(name: str, task_id: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        app.tasks[name].apply(args=args, kwargs=kwargs, task_id=task_id, throw=True)

    def one() -> int:
        app.send_task(bare.TASK_HOP, kwargs={"chain": uuid.uuid4().hex, "hop": 0, "total": hops})
        if not queues:  # the floor's queue, as its routing names it
            queues.extend(k.decode() for k in cast(list[bytes], r.keys("*")) if r.type(k) == b"list")
        done = drain(r, queues, run_task)
        if done != hops:
            raise SystemExit(f"the bare chain ran {done} hops, not {hops}")
        return done

    return one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inprocess", description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=["wesichain", "bare", *FANIN], default="wesichain")
    p.add_argument("--steps", type=int, default=10, help="tool steps per run (3N+1 transitions)")
    p.add_argument("--items", type=int, default=50, help=f"items per round of {', '.join(FANIN)}")
    p.add_argument("--runs", type=int, default=5, help="runs counted (after one warm-up run)")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile (CPU time) of the counted runs")
    p.add_argument("--redis-stats", action="store_true", help="add redis-server's figures per transition")
    p.add_argument(
        "--redis-instructions", action="store_true", help="count redis-server's instructions (valgrind)"
    )
    args = p.parse_args(argv)
    server = RedisServer()
    counter = RedisInstructions(server) if args.redis_instructions else None
    server.start()
    try:
        tasks: list[str] = []
        if args.system in FANIN:
            one = fanin_runs(server.url, args.system, args.items, tasks)
        else:
            one = (wesichain_runs if args.system == "wesichain" else bare_runs)(server.url, args.steps)
        one()
        stats = redis.Redis.from_url(server.url)
        if args.redis_stats:
            stats.config_resetstat()
            cpu_before = server_cpu_s(stats)
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        if profiler is not None:
            profiler.enable()
        del tasks[:]
        round_trips = count_round_trips() if args.redis_stats else None
        if counter is not None:
            counter.collect(True)
        cpu0, wall0, transitions = time.process_time(), time.perf_counter(), 0
        for _ in range(args.runs):
            transitions += one()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if counter is not None:
            counter.collect(False)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        figures: dict[str, Any] = {
            "system": args.system,
            "transitions": transitions,
            "cpu_ms_per_transition": round(1000 * cpu / transitions, 4),
            "wall_ms_per_transition": round(1000 * wall / transitions, 4),
        }
        if args.system in FANIN:
            # A "transition" here is one item (a direct run, an eval case, a pipeline item).
            figures["tasks_per_item"] = {
                name: round(tasks.count(name) / transitions, 3) for name in sorted(set(tasks))
            }
        if args.redis_stats:
            figures["redis"] = redis_figures(stats, transitions, server_cpu_s(stats) - cpu_before)
            assert round_trips is not None
            figures["redis"]["round_trips_per_transition"] = round(round_trips() / transitions, 2)
    finally:
        server.stop()
    if counter is not None:
        figures["redis_instructions_per_transition"] = counter.per(transitions)
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures))
    return 0


class RedisInstructions:
    """redis-server run under callgrind, instrumented only while told to (``--instr-atstart=no``)."""

    def __init__(self, server: RedisServer) -> None:
        if shutil.which("valgrind") is None:
            raise SystemExit("--redis-instructions needs valgrind (Debian: apt-get install valgrind)")
        self.dir = tempfile.mkdtemp(prefix="wesichain-callgrind-")
        self.out = os.path.join(self.dir, "callgrind.out")
        wrapper = os.path.join(self.dir, "redis-server")
        with open(wrapper, "w") as f:
            f.write(
                "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no"
                f' --callgrind-out-file={self.out} {server.binary} "$@"\n'
            )
        os.chmod(wrapper, 0o755)
        server.binary = wrapper
        self.server = server

    def collect(self, on: bool) -> None:
        assert self.server.proc is not None
        subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(self.server.proc.pid)],
            check=True,
            capture_output=True,
        )

    def per(self, transitions: int) -> dict[str, float]:
        """Instructions per transition (read once the server has stopped and written its counts)."""
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", "--auto=no", self.out],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        shutil.rmtree(self.dir, ignore_errors=True)

        def count(label: str) -> int:
            for line in text.splitlines():
                first = line.split(maxsplit=1)[0] if line.strip() else ""
                if label in line and first.replace(",", "").isdigit():
                    return int(first.replace(",", ""))
            return 0

        return {
            name: round(count(label) / transitions)
            for name, label in (
                ("all", "PROGRAM TOTALS"),
                ("scripts", ":evalShaCommand "),
                ("scripts_inner_commands", ":scriptCall "),
            )
        }


def server_cpu_s(r: redis.Redis) -> float:
    """redis-server's main-thread CPU so far, in seconds."""
    cpu = r.info("cpu")
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def redis_figures(r: redis.Redis, transitions: int, cpu_s: float) -> dict[str, Any]:
    """redis-server's figures since the last ``CONFIG RESETSTAT``, per transition.

    The benchmark's own reads are in them (the ``LMPOP`` standing in for the broker's delivery, the
    final ``HMGET`` of each run), as are a bare hop's in ``--system bare``.
    """
    commands = cast(dict[str, dict[str, Any]], r.info("commandstats"))
    # INFO's own call is counted before its reply: leave it out.
    commands.pop("cmdstat_info", None)
    scripts = [v for k, v in commands.items() if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")]
    return {
        "cpu_us_per_transition": round(1e6 * cpu_s / transitions, 2),
        "script_us_per_transition": round(sum(int(v["usec"]) for v in scripts) / transitions, 2),
        "calls_total_per_transition": round(sum(int(v["calls"]) for v in commands.values()) / transitions, 2),
        "calls_per_transition": {
            k.removeprefix("cmdstat_"): round(int(v["calls"]) / transitions, 3)
            for k, v in sorted(commands.items())
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
