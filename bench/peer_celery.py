"""Celery on Redis, the same noop work: the app its worker loads, and the client driver.

Worker: `celery -A bench.peer_celery worker --pool prefork --concurrency 2`
(Celery's defaults otherwise). Client: `python -m bench.peer_celery TASKS
WINDOW` prints one JSON line: elapsed seconds and each task's latency.
Only this module and bench.common are imported, so it runs wherever Celery is.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Any

from celery import Celery

from bench.common import payload

_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("bench", broker=_url, backend=_url)


@app.task(name="noop")
def noop(task: dict[str, Any]) -> int:
    return task["n"]


def drive(tasks: int, window: int, timeout: float) -> dict[str, Any]:
    """Keep `window` tasks outstanding; collect results oldest first (Celery has no 'any result' wait)."""
    latencies: list[float] = []
    outstanding: collections.deque[tuple[int, float, Any]] = collections.deque()
    deadline = time.monotonic() + timeout
    started = time.perf_counter()
    next_task = 0
    while next_task < tasks or outstanding:
        while next_task < tasks and len(outstanding) < window:
            outstanding.append((next_task, time.perf_counter(), noop.delay(payload(next_task))))
            next_task += 1
        n, sent_at, result = outstanding.popleft()
        value = result.get(timeout=max(1.0, deadline - time.monotonic()))
        latencies.append(time.perf_counter() - sent_at)
        if value != n:
            raise RuntimeError(f"task {n} returned {value!r}")
    return {"elapsed": time.perf_counter() - started, "latencies": latencies}


if __name__ == "__main__":
    count, in_flight = int(sys.argv[1]), int(sys.argv[2])
    print(json.dumps(drive(count, in_flight, float(sys.argv[3]) if len(sys.argv) > 3 else 600.0)))
