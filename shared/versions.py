"""Agent versions: which version of an agent's code a run is pinned to, and which workers may run it.

A run is pinned, when it starts, to the version of the agent that started it (:func:`version_to_pin`;
a run handed to another agent is pinned to that agent's version the same way). Every later task of
the run that runs agent code (think, the tool calls, observe, decide, spawn) goes to a **version
queue** of its kind, ``<namespace>.<kind>.<agent>-v<version>`` (:func:`version_queue`), built from
the run's head like every other route (``shared/tasks.py``), so a phase handed on by the sweeper or
re-sent from an outbox goes to the same queue. Only workers serving that agent version consume it
(:func:`version_queues_of`): a run never continues on other code by accident, and a run whose
version no live worker serves waits in its queue, holding nothing, until one does.

The start goes to the namespace's default queues (any worker of the agent may start a new run: that
is how a deploy moves new runs to new code), and so does a run's completion callback (it runs no
agent code).

An agent's author opts in to moving older runs forward (:class:`VersionPolicy`):

* ``compatible_versions``: this code serves runs started on those versions as they are; a worker
  consumes their version queues too, and the first phase it takes of such a run re-pins it to this
  version (a committed transition with a ``VersionUpgraded`` event);
* ``migrate_from``: a function per older version that maps a run's custom state (given its
  conversation, read only) to this version's; applied once, durably, as the same committed
  transition, when a worker of this version takes over a model phase (think, observe, decide) of
  such a run. The conversation itself is kept as it is: it is append-only, and every checkpoint
  and fork indexes into it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shared.errors import ConfigError
from shared.messages import Message
from shared.queues import DEFAULT_NAMESPACE, KINDS, queue_in
from shared.state import Phase, RunHead

if TYPE_CHECKING:
    from shared.store import RunStore
    from shared.workers import LiveWorker

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_VERSION_CHARS",
    "Migration",
    "MigrateFn",
    "PinnedCount",
    "PinnedRuns",
    "VersionLoad",
    "drain_target",
    "version_loads",
    "Upgrade",
    "VERSION_PATTERN",
    "VersionPolicy",
    "check_version",
    "is_version_queue",
    "upgrade_path",
    "version_queue",
    "version_queues_of",
    "version_to_pin",
    "waiting_for",
    "waiting_loads",
    "waiting_reason",
]

#: What a version looks like: short, and safe in a queue name, a key and a log line.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_VERSION_CHARS = 32
_VERSION = re.compile(VERSION_PATTERN)
#: The longest agent-and-version label in a queue name (a longer one is cut and given a digest).
MAX_LABEL_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def check_version(value: object, what: str = "version") -> str:
    """``value`` if it is a version (1..32 letters, digits, ``.``, ``_``, ``-``); else ConfigError."""
    if not isinstance(value, str) or not value or len(value) > MAX_VERSION_CHARS or not _VERSION.match(value):
        raise ConfigError(
            f"{what} {str(value)[:80]!r} must be 1..{MAX_VERSION_CHARS} letters, digits, '.', '_' and '-'"
        )
    return value


@dataclass(frozen=True)
class Migration:
    """What a migration function is given: a run pinned to ``from_version``, moving to ``to_version``."""

    run_id: str
    agent: str
    from_version: str
    to_version: str
    #: The run's custom state as the old version left it (None: it had none).
    state: dict[str, Any] | None
    #: The run's conversation so far, read only.
    messages: Sequence[Message]


#: Maps an old version's run to the new version's custom state (None: no state).
MigrateFn = Callable[[Migration], "dict[str, Any] | None"]


@dataclass(frozen=True)
class VersionPolicy:
    """Which runs an agent's code serves: its own version's, and the older ones it opts in to."""

    name: str
    version: str
    compatible_versions: tuple[str, ...] = ()
    migrate_from: Mapping[str, MigrateFn] | None = None

    def check(self) -> None:
        check_version(self.version, f"agent {self.name!r}: version")
        migrated = set(self.migrate_from or {})
        for v in (*self.compatible_versions, *migrated):
            check_version(v, f"agent {self.name!r}: an older version")
        if self.version in self.compatible_versions or self.version in migrated:
            raise ConfigError(
                f"agent {self.name!r}: version {self.version!r} cannot be its own older version"
            )
        if migrated & set(self.compatible_versions):
            both = sorted(migrated & set(self.compatible_versions))
            raise ConfigError(f"agent {self.name!r}: versions {both} are both compatible and migrated")
        for v, fn in (self.migrate_from or {}).items():
            if not callable(fn):
                raise ConfigError(f"agent {self.name!r}: migrate_from[{v!r}] is not callable")

    def served(self, kind: str) -> list[str]:
        """The versions whose ``kind`` queues a worker of this code consumes.

        Tool calls of a migrated version are not among them: the old version's tools run them (an
        upgrade happens at a model phase, when no call of the step is left half-done).
        """
        versions = [self.version, *self.compatible_versions]
        if kind == "model":
            versions += sorted(self.migrate_from or {})
        return versions


Upgrade = Literal["compatible", "migrated"]


def upgrade_path(policy: VersionPolicy, pinned: str) -> Upgrade | None:
    """How this code takes over a run pinned to ``pinned`` (None: as it is, the same version)."""
    if pinned == policy.version:
        return None
    if pinned in policy.compatible_versions:
        return "compatible"
    if pinned in (policy.migrate_from or {}):
        return "migrated"
    raise ConfigError(f"agent {policy.name!r} v{policy.version} does not serve runs of v{pinned}")


def version_to_pin(policy: VersionPolicy) -> str:
    """The version a run is pinned to when this agent's code starts it (or takes it over from
    another agent): the one place that chooses it."""
    return policy.version


def version_queue(namespace: str | None, kind: str, agent: str, version: str) -> str:
    """The queue of ``kind`` for the runs of ``agent`` pinned to ``version`` in ``namespace``.

    The label is the agent and version with anything but letters, digits, ``_`` and ``-`` made
    ``_`` (a queue name's dots separate its namespace and kind); a label that had to change, or is
    long, ends in a digest of the original, so two agents never share a queue.
    """
    if kind not in KINDS:
        raise ValueError(f"no queue kind {kind!r}")
    original = f"{agent}-v{version}"
    label = _UNSAFE.sub("_", original)
    if label != original or len(label) > MAX_LABEL_CHARS:
        digest = hashlib.sha256(original.encode()).hexdigest()[:10]
        label = f"{label[: MAX_LABEL_CHARS - 11]}-{digest}"
    return f"{namespace or DEFAULT_NAMESPACE}.{kind}.{label}"


def is_version_queue(queue: str) -> bool:
    """Whether ``queue`` is a version queue (a namespace's kind queue with a label after it)."""
    parts = queue.split(".")
    return len(parts) == 3 and parts[1] in KINDS


def version_queues_of(consumed: Iterable[str], policies: Iterable[VersionPolicy]) -> list[str]:
    """The version queues a worker consuming the kind queues ``consumed`` serves with these agents:
    for each ``<namespace>.<kind>`` queue, those of every agent version it serves for that kind."""
    found: list[str] = []
    listed = list(policies)
    for queue in consumed:
        namespace, _, kind = queue.rpartition(".")
        if not namespace or kind not in KINDS or kind == "callbacks":
            continue  # not a kind queue (a queue of its own), or one no version routes to
        for policy in listed:
            found += [version_queue(namespace, kind, policy.name, v) for v in policy.served(kind)]
    return list(dict.fromkeys(found))


def waiting_reason(agent: str, version: str) -> str:
    """What a run pinned to a version no live worker serves is said to be doing."""
    return f"waiting for a worker serving {agent} v{version}"


def _serves(worker: LiveWorker) -> bool:
    """Whether a live worker takes messages (every slot busy still counts: it will)."""
    return worker.record.consuming or worker.record.consumer_state == "saturated"


def waiting_for(
    head: RunHead, live: Sequence[LiveWorker], decided: bool = False, thread_previous: str | None = None
) -> str | None:
    """Why a queued or running run is not moving, when it can be told: parked until the run before
    it in its thread ends (``thread_previous``, read from the store by the caller), or no live
    worker consumes the queue its next task waits in (for a pinned run, its version's queue). None
    for a run that ended, or is parked undecided (a human or its subagents move it, not a worker; a
    ``decided`` one waits for the worker that resumes it), and for one some live worker can take."""
    if head.terminal or (head.phase is Phase.AWAITING_APPROVAL and not decided):
        return None
    if thread_previous is not None:
        return f"waiting for run {thread_previous} of its thread to end (parked, no worker held)"
    kind = "tools" if head.phase is Phase.ACTING else "model"
    consumed = {q for w in live if _serves(w) for q in w.record.queues}
    if head.agent_version and head.phase is not Phase.IDLE:
        pinned = version_queue(head.namespace, kind, head.active_agent, head.agent_version)
        return None if pinned in consumed else waiting_reason(head.active_agent, head.agent_version)
    queue = queue_in(head.namespace or DEFAULT_NAMESPACE, kind)
    if queue in consumed:
        return None
    return f"is {head.phase.value}, and no live worker consumes queue {queue}: it waits until one does"


@dataclass(frozen=True)
class PinnedCount:
    """The live runs pinned to one agent version."""

    agent: str
    version: str
    #: Queued or running (a worker of the version is needed to move them).
    active: int
    #: Parked: waiting for a human's decision or for subagents (no worker is held).
    parked: int


class PinnedRuns:
    """Which runs each agent version holds: a set per version, written before the commit that pins
    a run, so it holds every pinned run (and, for a moment, runs whose pinning commit did not
    happen); a read drops the runs that ended or moved to another version."""

    #: Runs looked at per read (a read is an operator's, or a draining worker's few-second check).
    CHUNK = 500

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.redis = store.redis
        self.keys = store.keys

    def pin(self, run_id: str, agent: str, version: str, tenant: str | None = None) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(self.keys.pinned(agent, version), run_id)
            pipe.sadd(self.keys.pinned_of(agent, version, tenant), run_id)
            pipe.sadd(self.keys.pinned_versions(), f"{agent}:{version}")
            pipe.execute()

    def versions(self) -> list[tuple[str, str]]:
        """Every agent version some run was pinned to (and not yet found to hold none)."""
        found = []
        for raw in self.redis.smembers(self.keys.pinned_versions()):
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            agent, _, version = text.rpartition(":")
            found.append((agent, version))
        return sorted(found)

    def count(self, agent: str, version: str, tenant: str | None | Literal["*"] = "*") -> PinnedCount:
        """The live runs pinned to ``agent`` ``version`` (of ``tenant`` only, unless ``"*"``: then
        its own set is read, so a tenant's count costs what its own runs do, not every tenant's)."""
        every = tenant == "*"
        key = self.keys.pinned(agent, version) if every else self.keys.pinned_of(agent, version, tenant)
        active = parked = 0
        gone: list[str] = []
        cursor: Any = 0
        while True:
            cursor, members = self.redis.sscan(key, cursor, count=self.CHUNK)
            run_ids = [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in members]
            # Every head of the page in one round trip: a run no longer in Redis has ended.
            for run_id, head in zip(run_ids, self.store.load_many(run_ids), strict=True):
                if (
                    head is None
                    or head.terminal
                    or head.agent_version not in ("", version)
                    or head.active_agent != agent
                ):
                    gone.append(run_id)
                elif tenant != "*" and head.tenant != tenant:
                    continue
                elif head.phase is Phase.AWAITING_APPROVAL:
                    parked += 1
                else:
                    active += 1
            if int(cursor) == 0:
                break
        if gone:
            self.redis.srem(key, *gone)
        if every and not active and not parked and not self.redis.exists(key):
            self.redis.srem(self.keys.pinned_versions(), f"{agent}:{version}")
        return PinnedCount(agent, version, active, parked)


def drain_target(worker: str | None = None, agent: str | None = None, version: str | None = None) -> str:
    """The field of the drains hash that asks ``worker``, or every worker of ``agent`` ``version``,
    to drain."""
    if worker:
        return f"worker:{worker}"
    if agent and version:
        return f"version:{agent}:{check_version(version)}"
    raise ConfigError("drain a worker (its node name) or an agent version (AGENT:VERSION)")


@dataclass(frozen=True)
class VersionLoad:
    """One agent version: the live workers serving it and the live runs pinned to it."""

    agent: str
    version: str
    #: Live, consuming workers whose code serves its runs (its own, or one declaring it compatible
    #: or migrating from it).
    workers: int
    #: Of those, the ones draining.
    draining: int
    active: int
    parked: int

    @property
    def waiting(self) -> bool:
        """Runs of it are queued and no live worker serves it: they wait for one."""
        return self.active > 0 and self.workers == 0


def _serving(live: Sequence[LiveWorker]) -> dict[tuple[str, str], list[bool]]:
    """Each agent version live workers serve: whether each of its workers is draining."""
    serving: dict[tuple[str, str], list[bool]] = {}
    for worker in live:
        record = worker.record
        if not _serves(worker):
            continue
        for info in record.agents:
            for v in dict.fromkeys([info.version, *info.compatible_versions, *info.migrates_from]):
                serving.setdefault((info.name, v), []).append(record.draining)
    return serving


def version_loads(
    pinned: PinnedRuns, live: Sequence[LiveWorker], tenant: str | None | Literal["*"] = "*"
) -> list[VersionLoad]:
    """Every agent version live workers serve or live runs are pinned to, with both counts."""
    serving = _serving(live)
    loads = []
    for agent, version in sorted(set(serving) | set(pinned.versions())):
        count = pinned.count(agent, version, tenant)
        workers = serving.get((agent, version), [])
        loads.append(VersionLoad(agent, version, len(workers), sum(workers), count.active, count.parked))
    return loads


def waiting_loads(pinned: PinnedRuns, live: Sequence[LiveWorker]) -> list[VersionLoad]:
    """The agent versions whose queued or running runs wait because no live worker serves them.

    Only the versions no live worker serves are counted, so the usual answer (every version with
    runs is served) costs one read of the pinned versions, whatever the number of runs.
    """
    serving = _serving(live)
    loads = []
    for agent, version in pinned.versions():
        if (agent, version) in serving:
            continue
        count = pinned.count(agent, version)
        if count.active:
            loads.append(VersionLoad(agent, version, 0, 0, count.active, count.parked))
    return loads
