"""How long the worst batch of inserts takes while maps of task ids grow to a million: dict against ShardedMap.

    python bench/map_growth.py [--keys 1000000] [--batch 200] [--maps 3] [--repeat 3]

The broker's maps keyed by task id (the book's records, the core's tasks, a
tenant's submission ids) grow in lockstep, one entry each per submit. A dict
resizes in one go — every entry moves — when it is two-thirds full; a
ShardedMap (cronoq/core/shards.py) resizes one shard at a time. This inserts
`keys` random 32-hex-digit ids (as the broker makes them) into `maps` maps
at once, a batch of `batch` submits at a time (about what one pass of the
broker's loop takes in a fill), and reports the slowest batches and the mean
cost per insert. GC is off, as it is for these untracked maps in the broker.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cronoq.core.shards import ShardedMap  # noqa: E402


def grow(make: Callable[[], object], ids: list[str], batch: int, maps: int) -> tuple[list[float], float]:
    """Insert every id into `maps` fresh maps, `batch` ids at a time; returns each batch's seconds and the total."""
    targets = [make() for _ in range(maps)]
    times = []
    started = time.perf_counter()
    for first in range(0, len(ids), batch):
        chunk = ids[first:first + batch]
        t0 = time.perf_counter()
        for task_id in chunk:
            for target in targets:
                target[task_id] = task_id  # type: ignore[index]
        times.append(time.perf_counter() - t0)
    return times, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--maps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ids = [os.urandom(16).hex() for _ in range(args.keys)]
    gc.disable()
    print(f"{args.keys:,} ids into {args.maps} maps, {args.batch} per batch; best of {args.repeat} runs")
    print(f"{'map':12} {'worst batch ms':>15} {'2nd':>8} {'5th':>8} {'batches > 2 ms':>15} {'ns/insert':>10}")
    for name, make in (("dict", dict), ("ShardedMap", ShardedMap)):
        runs = [grow(make, ids, args.batch, args.maps) for _ in range(args.repeat)]
        times, total = min(runs, key=lambda run: max(run[0]))
        ranked = sorted(times, reverse=True)
        print(f"{name:12} {ranked[0] * 1e3:15.2f} {ranked[1] * 1e3:8.2f} {ranked[4] * 1e3:8.2f} "
              f"{sum(t > 0.002 for t in times):15d} {total / (args.keys * args.maps) * 1e9:10.0f}")


if __name__ == "__main__":
    main()
