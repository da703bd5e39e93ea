"""The broker's side of cron schedules: turn due ticks into submissions, and remember what fired.

`cronoq.broker.schedules.ScheduleClock` decides which ticks are due. This module
keeps its memory across restarts in `data_dir/schedules.json` (the last
tick fired per schedule, replaced atomically) and builds each tick's
submission with the idempotency key `cronoq:schedule:<name>:<tick>`, in
the namespace clients may not write. The broker journals that submission
in the same pass, so if it crashes before this file is written, the tick
fires again on start and the key makes it the same task: once per tick.

Upgrades: versions before the reserved namespace keyed ticks
`schedule:<name>:<tick>` and wrote schedules.json without the
`cronoq:format` entry. Started on such a file, the broker lets a catch-up
tick (one due at start) also match a task kept under the old key, in the
schedule's pool and tenant, submitted between the tick and this start:
the task the old version submitted just before it stopped. Anything a
client submitted under that name before the tick is not taken for it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from cronoq.book.submission import FormerKey, SubmitRequest
from cronoq.broker.schedules import Schedule, ScheduleClock
from cronoq.wire.protocol import encode_body

log = logging.getLogger("cronoq.broker")

STATE_FILE = "schedules.json"
FORMAT_ENTRY = "cronoq:format"
"""Marks a state file whose ticks were keyed in the reserved namespace. No schedule can bear this name (':'
is not allowed in one), and versions that do not know the entry ignore it as a schedule they do not have."""
FORMAT = 2


class CronRunner:
    """Schedules of one broker: what is due now, and when to wake next."""

    def __init__(self, schedules: tuple[Schedule, ...], data_dir: Path | None, now: float) -> None:
        self._path = None if data_dir is None else Path(data_dir) / STATE_FILE
        self._started_at = now
        self._from_former_version = False
        """The state file was written by a version that keyed ticks `schedule:<name>:<tick>`."""
        self._clock = ScheduleClock(schedules, self._load(), started_at=now)

    def _load(self) -> dict[str, float]:
        if self._path is None or not self._path.exists():
            return {}
        try:
            state = json.loads(self._path.read_text())
            last_fired = {str(name): float(tick) for name, tick in state.items()}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            # Losing this file costs at most one catch-up tick per schedule (keys stop doubles).
            log.error("cannot read %s (%s); schedules start afresh", self._path, exc)
            return {}
        self._from_former_version = last_fired.pop(FORMAT_ENTRY, None) is None
        return last_fired

    def configure(self, schedules: tuple[Schedule, ...], now: float) -> None:
        """Take the schedules of a reloaded config; schedules that stay keep what they fired."""
        self._clock = ScheduleClock(schedules, self._clock.last_fired, started_at=now)

    def due(self, now: float) -> list[SubmitRequest]:
        """The submissions of every tick due at `now` (each tick once)."""
        fired = self._clock.due(now)
        return [
            SubmitRequest(
                encode_body(schedule.payload), pool=schedule.pool, tenant=schedule.tenant,
                priority=schedule.priority, deadline=schedule.deadline, key=schedule.key(tick),
                max_retries=schedule.max_retries, internal=True, former_key=self._former_key(schedule, tick),
            )
            for schedule, tick in fired
        ]

    def _former_key(self, schedule: Schedule, tick: float) -> FormerKey | None:
        """For a catch-up tick after an upgrade: the key the former version may have submitted it under."""
        if not self._from_former_version or tick > self._started_at:
            return None
        return FormerKey(schedule.former_key(tick), since=tick, until=self._started_at)

    def save(self) -> None:
        """Remember the last tick fired per schedule (after the pass that submitted it was committed)."""
        if self._path is None:
            return
        temporary = self._path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps({**self._clock.last_fired, FORMAT_ENTRY: FORMAT}))
            os.replace(temporary, self._path)
        except OSError as exc:
            log.error("cannot write %s: %s (a tick may fire again after a restart; its key stops a double)",
                      self._path, exc)

    def next_wakeup(self) -> float | None:
        return self._clock.next_wakeup()

    def describe(self) -> dict[str, dict[str, object]]:
        """Per schedule: its cron, pool and tenant, the last tick fired and the next one (Unix seconds)."""
        return {
            name: {
                "cron": schedule.cron, "timezone": schedule.timezone, "pool": schedule.pool,
                "tenant": schedule.tenant, "last_fired": self._clock.last_fired.get(name),
                "next_tick": self._clock.next_tick(name),
            }
            for name, schedule in self._clock.schedules.items()
        }
