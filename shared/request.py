"""What a producer asks for when it starts a run, validated the same way on every path.

The Python client, the CLI and a bare ``wesichain.start`` message from another service all end in
:func:`validate_request`, so the same limits hold whoever sends the run: a request over a limit is
refused with an :class:`~shared.errors.InvalidRequest` naming the field and the limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.configurable import check_assistant_name
from shared.errors import InvalidRequest
from shared.keys import names_another_runs_key
from shared.queues import check_namespace
from shared.settings import Limits
from shared.state import THREAD_POLICIES, Callback, EvalLink, PipelineLink, RunHead, ThreadPolicy

__all__ = [
    "MAX_NAME_CHARS",
    "NAME_PATTERN",
    "NOT_BLANK",
    "MAX_STATE_BYTES",
    "RESERVED_QUEUE_PREFIXES",
    "RESERVED_TASK_PREFIXES",
    "RunRequest",
    "StartMessage",
    "MAX_JSON_DEPTH",
    "check_callback",
    "check_callback_queue",
    "check_callback_task",
    "check_json_depth",
    "check_name",
    "check_thread_policy",
    "check_run_id",
    "new_run",
    "validate_request",
]

#: Agent names, thread ids and run ids: short, printable, no separators that mean something to Redis.
#: What a name (agent, thread, tenant) is: also the ``pattern`` of those fields in the OpenAPI document.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$"
_NAME = re.compile(NAME_PATTERN)
MAX_NAME_CHARS = 200
#: An input must hold something besides white space (a JSON Schema ``pattern`` searches).
NOT_BLANK = r"\S"


#: Task names no producer may name as a callback: the runtime's own protocol tasks (a pipeline's
#: child-ended handler, an eval's scorer, a subagent's result...) and Celery's built-in tasks.
#: Those are started only by the runtime, for runs it created itself (``RunHead.link``/``parent``).
RESERVED_TASK_PREFIXES = ("wesichain.", "celery.")
#: Queues no producer may send a callback to: the pool's default queues, Celery's own (the default
#: ``celery`` queue, its events and remote-control exchanges) and kombu's Redis bookkeeping
#: (``unacked``; its ``_kombu.*`` keys no name may start like).
RESERVED_QUEUE_PREFIXES = ("wesichain.", "celery", "unacked")


class RunRequest(BaseModel):
    """A run as a producer asks for it (the ``create`` of a bare ``wesichain.start`` message)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str = Field(description="The agent's registered name.")
    input: str = Field(description="The user's message.")
    thread_id: str | None = Field(
        default=None, description="A conversation thread: runs of one thread see the earlier runs' messages."
    )
    thread_policy: ThreadPolicy | None = Field(
        default=None,
        description="What the run does when another run of its thread has not ended: reject (refused,"
        " naming the busy run), enqueue (waits its turn), interrupt (the runs ahead stop at their next"
        " safe boundary, their messages kept), rollback (the runs ahead are cancelled and their"
        " messages dropped from the thread). None: the agent's default (enqueue unless it sets one).",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Free-form JSON stored with the run (bounded)."
    )
    model: str | None = Field(
        default=None, description="``PROVIDER:MODEL`` to use instead of the agent's own model."
    )
    tenant: str | None = Field(
        default=None, description="Whose run it is (the service API sets it from the caller's key)."
    )
    callback: Callback | None = Field(
        default=None, description="How to tell a service the run ended: a webhook url, or a Celery task."
    )
    state: dict[str, Any] | None = Field(
        default=None,
        description="The run's starting custom state, for an agent that declares a state type (checked"
        " against it when the run starts; bounded).",
    )
    namespace: str | None = Field(
        default=None,
        description="The queue namespace of the run's tasks: NAME sends them to NAME.model,"
        " NAME.tools and NAME.callbacks instead of the pool's default queues (1..48 letters,"
        " digits, _ and -).",
    )
    assistant: str | None = Field(
        default=None,
        description="An assistant of the run's tenant that configures the agent (it must configure"
        " this agent): the run is pinned to its current version, or to ``assistant_version``.",
    )
    assistant_version: int | None = Field(
        default=None, ge=1, description="The assistant's version to run (default: its current one)."
    )


