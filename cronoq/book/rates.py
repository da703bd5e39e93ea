"""Each pool's recent dispatch rate, and its classes' arrival rates, measured from samples of the core's counts.

The core keeps counts but reads no clock; the shell (the broker at each
heartbeat, the embedded Scheduler as it runs) samples them with its own
time. `cronoq status` shows the rates, and `explain` estimates a waiting
task's start from its pool's: how fast the pool dispatches, and how fast
work that goes before the task (higher classes, deadline tasks) keeps
arriving. Memory is bounded: one sample a heartbeat over the window, each
sample a few counts per pool (its dispatches, and two per priority class).
"""

from __future__ import annotations

from collections import deque

from cronoq.core import ClassRates, SchedulerCore

RATE_WINDOW = 10.0
"""Seconds over which a rate is measured."""

ARRIVAL_WINDOW = 3.0
"""Seconds over which (at least) the arrival rates for `explain` are measured."""


class DispatchRates:
    """Dispatches per second of each pool over about the last `window` seconds."""

    def __init__(self, core: SchedulerCore, window: float = RATE_WINDOW,
                 arrival_window: float = ARRIVAL_WINDOW) -> None:
        self._core = core
        self.window = window
        self.arrival_window = min(arrival_window, window)
        # (time, dispatches per pool) of each sample, the oldest one kept just before the window.
        self._samples: deque[tuple[float, dict[str, int]]] = deque()
        # (time, arrivals per pool: per class, all and with a deadline), sampled alongside.
        self._arrivals: deque[tuple[float, dict[str, tuple[tuple[int, int], ...]]]] = deque()

    def sample(self, now: float) -> None:
        """Take the core's counts now; samples older than the window go (but the one that starts it)."""
        samples = self._samples
        names = self._core.pool_names()
        samples.append((now, {name: self._core.dispatched(name) for name in names}))
        self._arrivals.append((now, {name: self._core.arrivals(name) for name in names}))
        while len(samples) > 2 and samples[1][0] <= now - self.window:
            samples.popleft()
            self._arrivals.popleft()

    def last_sampled(self) -> float | None:
        """When the last sample was taken (None: never)."""
        return self._samples[-1][0] if self._samples else None

    def rates(self, now: float, window: float | None = None) -> dict[str, float]:
        """Dispatches per second of each pool accepting tasks since the oldest sample kept ({} before any); with
        `window`, since the newest sample at least that old (the oldest if none is)."""
        if not self._samples:
            return {}
        then, counts = self._samples[0]
        if window is not None:
            for sampled_at, sampled in self._samples:
                if sampled_at > now - window:
                    break
                then, counts = sampled_at, sampled
        elapsed = now - then
        if elapsed <= 0:
            return {}
        accepting = set(self._core.pool_names())
        return {name: (self._core.dispatched(name) - count) / elapsed for name, count in counts.items()
                if name in accepting}

    def rate(self, pool: str, now: float, window: float | None = None) -> float | None:
        """The pool's rate (over `window`, see `rates`), or None when there is none yet to tell (no sample, or no
        time since)."""
        return self.rates(now, window).get(pool)

    def class_rates(self, pool: str, now: float) -> tuple[ClassRates, ...] | None:
        """How fast tasks became queued in each class of `pool` (highest first), per second, over about the last
        `arrival_window` seconds (since the oldest sample kept, early on); None when there is none yet to tell."""
        if not self._arrivals:
            return None
        # The newest sample at least ARRIVAL_WINDOW old (else the oldest): arrivals change faster than what the
        # pool can serve, and a surge of work ahead should show within seconds, not after the whole window.
        then, counts = self._arrivals[0]
        for sampled_at, sampled in self._arrivals:
            if sampled_at > now - self.arrival_window:
                break
            then, counts = sampled_at, sampled
        elapsed = now - then
        old = counts.get(pool)
        if elapsed <= 0 or old is None or pool not in self._core.pool_names():
            return None
        new = self._core.arrivals(pool)
        return tuple(ClassRates((all_now - all_then) / elapsed, (dl_now - dl_then) / elapsed)
                     for (all_now, dl_now), (all_then, dl_then) in zip(new, old))

    def for_explain(self, pool: str, now: float) -> tuple[float | None, tuple[ClassRates, ...] | None]:
        """What `explain` goes by: the pool's dispatch rate, the higher of its rates over the whole window and over
        the last `arrival_window` seconds (a pool that has just got busier serves at least what it shows now;
        one with long tasks dispatches too few in 3 s to go by), and its classes' arrival rates."""
        rates = [r for r in (self.rate(pool, now), self.rate(pool, now, self.arrival_window)) if r is not None]
        return (max(rates) if rates else None), self.class_rates(pool, now)
