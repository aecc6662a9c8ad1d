"""The Lua scripts of the stores, loaded once with the protocol prelude prepended, and their calls.

Every name, state and format a script keeps in Redis comes from :mod:`shared.protocol` (its
prelude); a script spells only Redis's own words and its own replies and argument modes
(``tests/unit/test_lua_protocol.py`` reads every ``.lua`` file for quoted literals).

What a script takes is declared once, here: :data:`SPECS` names each script's KEYS and ARGV in
order (and says what may follow them when a call passes a variable number), and the words of its
own vocabulary. The declaration is held to both sides of the call:

- the Lua side by ``test_lua_protocol``: where a script names its KEYS or ARGV (``local run,
  leases = KEYS[1], KEYS[2]``, ``local run_id, op = unpack(ARGV, 1, 2)``) the names and their
  number are the spec's, and no script reads ``KEYS[i]`` or ``ARGV[i]`` past its spec unless the
  spec says more may follow;
- the Python side at every call: a script registered through :func:`register_scripts` or
  :func:`register_script` refuses (:class:`ScriptCallError`, before anything is sent) a call
  passing another number of KEYS or ARGV than its spec, so every call the tests make checks its
  caller.

Typed per-script key and argument classes would check more at type-checking time, but would
rewrite every call site of every store for a check the count at call time and the names in the
Lua make as well (a call with its arguments in the wrong order but the right number is still
left to the stores' tests).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import redis
import redis.connection
from redis.utils import HIREDIS_AVAILABLE

from shared.protocol import lua_prelude

__all__ = [
    "LoopConnections",
    "SCRIPT_NAMES",
    "SPECS",
    "Script",
    "ScriptCallError",
    "ScriptConnections",
    "ScriptNameError",
    "ScriptSpec",
    "is_cluster",
    "register_script",
    "register_scripts",
    "run_many",
    "script_body",
    "script_connections",
    "script_files",
    "script_source",
]


@dataclass(frozen=True)
class ScriptSpec:
    """What one script takes: its KEYS and ARGV by name, in order, and its own words."""

    keys: tuple[str, ...]
    args: tuple[str, ...]
    #: What follows the named KEYS (ARGV) in a call that passes more; '' when nothing may.
    more_keys: str = ""
    more_args: str = ""
    #: The literals the script may spell besides Redis's words: its replies and the modes its
    #: caller passes, none of them kept in Redis (what is kept comes from the prelude).
    words: frozenset[str] = frozenset()

    def check(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
        for what, given, named, more in (
            ("KEYS", keys, self.keys, self.more_keys),
            ("ARGV", args, self.args, self.more_args),
        ):
            if len(given) < len(named) or (len(given) > len(named) and not more):
                want = f"{len(named)}{' or more' if more else ''}"
                raise ScriptCallError(
                    f"{name}.lua takes {want} {what} ({', '.join(named)}), not {len(given)}"
                )


def _spec(
    keys: str,
    args: str = "",
    *,
    more_keys: str = "",
    more_args: str = "",
    words: str = "",
    phrases: tuple[str, ...] = (),
) -> ScriptSpec:
    """A spec from space-separated names and words (``phrases``: words with spaces in them)."""
    return ScriptSpec(
        tuple(keys.split()),
        tuple(args.split()),
        more_keys,
        more_args,
        frozenset(words.split()) | set(phrases),
    )


#: Every script of the stores: ``shared/lua/<name>.lua``, or a feature's ``shared/<feature>/lua/<name>.lua``
#: (:func:`script_files` finds each by its name).
SPECS: dict[str, ScriptSpec] = {
    # -- the run store ---------------------------------------------------------------------------
    "create": _spec(
        "run checkpoints leases runs_index registry inflight",
        "run_id op request body outbox queued_lease_ms tenant released",
        more_keys="the index keys to enter the run in, then (released given) the set to remove it from",
        more_args="the broker commands that publish the start task (push_broker)",
        words="created exists",
    ),
    "claim_phase": _spec(
        "run attempts_key leases messages_key results_key inbox last_claim_key",
        "run_id version phase epoch step token holder lease_ms messages_from want_results want_inbox"
        " last_claim want_callback",
        words="missing stale busy ok none expired",
    ),
    "claim_call": _spec(
        "run attempts_key leases results_key last_claim_key",
        "run_id version epoch step call_id token holder lease_ms last_claim",
        words="missing stale busy done ok none expired",
    ),
    "renew": _spec("run leases", "run_id field token lease_ms extend"),
    "release": _spec("run attempts_key", "field mode token_or_holder version reason", words="token"),
    "commit": _spec(
        "run messages_key checkpoints events_key leases registry inflight status_from status_to ended",
        "run_id op expected_version claim_field claim_token new_version phase step body outbox calls kind"
        " queued_lease_ms retention_s events_maxlen n_messages n_events tenant callback signals_cursor",
        more_keys="(terminal commits) the run's other keys, to expire with it",
        more_args="n_messages messages, n_events events, then the broker commands (push_broker)",
        words="committed fenced cancel_pending signals_pending live terminal",
    ),
    "signal": _spec(
        "run inbox events_key",
        "key digest record_head record_tail event_head event_tail size max_count max_bytes events_maxlen",
        words="stored duplicate conflict ended full missing",
    ),
    "record_result": _spec(
        "run results_key events_key leases checkpoints",
        "run_id op version step call_id claim_token result event n_calls observe_version observe_body"
        " observe_outbox queued_lease_ms events_maxlen",
        more_args="the broker commands that publish observe (push_broker)",
        words="stale duplicate recorded complete",
    ),
    "emit_custom": _spec("run results_key events_key", "step call_id claim_token event events_maxlen"),
    "emit_live": _spec("run events_key", "step events_maxlen claim_token", more_args="each event's JSON"),
    "memory_write": _spec(
        "values versions created updated index expiry applied vectors",
        "quota applied_keep_ms purge_limit",
        more_args="six per write: write_id op entry value ttl_ms vector",
        words="put delete deleted absent duplicate full",
    ),
    "memory_scan": _spec("values versions created updated index expiry", "low high most most_bytes"),
    "record_child": _spec(
        "run results_key events_key leases",
        "step call_id result event events_maxlen expected queued_lease_ms run_id",
        words="stale duplicate recorded",
    ),
    "due": _spec("leases", "limit"),
    "inspect": _spec("run leases results_key", "run_id step_hint", words="gone settled moved alive due"),
    "recover": _spec(
        "run leases attempts_key results_key",
        "run_id op action version epoch step missing wait_ms queued_lease_ms reason",
        words="wait moved waiting handed_on",
    ),
    "unsent": _spec("run leases", "run_id version epoch delay_ms"),
    "cancel": _spec("run", ""),
    "decide": _spec("run leases", "run_id version decision queued_lease_ms"),
    "join_thread": _spec("thread", "run_id ttl"),
    "thread_admit": _spec(
        "order state waiting rolled_back",
        "run_id policy ttl",
        words="go wait busy ended reject interrupt rollback",
    ),
    "thread_release": _spec("state waiting", "run_id"),
    "thread_park": _spec("run attempts_key leases", "run_id version token why"),
    "thread_wake": _spec("run leases", "run_id queued_ms"),
    "thread_forget": _spec("held", "member score"),
    "thread_cancel": _spec("run leases", "run_id queued_ms"),
    "lock": _spec("lock", "token ttl_ms mode", words="release"),
    "sweep_watch": _spec("seen_key quiet_key", "gap_ms quiet_ms unreachable"),
    "scan_queue": _spec(
        "queue",
        "start count",
        more_args="the task ids looked for",
        # kombu's message JSON, not ours: how it names a message's task id.
        phrases=('"id": "([^"]*)"',),
    ),
    "worker_beat": _spec("record_key workers", "id record ttl_ms"),
    "worker_live": _spec("lives held_key", "life ttl_ms mode held", words="set"),
    "worker_gone": _spec("lives held_key", "life seen"),
    "held_claim": _spec(
        "run leases attempts_key",
        "run_id field holders mode lease_ms fence_ms version reason",
        words="extend",
    ),
    "finish_callback": _spec(
        "run leases", "run_id token outcome state next_ms queued_lease_ms", words="retry"
    ),
    "throttle": _spec("run attempts_key leases", "run_id version token wait_ms queued_ms why"),
    "limit_acquire": _spec(
        "state slots",
        "rpm tpm conc want holder lease_ms",
        words="ok retry_after concurrency rpm tpm",
    ),
    "limit_release": _spec("state slots", "holder tpm extra back_off_ms"),
    "limit_renew": _spec("slots", "holder lease_ms"),
    "archive_read": _spec(
        "", more_keys="for each run: its hash, messages, checkpoints, events", words="later"
    ),
    "archive_results": _spec("", more_keys="step results hashes"),
    "archive_drop": _spec(
        "",
        more_keys="for each run: its hash, leases, runs index, ended, its other keys, its listing indexes",
        more_args="for each run: run_id, version, n_parts, n_indexes",
        words="changed dropped gone",
    ),
    # -- assistants (shared.assistant_store) --------------------------------------------------------
    "assistant_put": _spec(
        "versions index sizes kept",
        "name mode record expected max_versions max_assistants max_bytes",
        words="create exists missing moved full spent over ok *total",
    ),
    "assistant_delete": _spec("versions index kept", "name keep_s"),
    # -- bulk jobs (shared.bulk) ---------------------------------------------------------------------
    "bulk_record": _spec("job outcomes", "run_id outcome counter"),
    # -- schedules (shared.schedules) ---------------------------------------------------------------
    "schedule_decide": _spec("schedule", "tick decision", words="ok stale"),
    "schedule_advance": _spec(
        "schedule history due", "tick next_tick entry counter count run_id member history_max decision"
    ),
    "schedule_state": _spec("schedule due", "mode member next_tick", words="pause ok missing"),
    "schedule_update": _spec("schedule due", "expected spec next_tick member", words="ok conflict missing"),
    # -- the API's submit limits (producer/api/limits.py builds its script around this one) ----------
    "submit_window": _spec("window", "limit window member"),
    # -- pipelines (shared.pipeline.store) -----------------------------------------------------------
    "pipe_create": _spec(
        "meta active index tenant_index",
        "pipeline_id created_ms retention_ms",
        more_args="meta field/value pairs",
        words="exists created",
    ),
    "pipe_advance": _spec(
        "meta steps items",
        "from_seq new_seq target index kind cap total step updated_ms",
        more_args="the items' input texts, in item order",
        words="stale ok",
    ),
    "pipe_reserve": _spec("meta items attempts", "seq want"),
    "pipe_record": _spec(
        "meta results attempts events children items pump",
        "seq item attempt result event events_maxlen run_id started_event created_at want token lease_ms",
        words="unknown stale dup ended complete recorded waiting pumping",
    ),
    "pipe_retry": _spec("meta attempts", "seq item attempt", words="stale ok"),
    "pipe_end": _spec(
        "meta",
        "seq status output error finished_ms",
        # '*': end the pipeline run at whatever step it is (an argument mode, not Redis's '*').
        words="* stale ok",
    ),
    "pipe_mark": _spec(
        "children events meta items attempts pump",
        "events_maxlen seq want token lease_ms hand_on",
        more_args="item, run_id and event of each child to note",
    ),
    # -- evals (shared.evals.store) ------------------------------------------------------------------
    "eval_create": _spec(
        "meta cases pending active index tenant_index",
        "eval_id created_ms n_cases n_items",
        more_args="meta field/value pairs, n_cases case JSONs, n_items work items",
        words="exists created",
    ),
    "eval_acquire": _spec(
        "meta pending slots counts active",
        "cap lease_ms want max_tokens max_cost_micro eval_id",
        words="stopped budget full ok empty",
    ),
    "eval_claim": _spec("results scoring cases", "item lease_ms case", words="done busy ok"),
    "eval_record": _spec(
        "results slots scoring counts meta pending active cases",
        "item result variant passed failed tokens cost_micro eval_id finished_ms retention_ms",
    ),
    "eval_drop": _spec(
        "meta cases pending slots scoring results counts index active tenant_index", "eval_id"
    ),
    "eval_status": _spec("meta active slots", "eval_id status", more_args="the statuses it may move from"),
}

#: The scripts :func:`register_scripts` registers: the run store's (the features register theirs).
SCRIPT_NAMES = (
    "create",
    "claim_phase",
    "claim_call",
    "renew",
    "release",
    "commit",
    "record_result",
    "emit_custom",
    "emit_live",
    "record_child",
    "due",
    "inspect",
    "recover",
    "unsent",
    "cancel",
    "decide",
    "signal",
    "join_thread",
    "thread_admit",
    "thread_release",
    "thread_park",
    "thread_wake",
    "thread_forget",
    "thread_cancel",
    "lock",
    "sweep_watch",
    "scan_queue",
    "worker_beat",
    "worker_live",
    "worker_gone",
    "held_claim",
    "finish_callback",
    "throttle",
    "limit_acquire",
    "limit_release",
    "limit_renew",
    "archive_read",
    "archive_results",
    "archive_drop",
)


class ScriptCallError(ValueError):
    """A script was called with another number of KEYS or ARGV than its spec names."""


class ScriptNameError(RuntimeError):
    """Two Lua files share a name: a script is found by its name alone, wherever it lives."""


#: redis-py's serializer of a connection that packs with hiredis (None: hiredis is not installed).
_HIREDIS_SERIALIZER: Any = (
    getattr(redis.connection, "HiredisRespSerializer", None) if HIREDIS_AVAILABLE else None
)
if HIREDIS_AVAILABLE:
    from hiredis import pack_command as _hiredis_pack


def _packed(connection: Any, command: tuple[Any, ...], hiredis: bool) -> Any:
    """``command`` in the Redis protocol: with ``hiredis``, packed by hiredis at once, where
    redis-py's pack walks every argument in Python first (converting a bytearray or a memoryview,
    which no script argument is); the bytes are the same. Else, or for a type only redis-py
    converts, the connection's own ``pack_command`` (which also says what is wrong)."""
    if hiredis:
        try:
            return [_hiredis_pack(command)]
        except TypeError:
            pass
    return connection.pack_command(*command)


