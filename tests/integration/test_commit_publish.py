"""Commit and publish in one step: the commit script pushes the next phase's Celery message itself.

The message must be exactly what Celery puts on the broker (it is built by Celery's ``send_task``
and kombu's Redis channel), a real worker must consume and acknowledge it, and task events must
show its tasks like any other (sent, received, succeeded). Redis's MONITOR tells who pushed each
message: a script (``lua``) or a client.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis
from celery import Celery

from producer.client import Client
from producer.publishing import PUBLISH_ERRORS, MessageBuilder, publish_commands, run_commands
from shared.protocol import QUEUED_CHECKS, QUEUED_UNSENT
from shared.settings import ENV_BROKER_URL, QUEUE_CALLBACKS, QUEUE_MODEL, QUEUE_TOOLS, celery_config
from shared.state import Phase, RunHead, TaskSpec
from shared.tasks import TASK_CALLBACK, TASK_THINK, TASK_TOOL, start_task
from tests.broker import Settings
from tests.conftest import _need_redis
from tests.harness import RedisServer, WorkerProcess, wait_until
from worker.acks import ACKED_IN_COMMIT
from worker.app import create_app

pytestmark = pytest.mark.redis_broker

SPECS = [
    TaskSpec(
        name=TASK_THINK,
        task_id="r1:v2:think",
        arguments={"run_id": "r1", "step": 1, "version": 2, "epoch": 0},
    ),
    TaskSpec(
        name=TASK_TOOL,
        task_id="r1:v3:tool:c1:e2",
        arguments={"run_id": "r1", "step": 1, "version": 3, "epoch": 2, "call_id": "c1"},
        time_limit_s=17.0,
    ),
    TaskSpec(
        name=TASK_CALLBACK,
        task_id="r1:v9:callback",
        arguments={"run_id": "r1", "step": 4, "version": 9, "epoch": 0, "phase": "completed"},
    ),
    # Arguments the builder writes the argsrepr/kwargsrepr headers of itself, and nested ones it
    # leaves to Celery: the headers must be Celery's either way.
    TaskSpec(
        name=TASK_THINK,
        task_id="r1:v4:think",
        arguments={"run_id": 'it\'s \\ "q"\né', "step": 2, "version": 4, "epoch": 0, "late": None},
        args=["a'b", 1.5, True, None],
    ),
    TaskSpec(
        name=TASK_CALLBACK,
        task_id="r1:v9:callback:e1",
        arguments={},
        args=[{"run_id": "r1", "status": "completed", "usage": {"tokens": 3}, "output": "x" * 700}],
    ),
]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    _need_redis()
    s = RedisServer().start()
    yield s
    s.cleanup()


def _queue_keys(r: redis.Redis) -> list[str]:
    return sorted(str(k) for k in r.keys("wesichain.*"))


def _comparable(raw: str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw)
    message["properties"].pop("delivery_tag")  # a fresh uuid per publish, in both paths
    message["properties"].pop("reply_to")  # the address of the sending app (one per app object)
    return message


def test_the_built_message_is_the_one_celery_publishes(server: RedisServer) -> None:
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    app = create_app(settings)
    # Celery as it comes, with the runtime's configuration: what its send_task publishes.
    celery = Celery("wesichain", set_as_current=False)
    celery.conf.update(celery_config(settings))
    r = server.client()
    builder = MessageBuilder(app)
    try:
        for spec in SPECS:
            celery.send_task(
                spec.name,
                args=spec.args or None,
                kwargs=spec.arguments or None,
                task_id=spec.task_id,
                time_limit=spec.time_limit_s,
                queue=spec.queue,
            )
            (key,) = _queue_keys(r)
            celerys = r.lpop(key)
            commands = builder.build([spec])
            assert [(name, args[0]) for name, args in commands] == [("lpush", key)]
            assert _comparable(commands[0][1][1]) == _comparable(str(celerys))
            assert (
                key
                == {TASK_THINK: QUEUE_MODEL, TASK_TOOL: QUEUE_TOOLS, TASK_CALLBACK: QUEUE_CALLBACKS}[
                    spec.name
                ]
            )
        # Run as the fallback publish (on the store's client), they put the same message there.
        run_commands(r, builder.build(SPECS[:1]))
        (raw,) = r.lrange(QUEUE_MODEL, 0, -1)
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        assert body[1] == SPECS[0].arguments
    finally:
        builder.close()
        celery.close()


def _pushed(r: redis.Redis) -> list[tuple[str, str]]:
    """Every message on a queue list, with its list, taken off the lists."""
    found = []
    for key in sorted(str(k) for k in r.keys("*")):
        if r.type(key) == "list":
            found += [(key, str(raw)) for raw in r.lrange(key, 0, -1)]
            r.delete(key)
    return found


def test_the_clients_start_message_is_the_one_celery_publishes(server: RedisServer) -> None:
    """A run's start is published from its kind's template on the store's client: the same bytes
    as Celery's send_task, on the same queue list (namespaces included), the first one before anything
    declared its queue (a run submitted before any worker started)."""
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    client = Client(settings)
    celery = Celery("wesichain-producer", set_as_current=False)
    celery.conf.update(celery_config(settings))
    r = server.client()
    try:
        assert client._messages is not None  # the broker is the store's Redis
        for spec in [
            start_task("r1"),
            start_task("r2"),  # from the template
            start_task("r3", namespace="tenant-a"),
            start_task("r4", version=3, epoch=2, namespace="tenant-a"),
        ]:
            client.send_run_task(spec)
            ((key, clients),) = _pushed(r)
            celery.send_task(spec.name, kwargs=spec.arguments, task_id=spec.task_id, queue=spec.queue)
            ((celerys_key, celerys),) = _pushed(r)
            assert key == celerys_key
            assert _comparable(clients) == _comparable(celerys)
            assert json.loads(clients)["headers"]["id"] == spec.task_id
    finally:
        client.close()
        celery.close()


def test_a_start_publish_to_an_unreachable_store_raises_a_publish_error(server: RedisServer) -> None:
    """The store's Redis unreachable at the start's publish: the publish raises what send_task
    raises for a broker it cannot reach, which the client catches to mark the start unsent for the sweeper."""
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    client = Client(settings)
    try:
        assert client._messages is not None
        commands = client._messages.build([start_task("r1")])
        dead = redis.Redis(port=1, socket_connect_timeout=1)  # nothing listens on port 1
        with pytest.raises(PUBLISH_ERRORS):
            publish_commands(dead, commands)
    finally:
        client.close()


def _watch(
    r: redis.Redis, stop: threading.Event, seen: list[str], by_port: list[tuple[int, str]] | None = None
) -> None:
    with r.monitor() as monitor:
        for command in monitor.listen():
            seen.append(f"{command['client_type']} {command['command']}")
            if by_port is not None:
                by_port.append((int(command.get("client_port") or 0), str(command["command"])))
            if stop.is_set():
                return


def _events(pubsub: Any, stop: threading.Event, events: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        message = pubsub.get_message(timeout=0.2)
        if message is None or message["type"] != "pmessage":
            continue
        body = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
        events.extend(body if isinstance(body, list) else [body])  # the worker sends some in groups


def _one_hop_phases(client: Client) -> list[str]:
    """Run ``one_hop`` to its end; the id prefixes of its tasks after the start (which the submit
    publishes): think, tool, observe, think."""
    handle = client.submit("one_hop", "go", check_agent=False)
    head = handle.wait(30)
    assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
    run = handle.run_id
    return [f"{run}:v2:think", f"{run}:v3:tool:", f"{run}:v4:observe", f"{run}:v5:think"]


class _Watched:
    """What a Redis server runs (MONITOR) and the Celery task events published on it, from the
    moment it is built until :meth:`pushes` is asked."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.stop = threading.Event()
        self.commands: list[str] = []
        #: The same commands, each with the port of the client connection that sent it.
        self.seen: list[tuple[int, str]] = []
        self.events: list[dict[str, Any]] = []
        self.pubsub = server.client().pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe("*celeryev*")
        self.threads = [
            threading.Thread(
                target=_watch, args=(server.client(), self.stop, self.commands, self.seen), daemon=True
            ),
            threading.Thread(target=_events, args=(self.pubsub, self.stop, self.events), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def reported(self, task_ids: list[str], kind: str) -> bool:
        """Whether an event of ``kind`` was published for each task whose id starts so."""
        return all(
            any(e["type"] == kind and str(e.get("uuid", "")).startswith(i) for e in self.events)
            for i in task_ids
        )

    def pushes(self) -> list[str]:
        """Every ``LPUSH`` the server ran, as ``"<client type> <command>"`` (watching ends)."""
        self.stop.set()
        self.server.client().ping()  # one more command for the monitor to wake on
        for t in self.threads:
            t.join(10)
        return [c.replace('\\"', '"') for c in self.commands if c.split(" ", 2)[1].upper() == "LPUSH"]

    def close(self) -> None:
        self.stop.set()
        self.pubsub.close()


def test_a_real_worker_consumes_acks_and_reports_what_the_commit_pushed(
    server: RedisServer, tmp_path: Any
) -> None:
    worker = WorkerProcess(
        "inline",
        server.url,
        concurrency=2,
        env={"WESICHAIN_TASK_EVENTS": "1"},
        log_dir=str(tmp_path),
    ).start()
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    r = server.client()
    watched = _Watched(server)
    try:
        ids = _one_hop_phases(client)
        wait_until(
            lambda: watched.reported(ids, "task-succeeded"),
            30,
            interval=0.1,
            what="task-succeeded events of every phase",
        )
        for prefix in ids:
            kinds = {e["type"] for e in watched.events if str(e.get("uuid", "")).startswith(prefix)}
            assert {"task-sent", "task-received", "task-started", "task-succeeded"} <= kinds, prefix
        # Acknowledged: nothing left unacked or queued.
        wait_until(lambda: r.hlen("unacked") == 0, 10, what="every message acked")
        assert r.llen(QUEUE_MODEL) == 0 and r.llen(QUEUE_TOOLS) == 0
        # Pushed by the commit scripts, not by a client: each phase message's LPUSH ran in Lua.
        pushes = watched.pushes()
        for prefix in ids:
            # A message names its own id, and its parent's (the task that published it).
            (push,) = [c for c in pushes if f'"id": "{prefix}' in c]
            assert push.startswith("lua "), push
    finally:
        watched.close()
        client.close()
        worker.stop()


@pytest.mark.parametrize("task_events", [False, True], ids=["templates", "task-events"])
def test_a_worker_beside_a_standalone_redis_broker_pushes_celerys_messages_there(
    server: RedisServer, tmp_path: Any, task_events: bool
) -> None:
    """With the broker a standalone Redis of its own (as beside a Redis Cluster run state), no
    commit script can push on it: each next phase is published after its commit, as the commands
    :class:`MessageBuilder` builds (from its kind's template, or by ``send_task`` into the
    collector when task events are on), run on the worker's kept client of the broker. Every phase
    arrives there from a client, is consumed and acknowledged, and, with task events on, each is
    reported sent, as Celery's own publish reports it."""
    broker = RedisServer().start()
    env = {ENV_BROKER_URL: broker.url, "WESICHAIN_TASK_EVENTS": "1" if task_events else "0"}
    worker = WorkerProcess("beside", server.url, concurrency=2, env=env, log_dir=str(tmp_path)).start()
    client = Client(
        Settings(redis_url=server.url, broker_url=broker.url, agents_module="tests.agents_fixture")
    )
    b = broker.client()
    watched = _Watched(broker)
    try:
        ids = _one_hop_phases(client)
        wait_until(lambda: b.hlen("unacked") == 0, 10, what="every message acked")
        assert b.llen(QUEUE_MODEL) == 0 and b.llen(QUEUE_TOOLS) == 0
        # Nothing of the broker's on the run state's server.
        assert _queue_keys(server.client()) == [] and not server.client().exists("unacked")
        if task_events:
            wait_until(lambda: watched.reported(ids, "task-sent"), 30, interval=0.1, what="every phase sent")
        # Pushed by a client (the worker's, or the submitting one's), not by a script.
        pushes = watched.pushes()
        for prefix in ids:
            (push,) = [c for c in pushes if f'"id": "{prefix}' in c]
            assert not push.startswith("lua "), push
    finally:
        watched.close()
        client.close()
        worker.stop()
        broker.cleanup()


def test_each_phase_s_message_is_acknowledged_by_the_commit_that_ends_it(
    server: RedisServer, tmp_path: Any
) -> None:
    """kombu's ack (the message's removal from the unacked hash and its index) runs in the commit
    script that ends the delivery's work, and the worker's main process sends none of its own."""
    worker = WorkerProcess("acks", server.url, log_dir=str(tmp_path)).start()
    client = Client(Settings(redis_url=server.url, agents_module="tests.agents_fixture"))
    r = server.client()
    stop = threading.Event()
    commands: list[str] = []
    watcher = threading.Thread(target=_watch, args=(server.client(), stop, commands), daemon=True)
    watcher.start()
    try:
        wait_until(lambda: r.ping() and commands, 10, interval=0.05, what="MONITOR to stream")
        handle = client.submit("one_hop", "go", check_agent=False)
        head = handle.wait(30)
        assert head.phase is Phase.COMPLETED and head.answer == "1 + 2 = 3"
        wait_until(lambda: r.hlen("unacked") == 0, 10, what="every message acked")
        assert r.zcard("unacked_index") == 0
        stop.set()
        r.ping()  # one more command for the monitor to wake on
        watcher.join(10)
        acks = [c.split(" ") for c in commands]
        acks = [c for c in acks if c[1:3] in (["HDEL", "unacked"], ["ZREM", "unacked_index"])]
        # start, think, the tool, observe, the last think: five deliveries, five acks in Lua.
        in_scripts = [c for c in acks if c[0] == "lua"]
        assert len([c for c in in_scripts if c[1] == "HDEL"]) == 5, acks
        assert len([c for c in in_scripts if c[1] == "ZREM"]) == 5, acks
        assert [c for c in acks if c[0] != "lua"] == []
    finally:
        stop.set()
        client.close()
        worker.stop()


def test_beside_a_standalone_broker_each_message_is_acknowledged_by_the_publish_after_its_commit(
    server: RedisServer, tmp_path: Any
) -> None:
    """With the broker a Redis of its own, no commit script reaches it: the removal of a delivery's
    message from kombu's unacked hash and its index runs in one transaction with the publish that
    follows its commit (alone, after the run's last commit), sent by the pool process, and the
    worker's main process sends none of its own."""
    broker = RedisServer().start()
    worker = WorkerProcess(
        "acks-beside", server.url, env={ENV_BROKER_URL: broker.url}, log_dir=str(tmp_path)
    ).start()
    client = Client(
        Settings(redis_url=server.url, broker_url=broker.url, agents_module="tests.agents_fixture")
    )
    b = broker.client()
    watched = _Watched(broker)
    try:
        wait_until(lambda: b.ping() and watched.seen, 10, interval=0.05, what="MONITOR to stream")
        _one_hop_phases(client)
        wait_until(lambda: b.hlen("unacked") == 0, 10, what="every message acked")
        assert b.zcard("unacked_index") == 0
        # Which of the worker's processes holds each of its connections to the broker.
        owner: dict[int, str] = {}
        for pid in worker.pids():
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == broker.port:
                    owner[conn.laddr.port] = "main" if pid == worker.pid else "child"
        watched.pushes()  # the end of what is watched
        by_port: dict[int, list[str]] = {}
        for port, command in watched.seen:
            by_port.setdefault(port, []).append(command.split(" ")[0].upper())
        ack_commands = ("HDEL unacked ", "ZREM unacked_index ")
        acks = [(owner.get(port, "other"), c) for port, c in watched.seen if c.startswith(ack_commands)]
        # start, think, the tool, observe, the last think: five deliveries, five acks, each in a
        # transaction of a pool process's, none from the main process.
        assert sorted(who for who, c in acks if c.startswith("HDEL")) == ["child"] * 5, acks
        assert sorted(who for who, c in acks if c.startswith("ZREM")) == ["child"] * 5, acks
        for port, commands in by_port.items():
            if owner.get(port) == "child" and "HDEL" in commands:
                assert commands.count("MULTI") == commands.count("EXEC") >= commands.count("HDEL"), commands
    finally:
        watched.close()
        client.close()
        worker.stop()
        broker.cleanup()


def test_beside_a_standalone_broker_an_ack_goes_only_with_a_publish_the_broker_took(
    server: RedisServer,
) -> None:
    """The runtime's publish that carries its delivery's acknowledgement, in a worker's own process:
    taken, the message is on the broker and the entry gone from kombu's unacked hash, and the task
    says so to the main process; refused (a broker that is gone), nothing is acknowledged, the
    outbox is marked unsent for a sweeper to send and the publish error raised, as for any publish;
    the acknowledgement alone refused (the run's last commit publishes nothing) is left to kombu."""
    broker = RedisServer().start()
    b = broker.client()
    try:
        live = create_app(
            Settings(redis_url=server.url, broker_url=broker.url, agents_module="tests.agents_fixture")
        )
        rt = live.wesichain_runtime.get()
        assert rt.acks is not None
        run_id = uuid.uuid4().hex
        assert rt.store.create(RunHead.new_idle(run_id, "one_hop", "go"), [start_task(run_id)])
        b.hset("unacked", "tag-1", "[]")
        b.zadd("unacked_index", {"tag-1": 1.0})
        rt.acks.begin(run_id, "tag-1")
        rt.publish([start_task(run_id)], 0, acking=run_id)
        assert rt.acks.end() == ACKED_IN_COMMIT
        assert b.hlen("unacked") == 0 and b.zcard("unacked_index") == 0
        (raw,) = b.lrange(QUEUE_MODEL, 0, -1)
        assert json.loads(raw)["headers"]["id"] == start_task(run_id).task_id

        gone = RedisServer().start()
        gone.cleanup()  # a port where a broker was and is no more
        dead = create_app(
            Settings(redis_url=server.url, broker_url=gone.url, agents_module="tests.agents_fixture")
        )
        rt = dead.wesichain_runtime.get()
        assert rt.acks is not None
        rt.acks.begin(run_id, "tag-2")
        with pytest.raises(PUBLISH_ERRORS):
            rt.publish([start_task(run_id)], 0, acking=run_id)
        assert rt.acks.end() is None  # not acknowledged: the main process acknowledges it
        assert rt.store.redis.hget(rt.store.keys.run(run_id), QUEUED_CHECKS) == str(QUEUED_UNSENT)
        rt.acks.begin(run_id, "tag-3")
        rt.publish([], 0, acking=run_id)  # no error: only an acknowledgement was to go
        assert rt.acks.end() is None
    finally:
        broker.cleanup()


def _another(spec: TaskSpec, n: int) -> TaskSpec:
    """A task of the same kind as ``spec`` (name, queue, time limit, argument names), other values."""
    arguments = {k: (f"{v}-{n}" if isinstance(v, str) else v) for k, v in spec.arguments.items()}
    return spec.model_copy(update={"task_id": f"{spec.task_id}:{n}", "arguments": arguments})


def test_a_message_built_from_its_kind_s_template_is_the_one_celery_publishes(server: RedisServer) -> None:
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    app = create_app(settings)
    celery = Celery("wesichain", set_as_current=False)
    celery.conf.update(celery_config(settings))
    r = server.client()
    builder = MessageBuilder(app)
    try:
        for spec in SPECS:
            builder.build([spec])  # the first of its kind: send_task, kept as the template
            for n in (1, 2):
                again = _another(spec, n)
                celery.send_task(
                    again.name,
                    args=again.args or None,
                    kwargs=again.arguments or None,
                    task_id=again.task_id,
                    time_limit=again.time_limit_s,
                    queue=again.queue,
                )
                (key,) = _queue_keys(r)
                celerys = r.lpop(key)
                commands = builder.build([again])
                assert [(name, args[0]) for name, args in commands] == [("lpush", key)]
                assert _comparable(commands[0][1][1]) == _comparable(str(celerys)), again
        # Every kind of plain arguments got its template; the fifth spec's argument is nested, and
        # only send_task writes its headers.
        assert len(builder._templates) == 4, builder._templates
    finally:
        builder.close()
        celery.close()


def test_inside_a_task_a_templated_message_names_it_as_parent_and_root_as_send_task_does(
    server: RedisServer,
) -> None:
    settings = Settings(redis_url=server.url, agents_module="tests.agents_fixture")
    app = create_app(settings)
    builder = MessageBuilder(app)
    spec = SPECS[0]
    builder.build([spec])  # the template, outside any task
    seen: dict[str, Any] = {}

    @app.task(name="tests.publish_inside")
    def publish_inside() -> None:
        again = _another(spec, 7)
        seen["templated"] = builder.build([again])
        seen["sent"] = builder._send_tasks([again])

    try:
        publish_inside.apply(task_id="outer-task")
        templated, sent = seen["templated"], seen["sent"]
        assert _comparable(templated[0][1][1]) == _comparable(sent[0][1][1])
        headers = json.loads(templated[0][1][1])["headers"]
        assert (headers["parent_id"], headers["root_id"]) == ("outer-task", "outer-task")
    finally:
        builder.close()
