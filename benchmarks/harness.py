"""Processes, clocks and statistics shared by the scenarios.

Everything runs for real: one ``redis-server`` on a free loopback port
(``worker.testing.harness.RedisServer``), ``wesichain worker`` processes and bare ``celery worker``
processes, each in its own process group.
The runtime's workers keep their run state and their broker in Redis database 0, with no broker
key prefix (the product's default); the bare Celery floor has the same configuration in database 1
(``benchmarks/bare.py``), so the two never share a queue. Each scenario gets its own run-state key
prefix, and the runner empties the server between scenarios (:meth:`Cluster.reset`), so no message
a scenario left in the broker reaches the next one's workers.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
from redis import Redis

from benchmarks import bare
from producer.client import Client
from shared import protocol
from shared.keys import Keys
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS, Settings
from shared.state import Phase, RunHead
from shared.workers import WorkerDirectory
from worker.testing.harness import RedisServer, WorkerProcess, wait_until

AGENTS = "benchmarks.agents"
END_MARKERS = ('"kind":"Completed"', '"kind":"Failed"', '"kind":"Interrupted"')

_live: list[WorkerProcess] = []


def _stop_all() -> None:
    for w in list(_live):
        try:
            w.stop(timeout=5)
        except Exception:  # best effort at exit
            w.kill()


atexit.register(_stop_all)


# -- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of a non-empty sample."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """n, min, p50, p95, max and mean of a sample, rounded."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values), digits),
        "p50": round(percentile(values, 50), digits),
        "p95": round(percentile(values, 95), digits),
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
    }


def ratio(value: float, reference: float) -> float:
    return round(value / reference, 3) if reference else math.nan


def check(value: float, target: float, op: str) -> dict[str, Any]:
    """A target verdict: ``op`` is "<=" (lower is better) or ">=" (higher is better)."""
    ok = value <= target if op == "<=" else value >= target
    return {"value": round(value, 3), "target": target, "op": op, "pass": bool(ok)}


# -- processes


