"""The persisted state of a run.

A run is stored as a small *head* (this model) plus an append-only message list. The head is
what a transition reads and rewrites; it stays small and does not grow with the run's length
(``message_count`` points into the list instead of holding it).

``version`` is the fencing token: every commit increments it with compare-and-set, and every task
message names the version it was enqueued for, so a duplicate or late delivery can tell that the
run has moved on.
"""

from __future__ import annotations

import enum
import time
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.errors import RunErrorInfo
from shared.llm.base import Usage
from shared.messages import ToolCall

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "DEFAULT_THREAD_POLICY",
    "THREAD_POLICIES",
    "ThreadPolicy",
    "Approval",
    "Callback",
    "CallbackState",
    "ChildRun",
    "Decision",
    "ForkOrigin",
    "EvalLink",
    "HandoffRecord",
    "ParentLink",
    "PipelineLink",
    "RunLink",
    "Phase",
    "PhaseRun",
    "REQUEST_FIELDS",
    "RUN_STATUSES",
    "RunHead",
    "RunStatus",
    "TERMINAL_PHASES",
    "Summary",
    "TaskSpec",
    "MemoryWrite",
    "ToolResult",
    "status_of",
]


class Phase(enum.StrEnum):
    """Where a run is in its life; the terminal ones are COMPLETED, FAILED and INTERRUPTED."""

    IDLE = "idle"
    THINKING = "thinking"
    ACTING = "acting"
    OBSERVING = "observing"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({Phase.COMPLETED, Phase.FAILED, Phase.INTERRUPTED})

RunStatus = Literal["queued", "running", "awaiting_approval", "completed", "failed", "interrupted"]
RUN_STATUSES: tuple[RunStatus, ...] = (
    "queued",
    "running",
    "awaiting_approval",
    "completed",
    "failed",
    "interrupted",
)


def status_of(phase: Phase) -> RunStatus:
    """A run's status as listings and the API show it: its phase, with the working ones as one."""
    if phase is Phase.IDLE:
        return "queued"
    if phase in (Phase.THINKING, Phase.ACTING, Phase.OBSERVING):
        return "running"
    return phase.value  # type: ignore[return-value]


class Callback(BaseModel):
    """How a service learns that a run ended: a webhook, or a Celery task sent by name.

    Exactly one of ``url`` (an HTTP(S) endpoint that gets a signed POST) and ``task`` (a task name,
    sent with the outcome as its only argument, on ``queue``) is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(default=None, max_length=2000, description="A webhook URL (http or https).")
    task: str | None = Field(default=None, max_length=200, description="A Celery task name to send.")
    queue: str | None = Field(default=None, max_length=200, description="The queue to send the task on.")

    @model_validator(mode="after")
    def _one_of(self) -> Callback:
        if (self.url is None) == (self.task is None):
            raise ValueError("a callback names exactly one of url and task")
        if self.url is not None and urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"a callback url must be http or https, got {self.url[:80]!r}")
        if self.queue is not None and self.task is None:
            raise ValueError("a callback queue goes with a task")
        return self


class TaskSpec(BaseModel):
    """One entry of a commit's outbox: a task to publish once the commit is durable."""

    name: str
    task_id: str
    arguments: dict[str, Any]
    #: Seconds to wait before the task may run (a model retry's backoff); 0 = now.
    countdown: float = 0.0
    #: Hard time limit of the task (a tool's timeout plus grace): its process is killed past it.
    time_limit_s: float | None = None
    #: Positional arguments (a Celery callback's outcome); phase tasks use ``arguments`` only.
    args: list[Any] = Field(default_factory=list)
    #: The queue to send it on, when not the one the routes give its name.
    queue: str | None = None


class CallbackState(BaseModel):
    """How a run's completion callback went, attempt by attempt (kept on the run)."""

    #: ``pending``, ``delivered`` or ``gave_up``.
    status: str = "pending"
    attempts: int = 0
    last_error: str | None = None
    last_status_code: int | None = None
    delivered_at: float | None = None
    next_attempt_at: float | None = None


class MemoryWrite(BaseModel):
    """One long-term memory put or delete of a tool call (``ctx.memory``), carried in its result
    until it is applied to the tenant's memory, once per ``write_id`` (``shared/memory.py``)."""

    op: Literal["put", "delete"]
    namespace: list[str]
    key: str
    value: dict[str, Any] | None = None
    ttl_s: float | None = None
    #: ``run:step:call:n``: applied once, however often the call's result is applied.
    write_id: str


