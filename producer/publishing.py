"""Celery's task messages, built once per kind and published as plain Redis commands.

Both the client (a run's start, its decisions) and the worker (every next phase) publish Celery
tasks. When the broker is the Redis that holds the run state, a task's publish is a few Redis
commands on the store's long-lived client; the worker's commit script can even push the next
phase's message itself, in the same atomic step as the checkpoint (one round trip instead of two,
and no window between commit and publish on that path). When the broker is a standalone Redis of
its own (beside a Redis Cluster run state), the same commands run on a long-lived client of the
broker's, after the commit (:func:`pushes_messages`). The outbox and the sweeper stay, for
RabbitMQ, for that separate broker and for the cases the script declines (the run's epoch moved
since the claim, a replayed commit).

The message is exactly what Celery puts there, because Celery and kombu build it: ``send_task``
(protocol 2, routing, parent and root ids, time limits, ETA, the task-sent event when task events
are on) through kombu's own Redis channel (its envelope, body encoding, delivery tag, priority queue
naming). Only kombu's last step changes: the channel hands its final Redis commands (``LPUSH`` of
the message, ``PUBLISH`` of an event, ``PEXPIRE`` of an expiring queue) to a collector, through
kombu's publish-batch interface, instead of running them. The same commands, run on the store's
long-lived client, are the fallback publish: no Redis client is built per publish, and the
exchange's bindings are read once per process instead of once per message.

Three of ``send_task``'s costs are skipped, none of which changes a byte of the message: the
queue declaration before each publish (the consumers declare their queues; a publish to the
default exchange names its queue list directly), kombu's retry wrapper (nothing here does I/O),
and, with the worker app's :class:`ReprAMQP`, Celery's ``saferepr`` of the arguments for the
``argsrepr``/``kwargsrepr`` headers, which costs more than the rest of the message: for arguments
of plain scalars (every phase task's) the same text is written by :func:`celery_repr`, and
anything else is left to Celery.

Celery's ``send_task`` itself still costs a phase more CPU than anything else it does (routing, the
configuration's lookups, kombu's message and envelope, about 170 µs on a quiet core). The messages
of one task name, queue and time limit differ only in a few fields, so :class:`MessageBuilder`
builds the first of each kind with ``send_task`` and keeps it as a :class:`MessageTemplate`; the
next ones are the template with those fields written in: the task id (and the correlation id that
repeats it), the parent and root ids Celery takes from the task running now, the argument headers,
the body and a fresh delivery tag. Only the messages whose other fields are known to be the same
take that path: no countdown, arguments of plain scalars, no task-sent event, no receiver of
Celery's publish signals, no priority inherited from the parent, Celery's own serializer; anything
else goes through ``send_task`` (``tests/integration/test_commit_publish.py`` holds both paths to
the bytes Celery publishes).
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _encode_string
from typing import Any

import redis
from celery import Celery
from celery.app.amqp import AMQP
from celery.signals import after_task_publish, before_task_publish
from kombu.exceptions import OperationalError
from kombu.transport import redis as redis_transport

from shared.redis_client import connect
from shared.settings import Settings
from shared.state import TaskSpec
from shared.store import PUBLISH_COMMANDS, BrokerCommand

__all__ = [
    "PUBLISH_ERRORS",
    "CollectingChannel",
    "CollectingTransport",
    "MessageBuilder",
    "MessageTemplate",
    "ReprAMQP",
    "RuntimePublisher",
    "broker_is_store",
    "broker_redis",
    "celery_repr",
    "publish_commands",
    "pushes_messages",
    "run_commands",
]

#: What a publish raises when the broker cannot take the message: kombu wraps connection errors of
#: every transport in it, after Celery's own publish retries (a publish on the store's client raises
#: it too, see :func:`run_commands`). ``shared`` imports neither Celery nor kombu: the client and the
#: worker catch it, and mark the task's outbox unsent (``shared/unsent.py``).
PUBLISH_ERRORS: tuple[type[Exception], ...] = (OperationalError,)

#: Arguments whose text stays below this are never truncated by Celery's ``saferepr`` (its limit
#: is ``argsrepr_maxsize``, 1024; keep well clear of where truncation starts).
_REPR_LIMIT = 512
_SCALARS = (str, int, float, bool, type(None))
#: Parameters of Celery 5.7's ``AMQP.as_task_v2`` between ``kwargs`` and ``argsrepr``.
_POSITIONAL_BEFORE_ARGSREPR = 21

_local = threading.local()


class _Collector:
    """kombu's publish-batch interface (``add``), keeping the commands of the publishes it sees."""

    def __init__(self) -> None:
        self.commands: list[BrokerCommand] = []

    def add(self, name: str, *args: Any) -> None:
        if name not in PUBLISH_COMMANDS:
            raise RuntimeError(f"kombu asked for an unexpected publish command {name!r}")
        self.commands.append((name, tuple(str(a) for a in args)))