@dataclass
class Cluster:
    """One redis-server (by default for the whole benchmark); workers come and go per scenario."""

    redis: RedisServer
    log_dir: str
    workers: list[WorkerProcess] = field(default_factory=list)
    #: Worker id -> run-state prefix of the wesichain workers started, whose registry records
    #: :meth:`up` waits for.
    registered: dict[str, str] = field(default_factory=dict)
    #: Worker id -> database of the wesichain workers started on another database than 0.
    databases: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, server: RedisServer | None = None) -> Cluster:
        """A cluster on ``server`` (started here if not running), or on a new plain redis-server."""
        server = server or RedisServer()
        if server.proc is None:
            server.start()
        return cls(redis=server, log_dir=tempfile.mkdtemp(prefix="wesichain-bench-"))

    @property
    def url(self) -> str:
        return self.redis.url

    @property
    def floor_url(self) -> str:
        """The bare Celery floor's broker and keys: the same server, its own database."""
        return bare.floor_url(self.url)

    def floor_redis(self) -> Redis:
        return Redis.from_url(self.floor_url, decode_responses=True)

    @property
    def defaults_url(self) -> str:
        """The floor under Celery's defaults: the same server, another database of its own."""
        return bare.floor_url(self.url, bare.DEFAULTS_DB)

    def db_url(self, db: int) -> str:
        """The same server, database ``db``."""
        return bare.floor_url(self.url, db)

    def reset(self) -> None:
        """Empty every database of the server (call it with no worker running)."""
        client = self.redis.client()
        try:
            client.flushall()
        finally:
            client.close()

    def settings(self, prefix: str, db: int = 0) -> Settings:
        return Settings(redis_url=self.db_url(db) if db else self.url, agents_module=AGENTS, prefix=prefix)

    def client(self, prefix: str, db: int = 0) -> Client:
        return Client(self.settings(prefix, db))

    def wesichain_worker(
        self,
        name: str,
        prefix: str,
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        queues: str | None = None,
        env: dict[str, str] | None = None,
        include: tuple[str, ...] = (),
        db: int = 0,
    ) -> WorkerProcess:
        """A ``wesichain worker``; ``db`` other than 0 gives it a database (run state and broker)
        of its own on the same server, for a variant that must not share queues with the others."""
        w = WorkerProcess(
            name,
            self.db_url(db) if db else self.url,
            agents=AGENTS,
            pool=pool,
            concurrency=concurrency,
            queues=queues,
            env={"WESICHAIN_PREFIX": prefix, **(env or {})},
            log_dir=self.log_dir,
            include=include,
        )
        self.registered[f"{name}@test"] = prefix
        self.databases[f"{name}@test"] = db
        return w

    def bare_worker(
        self, name: str, *, pool: str = "prefork", concurrency: int = 1, floor: str = "runtime"
    ) -> WorkerProcess:
        """A bare Celery worker, started with the same options ``wesichain worker`` passes to Celery.

        ``floor="defaults"``: the app under Celery's defaults (late acks and prefetch 1 only), on
        its own database and Celery's default queue.
        """
        if floor == "defaults":
            return self.celery_worker(
                name,
                "benchmarks.bare",
                pool=pool,
                concurrency=concurrency,
                env={bare.ENV_FLOOR: "defaults", bare.ENV_URL: self.defaults_url},
                queues=bare.DEFAULTS_QUEUE,
            )
        return self.celery_worker(name, "benchmarks.bare", pool=pool, concurrency=concurrency)

    def celery_worker(
        self,
        name: str,
        app_module: str,
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        queues: str = f"{QUEUE_MODEL},{QUEUE_TOOLS}",
    ) -> WorkerProcess:
        """``celery -A app_module worker`` with the options ``wesichain worker`` uses."""
        w = WorkerProcess(name, self.url, pool=pool, concurrency=concurrency, log_dir=self.log_dir)
        w.args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app_module,
            "worker",
            f"--queues={queues}",
            f"--pool={pool}",
            "--loglevel=INFO",
            f"--concurrency={concurrency}",
            f"--hostname={name}@bench",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
        ]
        w.env.update(
            {bare.ENV_URL: self.floor_url, "WESICHAIN_REDIS_URL": self.url, "WESICHAIN_AGENTS": AGENTS}
        )
        w.env.update(env or {})
        return w

    def up(self, *workers: WorkerProcess) -> list[WorkerProcess]:
        """Start workers in parallel and wait until every one is ready (see :meth:`ready`)."""
        self.launch(*workers)
        return self.ready(*workers)

    def launch(self, *workers: WorkerProcess) -> None:
        """Start workers without waiting for them."""
        for w in workers:
            w.start(wait=False)
            _live.append(w)
            self.workers.append(w)

    def ready(self, *workers: WorkerProcess) -> list[WorkerProcess]:
        """Wait until every one of ``workers`` (launched) is ready.

        A wesichain worker is ready once it is also listed, consuming, in its prefix's worker
        registry: only then does ``Client.submit`` (which checks that a live worker serves the
        agent) accept runs for it.
        """
        for w in workers:
            w.wait_ready(timeout=60)
        for w in workers:
            worker_id = f"{w.name}@test"
            if worker_id in self.registered:
                self.wait_registered(worker_id, self.registered[worker_id], self.databases.get(worker_id, 0))
        return list(workers)

    def wait_registered(self, worker_id: str, prefix: str, db: int = 0, timeout: float = 30.0) -> None:
        """Wait until the registry under ``prefix`` lists ``worker_id`` as live and consuming."""
        settings = self.settings(prefix, db)
        client = self.redis.client(db=db)
        directory = WorkerDirectory(client, Keys(prefix, settings.shards), settings.registry_interval_s)

        def listed() -> bool:
            return any(
                w.record.id == worker_id and (w.record.consuming or w.record.consumer_state == "saturated")
                for w in directory.live()
            )

        try:
            wait_until(listed, timeout=timeout, interval=0.05, what=f"{worker_id} in the worker registry")
        finally:
            client.close()

    def down(self, *workers: WorkerProcess) -> None:
        for w in workers:
            w.stop(timeout=10)
            if w in _live:
                _live.remove(w)
            if w in self.workers:
                self.workers.remove(w)
            self.registered.pop(f"{w.name}@test", None)
            self.databases.pop(f"{w.name}@test", None)

    def close(self, keep_logs: bool = False) -> None:
        """Stop every worker and the server; worker logs are kept only when asked (after a failure)."""
        self.down(*self.workers)
        self.redis.cleanup()
        if keep_logs:
            print(f"worker logs kept in {self.log_dir}", file=sys.stderr)
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)


