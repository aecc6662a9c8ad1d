"""What every phase task needs: the store, the agents, a publisher, the hooks, and the shared moves.

The moves (commit a transition and publish what it leads to, fail, interrupt) are the same for
every phase; the order of a phase task is in ``worker/phase.py``.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

from producer.publishing import PUBLISH_ERRORS
from shared import fsm
from shared.agents import Agent, AgentRegistry
from shared.call_memory import PhaseMemory
from shared.errors import ConfigError, InternalInvariant, InvalidRequest, PoisonPhase, RunErrorInfo
from shared.events import Event, this_worker, worker_identity
from shared.fsm import Transition
from shared.middleware import MiddlewareContext
from shared.pool_records import Throughput
from shared.settings import Settings
from shared.state import Phase, PhaseRun, RunHead, TaskSpec, ToolResult
from shared.store import BrokerCommand, Busy, ClaimOutcome, ClaimRef, Done, RunStore, Stale
from shared.tasks import TASK_CALLBACK, decide_task, task_for, with_epoch
from shared.unsent import mark_unsent
from worker.full import until_room
from worker.heartbeat import Heartbeat
from worker.hooks import Hooks
from worker.metrics import Metrics, metrics
from worker.threads import hand_thread_on
from worker.throttle import ModelGate
from worker.timeouts import hard_limit_s
from worker.tracing import Tracing

if TYPE_CHECKING:
    from shared.assistants import AssistantConfig
    from shared.memory import Memory
    from worker.acks import DeliveryAcks

__all__ = [
    "Cancelled",
    "Delivery",
    "Prepare",
    "Runtime",
    "Send",
    "internal_error",
    "middleware_context",
    "poison_error",
]

log = logging.getLogger("wesichain.worker")

#: Configured agents a process keeps (the oldest built is dropped past it).
_MAX_CONFIGURED = 256

#: Sends one task to the broker.
Send = Callable[[TaskSpec], None]

#: The broker commands that publish tasks, for a commit script to run (Redis broker on the store's
#: server only; see ``producer/publishing.py``).
Prepare = Callable[[Sequence[TaskSpec]], list[BrokerCommand]]


class Cancelled(Exception):
    """The run was cancelled while its phase was still working (seen by the heartbeat)."""


@dataclass(frozen=True)
class Delivery:
    """One delivery of a phase task, as Celery handed it over."""

    task: str
    run_id: str
    version: int
    epoch: int
    #: The broker handed this message over again after the worker running it was lost (Celery's
    #: ``retries`` / ``redelivered`` marks). It never lets a delivery take a live claim over; it
    #: only tells a stale delivery that the next phase may never have been published.
    redelivered: bool = False


@dataclass
class Runtime:
    """A worker process's store, agents, publisher, settings, heartbeat and hooks."""

    store: RunStore
    agents: AgentRegistry
    send: Send
    settings: Settings
    heartbeat: Heartbeat
    hooks: Hooks
    #: What this process did, for Prometheus (``worker/metrics.py``).
    metrics: Metrics = field(default_factory=metrics)
    #: The provider limits shared by the pool (None: no limit is configured anywhere).
    gate: ModelGate | None = None
    #: OpenTelemetry spans (no-ops unless ``WESICHAIN_OTEL=1``).
    tracing: Tracing = field(default_factory=Tracing)
    #: Commit and publish in one script (None: commit, then send).
    prepare: Prepare | None = None
    #: The acknowledgement of each thread's delivery, run by the commit script that publishes
    #: (``worker/acks.py``; None: the worker acknowledges every message itself).
    acks: DeliveryAcks | None = None
    #: Sends several tasks in one publish (None: ``send`` each); see :meth:`send_all`.
    send_many: Callable[[Sequence[TaskSpec]], None] | None = None
    #: Publishes tasks and runs the commands that acknowledge this thread's delivery in one
    #: transaction on the broker, for the publish that follows a commit when no commit script can
    #: carry them (a standalone Redis broker beside the run state's server: ``worker/acks.py``).
    publish_acked: Callable[[Sequence[TaskSpec], Sequence[BrokerCommand]], None] | None = None
    #: Callback tasks this worker runs in place of sending them (name -> the task's function,
    #: given the ended run as the callback's claim read it); see ``worker/callback.py``.
    local_callbacks: dict[str, Callable[[RunHead], object]] = field(default_factory=dict)
    #: Delivers a run's callback task in this process (``worker.callback.run_callback``); set by
    #: the app. A local callback then runs right after the terminal commit instead of being sent.
    deliver_callback: Callable[[Runtime, TaskSpec], None] | None = None
    #: Events the next commit of a run carries besides its transition's (a version upgrade made
    #: before its phase ran: ``worker/versions.py``), by run id.
    carried: dict[str, list[Event]] = field(default_factory=dict)
    #: The agents configured by assistant versions this process has built, by (tenant, assistant,
    #: version, agent, agent version): a version never changes, so neither does its agent.
    configured: dict[tuple[str | None, str, int, str, str], tuple[AssistantConfig, Agent]] = field(
        default_factory=dict, repr=False
    )

    def agent_of(self, head: RunHead) -> Agent:
        """The agent a phase of ``head`` runs: the registered one, configured by the run's
        assistant version (``shared/assistants.py``) until a handoff (whose target runs as it is
        registered). Raises :class:`ConfigError` for an unknown agent or a version that is gone."""
        agent = self.agents.get(head.active_agent)
        found = self._configured(head, agent)
        return agent if found is None else found[1]

    def assistant_config(self, head: RunHead) -> AssistantConfig | None:
        """The configuration of the run's assistant version (None: the run names none, or was
        handed off); raises :class:`ConfigError` as :meth:`agent_of`."""
        found = self._configured(head, self.agents.get(head.active_agent))
        return None if found is None else found[0]

    def _configured(self, head: RunHead, agent: Agent) -> tuple[AssistantConfig, Agent] | None:
        if head.assistant is None or head.assistant_version is None or head.handoffs:
            return None
        key = (head.tenant, head.assistant, head.assistant_version, agent.name, agent.version)
        found = self.configured.get(key)
        if found is None:
            # The assistants' store loads with the first run that names an assistant: a worker
            # whose runs name none never needs it (it is the package's own module, nothing that
            # configuration could leave out).
            from shared.assistant_store import AssistantStore
            from shared.assistants import apply_config

            try:
                version = AssistantStore(self.store.redis, self.store.keys).get(
                    head.tenant, head.assistant, head.assistant_version, deleted=True
                )
            except InvalidRequest as exc:
                raise ConfigError(f"the run's assistant: {exc.message}") from None
            found = (version.config, apply_config(agent, version.config))
            if len(self.configured) >= _MAX_CONFIGURED:
                self.configured.pop(next(iter(self.configured)))
            self.configured[key] = found
        return found

    def carry_events(self, run_id: str, *events: Event) -> None:
        """Have the next commit of ``run_id`` by this process carry ``events`` too."""
        self.carried.setdefault(run_id, []).extend(events)

    def memory(self, head: RunHead) -> Memory:
        """The long-term memory of the run's tenant (a run names no other)."""
        # Imported on a run's first memory operation: most phases never touch memory.
        from shared.embedding import load_embedding
        from shared.memory import memory_of

        embed = load_embedding(self.settings.memory_embedding)
        return memory_of(self.store.redis, self.store.keys, head.tenant, embed)

    def phase_memory(self, head: RunHead, hook: str) -> PhaseMemory:
        """What middleware hook(s) ``hook`` of the phase of ``head`` write memory through: each
        write's id names the run, its version and the hook, so a redelivered phase writes once."""
        return PhaseMemory(lambda: self.memory(head), f"{head.run_id}:v{head.version}:{hook}", until_room)

    def apply_memory(self, head: RunHead, results: Sequence[ToolResult]) -> None:
        """Apply the memory writes of recorded tool results (each write id once)."""
        writes = [w for r in results if r.ok and r.memory_writes for w in r.memory_writes]
        if writes:
            # A full Redis refuses them before writing: they wait for room like the result they
            # came with (a refusal would fail the phase after its result was recorded).
            self.memory(head).apply(writes, until_room)

    def holder(self) -> str:
        """This process, as claims name their holder (read per call: prefork children fork)."""
        return f"{worker_identity()}:{os.getpid()}"

    def outgoing(self, outbox: Sequence[TaskSpec], epoch: int) -> list[TaskSpec]:
        """The tasks that publish ``outbox`` under the run's ``epoch`` (as the hooks want them)."""
        return [task for spec in outbox for task in self.hooks.outgoing(with_epoch(spec, epoch))]

    def publish(self, outbox: Sequence[TaskSpec], epoch: int, acking: str | None = None) -> None:
        """Send ``outbox`` under the run's current ``epoch``.

        Should the broker refuse a task, the outbox is marked unsent (the sweeper sends it again)
        and the error raised: the delivery that committed it fails as it did. ``acking``: the run
        whose commit this publish follows, whose delivery's acknowledgement goes with it where
        :attr:`publish_acked` can carry it.
        """
        tasks = self.outgoing(outbox, epoch)
        if acking is not None and self.publish_acked is not None and self.acks is not None:
            ack = self.acks.commands_for(acking)
            if ack:
                acked = self._publish_acked(self.publish_acked, tasks, ack)
                self.acks.committed(acking, acked)
                return
        for task in tasks:
            try:
                self.send(task)
            except PUBLISH_ERRORS as exc:
                mark_unsent(self.store, task, exc)
                raise

    def _publish_acked(
        self,
        publish: Callable[[Sequence[TaskSpec], Sequence[BrokerCommand]], None],
        tasks: Sequence[TaskSpec],
        ack: Sequence[BrokerCommand],
    ) -> bool:
        """Publish ``tasks`` and acknowledge the delivery in one transaction: whether it ran.
        Raises as :meth:`publish` does when the broker refuses the tasks (the delivery is then not
        acknowledged either)."""
        try:
            publish(tasks, ack)
        except PUBLISH_ERRORS as exc:
            if not tasks:
                # Only the acknowledgement was refused: the worker makes it as kombu does.
                log.warning("acknowledging a delivery with its publish failed: %s", exc)
                return False
            for task in tasks:  # the tasks of one commit: one outbox, marked once
                if mark_unsent(self.store, task, exc):
                    break
            raise
        return True

    def send_all(self, tasks: Sequence[TaskSpec]) -> None:
        """Send ``tasks`` (runs' tasks built elsewhere, such as the starts of runs a pool
        creates): in one publish when this worker can, else one ``send`` each."""
        if self.send_many is not None:
            self.send_many(tasks)
            return
        for task in tasks:
            self.send(task)

    def push_for(self, run_id: str, outbox: Sequence[TaskSpec], epoch: int) -> list[BrokerCommand]:
        """The broker commands a commit script of ``run_id`` runs to publish ``outbox`` under
        ``epoch``, and to acknowledge the delivery committing (none when this worker cannot commit
        and publish in one step)."""
        if self.prepare is None:
            return []
        push = self.prepare(self.outgoing(outbox, epoch)) if outbox else []
        if self.acks is not None:
            push += self.acks.commands_for(run_id)
        return push

    def pushed(self, run_id: str, pushed: bool) -> None:
        """A commit script of ``run_id`` ran (``pushed``: with the broker commands it was given)."""
        if self.acks is not None:
            self.acks.committed(run_id, pushed)

    # -- deliveries that claim nothing -------------------------------------------------------

    def on_unclaimed(self, outcome: ClaimOutcome, delivery: Delivery) -> None:
        self.metrics.duplicate(delivery.task, _dropped_because(outcome))
        if outcome is None:
            log.warning("%s for unknown run %s dropped", delivery.task, delivery.run_id)
        elif isinstance(outcome, Busy):
            log.info(
                "run %s: %s v%d is already being worked on; duplicate dropped",
                delivery.run_id,
                delivery.task,
                delivery.version,
            )
        elif isinstance(outcome, Stale):
            self.on_stale(outcome, delivery)
        elif not isinstance(outcome, Done):
            raise InternalInvariant(f"{delivery.task}: unexpected claim outcome {outcome!r}")

    def on_stale(self, stale: Stale, delivery: Delivery) -> None:
        """A duplicate or late delivery: do nothing, unless the next phase may never have been sent.

        That is the case only when the broker handed this task over because its worker died (the
        worker may have died between its commit and its publish) and no task of the new version
        has claimed work since. Any other stale delivery is a benign duplicate: re-publishing from
        it would send a duplicate of the next phase, which would do the same one hop later.
        """
        # An ended run's outbox holds its callback task, if it has one: that one too may never
        # have been sent (on RabbitMQ, whose redeliveries also cover a worker that died whole).
        if not delivery.redelivered or stale.outbox_claimed or not stale.outbox:
            return
        if stale.version > delivery.version:
            log.info(
                "run %s: %s v%d is stale at v%d; re-publishing its outbox",
                delivery.run_id,
                delivery.task,
                delivery.version,
                stale.version,
            )
            self.publish(stale.outbox, stale.epoch)

    # -- moves -------------------------------------------------------------------------------

    def commit(
        self,
        current: fsm.LivePhase,
        transition: Transition[fsm.PhaseView],
        claim: ClaimRef | None,
        extra_events: Sequence[Event] = (),
        countdown: float = 0.0,
        signals_first: Callable[[], RunHead | None] | None = None,
    ) -> RunHead | None:
        """Commit a transition and publish what it leads to; a pending cancel wins over it.

        Returns the head this delivery committed (the interruption, if a cancel won), or None when
        the commit was fenced off (another delivery won, or this one lost its claim).
        ``signals_first``: what an answer's commit does instead when signals came into the run
        since its think's cursor (the commit refuses the answer: ``commit.lua``), still under
        this delivery's claim.
        """
        head = _stamped(transition.head, current.phase, claim)
        extra_events = (*self.carried.pop(head.run_id, ()), *extra_events)
        outbox = task_for(head, self.tool_time_limits(head))
        if countdown:
            outbox = [s.model_copy(update={"countdown": countdown}) for s in outbox]
        here = self._local_callback(head, outbox)
        sent = [s for s in outbox if s is not here]
        push = self.push_for(head.run_id, sent, current.head.epoch)
        result = until_room(
            lambda: self.store.commit(
                current.head,
                head,
                claim,
                transition.messages,
                (*extra_events, *transition.events),
                outbox,
                push,
            ),
            f"the commit of run {head.run_id} v{head.version}",
        )
        if result.status == "committed":
            self.pushed(head.run_id, result.pushed)
            self.metrics.committed(current.head, head)
            self._count_end(current.head, head)
            self.hooks.after_commit(current.phase, head, self.store)
            if not result.pushed:
                self.publish(sent, result.epoch, acking=head.run_id)
            if here is not None:
                self._run_here(here, result.epoch)
            if head.terminal:
                hand_thread_on(self, head)
            return head
        if result.status == "cancel_pending":
            return self.interrupt(current, claim, "cancelled", head.error)
        if result.status == "signals_pending" and signals_first is not None:
            log.info(
                "run %s: signals came in before its answer was committed: applying them first", head.run_id
            )
            return signals_first()
        self.metrics.fenced_off(current.phase)
        log.info("run %s: commit of v%d fenced off (another delivery won)", head.run_id, head.version)
        return None

    def _count_end(self, before: RunHead, after: RunHead) -> None:
        """A run's end this process committed, in the pool's per-minute counters (``shared/pool_records.py``).

        Best effort, after the commit: a failure to count loses one count, never the run's end."""
        if not after.terminal or before.terminal:
            return
        try:
            Throughput(self.store.redis, self.store.keys).record(after)
        except redis.RedisError as exc:
            log.warning("run %s: its end was not counted in the pool's throughput: %s", after.run_id, exc)

    def _local_callback(self, head: RunHead, outbox: Sequence[TaskSpec]) -> TaskSpec | None:
        """The callback task of an ended run when this process serves it (no queue named)."""
        callback = head.callback
        if (
            self.deliver_callback is None
            or not head.terminal
            or callback is None
            or callback.queue is not None
            or callback.task not in self.local_callbacks
        ):
            return None
        return next((s for s in outbox if s.name == TASK_CALLBACK), None)

    def _run_here(self, spec: TaskSpec, epoch: int) -> None:
        """Deliver the callback in this task, right after the commit that stored it in the outbox.

        It was not published: should this fail or the process die, the sweeper finds it unclaimed
        and missing from the broker and publishes it, as it does any lost message.
        """
        assert self.deliver_callback is not None
        try:
            self.deliver_callback(self, with_epoch(spec, epoch))
        except Exception:
            log.exception(
                "run %s: its callback failed here; the sweeper will send it", spec.arguments["run_id"]
            )

    def interrupt(
        self, current: fsm.LivePhase, claim: ClaimRef | None, reason: str, error: RunErrorInfo | None = None
    ) -> RunHead | None:
        self.cancel_children(current.head)  # first: a crash after the commit must not leave them running
        transition = current.interrupt(reason, error)
        head = _stamped(transition.head, current.phase, claim)
        outbox = task_for(head)  # its completion callback, if it has one (a child run's, say)
        events = (*self.carried.pop(head.run_id, ()), *transition.events)
        result = until_room(
            lambda: self.store.commit(current.head, head, claim, (), events, outbox),
            f"the interruption of run {head.run_id}",
        )
        if result.status != "committed":
            self.metrics.fenced_off(current.phase)
            return None
        self.metrics.committed(current.head, head)
        self._count_end(current.head, head)
        self.publish(outbox, result.epoch)
        hand_thread_on(self, head)
        return head

    def cancel_children(self, head: RunHead) -> None:
        """Ask every child of a run parked for its subagents to stop (they cascade to their own)."""
        if head.approval is None or head.approval.kind != "children":
            return
        for child in head.approval.children:
            phase = self.store.request_cancel(child.run_id)
            if phase is Phase.AWAITING_APPROVAL:
                parked = self.store.load(child.run_id)
                if parked is not None:
                    self.publish([decide_task(parked)], parked.epoch)  # no worker holds it: wake one

    def fail(
        self, current: fsm.LivePhase, claim: ClaimRef | None, error: RunErrorInfo, extra: Sequence[Event] = ()
    ) -> RunHead | None:
        return self.commit(current, current.fail(error), claim, extra)

    def tool_time_limits(self, head: RunHead) -> dict[str, float]:
        """Hard time limits of the tools an ACTING head calls (none for other phases)."""
        if head.phase is not Phase.ACTING:
            return {}
        try:
            tools = self.agent_of(head).tools
        except ConfigError:
            return {}
        return {
            c.name: hard_limit_s(t.attempt_limit_s) for c in head.pending_calls if (t := tools.get(c.name))
        }


