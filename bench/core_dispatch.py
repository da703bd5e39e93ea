"""Cost of the scheduling core's hot path: one submit plus one dispatch, at steady backlogs.

    python bench/core_dispatch.py            # the full table (about a minute)
    python bench/core_dispatch.py --quick    # a small smoke run (a few seconds)

For each row a fair pool is filled to the backlog with tasks spread over the
tenants (tenants drawn at random, fixed seed), then pairs of submit(new task)
+ dispatch(now, limit=1) to one worker are timed, keeping the backlog steady.
The dispatched tasks are finished outside the timed batches. Task objects are
built before timing (building one is the caller's cost, reported apart).
"full cycle" adds what a shell does per task besides: finish and grant, to a
worker with one slot. Times are CPU time of this process (best of 3 runs of
n pairs), so that other processes sharing the machine do not count; the best
wall time per pair is shown beside. The cyclic garbage collector is paused
while timing (its full passes over a large backlog are a cost of the
process, not of the algorithm; a broker tunes them with gc.freeze()); the
gc-on row shows the difference at one size.

"tree" rows spread the tasks over the leaves of a 3-level tenant tree
(10 top-level tenants x 100 x 100: `t3/m41/l7`), so every submit and
dispatch goes through three levels of fair sharing; set them next to the flat
row with as many tenants (10^5 leaves).

bytes/task is the traced memory of a backlog of 10^5 queued tasks (Task
object, its id string and every structure of the core), payload None, divided
by the number of tasks.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import platform
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task  # noqa: E402

NOW = 0.0
_ids = itertools.count()


def tenant_names(tenants: int, kind: str) -> list[str]:
    """Flat names, or the leaves of a 3-level tree (tenants = 10 * 100 * 100 is the issue's shape)."""
    if kind != "tree":
        return [f"tenant-{i}" for i in range(tenants)]
    top, mid = 10, 100
    leaves = tenants // (top * mid)
    return [f"t{i}/m{j}/l{k}" for i in range(top) for j in range(mid) for k in range(leaves)]


def build(
    backlog: int, tenants: int, kind: str = "fair", seed: int = 1
) -> tuple[SchedulerCore, list[str], random.Random]:
    """A core whose pool holds `backlog` queued tasks spread at random over `tenants` tenants."""
    core = SchedulerCore([PoolSettings("p", fair_share=kind != "fifo")])
    names = tenant_names(tenants, kind)
    rng = random.Random(seed)
    for i in range(backlog):
        core.submit(Task(f"q{i}", "p", tenant=names[rng.randrange(tenants)]), NOW)
    return core, names, rng


class Clock:
    """Wall time and this process's CPU time, summed over the timed stretches."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._wall
        self.cpu += time.process_time() - self._cpu


def pairs(core: SchedulerCore, names: list[str], rng: random.Random, n: int, batch: int = 2000) -> Clock:
    """Time n submit+dispatch pairs (in batches; the dispatched tasks are finished between batches)."""
    core.add_worker("bench", ["p"], 10**12)
    submit, dispatch, finish = core.submit, core.dispatch, core.finish
    done = 0
    clock = Clock()
    while done < n:
        m = min(batch, n - done)
        tasks = [Task(f"n{next(_ids)}", "p", tenant=names[rng.randrange(len(names))]) for _ in range(m)]
        out = []
        with clock:
            for task in tasks:
                submit(task, NOW)
                out += dispatch(NOW, 1)
        for _worker, task in out:
            finish(task.id, NOW, worker_id="bench", attempt=task.attempts, state=SUCCEEDED)
        done += m
    core.remove_worker("bench", NOW)
    return clock


def full_cycles(core: SchedulerCore, names: list[str], rng: random.Random, n: int, batch: int = 2000) -> Clock:
    """Time n rounds of submit + finish + grant + dispatch, with a worker of one slot."""
    core.add_worker("one", ["p"], 1)
    (_w, running), = core.dispatch(NOW, 1)
    submit, dispatch, finish, grant = core.submit, core.dispatch, core.finish, core.grant
    done = 0
    clock = Clock()
    while done < n:
        m = min(batch, n - done)
        tasks = [Task(f"c{next(_ids)}", "p", tenant=names[rng.randrange(len(names))]) for _ in range(m)]
        with clock:
            for task in tasks:
                submit(task, NOW)
                finish(running.id, NOW, worker_id="one", attempt=running.attempts, state=SUCCEEDED)
                grant("one", 1)
                (_w, running), = dispatch(NOW)
        done += m
    core.remove_worker("one", NOW)
    return clock


def measure(
    backlog: int, tenants: int, n: int, kind: str = "fair", gc_on: bool = False, wall: list[float] | None = None
) -> tuple[float, float]:
    """(seconds per submit+dispatch pair, seconds per full cycle): CPU time of this process, best of 3 runs.

    CPU time rather than wall time, so that other processes sharing the
    machine do not count; the best wall time per pair is appended to `wall`.
    """
    core, names, rng = build(backlog, tenants, kind)
    gc.collect()
    if not gc_on:
        gc.disable()
    try:
        runs = [pairs(core, names, rng, n) for _ in range(3)]
        cycles = [full_cycles(core, names, rng, n) for _ in range(3)]
    finally:
        gc.enable()
    assert core.backlog("p") == backlog, "the backlog drifted"
    if wall is not None:
        wall.append(min(c.wall for c in runs) / n)
    return min(c.cpu for c in runs) / n, min(c.cpu for c in cycles) / n


def bytes_per_task(n: int, tenants: int) -> float:
    names = [f"tenant-{i}" for i in range(tenants)]
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    rng = random.Random(2)
    picks = [names[rng.randrange(tenants)] for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        core.submit(Task(f"task-{i:08d}", "p", tenant=picks[i]), NOW)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert core.backlog("p") == n
    return (after - before) / n


def task_construction(n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        Task(f"x{i}", "p", tenant="acme")
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()

    rows: list[tuple]
    if args.quick:
        rows = [
            (10**3, 100, "fair"),
            (10**4, 1000, "fair"),
            (10**4, 10**4, "fair"),
            (10**4, 10**4, "tree"),
            (10**4, 100, "fifo"),
        ]
        n, mem_n = 5_000, 10_000
    else:
        rows = [
            (10**3, 1000, "fair"),
            (10**4, 1000, "fair"),
            (10**5, 1000, "fair"),
            (10**6, 1000, "fair"),
            (10**5, 10**4, "fair"),
            (10**5, 10**5, "fair"),
            (10**6, 10**5, "fair"),
            (10**6, 10**5, "tree"),
            (10**5, 1000, "fifo"),
        ]
        n, mem_n = 100_000, 100_000

    print(f"cronoq core benchmark: Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores")
    print(f"{n:,} timed pairs per run, best of 3 runs; ns of CPU time (wall time apart)")
    print()
    header = (
        f"{'backlog':>9} {'tenants':>8} {'pool':>5} | {'submit+dispatch':>15} {'pairs/s':>9} {'(wall)':>8} | "
        f"{'full cycle':>10}"
    )
    print(header)
    print("-" * len(header))
    results = {}
    rows.append((10**4 if args.quick else 10**5, 1000, "fair", "gc on"))
    for backlog, tenants, kind, *note in rows:
        wall: list[float] = []
        pair, cycle = measure(backlog, tenants, n, kind, gc_on=bool(note), wall=wall)
        if not note:
            results[(backlog, tenants, kind)] = pair
        print(
            f"{backlog:>9,} {tenants:>8,} {kind:>5} | {pair * 1e9:>15,.0f} {1 / pair:>9,.0f} {wall[0] * 1e9:>8,.0f} | "
            f"{cycle * 1e9:>10,.0f}" + (f"   ({note[0]})" if note else "")
        )
    print()
    print(f"Task(...) construction, outside the timings: {task_construction(n) * 1e9:,.0f} ns")
    mem = bytes_per_task(mem_n, 1000)
    print(f"bytes per queued task ({mem_n:,} queued over 1,000 tenants, payload None): {mem:,.0f}")

    if not args.quick:
        small, big = results[(10**3, 1000, "fair")], results[(10**6, 1000, "fair")]
        rate = 1 / results[(10**5, 10**4, "fair")]
        tree, flat = results[(10**6, 10**5, "tree")], results[(10**6, 10**5, "fair")]
        print()
        print("targets:")
        print(f"  cost at 10^6 / cost at 10^3 (1,000 tenants): {big / small:.2f}x (target <= 3x)")
        print(f"  pairs/s at 10^5 backlog over 10^4 tenants: {rate:,.0f} (target >= 200,000)")
        print(f"  bytes per queued task: {mem:,.0f} (target <= 400)")
        print(f"  3-level tree / flat, 10^6 queued over 10^5 leaves: {tree / flat:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