def _collector() -> _Collector:
    collector: _Collector | None = getattr(_local, "collector", None)
    if collector is None:
        raise RuntimeError("a collecting channel published outside MessageBuilder.build")
    return collector


class CollectingChannel(redis_transport.Channel):
    """kombu's Redis channel, giving a publish's final commands to the collector of this thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._tables: dict[str, list[tuple[str, ...]]] = {}

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        kwargs["_publish_batch"] = _collector()
        super()._put(queue, message, **kwargs)  # type: ignore[no-untyped-call]

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        kwargs["_publish_batch"] = _collector()
        super()._put_fanout(exchange, message, routing_key, **kwargs)  # type: ignore[no-untyped-call]

    def get_table(self, exchange: str) -> list[tuple[str, ...]]:
        # The runtime's queues are bound once and never unbound: read each exchange's bindings
        # once per process (kombu reads them from Redis at every publish).
        table = self._tables.get(exchange)
        if not table:
            table = self._tables[exchange] = super().get_table(exchange)  # type: ignore[no-untyped-call]
        return table


class CollectingTransport(redis_transport.Transport):
    """kombu's Redis transport with :class:`CollectingChannel`."""

    Channel = CollectingChannel


#: What a message's body carries after its arguments when the task has no links, chain or chord.
_NO_LINKS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

#: The fields :meth:`MessageTemplate.fill` writes, by where they are in the message.
_FILLED = {
    "body": ("body",),
    "headers": ("id", "root_id", "parent_id", "argsrepr", "kwargsrepr"),
    "properties": ("correlation_id", "reply_to", "delivery_tag"),
}
#: What stands for a filled field in the template's JSON: no string Celery writes looks like it.
_MARK = "\x00wesichain-filled:{}\x00"
_MARKED = re.compile(r'"\\u0000wesichain-filled:(\w+)\\u0000"')


@dataclass(frozen=True)
class MessageTemplate:
    """A message ``send_task`` built for one kind of task (name, queue, time limit, argument
    names), into which another task of that kind is written (see the module doc)."""

    #: The queue list the message is pushed on.
    key: str
    #: The message as kombu's channel pushed it, parsed (key order kept).
    message: dict[str, Any]
    #: The message's JSON around the fields :meth:`fill` writes, and those fields in that order:
    #: a message is the pieces and the fields' values joined, not the whole dict dumped again.
    pieces: tuple[str, ...] = field(init=False, repr=False, compare=False)
    filled: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        marked = dict(self.message)
        for part, names in _FILLED.items():
            if part == "body":
                marked["body"] = _MARK.format("body")
            else:
                marked[part] = {**self.message[part], **{name: _MARK.format(name) for name in names}}
        cut = _MARKED.split(json.dumps(marked))
        object.__setattr__(self, "pieces", tuple(cut[0::2]))
        object.__setattr__(self, "filled", tuple(cut[1::2]))

    @classmethod
    def of(cls, commands: Sequence[BrokerCommand]) -> MessageTemplate | None:
        """The template of one built message (None: not a single push of a JSON body Celery's way)."""
        if len(commands) != 1 or commands[0][0] != "lpush" or len(commands[0][1]) != 2:
            return None
        key, raw = commands[0][1]
        message = json.loads(raw)
        properties, headers = message.get("properties", {}), message.get("headers", {})
        if (
            message.get("content-type") != "application/json"
            or properties.get("body_encoding") != "base64"
            or headers.get("eta") is not None
            or headers.get("expires") is not None
            or headers.get("stamps")
        ):
            return None
        return cls(key, message)

    def fill(
        self,
        spec: TaskSpec,
        argsrepr: str,
        kwargsrepr: str,
        root_id: str | None,
        parent_id: str | None,
        reply_to: str,
    ) -> BrokerCommand:
        body = json.dumps([list(spec.args), spec.arguments, _NO_LINKS])
        values = {
            "body": base64.b64encode(body.encode()).decode(),
            "id": spec.task_id,
            "root_id": root_id or spec.task_id,
            "parent_id": parent_id,
            "argsrepr": argsrepr,
            "kwargsrepr": kwargsrepr,
            "correlation_id": spec.task_id,
            "reply_to": reply_to,
            "delivery_tag": str(uuid.uuid4()),
        }
        pieces = self.pieces
        text = [pieces[0]]
        for name, after in zip(self.filled, pieces[1:], strict=True):
            # Each value as ``json.dumps`` writes it in the message (ASCII, the C encoder's escapes).
            value = values[name]
            text += ("null" if value is None else _encode_string(value), after)
        return ("lpush", (self.key, "".join(text)))


