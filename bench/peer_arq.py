"""arq on Redis, the same noop work: the worker settings and the client driver.

Runs inside bench/.venv-arq (arq wants redis-py < 6, Celery's kombu >= 6.4).
Worker: `python -m arq bench.peer_arq.WorkerSettings`. Client: `python -m
bench.peer_arq TASKS WINDOW` prints one JSON line. The polls are tuned to
5 ms (worker) and 1 ms (result): at its defaults arq polls every 0.5 s,
which would measure its polling rather than its work.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

from bench.common import payload

WORKER_POLL = 0.005
RESULT_POLL = 0.001

_redis = RedisSettings(host="127.0.0.1", port=int(os.environ.get("BENCH_REDIS_PORT", "6379")))


async def noop(ctx: dict[str, Any], task: dict[str, Any]) -> int:
    return task["n"]


class WorkerSettings:
    functions = [noop]
    redis_settings = _redis
    poll_delay = WORKER_POLL


async def drive(tasks: int, window: int, timeout: float) -> dict[str, Any]:
    redis = await create_pool(_redis)
    latencies: list[float] = []
    next_task = 0

    async def lane() -> None:
        nonlocal next_task
        while next_task < tasks:
            n = next_task
            next_task += 1
            sent_at = time.perf_counter()
            job = await redis.enqueue_job("noop", payload(n))
            assert job is not None
            value = await job.result(timeout=timeout, poll_delay=RESULT_POLL)
            latencies.append(time.perf_counter() - sent_at)
            if value != n:
                raise RuntimeError(f"task {n} returned {value!r}")

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(lane() for _ in range(min(window, tasks)))), timeout)
    elapsed = time.perf_counter() - started
    await redis.aclose() if hasattr(redis, "aclose") else await redis.close()
    return {"elapsed": elapsed, "latencies": latencies}


if __name__ == "__main__":
    count, in_flight = int(sys.argv[1]), int(sys.argv[2])
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
    print(json.dumps(asyncio.run(drive(count, in_flight, limit))))