class ToolResult(BaseModel):
    """The recorded outcome of one tool call, written once per (run, step, call_id)."""

    call_id: str
    name: str
    ok: bool
    output: str
    error: RunErrorInfo | None = None
    duration_s: float = 0.0
    #: The changes the call made to the run's state (``ToolContext.update_state``), applied by the
    #: observe phase in call order; None when it changed nothing.
    state_update: dict[str, Any] | None = None
    #: The call's writes to the tenant's long-term memory (``ToolContext.memory``), applied once
    #: the result is recorded; None when it wrote nothing.
    memory_writes: list[MemoryWrite] | None = None


class ChildRun(BaseModel):
    """A subagent call's child run, as its parent's park names it (``shared/subagents.py``)."""

    call_id: str
    run_id: str
    agent: str
    input: str


class HandoffRecord(BaseModel):
    """One handoff of a run: the agent that handed the conversation over, the one that took it
    (and the version it runs at), the step and the transfer call (``shared/handoffs.py``)."""

    model_config = ConfigDict(frozen=True)

    from_agent: str
    to_agent: str
    to_version: str
    #: The step whose reply asked for it (the target's first step is the next one).
    step: int
    call_id: str
    #: Where the target's system prompt is in the stored conversation: its conversation starts there.
    at: int
    #: "kept": the target sees the conversation as it was; "filtered": the handoff's input filter's
    #: result, stored after the system prompt.
    history: Literal["kept", "filtered"] = "kept"


class ParentLink(BaseModel):
    """The run (and its call) a child run answers to."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    step: int
    call_id: str
    #: 1 for a child of a top-level run, 2 for a grandchild...
    depth: int = 1


class PipelineLink(BaseModel):
    """The pipeline run, step, item and attempt a child run was started for.

    Like :class:`ParentLink` and :class:`EvalLink`, only the runtime sets it, when it creates the
    run; no producer can (it is not a field of :class:`~shared.request.RunRequest`). What a run
    reports back to a pipeline is decided by this stored link, never by the run's metadata.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["pipeline"] = "pipeline"
    pipeline_id: str
    seq: int
    item: int
    attempt: int


class EvalLink(BaseModel):
    """The eval and case item (``Item``'s text form) a case run was started for; runtime-only,
    as :class:`PipelineLink`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["eval"] = "eval"
    eval_id: str
    item: str


#: What the runtime started a run for, besides a parent's subagent call (``ParentLink``).
RunLink = Annotated[PipelineLink | EvalLink, Field(discriminator="kind")]


class Summary(BaseModel):
    """The model-written summary of a run's oldest messages, committed once on the run."""

    #: How many messages of the stored conversation, after the system prompt, it stands for.
    upto: int
    text: str


class Approval(BaseModel):
    """Why a run is parked in AWAITING_APPROVAL, and for which calls."""

    #: "tool_calls": the calls need a human yes/no before they run.
    #: "unknown_outcome": a non-retry-safe call's worker died mid-call; a human says whether to go on.
    #: "children": the calls are subagents' runs; the run goes on when they have all ended.
    kind: Literal["tool_calls", "unknown_outcome", "children"]
    call_ids: list[str]
    reason: str
    #: The child runs of a "children" park, one per call.
    children: list[ChildRun] = Field(default_factory=list)


class Decision(BaseModel):
    """A human's answer to an :class:`Approval` (stored on the run, never in task arguments)."""

    approve: bool
    note: str = Field(default="", max_length=2000)
    #: With ``approve``: the tools of these calls need no approval again for the rest of the run.
    always: bool = False
    #: Who decided: the API key's tenant and id over HTTP, the CLI's ``--by`` or the OS user.
    by: str = Field(default="", max_length=200)


#: The fields of a head that a producer sets when it creates the run and that never change: they
#: are stored once (the run's ``request``), not copied into every commit and checkpoint.
REQUEST_FIELDS = frozenset(
    {
        "agent",
        "input",
        "thread_id",
        "metadata",
        "created_at",
        "tenant",
        "callback",
        "fork",
        "parent",
        "link",
        "namespace",
        "thread_policy",
        "assistant",
        "assistant_version",
    }
)

