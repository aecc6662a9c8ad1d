"""The run store: Redis keys and the atomic scripts over them.

Every write that matters is one Lua script (``shared/lua``), so Redis sees it whole or not at all:

* :meth:`RunStore.create` — a new run, once per run id;
* :meth:`RunStore.claim_phase` / :meth:`RunStore.claim_call` — check a delivery against the run and
  claim its work (attempt counted, lease set) in one round trip, reading what the work needs;
* :meth:`RunStore.commit` — compare-and-set the version as the claim's holder, append messages,
  emit events, record the checkpoint and the outbox of tasks to publish next;
* :meth:`RunStore.record_result` — one tool result once per ``(run, step, call)``, and the fan-in:
  the last result commits the OBSERVING head;
* :meth:`RunStore.inspect` / :meth:`RunStore.recover` — the sweeper's look at a run whose lease
  time came, and its hand-on under a new epoch.

A commit costs the same at step 50 as at step 1: messages are appended, never rewritten. Every
script can be replayed after a lost reply (each write carries an op id it recognises), so the
Redis client may retry them.

The store is one class made of one part per concern, each a mixin over :class:`~shared.store.base.StoreCore`
(``base.py``: the Redis client, keys, settings, script registry and archive they all share):

* ``runs.py`` — creating a run and reading it (head, conversation, results, checkpoints);
* ``claims.py`` — the fenced write path: claims, renewals, releases, commits and tool results;
* ``listing.py`` — listings over the indexes, their cursors, and threads;
* ``sweeping.py`` — due runs, their inspection and hand-on, queued waits and unsent publishes;
* ``threads.py`` — admission to conversation threads, parking and waking their runs;
* ``decisions.py`` — human decisions, cancels, completion callbacks and throttling;
* ``events.py`` — a run's event stream outside commits;
* ``signals.py`` — a run's inbox: messages and state updates sent into it.

Mixins rather than collaborator objects: every caller keeps calling ``store.<method>`` on the one
:class:`RunStore`, and the parts share one client and one script registry without passing them
around. Every name this module offered before the split is still imported from here.
"""

from __future__ import annotations

from shared.store.base import ACK_COMMANDS, PUBLISH_COMMANDS, BrokerCommand, MessageCache, new_op, new_token
from shared.store.claims import (
    Busy,
    CallClaim,
    Claim,
    ClaimOutcome,
    ClaimRef,
    ClaimsMixin,
    CommitStatus,
    Committed,
    Done,
    PhaseClaim,
    Recorded,
    RecordStatus,
    Stale,
)
from shared.store.decisions import DecisionsMixin
from shared.store.events import EventsMixin
from shared.store.listing import CURSOR_PATTERN, ListingMixin, RunPage
from shared.store.signals import SignalsMixin, SignalTaken
from shared.store.sweeping import Due, HandedOn, SweepingMixin, TaskState
from shared.store.threads import HeldThread, ThreadsMixin, ThreadTurn

__all__ = [
    "CURSOR_PATTERN",
    "ACK_COMMANDS",
    "PUBLISH_COMMANDS",
    "BrokerCommand",
    "Busy",
    "CallClaim",
    "Claim",
    "ClaimOutcome",
    "ClaimRef",
    "CommitStatus",
    "Committed",
    "Done",
    "Due",
    "HandedOn",
    "HeldThread",
    "MessageCache",
    "PhaseClaim",
    "RecordStatus",
    "Recorded",
    "RunPage",
    "RunStore",
    "SignalTaken",
    "SignalsMixin",
    "Stale",
    "TaskState",
    "ThreadTurn",
    "new_op",
    "new_token",
]


class RunStore(
    ClaimsMixin, ListingMixin, SweepingMixin, DecisionsMixin, EventsMixin, ThreadsMixin, SignalsMixin
):
    """Reads and atomic writes of run state in one Redis (or Redis Cluster, key layout permitting).

    With an archive (``Settings.archive_url``), every read of a run that is no longer in Redis is
    answered from the archive, in the same types: status, conversation, checkpoints, events, tool
    results, callback state, threads and listings span both.
    """
