"""What a schedule change, an end date, a pipeline schedule and the scheduler's hooks come to, without
servers: the end date's first and last ticks, the policies' checks, the PATCH body (a null end date
removes it, a missing one keeps it), the CLI's update, and which hooks a scheduler installs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producer.api.schedules import ScheduleBody, ScheduleUpdate
from producer.cli import _parser
from producer.scheduler import load_scheduler_hooks
from producer.schedules import SchedulerHooks, _check_policies, _first_tick, _starting_tick
from shared.errors import ConfigError, InvalidRequest
from shared.protocol import SCHED_ENDED
from shared.schedules import Schedule, Timing, tick_pipeline_id
from shared.scripts import SPECS
from worker.testing.faults import ChaosHooks


def test_an_end_date_stops_the_ticks_after_it() -> None:
    every = Timing(every_s=10, anchor=1000)
    assert _first_tick(every, 1000, None) == 1010
    assert _first_tick(every, 1000, 1010) == 1010
    assert _first_tick(every, 1000, 1009) == int(SCHED_ENDED) == 0
    with pytest.raises(InvalidRequest, match="never fire"):
        _starting_tick(every, 1000, 1005)


@pytest.mark.parametrize(
    ("missed", "catch_up", "overlap", "kept"),
    [("skip", 50, "skip", 1), ("catch_up", 50, "enqueue", 50), ("catch_up", 1000, "allow", 1000)],
)
def test_the_policies_come_to_how_many_missed_ticks_start(
    missed: str, catch_up: int, overlap: str, kept: int
) -> None:
    assert _check_policies(missed, catch_up, overlap) == kept


@pytest.mark.parametrize(
    ("missed", "catch_up", "overlap"),
    [
        ("never", 1, "skip"),
        ("catch_up", 0, "skip"),
        ("catch_up", 1001, "skip"),
        ("catch_up", True, "skip"),
        ("skip", 1, "queue"),
    ],
)
def test_bad_policies_are_refused(missed: str, catch_up: int, overlap: str) -> None:
    with pytest.raises(InvalidRequest):
        _check_policies(missed, catch_up, overlap)


def test_a_pipeline_schedules_tick_has_a_deterministic_pipeline_id() -> None:
    assert tick_pipeline_id("abc123", 1700000000) == "schedule-abc123-1700000000"
    view = Schedule(
        schedule_id="abc123",
        pipeline="chain",
        input="x",
        timing=Timing(every_s=5, anchor=0),
        missed="skip",
        catch_up=1,
        overlap="skip",
        created_at=0.0,
    )
    assert view.agent is None and view.run_thread is None


def test_the_patch_body_tells_a_removed_end_date_from_a_kept_one() -> None:
    kept = ScheduleUpdate.model_validate({"input": "new"})
    removed = ScheduleUpdate.model_validate({"until": None})
    assert "until" not in kept.model_fields_set
    assert "until" in removed.model_fields_set and removed.until is None
    for bad in ({"agent": "other"}, {"thread_id": "t"}, {"catch_up": 0}, {"until": -1}, {"tenant": "x"}):
        with pytest.raises(ValidationError):
            ScheduleUpdate.model_validate(bad)
    created = ScheduleBody.model_validate({"pipeline": "chain", "input": "x", "timing": {"every_s": 5}})
    assert (created.agent, created.pipeline) == (None, "chain")


def test_the_schedule_scripts_declare_what_they_take() -> None:
    assert SPECS["schedule_update"].args == ("expected", "spec", "next_tick", "member")
    assert SPECS["schedule_advance"].args[-1] == "decision"


def test_the_cli_updates_a_schedule_and_goes_over_the_api() -> None:
    parser, _ = _parser()
    args = parser.parse_args(
        ["schedules", "update", "abc", "--every", "60", "--no-until", "--api", "http://x", "--key", "k"]
    )
    assert (args.schedule_id, args.every, args.no_until, args.api) == ("abc", 60, True, "http://x")
    with pytest.raises(SystemExit):
        parser.parse_args(["schedules", "update", "abc", "--until", "5", "--no-until"])
    created = parser.parse_args(
        ["schedules", "create", "chain", "x", "--every", "5", "--pipeline", "--until", "9"]
    )
    assert created.pipeline and created.until == 9


def test_a_scheduler_installs_scheduler_hooks_and_ignores_a_workers_own() -> None:
    assert type(load_scheduler_hooks("")) is SchedulerHooks
    assert type(load_scheduler_hooks("worker.hooks:Hooks")) is SchedulerHooks
    assert isinstance(load_scheduler_hooks("worker.testing.faults:ChaosHooks"), ChaosHooks)
    with pytest.raises(ConfigError):
        load_scheduler_hooks("no.such.module:Hooks")