class MessageBuilder:
    """Builds the broker commands that publish tasks, with Celery's ``send_task`` (one per process)
    or from the template of the first message of its kind."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._connection: Any = None
        self._producer: Any = None
        #: Templates by kind of task, for the process that built them (a forked child builds its own:
        #: the ``origin`` header names the process).
        self._templates: dict[tuple[Any, ...], MessageTemplate] = {}
        self._templates_pid = os.getpid()
        self._conf_allows: bool | None = None

    def _open(self) -> Any:
        if self._producer is None:
            self._connection = self.app.connection_for_write(transport=CollectingTransport)
            self._producer = self.app.amqp.Producer(self._connection.default_channel, auto_declare=False)
        return self._producer

    def build(self, specs: Sequence[TaskSpec]) -> list[BrokerCommand]:
        """The Redis commands that publish ``specs``, as Celery's ``send_task`` would run them."""
        if not specs:
            return []
        if not self._templates_apply():
            return self._send_tasks(specs)
        commands: list[BrokerCommand] = []
        for spec in specs:
            commands += self._from_template(spec)
        return commands

    def _templates_apply(self) -> bool:
        """Whether nothing outside the task itself changes its message here (see the module doc)."""
        if self._conf_allows is None:
            self._conf_allows = self._conf_allows_templates()
        return self._conf_allows and not (before_task_publish.receivers or after_task_publish.receivers)

    def _conf_allows_templates(self) -> bool:
        """Read once: a worker's Celery configuration is set before its first task."""
        conf = self.app.conf
        return not (
            conf.task_send_sent_event
            or conf.task_inherit_parent_priority
            or conf.task_serializer != "json"
            or conf.task_compression
            or not isinstance(conf.task_routes or {}, dict)
            or any(callable(route) for route in (conf.task_routes or {}).values())
        )

    def _from_template(self, spec: TaskSpec) -> list[BrokerCommand]:
        argsrepr, kwargsrepr = celery_repr(spec.args or ()), celery_repr(spec.arguments or {})
        if spec.countdown or argsrepr is None or kwargsrepr is None:
            return self._send_tasks([spec])
        if os.getpid() != self._templates_pid:
            self._templates, self._templates_pid = {}, os.getpid()
        kind = (spec.name, spec.queue, spec.time_limit_s, len(spec.args), tuple(spec.arguments))
        template = self._templates.get(kind)
        if template is None:
            commands = self._send_tasks([spec])
            if (made := MessageTemplate.of(commands)) is not None:
                self._templates[kind] = made
            return commands
        parent = self.app.current_worker_task
        root_id = parent_id = None
        if parent:
            request = parent.request
            root_id = request.root_id or request.id
            parent_id = request.id
            if parent.trail:  # as send_task does (a task without a trail keeps no children)
                parent.add_trail(self.app.AsyncResult(spec.task_id))
        return [template.fill(spec, argsrepr, kwargsrepr, root_id, parent_id, self.app.thread_oid)]

    def _send_tasks(self, specs: Sequence[TaskSpec]) -> list[BrokerCommand]:
        with self._lock:
            producer = self._open()
            _local.collector = collector = _Collector()
            try:
                for spec in specs:
                    self.app.send_task(
                        spec.name,
                        args=spec.args or None,
                        kwargs=spec.arguments or None,
                        task_id=spec.task_id,
                        countdown=spec.countdown or None,
                        time_limit=spec.time_limit_s,
                        queue=spec.queue,
                        producer=producer,
                        declare=[],
                        retry=False,
                    )
            finally:
                _local.collector = None
        return collector.commands

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.release()
            self._connection = self._producer = None


class ReprAMQP(AMQP):  # type: ignore[misc]
    """Celery's task message factory, writing the argument headers of plain arguments itself."""

    def as_task_v2(
        self,
        task_id: str,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *more: Any,
        argsrepr: str | None = None,
        kwargsrepr: str | None = None,
        **options: Any,
    ) -> Any:
        if len(more) > _POSITIONAL_BEFORE_ARGSREPR:  # given by position: Celery's to handle
            return super().as_task_v2(task_id, name, args, kwargs, *more, **options)
        if argsrepr is None:
            argsrepr = celery_repr(args or ())
        if kwargsrepr is None:
            kwargsrepr = celery_repr(kwargs or {})
        return super().as_task_v2(
            task_id, name, args, kwargs, *more, argsrepr=argsrepr, kwargsrepr=kwargsrepr, **options
        )


