"""The Celery app: thin tasks that hand each phase to the runtime.

Start a worker with ``wesichain worker`` (or ``celery -A worker.app worker``). Settings come from
the environment (``WESICHAIN_REDIS_URL``, ``WESICHAIN_AGENTS``, ...), read once per process.
Every worker's main process also runs the sweeper (one sweeps at a time across the pool) unless
``WESICHAIN_SWEEPER=0``. A worker refuses to start (status 2, before it consumes anything) when it
cannot import its agents module, or when a ``rediss://`` server fails TLS verification.

A task whose delivery ended the run as FAILED or INTERRUPTED raises :class:`RunEnded` after the
commit, so a monitor such as Flower shows it as a failed task with the run's error; the message is
acknowledged like any other (it is an expected exception of the task: no retry, no redelivery).
With RabbitMQ as the broker, a task the run state's Redis did not answer goes back to RabbitMQ as a
retry (see :func:`outage_retry`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import redis
from billiard.einfo import ExceptionWithTraceback
from celery import Celery, Task
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_init,
    worker_ready,
    worker_shutdown,
)
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.request import Request
from kombu.transport import redis as redis_transport
from kombu.utils import json as kombu_json

from producer.publishing import (
    MessageBuilder,
    ReprAMQP,
    RuntimePublisher,
    broker_is_store,
    broker_redis,
    publish_commands,
    pushes_messages,
)
from shared.agents import load_registry
from shared.errors import ArchiveUnavailable, ConfigError, WesichainError
from shared.evals.tasks import TASK_EVAL_PUMP, TASK_EVAL_SCORE
from shared.events import configure_worker_identity, worker_identity
from shared.pipeline.tasks import TASK_PIPELINE_ADVANCE, TASK_PIPELINE_CHILD
from shared.redis_client import connect, preflight
from shared.settings import QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, Settings, celery_config
from shared.state import Phase, RunHead, TaskSpec
from shared.store import RunStore
from shared.tasks import (
    TASK_ARCHIVE,
    TASK_BULK,
    TASK_CALLBACK,
    TASK_CHILD_DONE,
    TASK_DECIDE,
    TASK_OBSERVE,
    TASK_SPAWN,
    TASK_START,
    TASK_SWEEP,
    TASK_THINK,
    TASK_TOOL,
)
from shared.tls import RedisTlsError
from worker import acks
from worker.acks import DeliveryAcks, acked_in_commit, forget_acked_in_commit
from worker.act import run_tool
from worker.broker_probe import BrokerProbe, RedisQueues, UnknownBroker
from worker.callback import run_callback
from worker.decide import run_decide
from worker.heartbeat import Heartbeat
from worker.hooks import load_hooks
from worker.logs import begin_phase, end_phase
from worker.logs import configure as configure_logs
from worker.lost import on_lost_process
from worker.metrics import cleanup_multiprocess
from worker.metrics import serve as serve_metrics
from worker.observe import run_observe
from worker.registry import RegistryBeat
from worker.runtime import Delivery, Runtime
from worker.start import run_start
from worker.subagents import run_child_done, run_spawn
from worker.sweeper import Sweeper
from worker.think import run_think
from worker.throttle import model_gate
from worker.tracing import Tracing
from worker.versions import DelayedQueues, add_version_queues

if TYPE_CHECKING:
    # Imported when first used: a worker whose pool runs no eval and no pipeline never loads them
    # (nor the client, the model providers and the HTTP client they bring).
    from worker.bulk import BulkPool
    from worker.evals import EvalPool
    from worker.pipelines import PipelinePool

__all__ = [
    "Consumer",
    "EXIT_CONFIG",
    "LoggedTask",
    "MalformedTask",
    "OUTAGE_RETRIES",
    "PHASE_OF_TASK",
    "PhaseRequest",
    "RunEnded",
    "RuntimeHolder",
    "check_agents_module",
    "create_app",
    "outage_retry",
]

log = logging.getLogger("wesichain.worker")


#: The CLI's exit status for a configuration error.
EXIT_CONFIG = 2


#: The phase each task does (a log line's ``phase`` before the run is claimed).
PHASE_OF_TASK = {
    TASK_START: Phase.IDLE.value,
    TASK_THINK: Phase.THINKING.value,
    TASK_TOOL: Phase.ACTING.value,
    TASK_OBSERVE: Phase.OBSERVING.value,
    TASK_DECIDE: Phase.AWAITING_APPROVAL.value,
    TASK_CALLBACK: "callback",
}


class RunEnded(WesichainError):
    """Raised by the task whose delivery ended its run FAILED or INTERRUPTED (after the commit)."""


class RuntimeHolder:
    """Builds the runtime lazily, once per process: Redis connections must not cross a fork."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._runtime: Runtime | None = None
        self.sweeper: Sweeper | None = None
        self.registry: RegistryBeat | None = None
        self._evals: EvalPool | None = None
        self._evals_pid = -1
        self._pipelines: PipelinePool | None = None
        self._pipelines_pid = -1
        self._bulk: BulkPool | None = None
        self._bulk_pid = -1

    def get(self) -> Runtime:
        if self._runtime is None or self._pid != os.getpid():
            with self._lock:
                if self._runtime is None or self._pid != os.getpid():
                    self._runtime = self._build()
                    self._pid = os.getpid()
        return self._runtime

    def _build(self) -> Runtime:
        settings = self.settings
        configure_worker_identity(settings.worker_name)
        store = RunStore(connect(settings), settings)
        app = self.app
        builder = MessageBuilder(app) if pushes_messages(settings) else None
        # Where the built messages go: the store's client when the broker is that Redis, else a
        # client of the broker's own Redis (the standalone one beside a Redis Cluster run state),
        # kept for the process as the store's is.
        in_store = broker_is_store(settings)
        broker = broker_redis(settings, store.redis) if builder is not None else store.redis
        # A commit script pushes its next phase (and acknowledges its delivery) only on the
        # broker's own server; beside it, the delivery's acknowledgement goes with the publish that
        # follows the commit, in one transaction on the broker (``worker/acks.py``).
        commit_pushes = builder is not None and in_store and settings.commit_publish
        publish_acks = builder is not None and not in_store and settings.commit_publish

        delayed = DelayedQueues(app)

        def send(spec: TaskSpec) -> None:
            if builder is not None:
                # Celery's message, pushed on a kept client: no Redis client per publish and no
                # send_task per message. A Redis it cannot reach raises what send_task raises.
                publish_commands(broker, builder.build([spec]))
                return
            countdown = spec.countdown or None
            if countdown and not settings.broker_is_redis:
                # RabbitMQ's delayed delivery counts whole seconds, and Celery 5.7 raises on a
                # countdown that truncates to 0 ("countdown must be a positive number").
                countdown = max(1.0, countdown)
                if spec.queue is not None:
                    delayed.ensure(spec.queue)
            app.send_task(
                spec.name,
                args=spec.args or None,
                kwargs=spec.arguments or None,
                task_id=spec.task_id,
                countdown=countdown,
                time_limit=spec.time_limit_s,
                queue=spec.queue,
            )

        agents = load_registry(settings.agents_module)
        renew_s = min(settings.lease_s / 3, 1.0)
        runtime = Runtime(
            store=store,
            agents=agents,
            send=send,
            settings=settings,
            heartbeat=Heartbeat(store, interval_s=renew_s),
            hooks=load_hooks(settings.hooks),
            gate=model_gate(store, agents, settings, renew_s),
            tracing=Tracing(settings.otel),
            prepare=builder.build if builder is not None and commit_pushes else None,
            acks=_delivery_acks(app) if commit_pushes or publish_acks else None,
            publish_acked=(
                lambda specs, ack: publish_commands(broker, [*builder.build(specs), *ack], atomic=True)
            )
            if builder is not None and publish_acks
            else None,
            # Celery's messages pushed in one pipelined round trip, as ``send`` pushes one.
            send_many=(lambda specs: publish_commands(broker, builder.build(specs)))
            if builder is not None
            else None,
        )
        # A case run's end is scored right after its terminal commit (see ``worker/evals.py``).
        runtime.local_callbacks[TASK_EVAL_SCORE] = lambda head: self.evals().score_run(head)
        # So is a pipeline's child run's end recorded (see ``worker/pipelines.py``).
        runtime.local_callbacks[TASK_PIPELINE_CHILD] = lambda head: self.pipelines().child_run_ended(head)
        runtime.deliver_callback = _deliver_callback
        return runtime

    def evals(self) -> EvalPool:
        """What the pool does for evals, once per process (its client creates the case runs)."""
        from worker.evals import EvalPool

        if self._evals is None or self._evals_pid != os.getpid():
            runtime = self.get()
            self._evals = EvalPool.for_runtime(runtime)
            self._evals_pid = os.getpid()
        return self._evals

    def pipelines(self) -> PipelinePool:
        """What the pool does for pipeline runs, once per process (its client creates the children)."""
        from producer.client import Client
        from worker.pipelines import PipelinePool

        if self._pipelines is None or self._pipelines_pid != os.getpid():
            runtime = self.get()
            # The children's starts go out as the worker's own phases do (see ``RuntimePublisher``).
            client = Client(
                self.settings,
                app=cast(Celery, RuntimePublisher(runtime.send, runtime.send_all)),
                store=runtime.store,
                # Each child's create script pushes its start, as a commit pushes its tasks.
                prepare=runtime.prepare,
            )
            self._pipelines = PipelinePool(client, runtime.agents, runtime.send)
            self._pipelines_pid = os.getpid()
        return self._pipelines

    def bulk(self) -> BulkPool:
        """What the pool does for bulk jobs, once per process (its client creates the runs)."""
        from producer.client import Client
        from worker.bulk import BulkPool

        if self._bulk is None or self._bulk_pid != os.getpid():
            runtime = self.get()
            client = Client(self.settings, app=self.app, store=runtime.store)
            self._bulk = BulkPool(client, runtime.send, lease_s=max(3.0, self.settings.lease_s * 3))
            self._bulk_pid = os.getpid()
        return self._bulk

    def probe(self) -> BrokerProbe:
        """How the sweeper asks the broker about queued messages."""
        if not self.settings.broker_is_redis:
            # The in-memory broker, or RabbitMQ: nothing to look into (the sweeper then waits a
            # generous total time before it publishes an unclaimed task again).
            return UnknownBroker()
        conf = celery_config(self.settings)
        options = conf["broker_transport_options"]
        return RedisQueues(
            broker_redis(self.settings, self.get().store.redis),
            [QUEUE_MODEL, QUEUE_TOOLS, QUEUE_CALLBACKS],
            prefix=options.get("global_keyprefix", ""),
        )

    def start_sweeper(self) -> None:
        if self.sweeper is None:
            self.sweeper = Sweeper(self.get(), self.probe(), self.evals, self.pipelines, self.bulk)
            self.sweeper.start()

    def stop_sweeper(self) -> None:
        if self.sweeper is not None:
            self.sweeper.stop()
            self.sweeper = None

    def start_registry(self, consumer: Any) -> None:
        if self.registry is None:
            self.registry = RegistryBeat(self.get(), consumer, self.settings.registry_interval_s)
            self.registry.start()

    def stop_registry(self) -> None:
        if self.registry is not None:
            self.registry.stop()
            self.registry = None


