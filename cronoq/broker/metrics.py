"""The broker's own counters and histograms: what /metrics reports besides the core's statistics.

On the hot path the broker only bumps these plain counters and histogram
buckets (`task_finished`, `commit_took`); broker/exposition.py turns them
into Prometheus metrics when a scrape asks, and is loaded only by a broker
configured to serve /metrics.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field


TASK_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
COMMIT_SECONDS_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
GC_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)
DROP_REASONS = ("timeout", "evicted", "refused")
PASS_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.5, 1, 5)


class Histogram:
    """Cumulative buckets as Prometheus wants them, at the cost of one bisect per observation."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


@dataclass
class DashboardConnections:
    """How many dashboard connections ended early, and why: counted by its HTTP server, served as metrics."""

    reset: int = 0
    """The peer reset or closed the connection in the middle of a request (or of our answer)."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Ended by the server, by reason: `timeout` (a request too slow to arrive, an answer not taken), `evicted`
    (an unauthenticated connection waiting for its request, closed to make room for a new one), `refused` (no
    room could be made)."""


class BrokerMetrics:
    """What the broker counts as it goes; the rest is read from its statistics at scrape time."""

    def __init__(self) -> None:
        self.completions: Counter[tuple[str, str]] = Counter()
        self.queue_wait: dict[str, Histogram] = {}
        self.run_time: dict[str, Histogram] = {}
        # pool -> (its queue_wait, its run_time): one lookup per finished task rather than two.
        self._task_histograms: dict[str, tuple[Histogram, Histogram]] = {}
        self.commit_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.sync_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.pass_seconds = Histogram(PASS_SECONDS_BUCKETS)
        self.pass_cpu_seconds = Histogram(PASS_SECONDS_BUCKETS)
        self.heartbeat_seconds = Histogram(PASS_SECONDS_BUCKETS)
        self.gc_seconds = [Histogram(GC_SECONDS_BUCKETS) for _ in range(3)]
        self.snapshot_start_seconds = Histogram(GC_SECONDS_BUCKETS)
        self.snapshot_spawn_seconds = Histogram(GC_SECONDS_BUCKETS)
        self.dashboard = DashboardConnections()

    def task_finished(self, pool: str, outcome: str, submitted_at: float, started_at: float | None,
                      finished_at: float | None) -> None:
        """Count a task that reached a terminal state, with its queue wait and run time (negative ones as 0)."""
        self.completions[(pool, outcome)] += 1
        if started_at is None:
            return
        # Every finished task comes through here: the pool's pair of histograms in one lookup.
        histograms = self._task_histograms.get(pool)
        if histograms is None:
            histograms = self._task_histograms[pool] = (self._histogram(self.queue_wait, pool),
                                                        self._histogram(self.run_time, pool))
        queue_wait, run_time = histograms
        waited = started_at - submitted_at
        queue_wait.observe(waited if waited > 0.0 else 0.0)
        if finished_at is not None:
            ran = finished_at - started_at
            run_time.observe(ran if ran > 0.0 else 0.0)

    def commit_took(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)

    def sync_took(self, seconds: float) -> None:
        """One background fdatasync of the journal (durability "sync"); called from the sync thread."""
        self.sync_seconds.observe(seconds)

    def pass_took(self, seconds: float, cpu_seconds: float) -> None:
        """One pass of the broker's loop (handle, dispatch, commit, send): its wall-clock time, and the CPU time
        the loop's thread used in it (less, when the machine gave the CPU to other processes meanwhile)."""
        self.pass_seconds.observe(seconds)
        self.pass_cpu_seconds.observe(cpu_seconds)

    def heartbeat_took(self, seconds: float) -> None:
        """The broker's once-a-heartbeat work: beats, liveness, sweeps, a journal compaction when one is due."""
        self.heartbeat_seconds.observe(seconds)

    def gc_paused(self, generation: int, seconds: float) -> None:
        """One collection of Python's cyclic garbage collector (generation 0, 1 or 2) held the loop this long."""
        self.gc_seconds[generation].observe(seconds)

    def snapshot_start_took(self, seconds: float) -> None:
        """Starting a compaction's snapshot writer held the loop this long: a fork, or handing the start of a
        process reading the files back to the housekeeping thread."""
        self.snapshot_start_seconds.observe(seconds)

    def snapshot_spawn_took(self, seconds: float) -> None:
        """The housekeeping thread started a compaction's process reading the files back in this long (the
        loop does not wait for it); called from that thread."""
        self.snapshot_spawn_seconds.observe(seconds)

    @staticmethod
    def _histogram(by_pool: dict[str, Histogram], pool: str) -> Histogram:
        histogram = by_pool.get(pool)
        if histogram is None:
            histogram = by_pool[pool] = Histogram(TASK_SECONDS_BUCKETS)
        return histogram