def celery_repr(value: Sequence[Any] | dict[str, Any]) -> str | None:
    """Celery's ``saferepr`` of task arguments made of plain scalars, as Celery writes it in the
    message's ``argsrepr``/``kwargsrepr`` headers; None for anything else (Celery then writes it).

    Celery quotes a string without escaping anything but its single quotes, and writes numbers,
    booleans and None as ``repr`` does.
    """
    if isinstance(value, dict):
        if not all(type(k) is str and type(v) in _SCALARS for k, v in value.items()):
            return None
        text = "{" + ", ".join(f"{_scalar(k)}: {_scalar(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, tuple | list):
        if not all(type(v) in _SCALARS for v in value):
            return None
        inner = ", ".join(_scalar(v) for v in value)
        if isinstance(value, list):
            text = f"[{inner}]"
        else:
            text = f"({inner},)" if len(value) == 1 else f"({inner})"
    else:
        return None
    return text if len(text) < _REPR_LIMIT else None


def _scalar(value: str | float | bool | None) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    return repr(value)


class RuntimePublisher:
    """A Celery app's ``send_task`` for a client in the worker that creates runs (eval case runs,
    pipeline children), publishing through the runtime's own path (which may push Celery's message
    on the store's connection) rather than through ``send_task`` and a second broker connection."""

    def __init__(
        self, send: Callable[[TaskSpec], None], send_many: Callable[[Sequence[TaskSpec]], None] | None = None
    ) -> None:
        self._send = send
        self._send_many = send_many

    def send_task(
        self,
        name: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        queue: str | None = None,
        **_: Any,
    ) -> None:
        spec = TaskSpec(
            name=name, task_id=task_id or uuid.uuid4().hex, arguments=kwargs or {}, args=args or []
        )
        self._send(spec.model_copy(update={"queue": queue}))

    def send_tasks(self, tasks: Sequence[TaskSpec]) -> None:
        """Send several tasks: in one publish when the runtime can, else one after another."""
        if self._send_many is not None:
            self._send_many(tasks)
            return
        for task in tasks:
            self._send(task)


def broker_is_store(settings: Settings) -> bool:
    """Whether the broker is the Redis of the run state (same server and database, no broker key
    prefix): then a task's publish is a few commands on the store's client, or in a commit script.
    """
    return not settings.embedded and not settings.broker_prefix and not settings.broker_url


def pushes_messages(settings: Settings) -> bool:
    """Whether a task's publish can be the Redis commands :class:`MessageBuilder` collects, run on a
    client of the broker's: the broker is a Redis (the run state's, or a standalone one of its own
    beside a Redis Cluster), with no broker key prefix (kombu writes the prefix into a command's
    keys as it runs it, so the commands it hands over have none)."""
    return settings.broker_is_redis and not settings.broker_prefix


def broker_redis(settings: Settings, store_client: Any) -> Any:
    """The client that reaches the broker's Redis: ``store_client`` when the broker is the run
    state's own server, else a new client of the broker's (``broker_url``: the standalone Redis
    beside a Redis Cluster run state), for the caller to keep. Only for a Redis broker."""
    return connect(settings.broker_endpoint()) if settings.broker_url else store_client


def publish_commands(client: Any, commands: Sequence[BrokerCommand], atomic: bool = False) -> None:
    """Run publish commands on ``client`` as a publish: a Redis it cannot reach raises what
    ``send_task`` raises for a broker it cannot reach (one of :data:`PUBLISH_ERRORS`), so that the
    caller marks the task unsent and the sweeper sends it later. ``atomic``: all of them or none
    (a transaction), for a publish that carries a delivery's acknowledgement.

    A Redis at ``maxmemory`` refuses the messages (``OutOfMemoryError``; a transaction whole): that
    raises the same, a publish the broker refused. As a Redis error, nothing would mark the task
    unsent: the sweeper would find its message missing and hand it on as a lost message once per
    queued lease until the run failed as poison, however soon the broker took messages again."""
    try:
        run_commands(client, commands, atomic)
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.OutOfMemoryError,
    ) as exc:
        raise OperationalError(str(exc)) from exc


def run_commands(client: Any, commands: Sequence[BrokerCommand], atomic: bool = False) -> None:
    """Run publish commands on ``client`` (one pipelined round trip; ``atomic``: in a transaction)."""
    if not commands:
        return
    with client.pipeline(transaction=atomic) as pipe:
        for name, args in commands:
            getattr(pipe, name)(*args)
        pipe.execute()