class LoggedTask(Task):  # type: ignore[misc]
    """Every task of the app names what it runs in the lines its thread logs (``worker/logs.py``).

    Celery calls these two methods directly around the task; the same work as receivers of its
    ``task_prerun``/``task_postrun`` signals paid for two signal dispatches per task.
    """

    def before_start(self, task_id: str, args: Any, kwargs: dict[str, Any] | None) -> None:
        kwargs = kwargs or {}
        holder: RuntimeHolder | None = getattr(self.app, "wesichain_runtime", None)
        if holder is not None:
            holder.get()  # built once per process: names the worker (its identity) before the first line
        begin_phase(
            run_id=kwargs.get("run_id"),
            step=kwargs.get("step"),
            phase=PHASE_OF_TASK.get(self.name, self.name),
            task_id=task_id,
            worker=worker_identity(),
        )

    def after_return(self, *_: Any) -> None:
        end_phase()
        acks.clear()


class PhaseRequest(Request):  # type: ignore[misc]
    """Celery's request, telling the runtime when the pool process running a phase died, and
    acknowledging in memory only a message its commit acknowledged (``worker/acks.py``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The worker runs each task's request as a class Celery derives from this one
        # (``create_request_cls``), whose ``on_success`` acknowledges the message without calling
        # this class's: the check that the commit acknowledged it already wraps that one.
        super().__init_subclass__(**kwargs)
        on_success = cls.__dict__.get("on_success")
        if on_success is None:
            return

        def on_success_acked(self: Request, failed__retval__runtime: Any, **more: Any) -> Any:
            failed, retval, _ = failed__retval__runtime
            if not failed and acked_in_commit(retval):
                forget_acked_in_commit(self._message)
            return on_success(self, failed__retval__runtime, **more)

        cls.on_success = on_success_acked

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, WorkerLostError | TimeLimitExceeded) and self.worker_pid:
            holder: RuntimeHolder | None = getattr(self.task.app, "wesichain_runtime", None)
            try:
                if holder is not None:
                    timed_out = isinstance(exc, TimeLimitExceeded)
                    why = "was killed at its hard time limit" if timed_out else f"died ({exc})"
                    on_lost_process(
                        holder.get(), self.task_name, self.kwargs, self.worker_pid, why, timed_out
                    )
            except Exception:  # the task's own failure handling must still run
                log.exception("could not hand on the work of dead pool process %s", self.worker_pid)
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer, surviving a broker outage while tasks are in flight.

    Celery 5.7.0 cleans a lost connection up with ``collect()`` and then ``close()``. With Redis
    still down, closing the channel inside ``collect()`` fails half-way (the channel stays open) and
    ``collect()`` drops the transport anyway; ``close()`` then closes that channel again, which
    restores its unacked messages through the dropped transport's client (None): AttributeError,
    not a connection error, so the worker exits ("Unrecoverable error"). Forget the half-closed
    channel once ``collect()`` ran: its messages stay in the broker's unacked hash and the sweeper
    hands their phases on when their leases expire.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _guard_redis_envelopes()
        # A delivery acknowledges only a message it holds in the unacked hash (``worker/acks.py``).
        acks.install()
        # A Redis at maxmemory refuses kombu's writes (an ack, the record of a message it hands
        # out) with OutOfMemoryError, a channel error Celery would not recover from: the consumer
        # stopped for good while the process stayed up. Treated as a lost connection, the consumer
        # restarts and consumes again (a BRPOP is served at maxmemory); a refused ack leaves its
        # message in the unacked hash, and a message popped but not recorded is one the sweeper
        # finds missing from the broker.
        errors: tuple[type[BaseException], ...] = getattr(self, "connection_errors", ())
        self.connection_errors = (*errors, redis.exceptions.OutOfMemoryError)
        # The version queues of the agents this worker serves, beside each kind queue it consumes
        # (``worker/versions.py``): every way a worker starts goes through here.
        holder: RuntimeHolder | None = getattr(self.app, "wesichain_runtime", None)
        if holder is not None:
            add_version_queues(self.app, load_registry(holder.settings.agents_module))

    # -- messages the worker cannot take: logged by what they are, never by what they carry --------
    #
    # Celery logs such a message's body and headers (up to a kilobyte of each), and a start message
    # of a bare producer carries its run's input, and its sender's ``kwargsrepr`` header a copy of
    # it. What identifies the message (its task name, id and size) is logged instead.

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body no decoder reads (malformed, or nested past any parser's depth): dropped, acked so
        it is not delivered again, and the consumer goes on."""
        cause = exc.__cause__ or exc.__context__ or exc
        log.critical(
            "dropped a message that cannot be decoded (%s): %s; %s",
            type(cause).__name__,
            _described(message),
            str(cause)[:200],
        )
        message.ack()

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        super().on_unknown_task(_not_shown(message), _without_reprs(message), exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        super().on_invalid_task(_not_shown(message), _without_reprs(message), exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        super().on_unknown_message(_not_shown(message), _without_reprs(message))

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            collect = connection.collect

            def collect_then_forget(*args: Any, **kwargs: Any) -> None:
                try:
                    collect(*args, **kwargs)
                finally:
                    connection._default_channel = None

            connection.collect = collect_then_forget
        super().on_connection_error_after_connected(exc)


class _Unreadable(dict[str, Any]):
    """What kombu's Redis transport is handed in place of a message envelope that is not JSON."""


_kombu_loads = cast(Callable[..., Any], kombu_json.loads)


def _tolerant_loads(text: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return _kombu_loads(text, *args, **kwargs)
    except (ValueError, TypeError, RecursionError):
        return _Unreadable()


def _well_formed(envelope: Any) -> bool:
    """Whether a raw envelope popped from a Redis queue is one kombu can make a message of."""
    if not isinstance(envelope, dict) or isinstance(envelope, _Unreadable):
        return False
    properties = envelope.get("properties")
    return (
        isinstance(properties, dict)
        and isinstance(properties.get("delivery_tag"), str | int)
        and isinstance(properties.get("delivery_info", {}), dict)
        and isinstance(properties.get("body_encoding", ""), str)
        and isinstance(envelope.get("headers") or {}, dict)
        and isinstance(envelope.get("body") or "", str)
        and all(isinstance(envelope.get(k) or "", str) for k in ("content-type", "content-encoding"))
    )


def _guard_redis_envelopes() -> None:
    """Drop, with one log line, a message on a Redis queue whose envelope kombu cannot read.

    Anyone who can reach the broker can push anything onto a queue's list. kombu's Redis transport
    pops it, then parses it as JSON and builds a message of it outside any handler Celery has: a
    list entry that is not JSON, or whose headers are not an object, raised out of the consumer's
    loop and the worker exited ("Unrecoverable error"), one worker per such entry. Here an entry
    that is not JSON reaches the delivery as an unreadable envelope, and a malformed envelope is
    dropped there (it was popped, and never entered the unacked hash): logged by its queue and
    what is wrong with it, never its content. (kombu's other reads of the module's ``loads``, of
    entries kombu wrote itself, fail on an unreadable entry as they failed before: with a
    ``ValueError``.)"""
    from kombu.transport import redis as kombu_redis
    from kombu.transport.virtual import base

    if getattr(base.Transport._deliver, "_wesichain_guard", False):
        return
    deliver = cast(Callable[..., None], base.Transport._deliver)

    def _deliver(self: Any, message: Any, queue: str) -> None:
        if not _well_formed(message):
            log.critical(
                "dropped a message on queue %r whose envelope is not kombu's (%s)",
                queue,
                "not JSON" if isinstance(message, _Unreadable) else type(message).__name__,
            )
            return
        deliver(self, message, queue)

    _deliver._wesichain_guard = True  # type: ignore[attr-defined]
    setattr(base.Transport, "_deliver", _deliver)  # noqa: B010 (mypy refuses assigning a method)
    setattr(kombu_redis, "loads", _tolerant_loads)  # noqa: B010


def _described(message: Any) -> str:
    """A message as a log line may show it: its task, id, content type and size, not its body."""
    headers = getattr(message, "headers", None) or {}
    return (
        f"task {str(headers.get('task'))[:200]!r} id {str(headers.get('id'))[:80]!r}"
        f" ({getattr(message, 'content_type', None)!s}, {len(getattr(message, 'body', b'') or b'')} bytes)"
    )


def _not_shown(message: Any) -> str:
    """What Celery's report of a refused message shows in place of its body."""
    return f"<{len(getattr(message, 'body', b'') or b'')} bytes, not shown>"


def _without_reprs(message: Any) -> Any:
    """The message, its headers without the sender's ``argsrepr`` and ``kwargsrepr`` (copies of
    its arguments) for Celery's report of it."""
    headers = getattr(message, "headers", None)
    if isinstance(headers, dict):
        message.headers = {k: v for k, v in headers.items() if k not in ("argsrepr", "kwargsrepr")}
    return message


def _deliver_callback(rt: Runtime, spec: TaskSpec) -> None:
    """A run's callback task, delivered in the process that ended the run (see ``Runtime``)."""
    a = spec.arguments
    run_callback(rt, Delivery(spec.name, a["run_id"], a["version"], a.get("epoch", 0)), a["step"], a["phase"])


class MalformedTask(ValueError):
    """A phase task whose arguments no producer of the runtime sends (wrong types, empty ids)."""


def _check_arguments(task: Task, run_id: object, version: object, epoch: object, **more: object) -> None:
    """Refuse a message whose arguments are not what the runtime's producers send, naming why.

    Anyone who can reach the broker can put a message there; the run state is only ever read
    for messages of the right shape, and the refusal is one log line, not a traceback.
    """
    wrong = [] if isinstance(run_id, str) and run_id else [f"run_id={str(run_id)[:80]!r}"]
    for name, value in {"version": version, "epoch": epoch, **more}.items():
        text = name == "call_id"
        ok = (isinstance(value, str) and bool(value)) if text else (type(value) is int and value >= 0)
        if not ok:
            wrong.append(f"{name}={str(value)[:80]!r}")
    if wrong:
        raise MalformedTask(f"{task.name}[{task.request.id}] has malformed arguments: {', '.join(wrong)}")


def _delivery(task: Task, rt: Runtime, run_id: str, version: int, epoch: int, **more: object) -> Delivery:
    _check_arguments(task, run_id, version, epoch, **more)
    request = task.request
    if rt.acks is not None:
        # Late-acked on a Redis broker: the commit that ends this delivery's work acknowledges its
        # message, or the publish that follows it on a broker of its own (``worker/acks.py``).
        tag = (request.properties or {}).get("delivery_tag") if task.acks_late else None
        rt.acks.begin(run_id, tag)
    redelivered = bool(request.retries) or bool((request.delivery_info or {}).get("redelivered"))
    return Delivery(task.name, run_id, version, epoch, redelivered)


def _acked(rt: Runtime) -> str | None:
    """What a phase task returns: whether its commit acknowledged its message (``worker/acks.py``)."""
    return rt.acks.end() if rt.acks is not None else None


def _delivery_acks(app: Celery) -> DeliveryAcks:
    """Where kombu keeps the messages the app's workers hold: the keys a commit's ack names."""
    options = app.conf.broker_transport_options or {}
    return DeliveryAcks(
        options.get("unacked_key", redis_transport.Channel.unacked_key),
        options.get("unacked_index_key", redis_transport.Channel.unacked_index_key),
    )


def _finish(head: RunHead | None) -> None:
    """A run this delivery ended as failed or interrupted makes its task a failed one.

    The exception names the run, its phase, step and error kind only: Celery records its repr and
    traceback in the task's events and result, which Flower shows to whoever may look at tasks, and
    an error's message can hold conversation text (a provider's 400 that echoes the prompt, a
    tool's exception). The message stays in the run's state and its ``Failed`` event.
    """
    if head is not None and head.phase in (Phase.FAILED, Phase.INTERRUPTED):
        error = head.error
        kind = error.kind if error is not None else "interrupted"
        raise RunEnded(f"run {head.run_id} {head.phase.value} at step {head.step}: {kind}"[:1000]) from None


def _subagent_tasks(app: Celery, holder: RuntimeHolder, retry: dict[str, Any]) -> None:
    """The tasks that start a subagent call's child run and record its end (``worker/subagents.py``)."""
    options = {"ignore_result": True, "shared": False, **retry}

    @app.task(name=TASK_SPAWN, **options)  # type: ignore[untyped-decorator]
    def spawn(run_id: str, step: int, version: int, call_id: str, epoch: int = 0) -> None:
        run_spawn(holder.get(), run_id, version, call_id)

    @app.task(name=TASK_CHILD_DONE, **options)  # type: ignore[untyped-decorator]
    def child_done(outcome: dict[str, Any]) -> None:
        run_child_done(holder.get(), outcome)


#: Retries of a task through a Redis outage (RabbitMQ broker): waits of 1, 2, 4, 8, 16 s, then 30 s, each
#: jittered down to a random share of itself: up to about 18 minutes of outage covered.
OUTAGE_RETRIES = 40


def outage_retry(settings: Settings) -> dict[str, Any]:
    """The task options for a Redis outage: what a task does when the run state's Redis fails it.

    On the Redis broker, nothing: the message is acknowledged as failed, and the sweeper, which
    sees it gone from the broker, hands the phase on one queued lease later (an outage of the
    broker itself stops the deliveries anyway). On RabbitMQ, deliveries go on while Redis is down:
    acknowledged as failed, every one of them would be lost, and the sweeper, which cannot look
    into RabbitMQ's queues, would publish it again only after its longest wait (about 22 minutes
    with the defaults). So the task goes back to RabbitMQ instead, as a retry on a backoff of up to
    30 s that RabbitMQ's delayed delivery holds (not a worker), until Redis answers; a delivery that
    finds the work done or held by then is dropped by its claim like any duplicate. Past
    :data:`OUTAGE_RETRIES` the sweeper is the last resort again.
    """
    if not settings.broker_url:
        return {}
    return {
        "autoretry_for": (redis.RedisError,),
        "retry_backoff": 1,
        "retry_backoff_max": 30,
        "retry_jitter": True,
        "retry_kwargs": {"max_retries": OUTAGE_RETRIES},
    }


def create_app(settings: Settings) -> Celery:
    # Celery's message factory with the argument headers of plain arguments written cheaply
    # (``producer/publishing.py``): the same messages, at half the cost of building one.
    app = Celery("wesichain", set_as_current=False, amqp=ReprAMQP, task_cls=LoggedTask)
    app.conf.update(celery_config(settings))
    app.conf.worker_consumer = "worker.app:Consumer"
    app.conf.beat_schedule = {
        "wesichain-sweep": {"task": TASK_SWEEP, "schedule": settings.sweep_interval_s},
    }
    if settings.archive_url:
        app.conf.beat_schedule["wesichain-archive"] = {
            "task": TASK_ARCHIVE,
            "schedule": settings.archive_interval_s,
        }
    holder = RuntimeHolder(app, settings)
    app.wesichain_runtime = holder  # the embedded mode and tests reach the runtime through the app
    options: dict[str, Any] = {
        "bind": True,
        "ignore_result": True,
        # No result is stored, so no result lists the tasks a phase sent: keeping them (Celery's
        # trail) cost an AsyncResult per publish.
        "trail": False,
        "shared": False,
        "Request": PhaseRequest,
        "throws": (RunEnded, MalformedTask),
        **outage_retry(settings),
    }

    @app.task(name=TASK_START, **options)  # type: ignore[untyped-decorator]
    def start(
        self: Task, run_id: str, version: int = 1, epoch: int = 0, create: dict[str, Any] | None = None
    ) -> str | None:
        rt = holder.get()
        _finish(run_start(rt, _delivery(self, rt, run_id, version, epoch), create))
        return _acked(rt)

    @app.task(name=TASK_THINK, **options)  # type: ignore[untyped-decorator]
    def think(self: Task, run_id: str, step: int, version: int, epoch: int = 0) -> str | None:
        rt = holder.get()
        _finish(run_think(rt, _delivery(self, rt, run_id, version, epoch, step=step), step))
        return _acked(rt)

    @app.task(name=TASK_TOOL, **options)  # type: ignore[untyped-decorator]
    def tool(self: Task, run_id: str, step: int, version: int, call_id: str, epoch: int = 0) -> str | None:
        rt = holder.get()
        run_tool(rt, _delivery(self, rt, run_id, version, epoch, step=step, call_id=call_id), step, call_id)
        return _acked(rt)

    @app.task(name=TASK_OBSERVE, **options)  # type: ignore[untyped-decorator]
    def observe(self: Task, run_id: str, step: int, version: int, epoch: int = 0) -> str | None:
        rt = holder.get()
        _finish(run_observe(rt, _delivery(self, rt, run_id, version, epoch, step=step), step))
        return _acked(rt)

    @app.task(name=TASK_DECIDE, **options)  # type: ignore[untyped-decorator]
    def decide(self: Task, run_id: str, version: int, epoch: int = 0, step: int | None = None) -> str | None:
        rt = holder.get()
        _finish(run_decide(rt, _delivery(self, rt, run_id, version, epoch), step))
        return _acked(rt)

    @app.task(name=TASK_CALLBACK, **options)  # type: ignore[untyped-decorator]
    def callback(self: Task, run_id: str, step: int, version: int, phase: str, epoch: int = 0) -> str | None:
        rt = holder.get()
        run_callback(rt, _delivery(self, rt, run_id, version, epoch), step, phase)
        return _acked(rt)

    _subagent_tasks(app, holder, outage_retry(settings))

    @app.task(name=TASK_SWEEP, ignore_result=True, shared=False)  # type: ignore[untyped-decorator]
    def sweep() -> int:
        sweeper = Sweeper(holder.get(), holder.probe(), holder.evals, holder.pipelines, holder.bulk)
        return sweeper.sweep_once_and_release()

    eval_options = {"ignore_result": True, "shared": False, **outage_retry(settings)}

    @app.task(name=TASK_EVAL_PUMP, **eval_options)  # type: ignore[untyped-decorator]
    def eval_pump(eval_id: str) -> int:
        return holder.evals().pump(eval_id)

    @app.task(name=TASK_EVAL_SCORE, **eval_options)  # type: ignore[untyped-decorator]
    def eval_score(ended: dict[str, Any]) -> None:
        holder.evals().score(ended)

    _pipeline_tasks(app, holder, outage_retry(settings))

    @app.task(name=TASK_BULK, **eval_options)  # type: ignore[untyped-decorator]
    def bulk_run(tenant: str | None, job_id: str) -> int:
        """The next chunk of a bulk job (``worker/bulk.py``)."""
        return holder.bulk().run(tenant, job_id)

    # A database that fails (down, full disk) is an outage the archiver has logged as a warning
    # already: the task fails (Flower shows it) without a traceback beside that warning each beat.
    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_ARCHIVE, ignore_result=True, shared=False, throws=(ArchiveUnavailable,)
    )
    def archive() -> int:
        """One bounded pass of the archiver (the next beat continues where it stopped)."""
        from worker.archiving import archive_pass

        return archive_pass(holder.get().store)

    return app


def _pipeline_tasks(app: Celery, holder: RuntimeHolder, retry: dict[str, Any]) -> None:
    """The tasks that drive pipeline runs (``worker/pipelines.py``)."""
    options = {"ignore_result": True, "shared": False, **retry}

    @app.task(name=TASK_PIPELINE_ADVANCE, **options)  # type: ignore[untyped-decorator]
    def pipeline_advance(pipeline_id: str, from_seq: int) -> None:
        holder.pipelines().advance(pipeline_id, from_seq)

    @app.task(name=TASK_PIPELINE_CHILD, **options)  # type: ignore[untyped-decorator]
    def pipeline_child(ended: dict[str, Any]) -> None:
        holder.pipelines().child_ended(ended)


def check_agents_module(app: Celery) -> None:
    """Exit (status 2) before consuming anything if the worker cannot import its agents module."""
    holder: RuntimeHolder = app.wesichain_runtime
    try:
        load_registry(holder.settings.agents_module)
    except ConfigError as exc:
        print(f"wesichain: refusing to start the worker: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None


def _default_app() -> Celery:
    return create_app(Settings.from_env())


#: The app ``celery -A worker.app`` finds.
app = _default_app()


@celeryd_init.connect  # type: ignore[untyped-decorator]
def _before_start(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """Refuse to start (status 2) before consuming anything when the worker cannot work.

    Without its agents module it would fail every run it takes; with a Redis certificate that
    does not verify, wrong credentials, or something that is not Redis at the URL, Celery would
    retry its broker connection forever. An unreachable Redis is an outage: the worker waits it out.
    """
    worker_app = getattr(instance, "app", None)
    holder: RuntimeHolder | None = getattr(worker_app, "wesichain_runtime", None)
    if worker_app is None or holder is None:
        return
    check_agents_module(worker_app)
    try:
        preflight(holder.settings)
    except (RedisTlsError, ConfigError) as exc:
        print(f"wesichain: refusing to start the worker: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
    port = holder.settings.metrics_port
    if port:
        # Here, before the pool starts: a port that cannot be served stops the worker at once.
        try:
            serve_metrics(port)
        except OSError as exc:
            print(f"wesichain: refusing to start the worker: metrics port {port}: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_CONFIG) from None
        log.info("serving Prometheus metrics on port %d", port)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _on_ready(sender: Any = None, **_: Any) -> None:
    """The consumer is ready (``sender``): join the registry and start sweeping."""
    holder: RuntimeHolder | None = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
    if holder is None:
        return
    holder.start_registry(sender)
    if holder.settings.sweeper:
        holder.start_sweeper()


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _on_shutdown(sender: Any = None, **_: Any) -> None:
    holder: RuntimeHolder | None = getattr(getattr(sender, "app", None), "wesichain_runtime", None)
    if holder is not None:
        holder.stop_sweeper()
        holder.stop_registry()
        if holder.settings.metrics_port:
            cleanup_multiprocess()


@after_setup_logger.connect  # type: ignore[untyped-decorator]
@after_setup_task_logger.connect  # type: ignore[untyped-decorator]
def _log_format(logger: Any = None, **_: Any) -> None:
    """JSON lines when ``WESICHAIN_LOG_FORMAT=json`` (read from the environment, as everything)."""
    configure_logs(Settings.from_env().log_format)
