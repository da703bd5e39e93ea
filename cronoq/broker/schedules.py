"""Cron schedules: which ticks are due, given the time and what already fired.

`[[schedules]]` in the broker's config submit a task on every tick of a
standard five-field cron expression, read in the schedule's time zone. The
broker asks `ScheduleClock.due(now)` on each pass and sleeps until
`next_wakeup()`; the clock reads no time of its own.

Once per tick, across restarts: the broker remembers the last tick fired per
schedule, and each tick's task carries the idempotency key
`cronoq:schedule:<name>:<tick>`, so a tick submitted just before a crash is
not submitted again after it. Keys starting with `cronoq:` are the
broker's own: clients may not submit them, so no client can claim a tick
ahead of its schedule. Ticks missed while the broker was down run once
(the latest of them) on start, or are skipped with `catch_up = false`.

A sixth field, seconds, may follow the standard five (croniter's
convention), for schedules finer than a minute.

Cron arithmetic is croniter's: it handles day-of-week/day-of-month rules,
ranges and steps, and time zones across daylight-saving changes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronoq.core import PRIORITIES
from cronoq.errors import ScheduleError


def _croniter() -> Any:
    """croniter's class, imported on first use: a broker without [[schedules]] starts without loading it."""
    from croniter import croniter

    return croniter


@dataclass(frozen=True)
class Schedule:
    """One `[[schedules]]` entry: submit `payload` to `pool` on every tick of `cron`."""

    name: str
    cron: str
    pool: str = "default"
    timezone: str = "UTC"
    tenant: str | None = None
    priority: str = "normal"
    payload: Any = None
    catch_up: bool = True
    deadline: float | None = None
    max_retries: int = 0
    _zone: datetime.tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.cron.split()) not in (5, 6):
            raise ScheduleError(
                f"expected a five-field cron expression (minute hour day month weekday, optionally "
                f"a sixth for seconds), got {self.cron!r}"
            )
        if not _croniter().is_valid(self.cron):
            raise ScheduleError(f"not a valid cron expression: {self.cron!r}")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ScheduleError(f"unknown time zone {self.timezone!r}; use an IANA name such as 'Europe/Berlin'") from None
        if self.priority not in PRIORITIES:
            raise ScheduleError(f"priority must be one of {', '.join(PRIORITIES)}, got {self.priority!r}")
        object.__setattr__(self, "_zone", zone)

    def next_tick(self, after: float) -> float:
        """The first tick strictly after `after` (Unix seconds)."""
        start = datetime.datetime.fromtimestamp(after, self._zone)
        return float(_croniter()(self.cron, start).get_next(float))

    def previous_tick(self, at_or_before: float) -> float:
        """The last tick at or before `at_or_before`."""
        start = datetime.datetime.fromtimestamp(at_or_before + 1e-6, self._zone)
        return float(_croniter()(self.cron, start).get_prev(float))

    def key(self, tick: float) -> str:
        """The idempotency key of this schedule's task for `tick` (in the broker's reserved namespace)."""
        return f"cronoq:schedule:{self.name}:{int(tick)}"

    def former_key(self, tick: float) -> str:
        """The key versions before the reserved namespace gave this tick's task."""
        return f"schedule:{self.name}:{int(tick)}"


class ScheduleClock:
    """Which ticks of a set of schedules are due; pure, time is a parameter."""

    def __init__(self, schedules: tuple[Schedule, ...], last_fired: Mapping[str, float], started_at: float) -> None:
        self.schedules = {s.name: s for s in schedules}
        self.last_fired: dict[str, float] = {}
        self._next: dict[str, float] = {}
        for schedule in schedules:
            last = last_fired.get(schedule.name)
            if last is None:
                # A new schedule starts now: it owes nothing for the past.
                self._next[schedule.name] = schedule.next_tick(started_at)
                continue
            self.last_fired[schedule.name] = last
            missed = schedule.next_tick(last)
            if missed <= started_at and not schedule.catch_up:
                self._next[schedule.name] = schedule.next_tick(started_at)
            elif missed <= started_at:
                # Missed ticks collapse into one: the latest, run once on start.
                self._next[schedule.name] = schedule.previous_tick(started_at)
            else:
                self._next[schedule.name] = missed
        # The broker asks on every pass of its loop: keep the earliest tick, recomputed only when one fires.
        self._wake = min(self._next.values(), default=None)

    def due(self, now: float) -> list[tuple[Schedule, float]]:
        """The (schedule, tick) pairs due at `now`; each is returned once, then counted as fired."""
        if self._wake is None or self._wake > now:
            return []
        fired = []
        for name, tick in self._next.items():
            if tick <= now:
                schedule = self.schedules[name]
                # If several ticks passed since (the loop fell behind), they collapse into the latest.
                tick = max(tick, schedule.previous_tick(now))
                fired.append((schedule, tick))
                self.last_fired[name] = tick
                self._next[name] = schedule.next_tick(tick)
        self._wake = min(self._next.values())
        return fired

    def next_tick(self, name: str) -> float:
        """When the schedule `name` fires next."""
        return self._next[name]

    def next_wakeup(self) -> float | None:
        """When the next tick of any schedule is due."""
        return self._wake