class ScriptConnections:
    """A connection of its own per thread for the scripts of one standalone Redis client.

    redis-py's way to a command takes a connection from the pool and gives it back, through its
    retry wrapper and observability hooks, each time: about 45 µs of CPU per command beside 30 µs
    for sending and reading it, and a transition runs two or three scripts. A thread here sends its
    ``EVALSHA`` on a connection it keeps (checked out of the client's pool, so it has the client's
    settings, TLS and credentials, and the client's ``close`` closes it), and reads the reply there.

    Anything but a reply hands the call to redis-py's own path, which does what it always did: a
    script Redis does not know (``NOSCRIPT``, after a restart or a ``SCRIPT FLUSH``) is loaded and
    run, and a dropped connection or a timeout is retried with the client's retries. Sending a
    script again whose reply was lost is what those retries already do: every script that writes
    recognises its own replay (an op id or the claim's token). redis-py drops a connection on any
    error or interruption while sending or reading, so a kept connection never holds a reply it
    has not read. A process forked after a thread took its connection takes a new one.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._local = threading.local()

    def run(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``script``'s reply to ``keys`` and ``args`` (already checked against its spec)."""
        held: _HeldConnection | None = getattr(self._local, "held", None)
        if held is None or held.pid != os.getpid():
            # As on redis-py's own path, a connect that fails (after the connection's own retries)
            # raises here: a second try through the client would only double the wait.
            held = self._local.held = _HeldConnection(self._pool)
        connection = held.connection
        try:
            connection.send_packed_command(held.pack(("EVALSHA", script.sha, len(keys), *keys, *args)))
            return connection.read_response()
        except (redis.exceptions.NoScriptError, redis.ConnectionError, redis.TimeoutError):
            pass
        return script.call_via_client(keys, args)