class StartMessage(BaseModel):
    """The keyword arguments of a ``wesichain.start`` message that creates a run."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        description="The run's id, chosen by the sender (1..200 letters, digits and . _ : @ / -)."
    )
    create: RunRequest = Field(description="What to run.")
    version: int = Field(default=1, description="Always 1 for a new run.")
    epoch: int = Field(default=0, description="Always 0 for a new run.")


def validate_request(raw: Mapping[str, Any], limits: Limits, *, runtime_callback: bool = False) -> RunRequest:
    """Check a request against the limits; raises :class:`InvalidRequest` saying what is wrong.

    ``runtime_callback`` is for the runtime's own runs only (a pipeline's child, an eval's case):
    their callback names one of its reserved tasks, which any other request is refused.
    """
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"the request must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(RunRequest.model_fields))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(map(repr, unknown))} in the request")
    if "agent" not in raw:
        raise InvalidRequest("the request names no agent ('agent' is required)")
    if "input" not in raw:
        raise InvalidRequest("the request has no input ('input' is required)")
    agent, text = raw["agent"], raw["input"]
    check_name("agent", agent)
    _check_input(text, limits)
    thread_id = raw.get("thread_id")
    if thread_id is not None:
        check_name("thread_id", thread_id)
    thread_policy = check_thread_policy(raw.get("thread_policy"))
    metadata = raw.get("metadata") or {}
    _check_metadata(metadata, limits)
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or ":" not in model or len(model) > MAX_NAME_CHARS):
        raise InvalidRequest(f"model must look like PROVIDER:MODEL, got {str(model)[:80]!r}")
    tenant = raw.get("tenant")
    if tenant is not None:
        check_name("tenant", tenant)
    state = raw.get("state")
    if state is not None:
        _check_state(state)
    namespace = check_namespace(raw.get("namespace"))
    assistant, assistant_version = raw.get("assistant"), raw.get("assistant_version")
    if assistant is not None:
        check_assistant_name(assistant)
    if assistant_version is not None:
        if assistant is None:
            raise InvalidRequest("assistant_version goes with an assistant")
        if (
            not isinstance(assistant_version, int)
            or isinstance(assistant_version, bool)
            or assistant_version < 1
        ):
            raise InvalidRequest(
                f"assistant_version must be a number from 1, got {str(assistant_version)[:20]!r}"
            )
    return RunRequest(
        agent=agent,
        input=text,
        thread_id=thread_id,
        thread_policy=thread_policy,
        metadata=metadata,
        model=model,
        tenant=tenant,
        callback=_callback(raw.get("callback"), runtime_callback),
        state=state,
        namespace=namespace,
        assistant=assistant,
        assistant_version=assistant_version,
    )


def new_run(
    run_id: str,
    request: RunRequest,
    *,
    link: PipelineLink | EvalLink | None = None,
    model_inherited: bool = False,
) -> RunHead:
    """The new run (IDLE, version 1) a validated request stands for, with every field it holds.

    The one place a request becomes a run: the Python client (and the HTTP API through it) and a
    bare ``wesichain.start`` message both create their runs here, so a field added to
    :class:`RunRequest` reaches the run on every path (a field ``RunHead.new_idle`` does not take
    fails at once, in every test that creates a run). ``link`` (a pipeline's child, an eval's
    case) and ``model_inherited`` (a retry keeping a model no one named, ``RunHead``) are the
    runtime's own: no request carries them.
    """
    fields = {
        name: getattr(request, name) for name in RunRequest.model_fields if name not in ("agent", "input")
    }
    return RunHead.new_idle(
        run_id, request.agent, request.input, link=link, model_inherited=model_inherited, **fields
    )


def _callback(raw: Any, runtime_callback: bool) -> Callback | None:
    if raw is None:
        return None
    if isinstance(raw, Callback):
        callback = raw
    else:
        try:
            callback = Callback.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise InvalidRequest(f"callback: {problems}") from None
    if not runtime_callback:
        check_callback(callback)
    return callback


def check_callback(callback: Callback) -> None:
    """Refuse a producer's callback that names a reserved task or queue (``RESERVED_*``)."""
    if callback.task is not None:
        check_callback_task(callback.task)
    if callback.queue is not None:
        check_callback_queue(callback.queue)


def check_callback_task(task: str) -> None:
    """Refuse a callback task name that is malformed or reserved (the runtime's, or Celery's).

    Names are compared case-folded: a broker or a future router that folds case must not turn
    an accepted name into a reserved one.
    """
    check_name("callback task", task)
    if task.casefold().startswith(RESERVED_TASK_PREFIXES):
        raise InvalidRequest(
            f"callback task {task[:80]!r} is reserved: names starting with"
            f" {' or '.join(RESERVED_TASK_PREFIXES)} are the runtime's own tasks"
        )