def middleware_context(head: RunHead, memory: PhaseMemory | None = None) -> MiddlewareContext:
    """What the agent's middleware is told about the run of ``head`` (``memory``: where its hooks
    write long-term memory, ``Runtime.phase_memory``)."""
    return MiddlewareContext(
        run_id=head.run_id,
        agent=head.active_agent,
        step=head.step,
        tenant=head.tenant,
        metadata=head.metadata,
        state=head.state,
        memory=memory,
    )


def _stamped(head: RunHead, phase: Phase, claim: ClaimRef | None) -> RunHead:
    """``head`` naming the delivery that commits it (a head copies its predecessor's otherwise)."""
    ran = None
    if claim is not None and claim.claimed_at:
        me = this_worker()
        ran = PhaseRun(
            phase=phase, host=me.host, pid=me.pid, claimed_at=claim.claimed_at, attempt=claim.attempt
        )
    return head.model_copy(update={"ran": ran})


def _dropped_because(outcome: ClaimOutcome) -> str:
    if outcome is None:
        return "unknown_run"
    if isinstance(outcome, Busy):
        return "busy"
    return "done" if isinstance(outcome, Done) else "stale"


def poison_error(
    what: str, phase: Phase, step: int, attempts: int, limit: int, last_error: str
) -> RunErrorInfo:
    """The error of a run whose phase was started too often without finishing."""
    return PoisonPhase(
        f"{what} was started {attempts} times without finishing (limit {limit})",
        step=step,
        phase=phase.value,
        attempts=attempts,
        last_error=last_error or "unknown: the process died without leaving a trace",
    ).info()


def internal_error(exc: BaseException, what: str, phase: Phase, step: int) -> RunErrorInfo:
    """The error of a run whose phase raised something the runtime did not expect: a bug."""
    trace = "".join(traceback.format_exception(exc, limit=-12))
    return InternalInvariant(
        f"{what} raised {type(exc).__name__}: {str(exc)[:500]}",
        step=step,
        phase=phase.value,
        exception_type=type(exc).__name__,
        exception_message=str(exc)[:2000],
        traceback=trace[-4000:],
    ).info()