class _HeldConnection:
    """A connection a thread keeps out of a pool: it goes back when the thread ends."""

    __slots__ = ("connection", "hiredis", "pid", "pool")

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.pid = os.getpid()
        self.connection: Any = None  # a pool whose connect fails keeps nothing to give back
        self.connection = pool.get_connection()
        #: The connection packs with hiredis: see :meth:`pack`.
        self.hiredis = _HIREDIS_SERIALIZER is not None and isinstance(
            getattr(self.connection, "_command_packer", None), _HIREDIS_SERIALIZER
        )

    def pack(self, command: tuple[Any, ...]) -> Any:
        """``command`` in the Redis protocol, as the connection's own ``pack_command`` packs it
        (a commit has about 40 arguments: see :func:`_packed`)."""
        return _packed(self.connection, command, self.hiredis)

    def __del__(self) -> None:
        try:
            if self.connection is not None and self.pid == os.getpid():
                self.pool.release(self.connection)
        except Exception:  # at interpreter exit the pool may be gone already: nothing to give back to
            pass


class Script:
    """A registered script that refuses a call whose KEYS or ARGV its spec does not take."""

    __slots__ = ("_connections", "_script", "name", "spec")

    def __init__(
        self,
        name: str,
        script: Any,
        connections: ScriptConnections | None = None,
        spec: ScriptSpec | None = None,
    ) -> None:
        self.name = name
        #: A script of a file has the spec :data:`SPECS` holds for it; one built around a file's
        #: script (the API's reservation, ``producer/api/limits.py``) brings its own.
        self.spec = spec or SPECS[name]
        self._script = script
        self._connections = connections

    @property
    def sha(self) -> str:
        return str(self._script.sha)

    @sha.setter
    def sha(self, value: str) -> None:
        self._script.sha = value

    @property
    def script(self) -> str:
        return str(self._script.script)

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
        self.spec.check(self.name, keys, args)
        if client is None and self._connections is not None:
            return self._connections.run(self, keys, args)
        return self._script(keys=keys, args=args, client=client)

    def call_via_client(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """The script's reply through redis-py's own call (loading the script when Redis lacks it)."""
        return self._script(keys=keys, args=args)


class LoopConnections:
    """:class:`ScriptConnections`' counterpart on an event loop: connections kept out of a
    standalone asyncio client's pool (``redis.asyncio``), for the commands a request sends on
    its way (the API's submit: its reservation and create scripts).

    redis-py's asyncio way to a command takes a connection from its pool and gives it back through
    the pool's condition, timeouts and hooks, about as many function calls again as sending the
    command and reading its reply. A command here takes an idle kept connection (or one from the
    pool when every kept one is busy: commands of concurrent requests run side by side), and keeps
    it again after the reply, up to ``keep`` of them; the rest go back to the pool. For the event
    loop's thread only (no lock).

    A connection that fails, times out or is cancelled between a command and its reply is
    disconnected by redis-py and handed back to the pool (which connects it again); after a failure
    or a timeout the command goes through the client's own path, with its retries, as for
    :class:`ScriptConnections` (every script that writes recognises its own replay). An error
    reply leaves the connection sound. The kept connections count against the pool's size.
    """

    def __init__(self, client: Any, keep: int = 4) -> None:
        self.client = client
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._keep = keep

    async def execute(self, *command: Any) -> Any:
        """``command``'s reply (an error reply raises, as redis-py does)."""
        connection = self._idle.pop() if self._idle else await self._pool.get_connection()
        try:
            # redis-py's asyncio pack walks every argument in Python (about 25 for a create); the
            # commands here carry only text and integers, encoded as UTF-8 as its encoder does.
            await connection.send_packed_command(_packed(connection, command, HIREDIS_AVAILABLE))
            reply = await connection.read_response()
        except redis.exceptions.ResponseError:
            await self._keep_or_release(connection)
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            await self._pool.release(connection)
            return await self.client.execute_command(*command)
        except BaseException:
            await self._pool.release(connection)
            raise
        await self._keep_or_release(connection)
        return reply

    async def run(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``script``'s reply to ``keys`` and ``args``; a script Redis does not know (``NOSCRIPT``,
        after a restart or a ``SCRIPT FLUSH``) is sent whole with ``EVAL``, which loads it."""
        script.spec.check(script.name, keys, args)
        try:
            return await self.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await self.execute("EVAL", script.script, len(keys), *keys, *args)

    async def _keep_or_release(self, connection: Any) -> None:
        if len(self._idle) < self._keep:
            self._idle.append(connection)
        else:
            await self._pool.release(connection)

    async def close(self) -> None:
        """Give the kept connections back to the pool (before the client closes it)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._pool.release(connection)


@cache
def script_files() -> dict[str, Traversable]:
    """Every script's file, by name: the run protocol's in ``shared/lua/``, a feature's beside its
    package (``shared/<feature>/lua/``, e.g. ``shared/pipeline/lua/pipe_create.lua``).

    A script is called by its name alone, so a name is one file wherever it lives: two files
    of one name are refused (:class:`ScriptNameError`).
    """
    return _find_scripts(resources.files("shared"))


def _find_scripts(root: Traversable) -> dict[str, Traversable]:
    """The ``.lua`` files of ``root/lua/`` and of each ``root/<sub-package>/lua/``, by name."""
    packages = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.name)
    dirs = [root / "lua"] + [d / "lua" for d in packages if (d / "lua").is_dir()]
    files: dict[str, Traversable] = {}
    for d in dirs:
        for f in sorted(d.iterdir(), key=lambda f: f.name):
            if not f.name.endswith(".lua") or not f.is_file():
                continue
            name = f.name.removesuffix(".lua")
            if name in files:
                raise ScriptNameError(f"two Lua scripts are named {name!r}: {files[name]} and {f}")
            files[name] = f
    return files


