"""Scale rows: dispatch cost as the backlog and the tenants grow, broker memory per queued task,
and the time a broker takes to come back with a large backlog, or with as many retained results.

Dispatch cost is measured on cronoq.core directly (the same core the broker
drives), so it shows the algorithm without the sockets: one cycle is one
submit plus one dispatch plus the finish that frees the slot again, at a
backlog that stays constant.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench.common import rss_bytes
from bench.load import submit_many
from bench.settings import BenchSettings
from bench.stacks import CronoqBroker, broker_config

import msgspec

from bench.common import payload


def dispatch_cost_ns(backlog: int, tenants: int, ops: int, rounds: int) -> list[float]:
    """ns per submit+dispatch+finish cycle with `backlog` tasks queued over `tenants` tenants (fair pool)."""
    from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task

    core = SchedulerCore([PoolSettings("bench", fair_share=True)])
    now = 1_000.0
    for i in range(backlog):
        core.submit(Task(f"q{i}", "bench", tenant=f"t{i % tenants}"), now)
    core.add_worker("w", ["bench"], 1)
    next_id = backlog
    results = []
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection landing in one round would measure the GC, not the scheduler
    try:
        for _ in range(rounds):
            started = time.perf_counter_ns()
            for _ in range(ops):
                core.submit(Task(f"q{next_id}", "bench", tenant=f"t{next_id % tenants}"), now)
                next_id += 1
                ((worker, task),) = core.dispatch(now)
                core.finish(task.id, now, worker_id=worker, attempt=task.attempts, state=SUCCEEDED)
                core.grant(worker, 1)
            results.append((time.perf_counter_ns() - started) / ops)
    finally:
        if gc_was_enabled:
            gc.enable()
    return results


def _core_cost_ns(backlog: int, tenants: int, ops: int, rounds: int) -> tuple[float, str, list[float]]:
    """(ns per operation, what one operation is, the runs) — from bench/core_dispatch.py when it is there.

    core_dispatch.py is the core's own benchmark; reusing its `measure` keeps one
    definition of "dispatch cost". Without it, the cycle above stands in.
    """
    import cronoq.core  # noqa: F401  (first, so a cronoq copy on PYTHONPATH wins over core_dispatch's sys.path entry)

    try:
        from bench import core_dispatch
    except ImportError:
        costs = dispatch_cost_ns(backlog, tenants, ops, rounds)
        return statistics.median(costs), "submit+dispatch+finish", costs
    pair, cycle = core_dispatch.measure(backlog, tenants, ops)
    return pair * 1e9, "submit+dispatch pair (core_dispatch.measure, best of 3)", [pair * 1e9, cycle * 1e9]


def dispatch_rows(s: BenchSettings, log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    cases = [(backlog, s.scale_tenants) for backlog in s.scale_backlogs]
    cases.append((max(s.scale_backlogs), s.scale_many_tenants))
    for backlog, tenants in cases:
        cost, what, runs = _core_cost_ns(backlog, tenants, s.scale_ops, s.repeat)
        log(f"  dispatch at backlog {backlog:,} over {tenants:,} tenants: {cost:,.0f} ns per {what}")
        rows.append({
            "name": f"core: backlog {backlog:.0e}, {tenants:.0e} tenants".replace("e+0", "e"),
            "kind": "dispatch", "backlog": backlog, "tenants": tenants, "ns_per_cycle": cost, "operation": what,
            "ns_runs": runs, "tasks_per_s": 1e9 / cost,
            "value": f"{cost / 1000:.2f} µs per {what.split(' (')[0]}",
        })
    base = rows[0]["ns_per_cycle"]
    for row in rows:
        row["vs_smallest_backlog"] = row["ns_per_cycle"] / base
        row["value"] += f" ({row['vs_smallest_backlog']:.2f}x the {s.scale_backlogs[0]:,} case)"
    return rows


def _run(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


async def _pause(address: str, pool: str = "default") -> None:
    import cronoq

    async with cronoq.connect(address) as sched:
        await sched.pause(pool)


def memory_row(s: BenchSettings, log: Callable[[str], None]) -> dict[str, Any]:
    """RSS growth of a (durable, default) broker per queued task, with its pool paused so tasks stay queued."""
    payload_bytes = len(msgspec.msgpack.encode(payload(0)))
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-mem-") as tmp:
        text, clients, _ = broker_config(durable=True, tokens=False, data_dir=Path(tmp) / "data")
        broker = CronoqBroker(text, Path(tmp))
        proc = broker.start()
        try:
            _run(_pause(clients))
            _run(submit_many(clients, min(1_000, s.memory_tasks), s.window))  # warm-up: buffers, interned names
            time.sleep(0.3)
            before = rss_bytes(proc.pid)
            _run(submit_many(clients, s.memory_tasks, s.window))
            time.sleep(0.3)
            after = rss_bytes(proc.pid)
        finally:
            broker.stop()
    per_task = (after - before) / s.memory_tasks
    log(f"  broker memory: {per_task:,.0f} B per queued task ({s.memory_tasks:,} queued)")
    return {
        "name": "broker memory per queued task", "kind": "memory", "tasks": s.memory_tasks,
        "bytes_per_task": per_task, "bytes_per_task_payload_aside": per_task - payload_bytes,
        "payload_bytes": payload_bytes, "rss_before": before, "rss_after": after,
        "value": f"{per_task:,.0f} B/task RSS growth ({per_task - payload_bytes:,.0f} B payload aside), "
                 f"{s.memory_tasks:,} queued, durable",
    }


async def _status_state(address: str, task_id: str) -> str | None:
    """The task's state, or None when the broker does not know it."""
    import cronoq

    async with cronoq.connect(address, request_timeout=60) as sched:
        try:
            return (await sched.status(task_id)).state
        except cronoq.NotFound:
            return None


