"""The worker's side of agent versions (``shared/versions.py``): the version queues it consumes, the
check every phase makes before running agent code, and draining.

A phase of a run pinned to a version this worker's code does not serve is never run here. Version
queues keep such tasks away; one that arrives anyway (a queue named by hand, a message sent before
the run was pinned) is given back uncounted and published again to the run's version queue, so it
is neither a takeover nor an attempt towards the poison limit.

A worker whose code declares an older version compatible, or migrates from it, takes that version's
runs over at their next model phase: the phase runs on this version's code, and its commit carries
the run forward (``agent_version``, the migrated state and a ``VersionUpgraded`` event), all in the
one compare-and-set commit of the phase. A migration is therefore applied once, durably: a delivery
that dies before its commit leaves the run as it was, and the next one migrates it afresh (a
migration function must be pure).

Draining: an operator marks a worker, or an agent version, as draining (``wesichain workers
drain``). Each registry beat of a draining worker stops its consumers of the default and namespace
queues (so it takes no new runs, pipeline or eval work), keeps serving its version queues, and once
no queued or running run is pinned to a version it serves, stops the worker warmly: tasks in
flight finish first. Parked runs (waiting for a human or for subagents) hold no worker: when they
resume, they wait for a worker serving their version, or one that takes them over.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from celery import Celery

from shared import fsm
from shared.agents import Agent, AgentRegistry
from shared.errors import ConfigError, RunConfigError
from shared.events import VersionUpgraded
from shared.run_state import StateError, check_state
from shared.state import Phase, RunHead
from shared.store import Claim
from shared.tasks import decide_task, task_for
from shared.versions import (
    Migration,
    PinnedRuns,
    drain_target,
    is_version_queue,
    upgrade_path,
    version_queues_of,
    version_to_pin,
    waiting_reason,
)
from worker.runtime import Runtime

__all__ = [
    "DelayedQueues",
    "Drain",
    "REROUTE_S",
    "VersionCheck",
    "add_version_queues",
    "check_version",
    "pin",
]

log = logging.getLogger("wesichain.worker")

#: The countdown of a task given back to its version queue (a worker consuming that queue by
#: mistake gets it again only this much later, not in a tight loop).
REROUTE_S = 1.0


def add_version_queues(app: Celery, registry: AgentRegistry) -> list[str]:
    """Add to what this worker consumes the version queues of the agents it serves, for each kind
    queue it consumes (``wesichain.model`` -> ``wesichain.model.<agent>-v<N>``); returns them."""
    queues = app.amqp.queues
    consumed = [q.name for q in queues.consume_from.values()] if queues.consume_from else list(queues)
    added = version_queues_of(consumed, (registry.get(n).versions for n in registry.names))
    for name in added:
        if name not in (queues.consume_from or {}):
            # Built as Celery builds a queue a publish names (``queues[name]``: on RabbitMQ a quorum
            # queue), so a queue a publish declared first is the same queue, not a conflicting one.
            queues.select_add(queues[name])
    return added


class DelayedQueues:
    """Makes sure a queue can receive a countdown's message on RabbitMQ before one is sent to it.

    A countdown travels through RabbitMQ's delayed-delivery exchanges, and Celery then neither
    declares the target queue nor binds it to the exchange that delivers it when due: only a worker
    consuming the queue did, when it started. A version queue no live worker consumes (a task given
    back to its version, a retry of a run whose workers are gone) would lose the message. So the
    queue is declared, as Celery declares a missing queue (quorum, its topic exchange), and bound,
    once per process and queue, before the first countdown to it.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._ready: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, name: str) -> None:
        if name in self._ready:
            return
        from kombu.transport.native_delayed_delivery import bind_queue_to_native_delayed_delivery_exchange

        with self._lock:
            if name in self._ready:
                return
            queue = self.app.amqp.queues[name]  # Celery's missing-queue settings (shared/settings.py)
            with self.app.connection_for_write() as connection:
                queue.bind(connection.default_channel).declare()
                bind_queue_to_native_delayed_delivery_exchange(connection, queue)
            self._ready.add(name)


def pin(rt: Runtime, head: RunHead, agent: Agent) -> str:
    """The version ``head``'s run is pinned to with ``agent``'s code, indexed before the commit that
    records it (the one place a run's version is chosen: the start, and a run handed to an agent)."""
    version = version_to_pin(agent.versions)
    PinnedRuns(rt.store).pin(head.run_id, agent.name, version, head.tenant)
    return version


class VersionCheck:
    """What :func:`check_version` found: run the phase on ``current`` (maybe carried forward), or
    stop here with ``head`` (None: nothing committed)."""

    def __init__(self, run: bool, current: Any = None, head: RunHead | None = None) -> None:
        self.run = run
        self.current = current
        self.head = head


