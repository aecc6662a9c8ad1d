"""Every event kind builds: their validators and serializers are built on first use (``defer_build``),
so a kind whose schema cannot build must fail here rather than in the middle of a run."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import BaseModel

from shared.events import EVENT_ADAPTER, EVENT_KINDS, Event, RunStarted, dump_event, load_event

KINDS: list[type[BaseModel]] = list(get_args(get_args(Event)[0]))


def test_the_union_lists_every_kind() -> None:
    assert [k.model_fields["kind"].default for k in KINDS] == list(EVENT_KINDS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_kind_builds(kind: type[BaseModel]) -> None:
    kind.model_rebuild(force=True)
    assert kind.__pydantic_complete__
    assert kind.model_json_schema()["title"] == kind.__name__


def test_the_union_reads_back_what_a_worker_writes() -> None:
    EVENT_ADAPTER.rebuild(force=True)
    event = RunStarted(run_id="r1", step=0, agent="a", agent_version="1", model="scripted:x")
    assert load_event(dump_event(event)) == event