def recovery_row(s: BenchSettings, log: Callable[[str], None]) -> dict[str, Any]:
    """Restart a durable broker holding `recovery_tasks` queued tasks: seconds until it serves again.

    First a probe: a few tasks queued (pool paused), SIGTERM, restart, and
    `status` of one. If the broker forgot it, durability is not there yet and
    the row says so instead of timing an empty restart.
    """
    name = f"restart with {s.recovery_tasks:,} queued"
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-rec-") as tmp:
        text, clients, _ = broker_config(durable=True, tokens=False, data_dir=Path(tmp) / "data")
        broker = CronoqBroker(text, Path(tmp))
        try:
            broker.start()
            _run(_pause(clients))
            probe = _run(submit_many(clients, 10, 10))
            broker.stop()
            broker.start()
            if _run(_status_state(clients, probe[-1])) is None:
                log("  recovery: n/a, the broker forgot its tasks on restart")
                return {"name": name, "kind": "recovery", "tasks": s.recovery_tasks,
                        "value": "n/a: durability not available",
                        "note": "n/a: durability not available"}
            _run(_pause(clients))
            ids = _run(submit_many(clients, s.recovery_tasks, s.window, timeout=3_600))
            stop_started = time.perf_counter()
            broker.stop(grace=600)
            stop_seconds = time.perf_counter() - stop_started
            started = time.perf_counter()
            broker.start(timeout=600)
            ready = time.perf_counter() - started
            state = _run(_status_state(clients, ids[-1]))
            serving = time.perf_counter() - started
        finally:
            broker.stop()
    if state is None:
        return {"name": name, "kind": "recovery", "value": f"lost tasks: the last of {s.recovery_tasks:,} is unknown",
                "note": "FAILED: a queued task was lost over the restart"}
    log(f"  recovery: ready after {ready:.2f} s, serving (status answered) after {serving:.2f} s")
    return {"name": name, "kind": "recovery", "tasks": s.recovery_tasks, "ready_s": ready, "serving_s": serving,
            "graceful_stop_s": stop_seconds, "state_after": state,
            "value": f"{serving:.2f} s to serving again (ready line {ready:.2f} s; graceful stop {stop_seconds:.2f} s)"}


def retained_row(s: BenchSettings, log: Callable[[str], None]) -> dict[str, Any]:
    """Run `recovery_tasks` noop tasks through a durable broker (two workers), so that as many finished tasks
    are retained (in the results store), then restart it: seconds until `status` of the first one answers."""
    from bench.common import Children, log_dir
    from bench.load import drive_cronoq
    from bench.stacks import start_cronoq_worker

    name = f"restart with {s.recovery_tasks:,} retained"
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-ret-") as tmp:
        text, clients, workers = broker_config(durable=True, tokens=False, data_dir=Path(tmp) / "data")
        # Room for every one of them: the default budget (128 MiB) keeps about 450,000 noop results.
        text = text.replace("[broker]\n", f"[broker]\nresult_retention_bytes = {1 << 30}\n", 1)
        broker = CronoqBroker(text, Path(tmp))
        procs = []
        try:
            broker.start()
            for i in range(s.workers):
                procs.append(start_cronoq_worker(workers, "bench.apps:noop", s.concurrency,
                                                 log_dir() / f"retained-worker-{i}.log", tokens=False))
            first = _run(submit_many(clients, 1, 1))[0]
            _run(drive_cronoq(clients, s.recovery_tasks, s.window, timeout=7_200))
            for proc in procs:
                Children.stop(proc)
            procs = []
            stop_started = time.perf_counter()
            broker.stop(grace=600)
            stop_seconds = time.perf_counter() - stop_started
            started = time.perf_counter()
            broker.start(timeout=600)
            ready = time.perf_counter() - started
            state = _run(_status_state(clients, first))
            serving = time.perf_counter() - started
        finally:
            for proc in procs:
                Children.stop(proc)
            broker.stop()
    if state != "succeeded":
        return {"name": name, "kind": "recovery", "value": f"lost: the first task is {state}",
                "note": "FAILED: a retained result was lost over the restart"}
    log(f"  recovery with retained results: ready after {ready:.2f} s, serving after {serving:.2f} s")
    return {"name": name, "kind": "recovery", "tasks": s.recovery_tasks, "ready_s": ready, "serving_s": serving,
            "graceful_stop_s": stop_seconds, "state_after": state,
            "value": f"{serving:.2f} s to serving again (ready line {ready:.2f} s; graceful stop {stop_seconds:.2f} s)"}
