"""The argument headers the message builder writes itself are the ones Celery's saferepr writes."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from celery.app.amqp import AMQP
from celery.utils.saferepr import saferepr

from producer.publishing import _POSITIONAL_BEFORE_ARGSREPR, celery_repr

FLAT: list[Any] = [
    (),
    {},
    [],
    ("a",),
    ("a", 1),
    ["x"],
    {"run_id": "5f0c", "step": 3, "version": 7, "epoch": 0, "call_id": "call_0"},
    {"text": 'it\'s \\ "quoted"\n\ttabbed é \x00'},
    ["a'b", 1, -2, None, True, False, 1.5, 1e100, float("nan"), float("-inf"), -0.0],
    {"'key'": "v", "k\\": 0},
]

#: Left to Celery: nested, long, or not plain scalars.
NOT_WRITTEN: list[Any] = [
    {"outcome": {"status": "completed"}},
    [[1]],
    {"s": "x" * 600},
    {"b": b"bytes"},
    {"t": (1, 2)},
    {1: "int key"},
]


@pytest.mark.parametrize("value", FLAT, ids=repr)
def test_plain_arguments_are_written_as_celery_writes_them(value: Any) -> None:
    assert celery_repr(value) == saferepr(value, 1024, maxlevels=3)


@pytest.mark.parametrize("value", NOT_WRITTEN, ids=lambda v: repr(v)[:40])
def test_other_arguments_are_left_to_celery(value: Any) -> None:
    assert celery_repr(value) is None


def test_the_message_factory_knows_where_celery_takes_the_argument_headers() -> None:
    parameters = list(inspect.signature(AMQP.as_task_v2).parameters)
    after_kwargs = parameters.index("argsrepr") - parameters.index("kwargs") - 1
    assert after_kwargs == _POSITIONAL_BEFORE_ARGSREPR