def check_version(rt: Runtime, current: fsm.LivePhase, claim: Claim) -> VersionCheck:
    """Before a phase runs agent code: is the run's version served here, and how?"""
    head = current.head
    pinned = head.agent_version
    if not pinned or head.phase is Phase.IDLE:
        return VersionCheck(True, current)  # not pinned yet: the start pins it
    try:
        agent = rt.agents.get(head.active_agent)
    except ConfigError:
        return VersionCheck(True, current)  # the phase fails the run with the agent's error
    try:
        how = upgrade_path(agent.versions, pinned)
    except ConfigError:
        _give_back(rt, head, claim)
        return VersionCheck(False)
    if how is None:
        return VersionCheck(True, current)
    state = head.state
    if how == "migrated":
        try:
            state = _migrated_state(rt, agent, head)
        except (StateError, ValueError, TypeError) as exc:
            error = RunConfigError(
                f"migrating {head.active_agent} v{pinned} to v{agent.version} failed: {str(exc)[:500]}",
                step=head.step,
            )
            return VersionCheck(False, head=rt.fail(current, claim.ref, error.info()))
    pin(rt, head, agent)
    moved = head.model_copy(update={"agent_version": agent.version, "state": state})
    rt.carry_events(
        head.run_id,
        VersionUpgraded(
            run_id=head.run_id,
            step=head.step,
            agent=head.active_agent,
            from_version=pinned,
            to_version=agent.version,
            how=how,
        ),
    )
    log.info(
        "run %s: taken over from %s v%s by v%s (%s)",
        head.run_id,
        head.active_agent,
        pinned,
        agent.version,
        how,
    )
    return VersionCheck(True, fsm.view_as(moved, type(current)))


def _migrated_state(rt: Runtime, agent: Agent, head: RunHead) -> dict[str, Any] | None:
    migrate = (agent.migrate_from or {})[head.agent_version]
    messages = rt.store.load_messages(head.run_id)
    state = migrate(
        Migration(
            run_id=head.run_id,
            agent=head.active_agent,
            from_version=head.agent_version,
            to_version=agent.version,
            state=head.state,
            messages=tuple(messages),
        )
    )
    if agent.state_type is None:
        if state is not None:
            raise StateError(f"v{agent.version} declares no state_type, and the migration gave a state")
        return None
    if not isinstance(state, dict):
        raise StateError("the migration must return the new version's state as a dict")
    return check_state(agent.state_type, state)


def _give_back(rt: Runtime, head: RunHead, claim: Claim) -> None:
    """A task of a version this worker does not serve: released uncounted, sent to its queue again."""
    why = waiting_reason(head.active_agent, head.agent_version)
    info = json.dumps({"version": head.version, "step": head.step, "limit": "agent version", "reason": why})
    if rt.store.throttle(head.run_id, head.version, claim.ref.token, REROUTE_S, info) == 0:
        return  # taken over meanwhile: the new holder goes on
    specs = task_for(head) if head.phase is not Phase.AWAITING_APPROVAL else [decide_task(head)]
    log.warning(
        "run %s: its %s v%s phase is not served here; sent back to its queue",
        head.run_id,
        head.active_agent,
        head.agent_version,
    )
    rt.publish([s.model_copy(update={"countdown": REROUTE_S}) for s in specs], head.epoch)


# -- draining ---------------------------------------------------------------------------------------


class Drain:
    """One worker's draining, checked at each registry beat (see the module doc)."""

    def __init__(self, rt: Runtime, consumer: Any, worker_id: str) -> None:
        self.rt = rt
        self.consumer = consumer
        self.worker_id = worker_id
        self.draining = False
        self.stopping = False
        self._since = 0.0
        self._cancelled: set[str] = set()
        agents = rt.agents
        self._own = [(n, agents.get(n).version) for n in agents.names]
        #: Every (agent, version) whose runs this worker moves: its own, and those it takes over.
        self._served = [(n, v) for n in agents.names for v in agents.get(n).versions.served("model")]

    def requested(self) -> bool:
        asked = self.rt.store.redis.hmget(
            self.rt.store.keys.drains(),
            [drain_target(worker=self.worker_id), *(drain_target(agent=a, version=v) for a, v in self._own)],
        )
        return any(a is not None for a in asked)

    def check(self) -> None:
        """Called by each registry beat: start draining when asked, stop once nothing is left."""
        if self.stopping:
            return
        if not self.draining:
            if not self.requested():
                return
            self.draining = True
            self._since = time.monotonic()
            log.warning(
                "worker %s drains: it takes no new runs and stops once its versions hold none", self.worker_id
            )
        self._stop_default_consumers()
        left = sum(PinnedRuns(self.rt.store).count(a, v).active for a, v in self._served)
        if left:
            return
        log.warning(
            "worker %s drained (%.1fs): no queued or running run of its versions is left; stopping",
            self.worker_id,
            time.monotonic() - self._since,
        )
        self.stopping = True
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown: tasks in flight finish

    def _stop_default_consumers(self) -> None:
        """Stop consuming every queue but the version queues (run in the consumer's own loop)."""
        tasks = getattr(self.consumer, "task_consumer", None)
        if tasks is None:
            return
        for queue in [q.name for q in getattr(tasks, "queues", [])]:
            if not is_version_queue(queue) and queue not in self._cancelled:
                self._cancelled.add(queue)
                self.consumer.call_soon(self.consumer.cancel_task_queue, queue)
