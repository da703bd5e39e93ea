"""A min-heap of timed entries with lazy deletion, for delays and deadlines.

Entries are `(key, seq, task)` tuples. An entry is live while the task still
has that `seq` (it has not been re-queued since) and is in the state the heap
watches; anything else is stale and is skipped when it reaches the top.
Whoever makes a live entry stale without popping it calls `stale()`, and the
heap rebuilds itself before its stale entries outnumber the live ones, so its
memory follows the live population, not the history.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush

from cronoq.core.task import Task

TimedEntry = tuple[float, int, Task]


class TimerHeap:
    """Tasks ordered by a time key; `pop_due(now)` yields those whose key has come."""

    __slots__ = ("_heap", "_stale", "_state")

    def __init__(self, state: str) -> None:
        self._heap: list[TimedEntry] = []
        self._stale = 0
        self._state = state  # the task state an entry's task must have for the entry to count

    def __len__(self) -> int:
        """Live entries."""
        return len(self._heap) - self._stale

    def push(self, entry: TimedEntry) -> None:
        """Add a live entry."""
        heappush(self._heap, entry)

    def stale(self) -> None:
        """One live entry just became stale in place (its task moved on)."""
        self._stale += 1
        if self._stale * 2 > len(self._heap):
            state = self._state
            self._heap = [e for e in self._heap if e[1] == e[2]._seq and e[2].state is state]
            heapify(self._heap)
            self._stale = 0

    def peek_key(self) -> float | None:
        """The smallest key among live entries, or None."""
        heap = self._heap
        state = self._state
        while heap:
            key, seq, task = heap[0]
            if seq == task._seq and task.state is state:
                return key
            heappop(heap)
            self._stale -= 1
        return None

    def pop_due(self, now: float) -> list[Task]:
        """Remove and return the tasks of live entries with key <= now, earliest first."""
        heap = self._heap
        state = self._state
        due: list[Task] = []
        while heap and heap[0][0] <= now:
            _key, seq, task = heappop(heap)
            if seq == task._seq and task.state is state:
                due.append(task)
            else:
                self._stale -= 1
        return due