def script_body(name: str) -> str:
    """A script's own text, as its file holds it (no prelude)."""
    try:
        return script_files()[name].read_text()
    except KeyError:
        raise KeyError(f"no Lua script named {name!r} in shared/lua/ or shared/*/lua/") from None


@cache
def script_source(name: str) -> str:
    """A script's source as Redis runs it: the prelude it uses (field names, helpers), then its body."""
    body = script_body(name)
    return lua_prelude(body) + body


def register_script(client: Any, name: str, connections: ScriptConnections | None = None) -> Script:
    """The script ``name`` registered on ``client`` (EVALSHA), checking each call against its spec;
    sent on the calling thread's own connection of ``connections`` when given."""
    return Script(name, client.register_script(script_source(name)), connections)


def register_scripts(client: redis.Redis, connections: ScriptConnections | None = None) -> dict[str, Script]:
    """Every script of :data:`SCRIPT_NAMES` registered on ``client`` (EVALSHA, reloaded by redis-py
    after a Redis restart), sent on the threads' kept ``connections`` (default: new ones, see
    :func:`script_connections`).

    On a cluster they are loaded on every primary at once (``SCRIPT LOAD`` goes to all of them),
    rather than on each primary's first NOSCRIPT reply; a promoted replica still gets them then.
    """
    connections = connections or script_connections(client)
    scripts = {name: register_script(client, name, connections) for name in SCRIPT_NAMES}
    if is_cluster(client):
        for script in scripts.values():
            script.sha = client.script_load(script.script)
    return scripts