def check_callback_queue(queue: str) -> None:
    """Refuse a callback queue that is malformed or reserved (the pool's, Celery's or kombu's),
    case-folded. On the Redis broker a queue is a list of that very name, in the Redis the run
    state may share: a queue name holds no ':', so it names no key of the run state (whose names
    are ``prefix:...``), and none of kombu's own keys (``unacked``, ``_kombu.binding.*``)."""
    check_name("callback queue", queue)
    if ":" in queue:
        raise InvalidRequest(
            f"callback queue {queue[:80]!r} holds ':': queue names are letters, digits and . _ @ / -"
        )
    if queue.casefold().startswith(RESERVED_QUEUE_PREFIXES):
        raise InvalidRequest(
            f"callback queue {queue[:80]!r} is reserved: queues starting with"
            f" {' or '.join(RESERVED_QUEUE_PREFIXES)} are the pool's own"
        )


def _check_input(text: Any, limits: Limits) -> None:
    if not isinstance(text, str):
        raise InvalidRequest(f"input must be text, got {type(text).__name__}")
    if not text.strip():
        raise InvalidRequest("input is empty")
    if len(text) > limits.max_input_chars:
        raise InvalidRequest(f"input is {len(text)} chars; the limit is {limits.max_input_chars}")


#: How deeply a producer's free-form JSON (metadata, state, memory values, updates) may nest. Every
#: reader of what is stored parses it again (pydantic's JSON parser refuses past about 200 levels,
#: its serializer past 255): a deeper value accepted once would be a run, an item or a signal that
#: no one could read back, not even to cancel or delete it.
MAX_JSON_DEPTH = 32


def check_json_depth(what: str, value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse (:class:`InvalidRequest`) a JSON value whose objects and arrays nest deeper than
    ``max_depth``; iterative, so any depth is measured without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > max_depth:
            raise InvalidRequest(f"{what} nests deeper than {max_depth} levels of objects and arrays")
        stack.extend((child, depth + 1) for child in children)


def _check_metadata(metadata: Any, limits: Limits) -> None:
    if not isinstance(metadata, dict):
        raise InvalidRequest(f"metadata must be a JSON object, got {type(metadata).__name__}")
    check_json_depth("metadata", metadata)
    try:
        size = len(json.dumps(metadata))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"metadata is not JSON: {exc}") from None
    if size > limits.max_metadata_chars:
        raise InvalidRequest(f"metadata is {size} chars of JSON; the limit is {limits.max_metadata_chars}")


#: The largest a run's custom state may be, as JSON (it is copied into every checkpoint).
MAX_STATE_BYTES = 64 * 1024


def _check_state(state: Any) -> None:
    if not isinstance(state, dict):
        raise InvalidRequest(f"state must be a JSON object, got {type(state).__name__}")
    check_json_depth("state", state)
    try:
        size = len(json.dumps(state, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"state is not JSON: {exc}") from None
    if size > MAX_STATE_BYTES:
        raise InvalidRequest(f"state is {size} bytes of JSON; the limit is {MAX_STATE_BYTES}")


def check_thread_policy(value: Any) -> ThreadPolicy | None:
    """A thread policy a producer chose (None: the agent's default); refuses any other value."""
    if value is None:
        return None
    for policy in THREAD_POLICIES:
        if value == policy:
            return policy
    shown = value[:40] if isinstance(value, str) else type(value).__name__
    raise InvalidRequest(f"thread_policy must be one of {', '.join(THREAD_POLICIES)}, got {shown!r}")


def check_name(field: str, value: Any) -> None:
    """Refuse a name (agent, tenant, thread, run id) that is not short, printable text."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be text, got {type(value).__name__}")
    if not value or len(value) > MAX_NAME_CHARS or not _NAME.match(value):
        raise InvalidRequest(
            f"{field} {value[:80]!r} must be 1..{MAX_NAME_CHARS} chars of letters, digits and . _ : @ / -"
        )


def check_run_id(run_id: Any) -> str:
    """A run id a producer chose; raises :class:`InvalidRequest` when it cannot name a run."""
    check_name("run_id", run_id)
    if names_another_runs_key(run_id):
        raise InvalidRequest(
            f"run_id {run_id[:80]!r} ends as a run's own keys do (':messages', ':inbox', ...)"
        )
    return str(run_id)
