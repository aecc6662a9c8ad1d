"""Prometheus metrics of the workers: what the phase tasks, the sweeper and the model calls did.

Counters and histograms live in each process that does the work. A prefork worker's tasks run in
its pool children, so a worker serving ``/metrics`` runs prometheus-client in *multiprocess mode*:
every process of the worker (main and children, each new child included) writes its values to
files in one private directory, and the main process's endpoint adds them up
(:func:`prepare_multiprocess`, :func:`serve`). One endpoint per worker process group: nothing is
shared between hosts, and Prometheus sums over the workers it scrapes. Facts of the whole pool
(queue depths, runs in flight, parked runs, leases) are not counted here but read from Redis and
the broker by ``wesichain metrics`` (``worker/exporter.py``), so no worker counts them twice.

Label values that come from outside (model strings a producer may set per run, tool names a model
may invent) are bounded (:class:`BoundedLabel`): past a fixed number of distinct values, new ones
are counted as ``other``, so a client cannot grow the series without limit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any

from shared.queues import queue_in
from shared.settings import QUEUE_MODEL, QUEUE_TOOLS
from shared.state import Phase, RunHead

__all__ = [
    "BoundedLabel",
    "ENV_MULTIPROC_DIR",
    "LATENCY_BUCKETS",
    "Metrics",
    "cleanup_multiprocess",
    "metrics",
    "model_error_kind",
    "prepare_multiprocess",
    "queue_of",
    "serve",
    "split_model",
]

#: prometheus-client's variable naming the multiprocess directory (read when it is imported).
ENV_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: Seconds: from a few milliseconds (a commit) to minutes (a long model call or tool).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def prepare_multiprocess(directory: str | None = None) -> str:
    """Make this process (and every process it forks) write metrics to one directory.

    Must run before prometheus-client is first imported (it chooses its value class then); the
    ``wesichain worker`` command calls it before it imports the Celery app. An operator-given
    directory is emptied first: values left by an earlier worker would be added to this one's.
    """
    chosen = directory or os.environ.get(ENV_MULTIPROC_DIR) or tempfile.mkdtemp(prefix="wesichain-metrics-")
    os.makedirs(chosen, exist_ok=True)
    for name in os.listdir(chosen):
        if name.endswith(".db"):
            os.remove(os.path.join(chosen, name))
    os.environ[ENV_MULTIPROC_DIR] = chosen
    return chosen


def serve(port: int, address: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``port`` from this process: the sum over every process of the worker
    in multiprocess mode, else this process's own registry. Returns the server."""
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

    registry = REGISTRY
    if os.environ.get(ENV_MULTIPROC_DIR):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    server, _thread = start_http_server(port, addr=address, registry=registry)
    return server


def cleanup_multiprocess() -> None:
    """Remove the multiprocess directory this worker made (at shutdown)."""
    directory = os.environ.get(ENV_MULTIPROC_DIR)
    if directory and os.path.basename(directory).startswith("wesichain-metrics-"):
        shutil.rmtree(directory, ignore_errors=True)


def queue_of(task: str, namespace: str | None = None) -> str:
    """The queue a phase task travels on: as the Celery routes say, or in the run's namespace."""
    if namespace is not None:
        return queue_in(namespace, "tools" if task == "wesichain.tool" else "model")
    return QUEUE_TOOLS if task == "wesichain.tool" else QUEUE_MODEL


def model_error_kind(status_code: int | None, retryable: bool) -> str:
    """A failed model call's kind, for labels: ``http_429``, ``http_5xx``, ``http_4xx``,
    ``transport`` (network trouble, timeouts: retryable without a status) or ``malformed``."""
    if status_code == 429:
        return "http_429"
    if status_code is not None:
        return "http_5xx" if status_code >= 500 else "http_4xx"
    return "transport" if retryable else "malformed"


def split_model(model: str) -> tuple[str, str]:
    """``react+openai:gpt-4o`` -> ("openai", "gpt-4o"); the provider and model label of a call."""
    provider, _, name = model.removeprefix("react+").partition(":")
    return (provider or "unknown"), (name or "unknown")


