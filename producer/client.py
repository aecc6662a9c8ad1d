"""The Python client: submit runs by agent name and follow them while any worker executes them.

    client = Client.from_env()                 # WESICHAIN_REDIS_URL
    handle = client.submit("research", "What is a lease?")
    for event in handle.events():               # live, from whichever worker runs each phase
        print(event.kind)
    head = handle.wait(timeout=60)

Submitting writes the run (IDLE) and sends ``wesichain.start`` by name; nothing here imports the
worker package, so a producer needs only the agent's name and the Redis URL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import redis
from celery import Celery
from pydantic import ValidationError

from producer.assistants import Assistants
from producer.publishing import (
    PUBLISH_ERRORS,
    MessageBuilder,
    RuntimePublisher,
    broker_is_store,
    broker_redis,
    publish_commands,
    pushes_messages,
)
from producer.schedules import Schedules
from shared.assistants import AssistantVersion
from shared.bulk import BulkJob, BulkOutcome, BulkStore, bulk_task
from shared.embedding import load_embedding
from shared.errors import InvalidRequest, StoreFull, ThreadBusy, WesichainError
from shared.events import END_EVENTS, Event, ToolDispatched, follow_events, read_all_events
from shared.memory import Memory, memory_of
from shared.pipeline.store import PipelinePage, PipelineStore, stored_pipeline_id
from shared.pool import PoolView, pool_view, with_deaths
from shared.pool_records import Obituaries
from shared.prompts import Prompt, missing_variables
from shared.redis_client import connect
from shared.request import check_name, check_run_id, new_run, validate_request
from shared.retention import MemoryGuard, full_message
from shared.search import SearchQuery
from shared.settings import Settings, celery_config
from shared.signals import SignalKind, SignalView, new_signal, signal_status
from shared.state import (
    Callback,
    CallbackState,
    Decision,
    EvalLink,
    ForkOrigin,
    Phase,
    PipelineLink,
    RunHead,
    TaskSpec,
    ThreadPolicy,
)
from shared.store import RunPage, RunStore, ThreadTurn
from shared.store.base import BrokerCommand
from shared.store.runs import Creation, NewRun, Release
from shared.tasks import decide_task, start_task
from shared.tenants import check_models_allowed
from shared.timeline import Timeline, build_timeline
from shared.timetravel import Checkpoint, checkpoint_of, fork_conversation, forked_handoffs
from shared.unsent import mark_unsent
from shared.versions import (
    PinnedRuns,
    VersionLoad,
    drain_target,
    version_loads,
    waiting_for,
)
from shared.workers import AgentInfo, LiveWorker, WorkerDirectory, agents_served

if TYPE_CHECKING:
    from producer.pipelines import PipelineHandle

__all__ = [
    "SignalRefused",
    "BulkJobNotFound",
    "Client",
    "RequestConflict",
    "RunHandle",
    "RunNotFound",
    "RunRequest",
    "RunTimeout",
    "signal_view",
    "NoLiveWorker",
    "UnknownAgent",
    "idempotent_run_id",
]


class RequestConflict(WesichainError):
    """An idempotency key was reused for a different request."""


class UnknownAgent(InvalidRequest):
    """No live worker serves the agent a run names, while other workers are live: a permanent
    refusal (a misspelled agent, or one no deployed worker has)."""


class NoLiveWorker(WesichainError):
    """No live worker is known right now that could serve the run (none registered, as for a few
    seconds after a Redis restart, or those serving its agent are reconnecting to the broker).

    Transient, unlike :class:`UnknownAgent`: the same request is accepted once the workers are
    back; retry after ``retry_after_s``. Not an :class:`InvalidRequest`.
    """

    #: How long to wait before submitting again: a worker re-registers within this once Redis answers.
    retry_after_s = 1.0


def idempotent_run_id(tenant: str | None, key: str) -> str:
    """The run id an idempotency key stands for: the same key (per tenant) is the same run."""
    if not key or len(key) > 255:
        raise InvalidRequest("an idempotency key is 1..255 characters")
    return "idem-" + hashlib.sha256(f"{tenant or '-'}\x00{key}".encode()).hexdigest()[:40]


def _canonical_request(created: RunHead) -> str:
    """What a producer asked for, from a run as it was created (IDLE, version 1), as canonical
    JSON: the same for the same request however its objects' keys were ordered (and still
    telling 1, 1.0 and true apart, as a plain comparison of the values would not)."""
    request = json.loads(created.dump_request(exclude_time=True))
    return json.dumps({**request, "model": created.model, "state": created.state}, sort_keys=True)


def _as_pinned(head: RunHead, existing: RunHead, asked_version: int | None) -> RunHead:
    """A resubmitted run as the one it repeats was pinned: a request that named its assistant but
    no version is the same request whichever version is current now."""
    if asked_version is None and head.assistant is not None and existing.assistant == head.assistant:
        return head.model_copy(update={"assistant_version": existing.assistant_version})
    return head


class BulkJobNotFound(WesichainError, LookupError):
    """No bulk job has this id (for this tenant), or it expired."""


def _search_query(query: SearchQuery | None, filters: dict[str, Any]) -> SearchQuery:
    """The query given, or made of keyword filters (not both); a bad one raises InvalidRequest."""
    if query is not None and filters:
        raise InvalidRequest("give a SearchQuery or keyword filters, not both")
    if query is not None:
        return query
    try:
        return SearchQuery.model_validate(filters)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidRequest(f"bad search: {problems}"[:500]) from None


#: The fields of a :class:`RunRequest` that are not the request a producer makes: the run's id
#: and the runtime's own link and model inheritance.
_NOT_REQUESTED = frozenset({"run_id", "link", "model_inherited"})


@dataclass(frozen=True)
class RunRequest:
    """One run for :meth:`Client.submit_many`: what :meth:`Client.submit` takes for it."""

    agent: str
    input: str
    run_id: str | None = None
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    model: str | None = None
    tenant: str | None = None
    callback: Callback | dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    namespace: str | None = None
    #: The runtime's own (see :meth:`Client.submit`).
    link: PipelineLink | EvalLink | None = None
    thread_policy: ThreadPolicy | None = None
    assistant: str | None = None
    assistant_version: int | None = None
    #: The runtime's own: ``model`` is kept from the run a retry repeats, named by no one
    #: (``RunHead.model_inherited``).
    model_inherited: bool = False


class RunTimeout(WesichainError, TimeoutError):
    """``RunHandle.wait`` ran out of time; the run goes on."""


class RunNotFound(WesichainError, LookupError):
    """No run has this id (never created, or expired after its retention)."""


class Client:
    """Submits runs and follows them, with the Redis URL and agent names only."""

    def __init__(
        self,
        settings: Settings,
        *,
        app: Celery | None = None,
        store: RunStore | None = None,
        prepare: Callable[[Sequence[TaskSpec]], list[BrokerCommand]] | None = None,
    ) -> None:
        self.settings = settings
        #: Builds a task's Celery message from its kind's template when the broker is a Redis
        #: (``producer/publishing.py``), pushed on :attr:`_broker`; else ``send_task``. Only on
        #: the client's own app: a given one publishes as its owner has it publish.
        self._messages: MessageBuilder | None = None
        if app is None:
            app = Celery("wesichain-producer", set_as_current=False)
            app.conf.update(celery_config(settings))
            if pushes_messages(settings):
                self._messages = MessageBuilder(app)
        self.app = app
        #: Builds the broker commands a create script runs to push the new run's start (no
        #: publish after it), when the broker is the store's Redis: the client's own messages, or,
        #: for a given app, its owner's builder (``prepare``: a worker's ``Runtime.prepare``, for
        #: the runs its pools create).
        in_store = broker_is_store(settings)
        self._prepare = self._messages.build if self._messages is not None and in_store else prepare
        self.store = store or RunStore(connect(settings), settings)
        #: Where the built messages are pushed: the store's client, or a client of the broker's
        #: own Redis (the standalone one beside a Redis Cluster run state).
        self._broker = self.store.redis
        if self._messages is not None:
            self._broker = broker_redis(settings, self.store.redis)
        self.workers = WorkerDirectory(self.store.redis, self.store.keys, settings.registry_interval_s)
        #: Refuses new runs while Redis is nearly at its maxmemory (see ``shared/retention.py``).
        self.memory_guard = MemoryGuard(self.store.redis, settings)
        self._served: dict[str, AgentInfo] = {}
        #: The tenants' assistants (``producer/assistants.py``).
        self.assistants = Assistants(self)
        #: The tenants' schedules (``producer/schedules.py``).
        self.schedules = Schedules(self)
        self._served_at = -1e9

    @property
    def memory(self) -> Memory:
        """The long-term memory of runs without a tenant (``shared/memory.py``); a tenant's is
        :meth:`memory_for`."""
        return memory_of(
            self.store.redis, self.store.keys, None, load_embedding(self.settings.memory_embedding)
        )

    def memory_for(self, tenant: str) -> Memory:
        """The long-term memory of ``tenant`` (its runs' tools read and write it)."""
        check_name("tenant", tenant)
        embed = load_embedding(self.settings.memory_embedding)
        return memory_of(self.store.redis, self.store.keys, tenant, embed)

    @classmethod
    def from_env(cls, **overrides: Any) -> Client:
        return cls(Settings.from_env(**overrides))

    def submit(
        self,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        run_id: str | None = None,
        check_agent: bool = True,
        tenant: str | None = None,
        callback: Callback | dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        state: dict[str, Any] | None = None,
        namespace: str | None = None,
        link: PipelineLink | EvalLink | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
        allowed_models: tuple[str, ...] | None = None,
        release: Release | None = None,
        model_inherited: bool = False,
    ) -> RunHandle:
        """Create the run and send its start task; raises :class:`InvalidRequest` for a bad request.

        ``namespace`` sends every task of the run to that queue namespace's queues
        (``NAME.model``, ``NAME.tools``, ``NAME.callbacks``; see ``shared/queues.py``): only
        workers consuming them run it.

        With ``check_agent`` (the default) a run for an agent no live worker serves is refused,
        naming the agents on offer (:class:`UnknownAgent`); while no live worker is known at all
        (a Redis restart: the workers register again within moments) or those serving the agent
        are reconnecting, it raises :class:`NoLiveWorker` instead, to retry. Without
        ``check_agent`` the run is queued until a worker serves it.
        With ``idempotency_key``, submitting the same request again (a retry after a lost answer)
        returns the same run instead of starting a second one; the same key with another request
        raises :class:`RequestConflict`. Keys are per tenant and last as long as the run.

        ``thread_policy`` (``reject | enqueue | interrupt | rollback``; None: the agent's, by default
        ``enqueue``) says what the run does while another run of its thread has not ended
        (``docs/agents.md``, "Threads and a second message"); ``reject`` raises
        :class:`~shared.errors.ThreadBusy` naming the busy run, and creates nothing.
        ``assistant`` runs the agent as the tenant's assistant of that name configures it
        (``client.assistants``), pinned to its current version now (or to ``assistant_version``):
        updating the assistant later changes nothing of this run.

        ``allowed_models``: the models the tenant may name (``Tenants.models``; None: any). The
        run's ``model`` and the model of the assistant version it is pinned to must be among
        them, else :class:`~shared.tenants.ModelNotAllowed` and nothing is created.

        ``link`` is the runtime's own: a pipeline's child run or an eval's case run is created
        with it (and the runtime's callback task that reports it back); a producer's request
        never carries one, and its callback may name no reserved task (``shared/request.py``).
        ``model_inherited`` is the runtime's too: a retry's ``model`` that no one named
        (``RunHead.model_inherited``).

        ``release`` (standalone Redis only): a sorted set's member the create script removes in
        the step that creates the run, as the API gives up its hold of the run's place under its
        tenant's limits. The handle's ``created`` is the run as this call created it (the member
        is removed then); None when it found the run already there (the member is not removed).
        """
        new = RunRequest(
            agent,
            input,
            run_id=run_id,
            thread_id=thread_id,
            metadata=metadata,
            model=model,
            tenant=tenant,
            callback=callback,
            state=state,
            namespace=namespace,
            link=link,
            thread_policy=thread_policy,
            assistant=assistant,
            assistant_version=assistant_version,
            model_inherited=model_inherited,
        )
        return self.submit_request(
            new,
            check_agent=check_agent,
            idempotency_key=idempotency_key,
            allowed_models=allowed_models,
            release=release,
        )

    def submit_request(
        self,
        new: RunRequest,
        *,
        check_agent: bool = True,
        idempotency_key: str | None = None,
        allowed_models: tuple[str, ...] | None = None,
        release: Release | None = None,
    ) -> RunHandle:
        """:meth:`submit` of a request already gathered in a :class:`RunRequest`."""
        head, start, asked_version = self.plan_run(new, check_agent, idempotency_key, allowed_models)
        run_id = head.run_id
        if idempotency_key is not None and (archive := self.store.archive) is not None:
            archived = archive.load(run_id)  # the key's run ended and left Redis: still the same run
            if archived is not None:
                self._check_same_request(archived, _as_pinned(head, archived, asked_version), idempotency_key)
                return RunHandle(self, run_id)
        (created,) = self._create_in_thread([(head, start)], check_agent, release)
        if isinstance(created, WesichainError):
            raise created
        if created == "exists":
            if idempotency_key is None:
                raise InvalidRequest(f"run id {run_id!r} already exists")
            existing = self.store.load(run_id)
            if existing is None:
                raise RequestConflict(f"idempotency key {idempotency_key!r} was used for another request")
            self._check_same_request(existing, _as_pinned(head, existing, asked_version), idempotency_key)
            if existing.phase is not Phase.IDLE:
                return RunHandle(self, run_id)
            # Still waiting for its start: the first submit may have died before sending it.
        if created != "pushed":
            self.send_starts([start])
        return RunHandle(self, run_id, created=head if created != "exists" else None)

    def submit_many(
        self, requests: Sequence[RunRequest], *, check_agent: bool = True
    ) -> list[bool | WesichainError]:
        """Create several runs and send the starts of those created: in one round trip on a
        standalone Redis that is the broker too (each create script pushes its run's start), where
        :meth:`submit` takes one per run; else the creates in one and the starts in one more. For
        each request: True if its run was created (and its start sent), False if its id is taken
        (nothing written, nothing sent), or why it was refused (:class:`InvalidRequest`,
        :class:`StoreFull`); the others are created all the same. Any other error raises.

        For the runtime's own runs made many at a time with ids of their own (a pipeline's
        children, an eval's cases): no idempotency key.
        """
        outcomes: list[bool | WesichainError] = [False] * len(requests)
        new: list[tuple[int, RunHead, TaskSpec]] = []
        for i, request in enumerate(requests):
            try:
                head, start, _ = self.plan_run(request, check_agent, None)
            except InvalidRequest as exc:
                outcomes[i] = exc
                continue
            new.append((i, head, start))
        created = self._create_in_thread([(head, start) for _, head, start in new], check_agent)
        for (i, _, _), made in zip(new, created, strict=True):
            outcomes[i] = made if isinstance(made, WesichainError) else made != "exists"
        self.send_starts(
            [start for (_, _, start), made in zip(new, created, strict=True) if made == "created"]
        )
        return outcomes

    def plan_run(
        self,
        new: RunRequest,
        check_agent: bool,
        idempotency_key: str | None,
        allowed_models: tuple[str, ...] | None = None,
    ) -> tuple[RunHead, TaskSpec, int | None]:
        """The run a request makes (validated, pinned to its assistant's version), its start task,
        and the assistant version the request asked for; raises :class:`InvalidRequest`, and
        :class:`~shared.tenants.ModelNotAllowed` for a model outside ``allowed_models``.

        What creating the run decides, apart from the writes (:meth:`run_to_create` and
        :meth:`creation_outcome` are the rest), shared by :meth:`submit` and the API's submit on
        its event loop. It reads Redis only for an assistant's pin and for the worker registry
        when :meth:`serves_cached` is False."""
        fields = {
            field.name: value
            for field in dataclasses.fields(new)
            if field.name not in _NOT_REQUESTED and (value := getattr(new, field.name)) is not None
        }
        request = validate_request(fields, self.settings.limits, runtime_callback=new.link is not None)
        asked_version = request.assistant_version
        request, pinned_to = self.assistants.store.pin(request)
        check_models_allowed(
            request.tenant, allowed_models, request.model, pinned_to.config.model if pinned_to else None
        )
        run_id = new.run_id
        if idempotency_key is not None:
            run_id = idempotent_run_id(request.tenant, idempotency_key)
        run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex
        if check_agent:
            self._check_agent(request.agent, request.metadata, pinned_to)
        head = new_run(run_id, request, link=new.link, model_inherited=new.model_inherited)
        return head, start_task(run_id, namespace=request.namespace), asked_version

    def _create_in_thread(
        self, runs: Sequence[tuple[RunHead, TaskSpec]], check_agent: bool, release: Release | None = None
    ) -> list[Creation | WesichainError]:
        """Take each run's turn in its thread (if it has one), then create them (see
        :meth:`_create_many` for the answers and ``release``)."""
        turns: list[ThreadTurn | None] = []
        try:
            for head, _ in runs:
                turns.append(self._take_thread_turn(head, check_agent))
            created = self._create_many(runs, release)
        except Exception:
            for (head, _), turn in zip(runs, turns, strict=False):  # the turns taken so far
                if turn is not None and head.thread_id is not None:
                    self.store.hand_thread_on(head.tenant, head.thread_id, head.run_id)  # never created
            raise
        for (head, _), turn, made in zip(runs, turns, created, strict=True):
            if turn is None:
                continue
            if not isinstance(made, WesichainError):
                self._stop_runs(turn.ahead)
            elif head.thread_id is not None:
                self.store.hand_thread_on(head.tenant, head.thread_id, head.run_id)  # never created
        return created

    def _take_thread_turn(self, head: RunHead, check_agent: bool) -> ThreadTurn | None:
        """Admit a new run to its thread now, in submit order, under its thread policy: the
        request's, else the agent's as its live workers describe it. Raises :class:`ThreadBusy`
        (``reject``) before anything is written. None when the policy is not known here (no
        agent check): the run's start admits it, with the agent's policy, on the worker."""
        if head.thread_id is None:
            return None
        policy = head.thread_policy
        if policy is None and check_agent and head.agent in self._served:
            policy = self._served[head.agent].thread_policy
        if policy is None:
            return None
        turn = self.store.admit_to_thread(head.tenant, head.thread_id, head.run_id, policy)
        if turn.woken:
            woken = self.store.load(turn.woken)
            if woken is not None:
                self.send_starts([start_task(turn.woken, namespace=woken.namespace)])
        if turn.verdict == "busy":
            raise ThreadBusy(head.thread_id, turn.holder)
        return turn

    def _stop_runs(self, run_ids: tuple[str, ...]) -> None:
        """Ask the runs ahead in the thread to stop (``interrupt``, ``rollback``): each ends at its
        next safe boundary, or before it starts (the new run's start asks again, should this die)."""
        for run_id in run_ids:
            RunHandle(self, run_id).cancel()

    def send_starts(self, starts: Sequence[TaskSpec]) -> None:
        """Send new runs' start tasks. The runs are created, each start in its run's outbox:
        should the broker refuse them, the runs are still accepted, and the workers' sweeper sends
        the tasks once the broker takes messages again (``shared/unsent.py``). Raising here instead
        would have a caller retry, and start second runs beside the first."""
        try:
            self.send_run_tasks(starts)
        except PUBLISH_ERRORS as exc:
            for start in starts:
                mark_unsent(self.store, start, exc, delay_s=0)

    def send_run_task(self, task: TaskSpec) -> None:
        """Send one of a run's tasks, on its namespace's queue if it names one."""
        self.send_run_tasks([task])

    def send_run_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Send runs' tasks, each on its namespace's queue if it names one: in one publish when
        the messages are built here, or through a runtime's publisher that sends several at once."""
        if not tasks:
            return
        if self._messages is not None:
            publish_commands(self._broker, self._messages.build(tasks))
        elif isinstance(self.app, RuntimePublisher):
            self.app.send_tasks(tasks)
        else:
            for task in tasks:
                self.app.send_task(task.name, kwargs=task.arguments, task_id=task.task_id, queue=task.queue)

    def _create(self, head: RunHead, start: TaskSpec) -> Creation:
        """Write one new run as :meth:`_create_many` does; raises :class:`StoreFull`."""
        (created,) = self._create_many([(head, start)])
        if isinstance(created, WesichainError):
            raise created
        return created

    def _create_many(
        self, runs: Sequence[tuple[RunHead, TaskSpec]], release: Release | None = None
    ) -> list[Creation | WesichainError]:
        """Write new runs (IDLE, each with its start task in its outbox), in one round trip on a
        standalone Redis: for each, what creating it did (``exists``: its id is taken), or
        :class:`StoreFull` when Redis is (nearly) full. When the broker is the store's Redis, each
        create script pushes its run's start message too (``pushed``: no window between the two);
        ``created``: the caller sends the start. ``release`` (one run only): the hold on the run's
        place under its tenant's limits that its create gives up (``producer/api/limits.py``)."""
        if not runs:
            return []
        if release is not None and len(runs) != 1:
            raise ValueError("a release goes with the create of one run")
        if not self.settings.embedded:
            try:
                self.memory_guard.check()
            except StoreFull as exc:
                return [exc] * len(runs)
        replies = self.store.create_many([self.run_to_create(head, start, release) for head, start in runs])
        return [self.creation_outcome(reply) for reply in replies]

    @property
    def pushes_starts(self) -> bool:
        """Whether a run's create script pushes its start message too (the broker is the store's
        Redis): its creation is then one round trip, and nothing is sent after it."""
        return self._prepare is not None and self.settings.commit_publish

    def run_to_create(self, head: RunHead, start: TaskSpec, release: Release | None = None) -> NewRun:
        """A planned run (:meth:`plan_run`) as its create script writes it: with the broker
        commands that push its start when :attr:`pushes_starts`, and ``release``."""
        prepare = self._prepare if self.settings.commit_publish else None
        return NewRun(head, [start], prepare([start]) if prepare is not None else (), release)

    def creation_outcome(self, reply: Creation | Exception) -> Creation | StoreFull:
        """What a create did, from its reply (``RunStore.create_many``'s, or ``creation_of`` of the
        script's): an out-of-memory reply is :class:`StoreFull` (:meth:`store_full`, which reads
        how full Redis is: a caller on an event loop builds it on a thread); any other error
        raises."""
        if isinstance(reply, redis.exceptions.OutOfMemoryError):
            return self.store_full()
        if isinstance(reply, Exception):
            raise reply
        return reply

    def store_full(self) -> StoreFull:
        """The refusal of a run Redis had no memory to create (reads how full it is)."""
        return StoreFull(full_message(self.memory_guard.state(), self.settings.submit_max_memory))

    def children(self, run_id: str) -> list[RunHead]:
        """The run's subagent runs (each names it in ``parent``), in the order its steps started
        them: the dispatches its events record, one per child (a redelivered one names the same)."""
        if self.store.load(run_id) is None:
            raise RunNotFound(f"no run {run_id!r}")
        found: dict[str, RunHead] = {}
        for _, event in read_all_events(self.store, run_id):
            child_id = event.child_run_id if isinstance(event, ToolDispatched) else None
            if child_id is not None and child_id not in found and (child := self.store.load(child_id)):
                found[child_id] = child
        return list(found.values())

    def checkpoints(self, run_id: str) -> list[Checkpoint]:
        """Every committed head of a run, oldest first: version, step, phase, time, worker."""
        heads = self.store.checkpoints(run_id)
        if not heads:
            raise RunNotFound(f"no run {run_id!r}")
        return [Checkpoint.of(h) for h in heads]

    def retry(
        self,
        run: RunHead | str,
        *,
        idempotency_key: str | None = None,
        check_agent: bool = True,
        allowed_models: tuple[str, ...] | None = None,
    ) -> RunHandle:
        """A fresh run with the same request as ``run`` (a run id, or its head): its agent, input,
        thread, metadata, callback, namespace, thread policy and assistant version, and the model
        override and starting state of its first checkpoint. The original is untouched; unlike
        :meth:`fork`, nothing of its conversation is kept. ``idempotency_key`` and
        ``allowed_models`` as for :meth:`submit`: a model allowed when the run was created but
        taken back since is refused.
        """
        source = self.store.load(run) if isinstance(run, str) else run
        if source is None:
            raise RunNotFound(f"no run {run!r}")
        created = self.store.checkpoints(source.run_id, 0, 0)
        first = created[0] if created else source
        inherited = bool(first.model) and _inherited_model(source)
        if allowed_models is not None and inherited:
            # A fork's model is the one its original ran with (no one named it): the retry keeps
            # it, and records so, for a retry or a fork of the retry to keep it too.
            allowed_models = (*allowed_models, first.model)
        return self.submit(
            source.agent,
            source.input,
            thread_id=source.thread_id,
            metadata=source.metadata or None,
            model=first.model or None,
            tenant=source.tenant,
            callback=source.callback,
            idempotency_key=idempotency_key,
            state=first.state,
            namespace=source.namespace,
            thread_policy=source.thread_policy,
            assistant=source.assistant,
            assistant_version=source.assistant_version,
            check_agent=check_agent,
            allowed_models=allowed_models,
            model_inherited=inherited,
        )

    def fork(
        self,
        run_id: str,
        at_version: int,
        *,
        input: str | None = None,
        model: str | None = None,
        new_run_id: str | None = None,
        check_agent: bool = True,
        allowed_models: tuple[str, ...] | None = None,
    ) -> RunHandle:
        """Start a new run from checkpoint ``at_version`` of run ``run_id``; the original is untouched.

        The new run thinks again from the conversation as it was at that version (see
        ``shared/timetravel.py``): ``input`` replaces its last user message, ``model`` is another
        ``PROVIDER:MODEL`` (default: the original's at that checkpoint). It records its origin
        (``RunHead.fork``) and gets the agent's whole step budget. A fork of a handed-off run goes
        on under the agent in charge at that checkpoint, with its handoff records.
        ``allowed_models`` as for :meth:`submit`: the fork's ``model`` and the models the original's
        request named (its own, its assistant version's) must be among them.
        """
        source = self.store.load(run_id)
        if source is None:
            raise RunNotFound(f"no run {run_id!r}")
        heads = self.store.checkpoints(run_id)
        origin = checkpoint_of(heads, at_version)
        if origin is None:
            versions = f"1..{heads[-1].version}" if heads else "none"
            raise InvalidRequest(f"run {run_id!r} has no checkpoint v{at_version} (versions: {versions})")
        fields: dict[str, Any] = {"agent": source.agent, "input": source.input if input is None else input}
        if source.metadata:
            fields["metadata"] = source.metadata
        if chosen := model or self._fork_model(run_id, heads, origin, input) or source.model:
            fields["model"] = chosen
        request = validate_request(fields, self.settings.limits)
        if allowed_models is not None and source.tenant is not None:
            # The models the original's request named: its override (its first checkpoint's: the
            # start fills in the agent's) and its assistant version's; the agents' own are not
            # the tenant's choice (a fork goes on under the agent in charge at its checkpoint).
            created = heads[0] if heads else source
            assistant = (
                self.assistants.store.get(source.tenant, source.assistant, source.assistant_version)
                if source.assistant is not None
                else None
            )
            check_models_allowed(
                source.tenant,
                allowed_models,
                model,
                None if _inherited_model(source) else created.model,
                assistant.config.model if assistant is not None else None,
            )
        if check_agent:
            self._check_agent(request.agent, request.metadata)
        new_id = check_run_id(new_run_id) if new_run_id is not None else uuid.uuid4().hex
        head = RunHead.new_idle(
            new_id,
            request.agent,
            request.input,
            metadata=request.metadata,
            model=request.model,
            tenant=source.tenant,
            fork=ForkOrigin(
                run_id=run_id,
                version=at_version,
                edited_input=input is not None,
                model_named=model is not None,
            ),
            model_inherited=model is None and bool(request.model),
            namespace=source.namespace,
            assistant=source.assistant,
            assistant_version=source.assistant_version,
        )
        start = start_task(new_id, namespace=source.namespace)
        creation = self._create(head, start)
        if creation == "exists":
            raise InvalidRequest(f"run id {new_id!r} already exists")
        if creation != "pushed":
            self.send_starts([start])
        return RunHandle(self, new_id)

    def _fork_model(
        self, run_id: str, heads: list[RunHead], origin: RunHead, input: str | None
    ) -> str | None:
        """The model a fork runs by default: the one of the agent it goes on under. That is the
        checkpoint's when the fork keeps its handoffs (the agent in charge there has its own), else
        the one the original started with (``shared/timetravel.py``)."""
        kept = origin.handoffs
        if kept and input is not None:
            # An edited input cuts the conversation at its last user message, maybe before them.
            stored = self.store.load_messages(run_id, 0, origin.message_count - 1)
            kept = forked_handoffs(origin, len(fork_conversation(fork_conversation(stored, None), input)))
        if kept:
            return origin.model
        started = next((h for h in heads if h.phase is not Phase.IDLE), None)
        return started.model if started is not None else origin.model

    def _check_same_request(self, existing: RunHead, head: RunHead, idempotency_key: str) -> None:
        """The same key must carry the same request, compared as JSON values (object keys in any
        order), the model override and starting state included: those are read from the run's
        first checkpoint, since the start phase fills them in from the agent."""
        first = existing
        if existing.version != 1:
            created = self.store.checkpoints(existing.run_id, 0, 0)
            first = created[0] if created else existing
        if _canonical_request(first) != _canonical_request(head):
            raise RequestConflict(f"idempotency key {idempotency_key!r} was used for another request")

    def list_runs(
        self,
        *,
        tenant: str | None = None,
        agent: str | None = None,
        status: str | None = None,
        thread_id: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """A tenant's runs (``None``: runs without a tenant), newest first, a page at a time."""
        if not 1 <= limit <= 500:
            raise InvalidRequest(f"limit must be in 1..500, got {limit}")
        return self.store.list_runs(
            tenant, agent=agent, status=status, thread_id=thread_id, since=since, cursor=cursor, limit=limit
        )

    # -- search and bulk jobs (shared/search.py, shared/bulk.py) -------------------------------

    def search(
        self,
        query: SearchQuery | None = None,
        *,
        tenant: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
        **filters: Any,
    ) -> RunPage:
        """A tenant's runs that match ``query`` (or the filters of :class:`SearchQuery` given as
        keywords: ``agent``, ``version``, ``status``, ``error_kind``, ``thread_id``, ``since``,
        ``until``, ``metadata``), newest first, live and archived, a page at a time.

        Raises :class:`~shared.search.UndeclaredSearchKey` (an :class:`InvalidRequest`) for a
        metadata key not declared in ``WESICHAIN_SEARCH_ATTRIBUTES``.
        """
        if not 1 <= limit <= 500:
            raise InvalidRequest(f"limit must be in 1..500, got {limit}")
        query = _search_query(query, filters)
        query.check_declared(self.settings.search_attributes)
        return self.store.search_runs(tenant, query, cursor=cursor, limit=limit)

    def bulk(
        self,
        action: str,
        query: SearchQuery | None = None,
        *,
        tenant: str | None = None,
        rate_per_s: float | None = None,
        **filters: Any,
    ) -> BulkJob:
        """Start a bulk job: ``action`` (``retry``, ``fork`` or ``cancel``) on every run of
        ``tenant`` the search finds, created before now, at ``rate_per_s`` runs a second at most.
        The pool works it (``worker/bulk.py``); follow it with :meth:`bulk_job`."""
        query = _search_query(query, filters)
        query.check_declared(self.settings.search_attributes)
        jobs = BulkStore(self.store.redis, self.store.keys)
        job = jobs.create(tenant, action, query, rate_per_s)
        try:
            self.send_run_task(bulk_task(tenant, job.job_id))
        except PUBLISH_ERRORS:
            pass  # the job is running: the workers' sweeper sends its task once the broker is back
        return job

    def bulk_job(self, job_id: str, *, tenant: str | None = None) -> BulkJob:
        """A bulk job of ``tenant`` and how far it got; raises :class:`BulkJobNotFound`."""
        job = BulkStore(self.store.redis, self.store.keys).load(tenant, job_id)
        if job is None:
            raise BulkJobNotFound(f"no bulk job {job_id[:80]!r}")
        return job

    def bulk_jobs(self, *, tenant: str | None = None, limit: int = 50) -> list[BulkJob]:
        """The tenant's bulk jobs, newest first."""
        return BulkStore(self.store.redis, self.store.keys).list_jobs(tenant, min(max(limit, 1), 200))

    def bulk_outcomes(self, job_id: str, *, tenant: str | None = None) -> dict[str, BulkOutcome]:
        """What a bulk job did to each run it got to (run id -> outcome)."""
        self.bulk_job(job_id, tenant=tenant)
        return BulkStore(self.store.redis, self.store.keys).outcomes(tenant, job_id)

    def cancel_bulk(self, job_id: str, *, tenant: str | None = None) -> BulkJob:
        """Stop a running bulk job: it acts on no further run (the runs it made go on)."""
        self.bulk_job(job_id, tenant=tenant)
        BulkStore(self.store.redis, self.store.keys).end(tenant, job_id, "cancelled")
        return self.bulk_job(job_id, tenant=tenant)

    def serves_cached(self, agent: str) -> bool:
        """Whether :meth:`served` answers for ``agent`` from what it read of the registry, without
        reading it again (read within ``registry_interval_s``, and ``agent`` was served then)."""
        return self.registry_fresh() and agent in self._served

    def registry_fresh(self, for_s: float = 0.0) -> bool:
        """Whether what :meth:`served` read of the registry is fresh (for ``for_s`` seconds more)."""
        return time.monotonic() - self._served_at <= self.settings.registry_interval_s - for_s

    def note_live_workers(self, live: list[LiveWorker], read_at: float) -> None:
        """What :meth:`served` answers from, as read of the registry by another (a caller that
        keeps the live workers itself, at ``read_at`` on ``time.monotonic``)."""
        self._served, self._served_at = agents_served(live), read_at

    def served(self, agent: str) -> AgentInfo:
        """What the live workers advertise of ``agent``; :class:`UnknownAgent` or
        :class:`NoLiveWorker` when none serves it now."""
        # The registry changes slowly: a bulk submitter asks it at most once per registry interval,
        # and again at once when an agent is missing (it may have just appeared).
        now = time.monotonic()
        if now - self._served_at > self.settings.registry_interval_s or agent not in self._served:
            self._served = self.workers.agents()
            self._served_at = now
        served = self._served
        if agent not in served:
            self._refuse_unserved(agent, served)
        return served[agent]

    def _check_agent(
        self, agent: str, metadata: dict[str, Any], assistant: AssistantVersion | None = None
    ) -> None:
        variables = set(self.served(agent).variables)
        if assistant is not None:
            # The assistant's values fill variables; a system prompt of its own needs its own.
            config = assistant.config
            if config.system_prompt is not None:
                variables = set(Prompt(config.system_prompt).variables)
            variables -= set(config.template_values or {})
        missing = missing_variables(frozenset(variables), metadata)
        if missing:
            raise InvalidRequest(
                f"agent {agent!r} fills its prompt from metadata {', '.join(map(repr, missing))}:"
                " the request has none"
            )

    def _refuse_unserved(self, agent: str, served: dict[str, AgentInfo]) -> NoReturn:
        """Why no consuming worker serves ``agent`` now: a transient gap, or a name nothing serves."""
        live = self.workers.live()
        listed = {a.name for w in live for a in w.record.agents}
        if not live or agent in listed:
            # No worker known at all (Redis just came back and the workers have not registered
            # again yet, or none is up), or the ones that serve it cannot consume right now
            # (reconnecting): the same request succeeds once they are back, so the caller retries.
            raise NoLiveWorker(
                f"no live worker is known right now to serve agent {agent!r}"
                f" ({'none is registered' if not live else 'its workers are not consuming'});"
                " retry shortly"
            )
        known = ", ".join(sorted(served)) or "none consuming now"
        raise UnknownAgent(
            f"no live worker serves agent {agent!r} (agents served now: {known}); submit with"
            " check_agent=False (--no-check) to queue the run anyway"
        )

    def handle(self, run_id: str) -> RunHandle:
        return RunHandle(self, run_id)

    def submit_pipeline(
        self,
        name: str,
        input: str,
        *,
        pipeline_id: str | None = None,
        tenant: str | None = None,
        check: bool = True,
        namespace: str | None = None,
    ) -> PipelineHandle:
        """Start a pipeline run of the agents module's pipeline ``name`` (see ``producer/pipelines.py``);
        ``namespace`` sends its child runs and its own tasks to that queue namespace's queues."""
        from producer.pipelines import submit_pipeline

        return submit_pipeline(
            self, name, input, pipeline_id=pipeline_id, tenant=tenant, check=check, namespace=namespace
        )

    def pipeline(self, pipeline_id: str, *, tenant: str | None = None) -> PipelineHandle:
        """The pipeline run ``pipeline_id`` of ``tenant`` (None: a run without a tenant)."""
        from producer.pipelines import PipelineHandle

        return PipelineHandle(self, stored_pipeline_id(tenant, pipeline_id))

    def list_pipelines(
        self,
        *,
        tenant: str | None = None,
        name: str | None = None,
        status: str | None = None,
        since: float | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> PipelinePage:
        """A tenant's pipeline runs (``None``: those without a tenant), newest first, a page at a time."""
        if not 1 <= limit <= 500:
            raise InvalidRequest(f"limit must be in 1..500, got {limit}")
        store = PipelineStore(self.store.redis, self.store.keys, self.settings.retention_s)
        return store.list_pipelines(tenant, name=name, status=status, since=since, cursor=cursor, limit=limit)

    def versions(self, tenant: str | None | Literal["*"] = "*") -> list[VersionLoad]:
        """Every live agent version: the workers serving it and the live runs pinned to it (of
        ``tenant`` only, unless ``"*"``): see ``shared/versions.py``."""
        return version_loads(PinnedRuns(self.store), self.workers.live(), tenant)

    def pool(self, tenant: str | None = None, *, operator: bool = True, minutes: int = 60) -> PoolView:
        """The pool as the operator view shows it (``shared/pool.py``): with ``operator``, every
        live worker and queue and pool-wide counts; without, what ``tenant``'s key may see.
        ``minutes``: how much of the runs-ended-per-minute series (at most a day)."""
        return pool_view(self.store, self.settings, self.workers.live(), tenant, operator, minutes)

    def drain(
        self,
        worker: str | None = None,
        *,
        agent: str | None = None,
        version: str | None = None,
        cancel: bool = False,
    ) -> str:
        """Ask a worker (by node name), or every worker of ``agent`` ``version``, to drain: it takes
        no new runs and stops once no queued or running run is pinned to its versions (``cancel``:
        take the request back; a worker already draining goes on). Returns what was asked."""
        target = drain_target(worker, agent, version)
        if cancel:
            self.store.redis.hdel(self.store.keys.drains(), target)
        else:
            self.store.redis.hset(self.store.keys.drains(), target, f"{time.time():.3f}")
        return target

    def close(self) -> None:
        if self._messages is not None:
            self._messages.close()
        self.store.close_archive()
        self.store.redis.close()
        if self._broker is not self.store.redis:
            self._broker.close()


def _inherited_model(run: RunHead) -> bool:
    """Whether the run's model is an inheritance (a fork's original's, or a retry's of such a
    run), not a model anyone named: a retry or a fork of it may keep it whatever models its tenant
    may name. (A fork created before ``RunHead.model_inherited`` says so by its origin alone.)"""
    return run.model_inherited or (run.fork is not None and not run.fork.model_named)


class RunHandle:
    """One run: its status, its events, and the cancel and approval verbs."""

    def __init__(self, client: Client, run_id: str, *, created: RunHead | None = None) -> None:
        self.client = client
        self.run_id = run_id
        #: The run as the submit that returned this handle created it (None: another handle, or a
        #: submit that found the run already there).
        self.created = created

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def status(self) -> RunHead:
        head = self.client.store.load(self.run_id)
        if head is None:
            raise RunNotFound(f"no run {self.run_id!r}")
        return head

    def events(
        self,
        *,
        follow: bool = True,
        after: str = "0-0",
        idle_timeout: float | None = None,
        kinds: Collection[str] | None = None,
    ) -> Iterator[Event]:
        """Every event of the run, in order; with ``follow``, live until the run's end event.

        Each event carries its ``stream_id``: pass the last one seen as ``after`` to resume.
        ``idle_timeout`` ends following when nothing arrived for that long. ``kinds``: only events
        of these kinds (e.g. ``{"CustomEvent"}``), and the run's end event.
        """
        if kinds is not None:
            wanted = set(kinds) | set(END_EVENTS)
            yield from (
                e
                for e in self.events(follow=follow, after=after, idle_timeout=idle_timeout)
                if e.kind in wanted
            )
            return
        store = self.client.store
        if follow:
            yield from (event for _, event in follow_events(store, self.run_id, after, idle_timeout))
            return
        for _, event in read_all_events(store, self.run_id, after):
            yield event
            if event.kind in END_EVENTS:
                return

    def timeline(self) -> Timeline:
        """Where the run's time went: each phase and tool call on its worker, queue waits, takeovers."""
        head = self.status()
        events = list(self.events(follow=False))
        store = self.client.store
        built = build_timeline(head, store.checkpoints(self.run_id), events)
        return with_deaths(built, Obituaries(store.redis, store.keys), time.time())

    def wait(self, timeout: float = 60.0) -> RunHead:
        """Block until the run is terminal; raise :class:`RunTimeout` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            head = self.status()
            if head.terminal:
                return head
            if time.monotonic() >= deadline:
                raise RunTimeout(f"run {self.run_id} still {head.phase.value} after {timeout}s")
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)

    def callback(self) -> CallbackState | None:
        """How the run's completion callback went so far (None: it has none, or it has not ended)."""
        raw = self.client.store.callback_state(self.run_id)
        return CallbackState.model_validate_json(raw) if raw is not None else None

    def why_waiting(self) -> str | None:
        """Why the run is not moving, when something can be said: no live worker consumes the queue
        its next task waits in (a pinned run: its version's), see ``shared/versions.py``."""
        head = self.status()
        decided = (
            head.phase is Phase.AWAITING_APPROVAL and self.client.store.load_decision(head.run_id) is not None
        )
        wait = self.client.store.thread_wait(head.run_id) if head.phase is Phase.IDLE else None
        previous = str(wait["waiting_for"]) if wait is not None else None
        return waiting_for(head, self.client.workers.live(), decided, previous)

    def cancel(self) -> Phase | None:
        """Ask the run to stop; it ends INTERRUPTED at its next phase boundary (or cooperative check).

        A run parked waiting for its thread is unparked in the same step and its start sent, so it
        ends at once, without running, and hands the thread on if it held it."""
        phase, woken = self.client.store.cancel_unparking(self.run_id)
        if woken:
            head = self.status()
            self.client.send_starts([start_task(self.run_id, namespace=head.namespace)])
        elif phase is Phase.AWAITING_APPROVAL:
            # No worker holds a parked run: wake one to commit the interruption.
            self._send_decide(self.status())
        return phase

    def approve(self, note: str = "", *, always: bool = False, by: str = "") -> None:
        """Approve the tool calls a parked run waits on (or accept an unknown tool outcome).

        ``always``: the tools of these calls need no approval again for the rest of the run;
        ``note``: the model reads it with their results; ``by``: who approved (in the run's events).
        """
        self.decide(Decision(approve=True, note=note, always=always, by=by))

    def deny(self, note: str = "", *, by: str = "") -> None:
        """Deny them: the model is told and thinks again (an unknown outcome: the run fails)."""
        self.decide(Decision(approve=False, note=note, by=by))

    def decide(self, decision: Decision) -> None:
        head = self.status()
        if head.phase is not Phase.AWAITING_APPROVAL:
            raise ValueError(f"run {self.run_id} is {head.phase.value}, not awaiting approval")
        if not self.client.store.submit_decision(self.run_id, head.version, decision):
            raise ValueError(f"run {self.run_id} was already decided or has moved on")
        self._send_decide(head)

    def _send_decide(self, head: RunHead) -> None:
        self.client.send_run_task(decide_task(head))

    # -- signals: messages and state updates into the running run (shared/signals.py) --------

    def send_message(self, text: str, *, key: str | None = None, by: str = "") -> SignalView:
        """Send a user message into the run: stored at once, seen by the run's next think.

        ``key`` makes the send idempotent: sending again under it answers the same signal (the
        same key with another text raises :class:`RequestConflict`). A run parked for approval
        whose agent has ``wake_on_message`` is woken (its calls denied, the model told the message).
        Raises :class:`SignalRefused` (the run ended, or took all the signals it may),
        :class:`InvalidRequest` (a bad message), :class:`RunNotFound`.
        """
        return self._send_signal("message", text, key, by)

    def update(
        self, patch: dict[str, Any], *, key: str | None = None, wait: float | None = 30.0, by: str = ""
    ) -> SignalView:
        """Send a state update: ``patch``'s fields are merged over the run's state at its next
        think, validated against its agent's ``state_type``, and committed with it (or rejected).

        Waits up to ``wait`` seconds (None: not at all) for the outcome: ``accepted``, or
        ``rejected`` with the validation error in ``error``; still ``pending`` if the run did not
        think in that time. ``key`` as for :meth:`send_message`.
        """
        sent = self._send_signal("update", patch, key, by)
        if wait is None or sent.status != "pending":
            return sent
        return self.signal(sent.id, wait=wait)

    def signal(self, signal_id: int, *, wait: float = 0.0) -> SignalView:
        """What became of one signal of the run; ``wait``: seconds to wait while it is pending."""
        deadline = time.monotonic() + max(wait, 0.0)
        delay = 0.005
        while True:
            view = signal_view(self.client.store, self.run_id, signal_id)
            if view is None:
                raise RunNotFound(f"no signal {signal_id} in run {self.run_id!r}")
            if view.status != "pending" or time.monotonic() >= deadline:
                return view
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.1)

    def _send_signal(self, kind: SignalKind, body: Any, key: str | None, by: str) -> SignalView:
        signal = new_signal(
            kind,
            body,
            key=key,
            by=by,
            at=time.time(),
            max_message_chars=self.client.settings.limits.max_message_chars,
        )
        taken = self.client.store.send_signal(self.run_id, signal)
        match taken.status:
            case "missing":
                raise RunNotFound(f"no run {self.run_id!r}")
            case "conflict":
                raise RequestConflict(f"key {key!r} was used for another signal (#{taken.seq}) of this run")
            case "ended":
                raise SignalRefused(
                    f"run {self.run_id} has ended ({taken.phase}); it takes no signals", "run_ended"
                )
            case "full":
                raise SignalRefused(
                    f"run {self.run_id} has taken as many signals as it may ({taken.limit})", "inbox_full"
                )
        if kind == "message" and taken.phase is Phase.AWAITING_APPROVAL:
            # No worker holds a parked run: wake one to see whether the message wakes the run (its
            # agent decides). A retry under the same key sends it again, should this send be lost.
            head = self.status()
            if head.phase is Phase.AWAITING_APPROVAL and head.approval is not None:
                if head.approval.kind == "tool_calls":
                    self._send_decide(head)
        view = signal_view(self.client.store, self.run_id, taken.seq)
        if view is None:  # the run expired this very moment
            raise RunNotFound(f"no run {self.run_id!r}")
        return view.model_copy(update={"duplicate": taken.status == "duplicate"})


class SignalRefused(WesichainError):
    """The run takes no more signals: it has ended (``run_ended``), or it took as many as a run
    may (``inbox_full``)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def signal_view(store: RunStore, run_id: str, signal_id: int) -> SignalView | None:
    """One signal of a run as producers see it (None: no such run or signal)."""
    found = store.load_signal(run_id, signal_id)
    head = store.load(run_id) if found is not None else None
    if found is None or head is None:
        return None
    return signal_status(found[0], head, found[1])
