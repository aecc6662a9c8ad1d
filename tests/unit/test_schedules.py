"""Schedule timings: parsing, next fire times, daylight-saving changes, and what an outage's
backlog of due ticks comes to under each missed policy (``shared/schedules.py``)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from shared.errors import InvalidRequest
from shared.schedules import Timing, due_plan, tick_key

NY = ZoneInfo("America/New_York")


def _at(*parts: int, tz: ZoneInfo = NY) -> int:
    year, month, day, hour, minute, *rest = parts
    second = rest[0] if rest else 0
    return int(datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp())


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"cron": "* * * * *", "every_s": 5},
        {"cron": "not cron"},
        {"cron": "* * * * * * *"},  # croniter takes a seventh field (years); the docs say 5 or 6
        {"cron": "* * * * *", "timezone": "Mars/Olympus"},
        {"cron": "* * * * *", "anchor": 5},
        {"every_s": 0},
        {"every_s": 10, "timezone": "Europe/Paris"},
        {"every_s": 400 * 24 * 3600},
        {"cron": "x" * 500},
        {"every_s": 5, "extra": 1},
    ],
)
def test_bad_timings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Timing.model_validate(fields)


def test_an_interval_counts_from_its_anchor() -> None:
    timing = Timing(every_s=10, anchor=1000)
    assert timing.next_after(0) == 1000
    assert timing.next_after(999) == 1000
    assert timing.next_after(1000) == 1010
    assert timing.next_after(1009) == 1010
    assert timing.at_or_before(999) is None
    assert timing.at_or_before(1000) == 1000
    assert timing.at_or_before(1019) == 1010
    ticks = timing.ticks_from(1010)
    assert [next(ticks) for _ in range(3)] == [1010, 1020, 1030]
    assert Timing(every_s=60).anchored(500).anchor == 500
    assert Timing(every_s=60, anchor=7).anchored(500).anchor == 7


def test_cron_fire_times_in_a_time_zone() -> None:
    timing = Timing(cron="0 9 * * 1-5", timezone="America/New_York")
    friday_noon = _at(2024, 5, 3, 12, 0)
    # The next ones after Friday noon: Monday and Tuesday at 09:00 New York time.
    ticks = timing.ticks_from(timing.next_after(friday_noon))
    assert [next(ticks) for _ in range(2)] == [_at(2024, 5, 6, 9, 0), _at(2024, 5, 7, 9, 0)]
    assert timing.at_or_before(_at(2024, 5, 6, 9, 0)) == _at(2024, 5, 6, 9, 0)
    assert timing.at_or_before(_at(2024, 5, 6, 8, 59)) == _at(2024, 5, 3, 9, 0)
    seconds = Timing(cron="* * * * * */15")  # six fields: seconds last
    assert seconds.next_after(_at(2024, 1, 1, 0, 0, 1, tz=ZoneInfo("UTC"))) == _at(
        2024, 1, 1, 0, 0, 15, tz=ZoneInfo("UTC")
    )


def test_a_cron_that_never_fires_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="never fires"):
        Timing(cron="0 0 31 2 *").next_after(0)


def test_a_skipped_local_time_fires_after_the_gap_and_a_repeated_one_twice() -> None:
    # 2024-03-10: New York clocks go from 02:00 to 03:00; 02:30 does not exist that day.
    daily = Timing(cron="30 2 * * *", timezone="America/New_York")
    ticks = daily.ticks_from(daily.next_after(_at(2024, 3, 9, 12, 0)))
    assert [next(ticks) for _ in range(2)] == [_at(2024, 3, 10, 3, 0), _at(2024, 3, 11, 2, 30)]
    # 2024-11-03: clocks go from 02:00 back to 01:00; 01:30 happens twice, an hour apart.
    repeated = Timing(cron="30 1 * * *", timezone="America/New_York")
    first = repeated.next_after(_at(2024, 11, 2, 12, 0))
    ticks = repeated.ticks_from(first)
    assert [next(ticks) for _ in range(3)] == [first, first + 3600, _at(2024, 11, 4, 1, 30)]


def test_nothing_is_due_before_the_next_tick() -> None:
    assert due_plan(Timing(every_s=10, anchor=0), 100, 99, keep=5) is None


def test_a_tick_merely_late_is_fired_not_missed() -> None:
    timing = Timing(every_s=10, anchor=0)
    assert due_plan(timing, 100, 100, keep=1) == (100, 0)
    assert due_plan(timing, 100, 109, keep=1) == (100, 0)


def test_skip_starts_only_the_newest_due_tick() -> None:
    timing = Timing(every_s=10, anchor=0)
    # Due: 100, 110, ..., 150 (six ticks); skip keeps 150 and passes over five.
    assert due_plan(timing, 100, 155, keep=1) == (150, 5)


def test_catch_up_starts_the_newest_n_oldest_first() -> None:
    timing = Timing(every_s=10, anchor=0)
    assert due_plan(timing, 100, 155, keep=10) == (100, 0)  # all six fit
    assert due_plan(timing, 100, 155, keep=6) == (100, 0)
    assert due_plan(timing, 100, 155, keep=4) == (120, 2)
    cron = Timing(cron="*/5 * * * *")
    start = _at(2024, 1, 1, 0, 0, tz=ZoneInfo("UTC"))
    now = start + 3600 + 10  # 13 ticks due: 00:00 .. 01:00
    assert due_plan(cron, start, now, keep=20) == (start, 0)
    assert due_plan(cron, start, now, keep=3) == (start + 50 * 60, 10)
    assert due_plan(cron, start, now, keep=1) == (start + 3600, 12)


def test_tick_keys_are_deterministic_per_schedule_and_tick() -> None:
    assert tick_key("abc", 100) == tick_key("abc", 100)
    assert len({tick_key("abc", 100), tick_key("abc", 101), tick_key("abd", 100)}) == 3
