"""How the registry tells a live RabbitMQ consumer from a deaf one (``worker/registry.py``).

Stand-ins for Celery's consumer and kombu's task consumer around a real (unconnected)
``amqp.Connection``; time is moved by patching the clock the watch reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import amqp
import pytest
from celery.bootsteps import CLOSE, RUN
from celery.worker import state as worker_state

from worker.registry import STOPPING, ConsumerWatch


@dataclass
class Queue:
    name: str


@dataclass
class Channel:
    is_open: bool = True
    #: Consumer tag -> callback, as py-amqp keeps them (a tag the broker cancelled is removed).
    callbacks: dict[str, Any] = field(default_factory=dict)


@dataclass
class TaskConsumer:
    queues: list[Queue]
    channel: Channel
    _active_tags: dict[str, str]


@dataclass
class KombuConnection:
    _connection: amqp.Connection
    connected: bool = True
    transport: Any = None


@dataclass
class CeleryConsumer:
    connection: KombuConnection
    task_consumer: TaskConsumer | None
    hub: Any = None
    #: Celery's consumer blueprint; its state says whether the consumer still runs.
    blueprint: Any = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


def consumer(heartbeat: int = 10) -> CeleryConsumer:
    raw = amqp.Connection("127.0.0.1:1")  # never connected: only its counters are read
    raw.heartbeat = heartbeat
    channel = Channel(callbacks={"ctag-1": print, "ctag-2": print})
    tasks = TaskConsumer(
        [Queue("wesichain"), Queue("wesichain.tools")],
        channel,
        {"wesichain": "ctag-1", "wesichain.tools": "ctag-2"},
    )
    return CeleryConsumer(KombuConnection(raw), tasks)


def test_a_consumer_hearing_the_broker_consumes(clock: Clock) -> None:
    c = consumer()
    watch = ConsumerWatch(c)
    assert watch.state() == (True, "consuming")
    for _ in range(5):
        clock.now += 8  # under a heartbeat between two looks, and a frame came in each time
        c.connection._connection.bytes_recv += 1
        assert watch.state() == (True, "consuming")


def test_silence_for_a_whole_heartbeat_is_deaf(clock: Clock) -> None:
    c = consumer(heartbeat=10)
    watch = ConsumerWatch(c)
    assert watch.state() == (True, "consuming")
    clock.now += 10
    assert watch.state() == (True, "consuming")  # one heartbeat: the broker's frame may be due
    clock.now += 2
    assert watch.state() == (False, "deaf: nothing from the broker for 12s (heartbeat 10s)")
    c.connection._connection.bytes_recv += 1  # a frame again: the way from the broker is back
    assert watch.state() == (True, "consuming")


def test_without_heartbeats_silence_says_nothing(clock: Clock) -> None:
    watch = ConsumerWatch(consumer(heartbeat=0))
    watch.state()
    clock.now += 3600
    assert watch.state() == (True, "consuming")


def test_a_new_connection_starts_its_own_count(clock: Clock) -> None:
    c = consumer(heartbeat=10)
    watch = ConsumerWatch(c)
    watch.state()
    clock.now += 30
    c.connection._connection = consumer(heartbeat=10).connection._connection  # reconnected
    assert watch.state() == (True, "consuming")


def test_a_consumer_the_broker_cancelled_is_deaf(clock: Clock) -> None:
    c = consumer()
    assert c.task_consumer is not None
    del c.task_consumer.channel.callbacks["ctag-2"]  # basic.cancel from the broker
    assert ConsumerWatch(c).state() == (False, "deaf: it has no consumer registered on wesichain.tools")


def test_a_queue_never_consumed_is_deaf(clock: Clock) -> None:
    c = consumer()
    assert c.task_consumer is not None
    del c.task_consumer._active_tags["wesichain"]
    assert ConsumerWatch(c).state() == (False, "deaf: it has no consumer registered on wesichain")


def test_a_closed_channel_is_deaf(clock: Clock) -> None:
    c = consumer()
    assert c.task_consumer is not None
    c.task_consumer.channel.is_open = False
    assert ConsumerWatch(c).state() == (False, "deaf: its consumer channel to the broker is closed")


def test_no_queues_is_not_consuming(clock: Clock) -> None:
    c = consumer()
    c.task_consumer = None
    assert ConsumerWatch(c).state() == (False, "not consuming any queue")


def test_a_dropped_connection_is_reconnecting(clock: Clock) -> None:
    c = consumer()
    c.connection.connected = False
    assert ConsumerWatch(c).state() == (False, "not connected to the broker (reconnecting)")


@dataclass
class Blueprint:
    state: int


def test_a_stopped_consumer_is_deaf(clock: Clock) -> None:
    """A consumer Celery stopped for good (its blueprint closed) while the process lives on."""
    c = consumer()
    watch = ConsumerWatch(c)
    c.blueprint = Blueprint(RUN)
    assert watch.state() == (True, "consuming")
    c.blueprint = Blueprint(CLOSE)
    assert watch.state() == (False, "deaf: its consumer stopped")


@pytest.mark.parametrize("asked", ["should_stop", "should_terminate"])
def test_a_consumer_closed_by_a_shutdown_is_stopping_not_deaf(
    monkeypatch: pytest.MonkeyPatch, asked: str
) -> None:
    # A warm or cold shutdown closes the consumer on purpose: not consuming, and nothing to report
    # as an error (every deploy would log one); closed with no shutdown asked, it is deaf.
    c = consumer()
    c.blueprint = Blueprint(CLOSE)
    assert ConsumerWatch(c).state() == (False, "deaf: its consumer stopped")
    monkeypatch.setattr(worker_state, asked, 0)
    assert ConsumerWatch(c).state() == (False, STOPPING)