#: What a run does when another run of its thread has not ended (``docs/agents.md``, "Threads and
#: a second message"): be refused, wait its turn, interrupt it, or cancel it and roll its messages
#: out of the thread.
ThreadPolicy = Literal["reject", "enqueue", "interrupt", "rollback"]
THREAD_POLICIES: tuple[ThreadPolicy, ...] = ("reject", "enqueue", "interrupt", "rollback")
#: The policy of an agent that names none.
DEFAULT_THREAD_POLICY: ThreadPolicy = "enqueue"


class ForkOrigin(BaseModel):
    """The checkpoint a forked run started from (``Client.fork``)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    version: int
    #: The fork's input replaces the last user message of the original's conversation.
    edited_input: bool = False
    #: Its model was named by whoever forked it; else it is the one the original ran with at that
    #: checkpoint (recorded so the fork runs it too), which is not the tenant's choice.
    model_named: bool = False


class PhaseRun(BaseModel):
    """Which delivery of a phase committed a version: who ran it and when it claimed the phase.

    With the head's ``updated_at`` (the commit) it is one bar of the run's timeline, and the gap
    from the previous version's commit to ``claimed_at`` is the time the phase waited in its queue.
    Times are the worker's clock (the same clock as ``updated_at``).
    """

    phase: Phase
    host: str
    pid: int
    claimed_at: float
    #: Claims of this phase at this version, this one included (above 1: an earlier delivery died).
    attempt: int = 1


class RunHead(BaseModel):
    """The state of a run a transition reads and rewrites (the conversation is stored apart).

    ``epoch`` is not part of a committed head: it belongs to the recovery protocol (the sweeper
    bumps it when it hands a phase on) and is read from the run's hash with the head.
    """

    run_id: str
    agent: str
    #: Filled in by the start phase from the agent spec (a producer knows only the agent's name).
    agent_version: str = ""
    #: ``PROVIDER:MODEL``; a producer may set it to override the agent's model.
    model: str = ""
    phase: Phase
    #: The current step: one think (and the tool calls it asked for, and their observation).
    step: int = 0
    version: int = 0
    #: Bumped each time the sweeper takes a phase over from a worker that stopped renewing it.
    epoch: int = 0
    input: str
    thread_id: str | None = None
    #: The thread policy the producer chose for this run (None: its agent's, ``Agent.thread_policy``).
    thread_policy: ThreadPolicy | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Whose run it is (set by the service API from the caller's key); None for runs started
    #: directly on Redis or the broker, which only operators can do.
    tenant: str | None = None
    #: How to tell a service the run ended (None: nobody is told).
    callback: Callback | None = None
    #: The queue namespace every task of the run goes to (``shared/queues.py``); None: the
    #: pool's default queues.
    namespace: str | None = None
    #: The assistant whose configuration the run's agent runs with (``shared/assistants.py``), and
    #: the version it was pinned to when the run was created (None: the agent as registered).
    assistant: str | None = None
    assistant_version: int | None = None
    #: The run and checkpoint this run was forked from (None: not a fork).
    fork: ForkOrigin | None = None
    #: Its ``model`` was named by no one: kept from the run it goes on from (a fork's original,
    #: unless the fork named one) or repeats (a retry of such a run). Not the tenant's choice, so a
    #: retry or a fork of it may keep that model whatever models the tenant may name now.
    model_inherited: bool = False
    #: The run whose subagent call this run is (None: a top-level run).
    parent: ParentLink | None = None
    #: The pipeline item or eval case the runtime started this run for (None: neither).
    link: RunLink | None = None
    #: Subagent runs this run has started so far.
    children: int = 0
    #: The run's handoffs, oldest first (``shared/handoffs.py``): the last one's target is the agent
    #: the run goes on under (:attr:`active_agent`). Bounded by the agents' ``max_handoffs``.
    handoffs: list[HandoffRecord] = Field(default_factory=list)
    #: The summary of the oldest messages (an agent whose context strategy is ``summarise``).
    summary: Summary | None = None
    message_count: int = 0
    #: The sequence number of the last signal (message or state update sent into the run) that a
    #: commit applied; later ones are pending (``shared/signals.py``).
    signals_applied: int = 0
    #: The accepted tool calls of the current step (ACTING / OBSERVING): with a cap on parallel
    #: calls (``Agent.max_parallel_tools``), the wave running now.
    pending_calls: list[ToolCall] = Field(default_factory=list)
    #: Calls of the current step whose wave ran already (their results are in).
    done_calls: list[ToolCall] = Field(default_factory=list)
    #: Calls of the current step waiting for a later wave.
    waiting_calls: list[ToolCall] = Field(default_factory=list)
    approval: Approval | None = None
    #: Tools a reviewer approved "always for this run": their calls no longer park it.
    approved_tools: list[str] = Field(default_factory=list)
    #: The note of the human who approved this step's calls: the model reads it with their results.
    approval_note: str = ""
    max_steps: int = 0
    #: Steps charged against ``max_steps`` (thinks, plus reprompts/retries that consume budget).
    steps_used: int = 0
    reprompts: int = 0
    #: Model-call retries of the current step (reset when the step advances).
    model_retries: int = 0
    answer: str | None = None
    #: The final answer was cut at the model's output token limit, and accepted as it was
    #: (``Policy.on_truncated``).
    truncated: bool = False
    #: The final answer validated against the agent's ``output_type``, as JSON (None without one).
    output: Any = None
    #: The agent's custom run state (its ``state_type``, as JSON), updated by its tools and
    #: checkpointed with every commit (``shared/run_state.py``); None for an agent without one.
    state: dict[str, Any] | None = None
    error: RunErrorInfo | None = None
    usage: Usage = Field(default_factory=Usage)
    #: The phase delivery that committed this version (None: committed by no claimed phase, such
    #: as the producer's create, the sweeper's poison verdict or the fan-in of tool results).
    ran: PhaseRun | None = None
    created_at: float
    updated_at: float

    @property
    def terminal(self) -> bool:
        return self.phase.terminal

    @property
    def active_agent(self) -> str:
        """The agent the run goes on under: the one it was started for, or its last handoff's target."""
        return self.handoffs[-1].to_agent if self.handoffs else self.agent

    def output_as(self, output_type: type[M]) -> M | None:
        """The run's structured output as ``output_type`` (None while it has none)."""
        return None if self.output is None else output_type.model_validate(self.output)

    def state_as(self, state_type: type[M]) -> M | None:
        """The run's custom state as ``state_type`` (None for an agent without one)."""
        return None if self.state is None else state_type.model_validate(self.state)

    def dump_request(self, *, exclude_time: bool = False) -> str:
        """The part of the head stored once, when the run is created (``exclude_time``: but
        ``created_at``, to compare two requests)."""
        fields = REQUEST_FIELDS - {"created_at"} if exclude_time else REQUEST_FIELDS
        return self.model_dump_json(include=set(fields))

    def dump_body(self) -> str:
        """The part of the head each commit writes (and its checkpoint keeps).

        Fields at their defaults are left out (``compose`` restores them): most of a head is empty
        lists, nulls and zeros, and every commit writes the body twice (the head and its
        checkpoint), the claim reads it back, and every checkpoint keeps it for the retention.
        """
        return self.model_dump_json(exclude={*REQUEST_FIELDS, "epoch"}, exclude_defaults=True)

    @classmethod
    def compose(cls, body: str, request: str, epoch: int) -> RunHead:
        """The head from its stored parts: both are JSON objects written by pydantic."""
        return cls.model_validate_json(f'{{"epoch":{epoch},{request[1:-1]},{body[1:]}')

    @classmethod
    def new_idle(
        cls,
        run_id: str,
        agent: str,
        input: str,
        *,
        thread_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        model: str | None = None,
        tenant: str | None = None,
        callback: Callback | None = None,
        fork: ForkOrigin | None = None,
        model_inherited: bool = False,
        parent: ParentLink | None = None,
        link: PipelineLink | EvalLink | None = None,
        state: dict[str, Any] | None = None,
        namespace: str | None = None,
        thread_policy: ThreadPolicy | None = None,
        assistant: str | None = None,
        assistant_version: int | None = None,
    ) -> RunHead:
        """A run as a producer creates it: version 1, IDLE, waiting for the start phase."""
        now = time.time()
        return cls(
            run_id=run_id,
            agent=agent,
            model=model or "",
            phase=Phase.IDLE,
            version=1,
            input=input,
            thread_id=thread_id,
            metadata=metadata or {},
            tenant=tenant,
            callback=callback,
            fork=fork,
            model_inherited=model_inherited,
            parent=parent,
            link=link,
            state=state,
            namespace=namespace,
            thread_policy=thread_policy,
            assistant=assistant,
            assistant_version=assistant_version,
            created_at=now,
            updated_at=now,
        )

    @property
    def status(self) -> RunStatus:
        return status_of(self.phase)
