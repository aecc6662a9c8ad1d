"""What every phase task needs: the store, the agents, a publisher, and the shared moves.

A phase task follows one shape (see ``think.py``, ``act.py``, ``observe.py``):
claim the phase with :meth:`RunStore.begin`; if the run is elsewhere, only make sure its outbox
was published; otherwise do the phase, commit with compare-and-set, then publish the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared import fsm
from shared.agents import AgentRegistry
from shared.errors import PoisonPhase, RunErrorInfo
from shared.events import Event
from shared.fsm import Transition
from shared.messages import Message, SystemMessage, UserMessage
from shared.settings import Settings
from shared.state import Phase, RunHead, TaskSpec
from shared.store import CommitStatus, RunStore, Stale

log = logging.getLogger("wesichain.worker")

#: Sends one task to the broker: (name, kwargs, task_id).
Send = Callable[[str, dict[str, Any], str], None]

TASK_START = "wesichain.start"
TASK_THINK = "wesichain.think"
TASK_TOOL = "wesichain.tool"
TASK_OBSERVE = "wesichain.observe"


def task_for(head: RunHead) -> list[TaskSpec]:
    """The outbox of a committed head: the tasks that carry the run to its next phase."""
    base = {"run_id": head.run_id, "step": head.step, "version": head.version}
    if head.phase is Phase.IDLE:
        return [start_task(head.run_id, head.version)]
    if head.phase is Phase.THINKING:
        return [TaskSpec(name=TASK_THINK, task_id=f"{head.run_id}:v{head.version}:think", arguments=base)]
    if head.phase is Phase.ACTING:
        return [
            TaskSpec(
                name=TASK_TOOL,
                task_id=f"{head.run_id}:v{head.version}:tool:{c.id}",
                arguments={**base, "call_id": c.id},
            )
            for c in head.pending_calls
        ]
    if head.phase is Phase.OBSERVING:
        return [TaskSpec(name=TASK_OBSERVE, task_id=f"{head.run_id}:v{head.version}:observe", arguments=base)]
    return []


def start_task(run_id: str, version: int) -> TaskSpec:
    return TaskSpec(
        name=TASK_START,
        task_id=f"{run_id}:v{version}:start",
        arguments={"run_id": run_id, "version": version},
    )


def observe_task(acting: RunHead) -> TaskSpec:
    """The observe task the fan-in will enqueue: it expects the version after the last result."""
    version = acting.version + 1
    return TaskSpec(
        name=TASK_OBSERVE,
        task_id=f"{acting.run_id}:v{version}:observe",
        arguments={"run_id": acting.run_id, "step": acting.step, "version": version},
    )


@dataclass
class Runtime:
    store: RunStore
    agents: AgentRegistry
    send: Send
    settings: Settings

    def publish(self, outbox: Sequence[TaskSpec]) -> None:
        for spec in outbox:
            self.send(spec.name, spec.arguments, spec.task_id)

    def on_stale(self, stale: Stale, task: str, version: int) -> None:
        """A duplicate or late delivery: do nothing but make sure the run's next phase was sent."""
        head = stale.head
        if head is None or head.terminal:
            return
        if head.version > version and not stale.outbox_sent:
            log.info(
                "run %s: %s v%d is stale at v%d; re-publishing its outbox",
                head.run_id,
                task,
                version,
                head.version,
            )
            self.publish(stale.outbox)

    def commit(
        self,
        current: fsm.LivePhase,
        transition: Transition[fsm.PhaseView],
        extra_events: Sequence[Event] = (),
    ) -> CommitStatus:
        """Commit a transition and publish what it leads to; a pending cancel wins over it."""
        head = transition.head
        events = (*extra_events, *transition.events)
        status = self.store.commit(current.head.version, head, transition.messages, events, task_for(head))
        if status == "committed":
            self.publish(task_for(head))
        elif status == "cancel_pending":
            self.interrupt(current, "cancelled")
        else:
            log.info("run %s: commit of v%d fenced off (another delivery won)", head.run_id, head.version)
        return status

    def interrupt(self, current: fsm.LivePhase, reason: str, error: RunErrorInfo | None = None) -> None:
        transition = current.interrupt(reason, error)
        self.store.commit(current.head.version, transition.head, (), transition.events)

    def fail(self, current: fsm.LivePhase, error: RunErrorInfo, extra: Sequence[Event] = ()) -> None:
        self.commit(current, current.fail(error), extra)

    def check_poison(self, current: fsm.LivePhase, attempts: int, what: str) -> bool:
        """Past the attempt limit, end the run instead of crashing another worker."""
        if attempts <= self.settings.max_phase_attempts:
            return False
        error = PoisonPhase(
            f"{what} was started {attempts} times without finishing"
            f" (limit {self.settings.max_phase_attempts})",
            step=current.head.step,
        ).info()
        self.fail(current, error)
        return True


def initial_messages(system_prompt: str, history: Sequence[Message], user_input: str) -> list[Message]:
    return [SystemMessage(content=system_prompt), *history, UserMessage(content=user_input)]
