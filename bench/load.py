"""Load through cronoq's public client API: a window of submit-then-result loops.

Each in-flight slot is one coroutine that submits a task, awaits its result,
checks it, and goes again; latency is measured from the call to `submit` to
the value coming back, which is what a user of `cronoq.connect` sees.
"""

from __future__ import annotations

import asyncio
import time

import cronoq
from bench.common import Run, payload


async def drive_cronoq(address: str, tasks: int, window: int, *, token: str | None = None, pool: str = "default",
                       tenant_of: list[str | None] | None = None, timeout: float = 600.0,
                       progress: list[int] | None = None, call: bool = False) -> tuple[Run, list]:
    """Run `tasks` tasks with `window` in flight; returns the run and each task's result (index = task number).
    Each task is `submit`ted and its handle's `result` awaited, or with `call` submitted and awaited in one
    request.

    `progress[0]` counts finished tasks as they come, for a watcher in another thread."""
    results: list = [None] * tasks
    latencies: list[float] = []
    next_task = 0
    result_timeout = max(timeout, 60.0)

    async def lane(sched: cronoq.Client) -> None:
        nonlocal next_task
        while next_task < tasks:
            n = next_task
            next_task += 1
            started = time.perf_counter()
            tenant = tenant_of[n] if tenant_of is not None else None
            if call:
                results[n] = await sched.call(payload(n), pool=pool, tenant=tenant, timeout=result_timeout)
            else:
                handle = await sched.submit(payload(n), pool=pool, tenant=tenant)
                results[n] = await handle.result(timeout=result_timeout)
            latencies.append(time.perf_counter() - started)
            if progress is not None:
                progress[0] += 1

    async with cronoq.connect(address, token=token) as sched:
        await sched.ping()  # connected and answered before the clock starts
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(lane(sched) for _ in range(min(window, tasks)))), timeout)
        elapsed = time.perf_counter() - started
    return Run(tasks=len(latencies), elapsed=elapsed, latencies=latencies), results


async def submit_many(address: str, tasks: int, window: int, *, token: str | None = None, pool: str = "default",
                      timeout: float = 900.0) -> list[str]:
    """Only submit (no waiting for results), `window` at a time; returns the task ids in order."""
    ids: list[str] = [""] * tasks
    next_task = 0

    async def lane(sched: cronoq.Client) -> None:
        nonlocal next_task
        while next_task < tasks:
            n = next_task
            next_task += 1
            ids[n] = (await sched.submit(payload(n), pool=pool)).id

    async with cronoq.connect(address, token=token) as sched:
        await asyncio.wait_for(asyncio.gather(*(lane(sched) for _ in range(min(window, tasks)))), timeout)
    return ids
