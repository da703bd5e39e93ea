"""Cron schedules with a fake clock: which ticks fire, once each, across restarts and downtime."""

from __future__ import annotations

import dataclasses
import datetime
from zoneinfo import ZoneInfo

import pytest

from cronoq.broker.schedules import Schedule, ScheduleClock, ScheduleError

HOUR = 3600.0
T0 = datetime.datetime(2026, 3, 2, 12, 0, tzinfo=datetime.timezone.utc).timestamp()  # a Monday, on the hour


def hourly(**changes) -> Schedule:
    return dataclasses.replace(Schedule("hourly", "0 * * * *"), **changes)


def test_a_new_schedule_owes_nothing_for_the_past_and_fires_on_each_tick_once():
    clock = ScheduleClock((hourly(),), {}, started_at=T0 + 10)
    assert clock.next_wakeup() == T0 + HOUR
    assert clock.due(T0 + HOUR - 1) == []
    assert [tick for _, tick in clock.due(T0 + HOUR)] == [T0 + HOUR]
    assert clock.due(T0 + HOUR + 5) == []  # never twice
    assert clock.next_wakeup() == T0 + 2 * HOUR
    assert clock.last_fired == {"hourly": T0 + HOUR}


def test_ticks_missed_while_down_run_once_on_start():
    clock = ScheduleClock((hourly(),), {"hourly": T0}, started_at=T0 + 5 * HOUR + 30)
    assert [tick for _, tick in clock.due(T0 + 5 * HOUR + 30)] == [T0 + 5 * HOUR]  # the latest, once
    assert clock.due(T0 + 5 * HOUR + 31) == []
    assert clock.next_wakeup() == T0 + 6 * HOUR


def test_catch_up_false_skips_missed_ticks():
    clock = ScheduleClock((hourly(catch_up=False),), {"hourly": T0}, started_at=T0 + 5 * HOUR + 30)
    assert clock.due(T0 + 5 * HOUR + 30) == []
    assert clock.next_wakeup() == T0 + 6 * HOUR


def test_a_restart_between_ticks_does_not_fire_again():
    clock = ScheduleClock((hourly(),), {"hourly": T0 + HOUR}, started_at=T0 + HOUR + 60)
    assert clock.due(T0 + HOUR + 60) == []
    assert clock.next_wakeup() == T0 + 2 * HOUR


def test_a_loop_that_fell_behind_fires_the_latest_tick_once():
    clock = ScheduleClock((hourly(),), {}, started_at=T0)
    assert [tick for _, tick in clock.due(T0 + 3 * HOUR + 1)] == [T0 + 3 * HOUR]
    assert clock.next_wakeup() == T0 + 4 * HOUR


def test_time_zones_follow_local_wall_clock_time():
    nine_in_berlin = Schedule("standup", "0 9 * * 1-5", timezone="Europe/Berlin")
    tick = nine_in_berlin.next_tick(T0)
    local = datetime.datetime.fromtimestamp(tick, ZoneInfo("Europe/Berlin"))
    assert (local.weekday(), local.hour, local.minute) == (1, 9, 0)  # Tuesday 09:00 local
    # Across the spring change (29 March 2026), still 09:00 local.
    after_dst = datetime.datetime(2026, 3, 29, 12, tzinfo=datetime.timezone.utc).timestamp()
    local = datetime.datetime.fromtimestamp(nine_in_berlin.next_tick(after_dst), ZoneInfo("Europe/Berlin"))
    assert (local.day, local.hour) == (30, 9)


def test_a_seconds_field_allows_fine_schedules_and_keys_name_the_tick():
    every_two = Schedule("fast", "* * * * * */2")
    assert every_two.next_tick(T0 + 0.5) == T0 + 2
    assert every_two.key(T0 + 2) == f"cronoq:schedule:fast:{int(T0 + 2)}"  # a namespace clients may not write
    assert every_two.former_key(T0 + 2) == f"schedule:fast:{int(T0 + 2)}"  # as versions before that keyed it


@pytest.mark.parametrize("cron, zone, problem", [
    ("* * *", "UTC", "five-field"),
    ("99 * * * *", "UTC", "not a valid cron"),
    ("* * * * *", "Nowhere/Town", "unknown time zone"),
])
def test_invalid_schedules_are_refused(cron, zone, problem):
    with pytest.raises(ScheduleError, match=problem):
        Schedule("bad", cron, timezone=zone)
