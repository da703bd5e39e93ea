"""How the broker keeps Python's cyclic garbage collector from stalling its loop.

CPython's collector walks every tracked object of the generations it
collects, and a full collection walks the whole heap. A broker holding 10^6
tasks has millions of tracked objects (records, core tasks, queue entries),
so a full collection took 0.65–0.86 s, and the interpreter starts one each
time the heap has grown by a quarter: in the middle of a fill, with every
client of every pool waiting.

The young generation has a trap of its own. The interpreter counts
allocations *minus deallocations* to decide when to collect it, and while a
backlog drains the broker frees about as many old objects (the queued
tasks) as it makes new ones that stay (the finished records): the count
hardly moves, no young collection comes, and the young generation fills
with every record of the drain, until one collection walks them all (90 ms
after a drain of 300,000, 0.46–0.69 s after 10^6).

Yet the broker makes almost no cyclic garbage: records, tasks and queues are
trees, freed by reference counting the moment they are dropped. (Measured: a
25-second soak at 18,000 tasks/s ran 19 full collections that found 0
unreachable objects; the young collections found about 30 a second.) So:

- the automatic full collection is off;
- the loop reports its work (`worked`), and after every
  YOUNG_COLLECTION_WORK messages and dispatches the young generations are
  collected and what survived them is frozen (`gc.freeze()`), out of every
  later collection's way: each collection walks at most that much work's
  new objects, whatever counts the interpreter keeps;
- what start-up made (modules, config, a recovered data_dir) is frozen too.

A cycle that turned into garbage after being frozen waits for a full
collection. One runs at quiet points only: after a heartbeat interval in
which the loop handled nothing, and only while the heap is small enough to
walk in a few tens of milliseconds (the broker holds at most
QUIET_COLLECTION_RECORDS task records). `BrokerMetrics` records every
collection's pause by generation (`cronoq_gc_pause_seconds`).
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

# A gen-2 threshold no broker reaches: gen1 collections counted before an automatic full one.
NEVER = 1 << 30
# Messages handled plus tasks dispatched between two young collections (each then walks ~1 ms of objects).
YOUNG_COLLECTION_WORK = 2000
# Task records (each a few tracked objects) below which a full collection takes a few tens of ms.
QUIET_COLLECTION_RECORDS = 20_000
# Seconds between two quiet full collections at most as often: an idle broker has nothing new to reclaim.
QUIET_COLLECTION_INTERVAL = 600.0


class CollectorPolicy:
    """Applies the policy above to the interpreter while the broker serves; `stop()` puts it back."""

    def __init__(self, on_pause: Callable[[int, float], None]) -> None:
        self._on_pause = on_pause
        self._saved: tuple[int, int, int] | None = None
        self._started = 0.0
        self._last_quiet = float("-inf")
        self._work = 0

    def start(self) -> None:
        """Freeze what exists now, turn off automatic full collections, and time every collection."""
        if self._saved is not None:
            return
        self._saved = gc.get_threshold()
        gc.collect()  # what start-up left behind goes now, not into the frozen generation
        gc.freeze()
        young, middle, _ = self._saved
        gc.set_threshold(young, middle, NEVER)
        gc.callbacks.append(self._observe)

    def stop(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        self._saved = None
        if self._observe in gc.callbacks:
            gc.callbacks.remove(self._observe)

    def worked(self, units: int) -> None:
        """The loop handled `units` messages and dispatches: collect the young and freeze the survivors when due."""
        self._work += units
        if self._work >= YOUNG_COLLECTION_WORK and self._saved is not None:
            self._work = 0
            gc.collect(1)
            gc.freeze()

    def quiet(self, now: float, records: int) -> bool:
        """The loop was idle for a heartbeat: collect everything if the heap is small; True if it did."""
        if self._saved is None or records > QUIET_COLLECTION_RECORDS or now - self._last_quiet < QUIET_COLLECTION_INTERVAL:
            return False
        self._last_quiet = now
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return True

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._on_pause(info["generation"], time.perf_counter() - self._started)
