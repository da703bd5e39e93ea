"""cronoq.Scheduler: the broker's scheduling in one process, with no sockets.

The same core and task book as the broker; the only worker is this process,
with `concurrency` slots. Payloads and results go through msgpack as they
would over the wire, so code that works here works against a broker.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import traceback
import uuid
from typing import Any, Iterable

from cronoq.answers import Explanation, TaskInfo, seconds_from_now

from cronoq.book.records import TaskRecord

from cronoq.book.submission import SubmitRequest

from cronoq.book.rates import DispatchRates
from cronoq.book.retention import DEFAULT_RESULT_TTL, DEFAULT_RETENTION_BYTES
from cronoq.book.taskbook import TaskBook
from cronoq.core import SchedulerCore
from cronoq.errors import FailedPrecondition, InvalidArgument
from cronoq.handles import TaskHandle, outcome_value
from cronoq.pool import Pool
from cronoq.wire.protocol import decode_body, encode_body

LOCAL_WORKER = "local"
# Seconds between samples of the dispatch counts (the broker samples at each heartbeat, once a second).
RATE_SAMPLE_INTERVAL = 1.0


class Scheduler:
    """Schedules and runs tasks of `pools` in this process, `concurrency` at a time.

    Use as `async with cronoq.Scheduler([pool], concurrency=4) as sched:`;
    leaving the block lets running tasks finish. Finished tasks stay in
    memory for `result_ttl` seconds, or until they weigh more than
    `result_retention_bytes` (the oldest go first).
    """

    def __init__(
        self,
        pools: Pool | Iterable[Pool],
        *,
        concurrency: int = 4,
        max_payload_bytes: int = 1 << 20,
        result_ttl: float = DEFAULT_RESULT_TTL,
        result_retention_bytes: int = DEFAULT_RETENTION_BYTES,
    ) -> None:
        pool_list = [pools] if isinstance(pools, Pool) else list(pools)
        if not pool_list:
            raise InvalidArgument("Scheduler needs at least one cronoq.Pool")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
        if isinstance(result_ttl, bool) or not isinstance(result_ttl, (int, float)) or not 0 < result_ttl < math.inf:
            raise InvalidArgument(f"result_ttl must be a positive number of seconds, got {result_ttl!r}")
        if (isinstance(result_retention_bytes, bool) or not isinstance(result_retention_bytes, int)
                or result_retention_bytes < 1):
            raise InvalidArgument(f"result_retention_bytes must be a positive integer, got {result_retention_bytes!r}")
        self._pools: dict[str, Pool] = {}
        for pool in pool_list:
            if not isinstance(pool, Pool):
                raise InvalidArgument(f"Scheduler takes cronoq.Pool objects, got {pool!r}")
            if pool.name in self._pools:
                raise InvalidArgument(f"two pools are named {pool.name!r}")
            if pool.run is None:
                raise InvalidArgument(f"pool {pool.name!r} has no handler; the embedded Scheduler runs tasks itself")
            self._pools[pool.name] = pool
        self.concurrency = concurrency
        self._core = SchedulerCore(pool.settings() for pool in pool_list)
        self._book = TaskBook(
            self._core, new_id=lambda: uuid.uuid4().hex, on_terminal=self._on_terminal,
            max_payload_bytes=max_payload_bytes, result_ttl=result_ttl, result_retention_bytes=result_retention_bytes,
            rng=random.Random(), pacing_clock=time.perf_counter,
        )
        self._rates = DispatchRates(self._core)
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> "Scheduler":
        self._start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._core.add_worker(LOCAL_WORKER, list(self._pools), self.concurrency)

    async def close(self) -> None:
        """Stop dispatching and let running tasks finish."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    # ----------------------------------------------------------------- API

    async def submit(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None,
    ) -> TaskHandle:
        """Queue a task; returns its handle. docs/api.md ("Submitting a task") describes each argument."""
        self._check_open()
        now = time.time()
        request = SubmitRequest(
            encode_body(payload), pool=pool, tenant=tenant, priority=priority,
            deadline=seconds_from_now(deadline, "deadline", now), delay=seconds_from_now(delay, "delay", now),
            key=key, max_retries=max_retries, cost=cost,
        )
        record, duplicate = self._book.submit(request, now)
        self._pump()
        return TaskHandle(record.id, self, duplicate=duplicate)

    async def call(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None, timeout: float | None = None,
    ) -> Any:
        """Submit a task and wait for its value, as `Client.call` does: submit, then `result(timeout)`."""
        handle = await self.submit(payload, pool=pool, tenant=tenant, priority=priority, deadline=deadline,
                                   delay=delay, key=key, max_retries=max_retries, cost=cost)
        return await self.result(handle.id, timeout)

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task's value by id; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        record = self._book.get(task_id)
        if record.finished_at is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(task_id, []).append(waiter)
            try:
                await asyncio.wait_for(asyncio.shield(waiter), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(f"task {task_id} did not finish within {timeout} s") from None
            finally:
                waiters = self._waiters.get(task_id)
                if waiters and waiter in waiters:
                    waiters.remove(waiter)
        return outcome_value(record.id, record.state, record.result, record.error_type,
                             record.error_message, record.traceback)

    async def status(self, task_id: str) -> TaskInfo:
        """A snapshot of a task: state, attempts, timings."""
        return self._book.info(task_id)

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task not yet dispatched; False if it already runs or has finished."""
        self._book.get(task_id)
        cancelled = self._book.cancel(task_id, time.time())
        self._pump()
        return cancelled

    async def explain(self, task_id: str) -> Explanation:
        """Why the task is where it is: what stands before a waiting task and when it may start, or how each
        attempt of one that ran ended (docs/scheduling.md, "Why is my task waiting?"). NotFound if unknown."""
        record = self._book.get(task_id)
        now = time.time()
        self._sample_rates(now)
        return self._book.explain(task_id, now, *self._rates.for_explain(record.pool, now))

    async def pause(self, pool: str) -> None:
        """Stop dispatching `pool`; it still accepts tasks."""
        self._core.pause(pool)

    async def resume(self, pool: str) -> None:
        """Dispatch `pool` again."""
        self._core.resume(pool)
        self._pump()

    async def stats(self) -> dict[str, Any]:
        """Per pool: backlog and running by class and tenant, dispatch counts, lag and ceilings."""
        return self._core.stats(now=time.time())

    # ----------------------------------------------------------------- the loop

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPrecondition("this Scheduler is closed")
        self._start()

    def _pump(self) -> None:
        """Expire and dispatch everything due now, then sleep until the core's next wake-up."""
        if self._closed:
            return
        now = time.time()
        self._sample_rates(now)
        for _, record, attempt in self._book.dispatch(now):
            job = asyncio.get_running_loop().create_task(self._run(record, attempt))
            self._running.add(job)
            job.add_done_callback(self._running.discard)
        self._arm_timer(now)

    def _sample_rates(self, now: float) -> None:
        last = self._rates.last_sampled()
        if last is None or now - last >= RATE_SAMPLE_INTERVAL:
            self._rates.sample(now)

    def _arm_timer(self, now: float) -> None:
        wake = self._book.next_wakeup()
        if wake == self._timer_at:
            return  # every task's completion pumps: keep the timer unless the wake-up moved
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake
        if wake is not None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, wake - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    async def _run(self, record: TaskRecord, attempt: int) -> None:
        pool = self._pools[record.pool]
        outcome: dict[str, Any]
        try:
            value = await pool.call(decode_body(record.payload))
            outcome = {"ok": True, "result": encode_body(value)}
        except Exception as exc:  # the handler's failure is the task's outcome, not ours
            outcome = {
                "ok": False, "error_type": type(exc).__name__, "error_message": str(exc),
                "traceback": traceback.format_exc(),
            }
        self._book.complete(LOCAL_WORKER, record.id, attempt, time.time(), **outcome)
        self._core.grant(LOCAL_WORKER, 1)
        self._pump()

    def _on_terminal(self, record: TaskRecord) -> None:
        for waiter in self._waiters.pop(record.id, ()):
            if not waiter.done():
                waiter.set_result(None)