class PersistentRedisServer(RedisServer):
    """The harness's redis-server with a chosen persistence: no AOF, or AOF with an fsync policy.

    ``appendfsync`` None starts it as the harness does (``--appendonly no``); "everysec" or
    "always" start it with ``appendonly=True`` (the harness's own AOF setup: the file in the
    server's temporary directory, ``--appendfsync always``), then set the fsync policy with
    ``CONFIG SET appendfsync``. RDB snapshots stay off (``--save ""``) in every case.
    """

    def __init__(self, appendfsync: str | None = None) -> None:
        if appendfsync not in (None, "everysec", "always"):
            raise ValueError(f"appendfsync must be None, 'everysec' or 'always', not {appendfsync!r}")
        super().__init__(appendonly=appendfsync is not None)
        self.appendfsync = appendfsync

    def start(self) -> PersistentRedisServer:
        super().start()
        client = self.client()
        try:
            if self.appendfsync is not None:
                client.config_set("appendfsync", self.appendfsync)
            conf = self._config(client)
            wanted = {"appendonly": "yes" if self.appendfsync else "no"}
            if self.appendfsync:
                wanted["appendfsync"] = self.appendfsync
            if any(conf.get(k) != v for k, v in wanted.items()):
                raise RuntimeError(f"redis-server persistence is {conf}, wanted {wanted}")
        finally:
            client.close()
        return self

    @staticmethod
    def _config(client: Redis) -> dict[str, str]:
        return {k: str(client.config_get(k).get(k)) for k in ("appendonly", "appendfsync")}

    def persistence(self) -> dict[str, Any]:
        """The server's persistence settings and AOF counters, and the file system the AOF is on."""
        client = self.client()
        try:
            conf = self._config(client)
            info = client.info("persistence")
        finally:
            client.close()
        keep = ("aof_enabled", "aof_current_size", "aof_delayed_fsync", "aof_last_write_status")
        return {**conf, **{k: info[k] for k in keep if k in info}, "dir": self.dir, **file_system(self.dir)}


def file_system(path: str) -> dict[str, str]:
    """The device, mount point and type of the file system holding ``path``."""
    real = os.path.realpath(path)
    best: Any = None
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and (
            best is None or len(mount) > len(best.mountpoint)
        ):
            best = part
    if best is None:
        return {}
    return {"device": best.device, "mountpoint": best.mountpoint, "fstype": best.fstype}


def new_prefix(name: str) -> str:
    return f"b{uuid.uuid4().hex[:6]}-{name}:"


# -- memory


def worker_rss(worker: WorkerProcess) -> dict[str, float]:
    """RSS in MiB of a worker's main process and of its pool children (recursively)."""
    try:
        main = psutil.Process(worker.pid)
        main_rss = main.memory_info().rss
        kids = 0
        for child in main.children(recursive=True):
            try:
                kids += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        return {"main_mib": 0.0, "children_mib": 0.0, "total_mib": 0.0}
    mib = 1024 * 1024
    return {
        "main_mib": round(main_rss / mib, 2),
        "children_mib": round(kids / mib, 2),
        "total_mib": round((main_rss + kids) / mib, 2),
    }


def settled_rss(worker: WorkerProcess, children: int = 1, timeout: float = 15.0) -> dict[str, float]:
    """:func:`worker_rss` once the pool has all its children (prefork replaces a child every
    ``worker_max_tasks_per_child`` tasks; caught mid-replacement, a worker would look half its size),
    as the median of three samples."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rss = worker_rss(worker)
        if len(worker.children()) >= children and (children == 0 or rss["children_mib"] > 0):
            break
        time.sleep(0.1)
    samples = []
    for _ in range(3):
        samples.append(worker_rss(worker))
        time.sleep(0.1)
    return sorted(samples, key=lambda r: r["total_mib"])[1]


class PeakRss:
    """Samples the summed RSS of some workers in a background thread; ``peak`` is the maximum seen."""

    def __init__(self, workers: Iterable[WorkerProcess], interval_s: float = 0.05) -> None:
        self.workers = list(workers)
        self.interval_s = interval_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        total = sum(worker_rss(w)["total_mib"] for w in self.workers)
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- runs


def wait_terminal(client: Client, run_id: str, timeout: float = 60.0) -> RunHead:
    """Block on the run's event stream (XREAD BLOCK, no polling delay) until its end event."""
    store = client.store
    key = store.keys.events(run_id)
    cursor = "0-0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply: Any = store.redis.xread({key: cursor}, count=500, block=500)
        if not reply:
            head = store.load(run_id)
            if head is not None and head.terminal:
                return head
            continue
        entries = reply[0][1]
        cursor = entries[-1][0]
        if any(marker in fields["e"] for _, fields in entries for marker in END_MARKERS):
            head = store.load(run_id)
            assert head is not None
            return head
    raise TimeoutError(f"run {run_id} not finished after {timeout}s")