def script_connections(client: Any) -> ScriptConnections | None:
    """Kept connections for the scripts of ``client``, if it is one they are for (see
    :func:`_plain_standalone`)."""
    return ScriptConnections(client) if _plain_standalone(client) else None


def _plain_standalone(client: Any) -> bool:
    """Whether ``client`` is redis-py's own standalone client over a pool (not a cluster client, a
    single-connection client or a stand-in such as the embedded mode's): the scripts' kept
    connections (:class:`ScriptConnections`) are for it only."""
    return type(client) is redis.Redis and client.connection is None


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is redis-py's cluster client (``Settings.redis_cluster``)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def run_many(
    client: Any,
    script: Script,
    calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
    *,
    raise_on_error: bool = True,
) -> list[Any]:
    """Run ``script`` once per (keys, args): pipelined in one round trip on a standalone Redis.

    The pipeline sends ``EVALSHA`` itself: redis-py's ``Script`` in a pipeline asks ``SCRIPT
    EXISTS`` first, a round trip of its own at every call. A Redis that lost its scripts (a restart,
    a ``SCRIPT FLUSH``) ran none of the calls it answered ``NOSCRIPT``; each of those goes through
    redis-py's own call, which loads the script. With ``raise_on_error`` False an error reply is
    returned in its call's place (the other calls ran) instead of raised.

    redis-py's cluster pipeline refuses scripts (their keys' slots may lie on several primaries),
    so on a cluster they are sent one after the other.
    """
    if not calls:
        return []
    for keys, args in calls:
        script.spec.check(script.name, keys, args)
    if is_cluster(client):
        replies = [_reply_or_error(script, keys, args) for keys, args in calls]
    else:
        sha = script.sha
        with client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            replies = list(pipe.execute(raise_on_error=False))
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                replies[i] = _reply_or_error(script, *calls[i], via_client=True)
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    return replies


def _reply_or_error(
    script: Script, keys: Sequence[Any], args: Sequence[Any], via_client: bool = False
) -> Any:
    """One call's reply, or the error Redis answered to it."""
    try:
        if via_client:
            return script.call_via_client(list(keys), list(args))
        return script(keys=list(keys), args=list(args))
    except redis.exceptions.ResponseError as exc:
        return exc
