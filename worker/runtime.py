"""What every phase task needs: the store, the agents, a publisher, and the shared moves.

A phase task follows one shape (see ``think.py``, ``act.py``, ``observe.py``, ``start.py``):
claim the phase with :meth:`RunStore.begin`; if the run is elsewhere, only make sure its outbox
was published; if another delivery holds a live claim, do nothing; otherwise do the phase under
a heartbeat, commit with compare-and-set, then publish the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared import fsm
from shared.agents import AgentRegistry
from shared.errors import PoisonPhase, RunErrorInfo
from shared.events import Event
from shared.fsm import Transition
from shared.messages import Message, SystemMessage, UserMessage
from shared.settings import Settings
from shared.state import Phase, TaskSpec
from shared.store import Busy, Claim, CommitStatus, Done, RunStore, Stale
from shared.tasks import task_for
from worker import faults
from worker.heartbeat import Heartbeat

log = logging.getLogger("wesichain.worker")

#: Sends one task to the broker.
Send = Callable[[TaskSpec], None]


@dataclass
class Runtime:
    store: RunStore
    agents: AgentRegistry
    send: Send
    settings: Settings
    heartbeat: Heartbeat

    def publish(self, outbox: Sequence[TaskSpec]) -> None:
        for spec in outbox:
            self.send(spec)
            if faults.enabled("duplicate_publish"):
                self.send(spec)

    def unclaimed(
        self, claim: Claim | Busy | Done | Stale | None, task: str, run_id: str, version: int
    ) -> bool:
        """Handle every outcome of begin() but a fresh claim; True when the task must stop here."""
        if claim is None:
            log.warning("%s for unknown run %s dropped", task, run_id)
            return True
        if isinstance(claim, Done):
            return True
        if isinstance(claim, Busy):
            log.info("run %s: %s v%d is already being worked on; duplicate dropped", run_id, task, version)
            return True
        if isinstance(claim, Stale):
            self.on_stale(claim, task, version)
            return True
        return False

    def ready(
        self, claim: Claim | Busy | Done | Stale | None, task: str, run_id: str, version: int, what: str
    ) -> Claim | None:
        """The claim, when this delivery is to do its phase; None when it must stop here.

        Stopping may still take an action: re-publish a stale run's unsent outbox, fail a run
        whose phase crashed its workers too often, or commit a requested cancel.
        """
        if self.unclaimed(claim, task, run_id, version):
            return None
        assert isinstance(claim, Claim)
        current = fsm.view(claim.head)
        assert not isinstance(current, fsm.Completed | fsm.Failed | fsm.Interrupted)
        if self.check_poison(current, claim.attempts, what):
            return None
        if claim.cancel_requested:
            self.interrupt(current, "cancelled")
            return None
        return claim

    def paused(self, phase: Phase, run_id: str) -> None:
        faults.pause_point(phase.value, self.store, run_id)

    def on_stale(self, stale: Stale, task: str, version: int) -> None:
        """A duplicate or late delivery: do nothing, unless the run's next phase may never have been sent.

        That is the case only when the broker handed this task over because its worker died (the
        worker may have died between its commit and its publish) and no task of the new version
        has claimed the run since. Any other stale delivery is a benign duplicate: re-publishing
        from it would send a duplicate of the next phase, which would do the same one hop later.
        """
        head = stale.head
        if head is None or head.terminal:
            return
        if stale.takeover and head.version > version and not stale.outbox_sent:
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
        countdown: float = 0.0,
    ) -> CommitStatus:
        """Commit a transition and publish what it leads to; a pending cancel wins over it."""
        head = transition.head
        events = (*extra_events, *transition.events)
        outbox = (
            [s.model_copy(update={"countdown": countdown}) for s in task_for(head)]
            if countdown
            else task_for(head)
        )
        status = self.store.commit(current.head.version, head, transition.messages, events, outbox)
        if status == "committed":
            faults.crash_point(f"crash_after_commit:{current.phase.value}", self.store, head.run_id)
            self.publish(outbox)
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