def wait_all_terminal(client: Client, run_ids: Sequence[str], timeout: float) -> None:
    """Poll many runs' phases with one pipeline round trip every 20 ms until all are terminal."""
    keys = [client.store.keys.run(r) for r in run_ids]
    terminal = {p.value for p in Phase if p.terminal}
    pending = list(keys)

    def done() -> bool:
        nonlocal pending
        pipe = client.store.redis.pipeline(transaction=False)
        for k in pending:
            pipe.hget(k, protocol.PHASE)
        phases = pipe.execute()
        pending = [k for k, p in zip(pending, phases, strict=True) if p not in terminal]
        return not pending

    wait_until(done, timeout=timeout, interval=0.02, what=f"{len(run_ids)} runs to finish")


def run_and_wait(
    client: Client, agent: str, text: str, *, model: str | None = None, check_agent: bool = True
) -> tuple[RunHead, float]:
    """Submit one run and follow it to its end; returns the final head and client latency in ms.

    The latency includes ``Client.submit``'s check that a live worker serves the agent (one read
    of the worker registry) unless ``check_agent`` is False.
    """
    started = time.perf_counter()
    handle = client.submit(agent, text, model=model, check_agent=check_agent)
    head = wait_terminal(client, handle.run_id)
    return head, (time.perf_counter() - started) * 1000


def bare_chain(r: Redis, app: Any, task: str, hops: int, timeout: float = 60.0) -> float:
    """Run one bare hop chain; returns milliseconds per hop (first hop start to last hop end).

    ``r`` is a client of the floor's database (:meth:`Cluster.floor_redis`), ``app`` the floor's
    app (``bare.make_app(cluster.floor_url)``).
    """
    chain = uuid.uuid4().hex
    app.send_task(task, kwargs={"chain": chain, "hop": 0, "total": hops}, task_id=f"{chain}:h0")
    wait_until(lambda: r.exists(bare.end_key(chain)), timeout=timeout, interval=0.005, what="bare chain")
    start, end = float(str(r.get(bare.start_key(chain)))), float(str(r.get(bare.end_key(chain))))
    return (end - start) * 1000 / (hops - 1)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def environment() -> dict[str, Any]:
    import platform
    import subprocess

    import celery
    import kombu
    import pydantic
    import redis as redis_py

    try:
        server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10)
        redis_server = server.stdout.strip()
    except OSError:
        redis_server = "unknown"
    peers: dict[str, str] = {}
    for name in ("langgraph", "langgraph.checkpoint.sqlite", "langchain_core"):
        try:
            from importlib.metadata import version

            dist = {
                "langgraph": "langgraph",
                "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
                "langchain_core": "langchain-core",
            }[name]
            peers[dist] = version(dist)
        except Exception:  # not installed: the peers scenario says so
            pass
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis_py": redis_py.__version__,
        "pydantic": pydantic.VERSION,
        "redis_server": redis_server,
        "peers": peers,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def process_cpu_s(worker: WorkerProcess) -> dict[str, float]:
    """CPU seconds (user + system) of a worker's main process and of its pool children so far.

    Children include those already reaped (prefork replaces a child every
    ``worker_max_tasks_per_child`` tasks), through the main process's ``children_*`` times.
    """
    try:
        main = psutil.Process(worker.pid)
        t = main.cpu_times()
        kids = t.children_user + t.children_system
        for child in main.children(recursive=True):
            try:
                c = child.cpu_times()
                kids += c.user + c.system
            except psutil.NoSuchProcess:
                pass
        return {"main": t.user + t.system, "children": kids}
    except psutil.NoSuchProcess:
        return {"main": 0.0, "children": 0.0}


def pid_cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.NoSuchProcess:
        return 0.0