class BoundedLabel:
    """At most ``limit`` distinct values of one label; later new values become ``other``."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        value = value[:120]
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return "other"


class Metrics:
    """Every metric a worker process exports, with one method per thing that happened.

    Methods are cheap (in-memory or mmap writes) and never raise into the phase.
    """

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self._models = BoundedLabel()
        self._tools = BoundedLabel()
        self._agents = BoundedLabel()
        #: Queue names include the runs' namespaces, which producers choose.
        self._queues = BoundedLabel()
        #: Each metric's children by label values (bounded: every label's values are), so a
        #: transition does not pay for prometheus-client's ``labels`` lookup each time.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.runs_started = Counter("wesichain_runs_started", "Runs that began thinking", ["agent"])
        self.runs_ended = Counter(
            "wesichain_runs_ended",
            "Runs that ended, by the agent in charge at the end, status (completed, failed,"
            " interrupted) and error kind",
            ["agent", "status", "error_kind"],
        )
        self.handoffs = Counter(
            "wesichain_handoffs",
            "Handoffs committed, by the agent that handed over and its target",
            ["from_agent", "to_agent"],
        )
        self.phase_seconds = Histogram(
            "wesichain_phase_duration_seconds",
            "Time a claimed phase (or tool call, phase acting) took, from claim to commit",
            ["phase"],
            buckets=LATENCY_BUCKETS,
        )
        self.queue_wait = Histogram(
            "wesichain_queue_wait_seconds",
            "Time from the commit that published a task to its first claim (includes countdowns)",
            ["queue"],
            buckets=LATENCY_BUCKETS,
        )
        self.takeovers = Counter(
            "wesichain_sweeper_takeovers",
            "Phases the sweeper handed on, by reason (lease_expired, message_lost)",
            ["reason"],
        )
        self.poison = Counter("wesichain_poison_failures", "Runs failed as PoisonPhase", ["phase"])
        self.fenced = Counter(
            "wesichain_commits_fenced", "Commits refused because another delivery won", ["phase"]
        )
        self.duplicates = Counter(
            "wesichain_duplicate_deliveries_dropped",
            "Deliveries that found the run elsewhere or the work held (stale, busy, done)",
            ["task", "reason"],
        )
        self.model_calls = Counter(
            "wesichain_model_calls",
            "Model calls, by outcome (ok, or the error kind)",
            ["provider", "model", "outcome"],
        )
        self.model_seconds = Histogram(
            "wesichain_model_call_duration_seconds",
            "Model call latency (retries inside the call included)",
            ["provider", "model"],
            buckets=LATENCY_BUCKETS,
        )
        self.model_errors = Counter(
            "wesichain_model_call_errors",
            "Failed model calls by kind (http_429, http_5xx, http_4xx, network, malformed, ...)",
            ["provider", "model", "kind"],
        )
        self.tokens = Counter(
            "wesichain_model_tokens", "Tokens in and out", ["provider", "model", "direction"]
        )
        self.throttled = Counter(
            "wesichain_model_calls_throttled",
            "Thinks re-queued because a provider limit had no capacity (rpm, tpm, concurrency, retry_after)",
            ["provider", "model", "reason"],
        )
        self.tool_calls = Counter("wesichain_tool_calls", "Tool calls by outcome", ["tool", "outcome"])
        self.tool_seconds = Histogram(
            "wesichain_tool_call_duration_seconds", "Tool call latency", ["tool"], buckets=LATENCY_BUCKETS
        )
        self.tool_errors = Counter(
            "wesichain_tool_call_errors", "Failed tool calls by kind", ["tool", "kind"]
        )

    def _of(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per process and label values."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    # -- runs --------------------------------------------------------------------------------------

    def committed(self, before: RunHead, after: RunHead) -> None:
        """A transition was committed by this process: count starts, handoffs and ends of runs.

        A start counts under the agent the run was submitted for; an end under the agent in
        charge when it ended (after a handoff, the target: whose answer, failure or budget it is).
        """
        if before.phase is Phase.IDLE and after.phase is Phase.THINKING:
            self._of(self.runs_started, self._agents(after.agent)).inc()
        if len(after.handoffs) > len(before.handoffs) and before.phase is not Phase.IDLE:
            handed = after.handoffs[-1]
            self._of(self.handoffs, self._agents(handed.from_agent), self._agents(handed.to_agent)).inc()
        if after.terminal and not before.terminal:
            kind = after.error.kind if after.error is not None else "none"
            self._of(self.runs_ended, self._agents(after.active_agent), after.status, kind).inc()
            if kind == "PoisonPhase" and after.error is not None:
                self._of(self.poison, str(after.error.details.get("phase", before.phase.value))).inc()

    def phase_done(self, phase: Phase, seconds: float) -> None:
        self._of(self.phase_seconds, phase.value).observe(max(0.0, seconds))

    def waited(self, task: str, seconds: float, namespace: str | None = None) -> None:
        """A phase task waited ``seconds`` in its queue (its run's namespace's, if it has one)."""
        self._of(self.queue_wait, self._queues(queue_of(task, namespace))).observe(max(0.0, seconds))

    def duplicate(self, task: str, reason: str) -> None:
        self._of(self.duplicates, task, reason).inc()

    def fenced_off(self, phase: Phase) -> None:
        self._of(self.fenced, phase.value).inc()

    def takeover(self, reason: str) -> None:
        self._of(self.takeovers, reason).inc()

    # -- model and tool calls ------------------------------------------------------------------------

    def model_call(
        self, model: str, seconds: float, *, error: str | None, tokens_in: int = 0, tokens_out: int = 0
    ) -> None:
        provider, name = split_model(model)
        name = self._models(f"{provider}:{name}").partition(":")[2] or "other"
        self._of(self.model_calls, provider, name, error or "ok").inc()
        self._of(self.model_seconds, provider, name).observe(max(0.0, seconds))
        if error is not None:
            self._of(self.model_errors, provider, name, error).inc()
        if tokens_in:
            self._of(self.tokens, provider, name, "in").inc(tokens_in)
        if tokens_out:
            self._of(self.tokens, provider, name, "out").inc(tokens_out)

    def model_throttled(self, model: str, reason: str) -> None:
        provider, name = split_model(model)
        name = self._models(f"{provider}:{name}").partition(":")[2] or "other"
        self._of(self.throttled, provider, name, reason).inc()

    def tool_call(self, tool: str, seconds: float, error_kind: str | None, *, known: bool = True) -> None:
        label = self._tools(tool) if known else "unknown"
        self._of(self.tool_calls, label, "ok" if error_kind is None else "error").inc()
        self._of(self.tool_seconds, label).observe(max(0.0, seconds))
        if error_kind is not None:
            self._of(self.tool_errors, label, error_kind).inc()


_lock = threading.Lock()
_metrics: Metrics | None = None


def metrics() -> Metrics:
    """This process's metrics (created once: prometheus-client registers each name once)."""
    global _metrics
    if _metrics is None:
        with _lock:
            if _metrics is None:
                _metrics = Metrics()
    return _metrics
