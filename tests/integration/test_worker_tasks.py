"""A worker's own bookkeeping of its tasks: what it counts as running, and how it runs a pool's handler."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars

import cronoq
from tests.support import BEATS, until

WAIT = 30.0


async def test_running_counts_the_tasks_still_running_and_none_once_they_end(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    release = asyncio.Event()

    async def handler(payload):
        if payload == "hold":
            await release.wait()
        return payload

    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", handler), concurrency=4, **BEATS)

    def running(n: int):
        async def check() -> bool:
            return worker.running == n
        return check

    serving = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            held = [await client.submit("hold") for _ in range(2)]
            quick = [await client.submit(i) for i in range(20)]  # through the two slots left, many messages
            assert [await handle.result(timeout=WAIT) for handle in quick] == list(range(20))
            await until(running(2), "only the two held tasks run")
            release.set()
            assert [await handle.result(timeout=WAIT) for handle in held] == ["hold", "hold"]
            await until(running(0), "no task runs")
            assert worker.finished == 22
    finally:
        await worker.stop()
        await serving


def test_a_pool_whose_handler_is_replaced_runs_the_new_one_as_its_kind_says():
    async def on_the_loop(payload):
        return payload

    def in_a_thread(payload):
        return payload

    pool = cronoq.Pool("default", on_the_loop)
    assert pool.is_async
    pool.run = in_a_thread
    assert not pool.is_async
    pool.run = on_the_loop
    assert pool.is_async
    pool.run = None
    assert not pool.is_async


async def test_each_run_of_a_coroutine_handler_is_a_task_of_its_own_from_its_first_line(broker_factory):
    """Each run of a coroutine handler is a task of the loop with a context of its own, from its first line,
    whether or not it ever waits: asyncio.timeout works there (it needs the current task), what a run sets in a
    ContextVar is not seen by the next, and a failure after a wait is the task's outcome."""
    broker = broker_factory('[[pools]]\nname = "default"\n')
    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="fresh")
    tasks: set[asyncio.Task] = set()

    async def handler(payload):
        tasks.add(asyncio.current_task())
        before = seen.get()
        seen.set(f"set by {payload}")
        # asyncio.timeout (Python 3.11 on) needs the current task; on 3.10 current_task() alone says it.
        async with asyncio.timeout(WAIT) if hasattr(asyncio, "timeout") else contextlib.nullcontext():
            if payload.startswith("wait"):
                await asyncio.sleep(0.01)
                if payload == "wait and fail":
                    raise ValueError(f"{payload} saw {seen.get()}")
        return [before, seen.get()]

    worker = cronoq.Worker(broker.workers, cronoq.Pool("default", handler), concurrency=2, **BEATS)
    serving = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with cronoq.connect(broker.clients) as client:
            for payload in ("quick", "wait", "quick again", "wait again"):
                assert await client.call(payload, timeout=WAIT) == ["fresh", f"set by {payload}"]
            failing = await client.submit("wait and fail")
            try:
                await failing.result(timeout=WAIT)
            except cronoq.TaskFailed as exc:
                assert exc.type == "ValueError"
                assert "wait and fail saw set by wait and fail" in str(exc)
            else:
                raise AssertionError("the failing handler's task did not fail")
            assert worker.running == 0
            assert worker.finished == 5
        assert None not in tasks and len(tasks) == 5, "each run in a task of its own"
    finally:
        await worker.stop()
        await serving
