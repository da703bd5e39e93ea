"""Throughput and latency rows: the relay (the limit) and cronoq end to end, each a median of runs."""

from __future__ import annotations

import time
from typing import Any, Callable, Coroutine

from bench.common import Run, median_of
from bench.load import drive_cronoq
from bench.relay import drive_relay
from bench.settings import BenchSettings
from bench.stacks import TOKENS, Stack, cronoq_stack, relay_stack

# The cronoq variants: (row name, durable, tokens); durable as in stacks.broker_config.
# The last one is the configuration the targets are about; "fsync" syncs before every accept.
CRONOQ_VARIANTS: list[tuple[str, bool | str, bool]] = [
    ("cronoq, durability none", False, False),
    ("cronoq, durability none, tokens", False, True),
    ("cronoq, durability fsync, tokens", "fsync", True),
    ("cronoq, durable (default)", True, False),
    ("cronoq, durable, tokens", True, True),
]


def _run_async(coro: Coroutine[Any, Any, Run]) -> Run:
    import uvloop

    return uvloop.run(coro)


def _measured(stack: Stack, drive: Callable[[], Coroutine[Any, Any, Run]]) -> dict[str, Any]:
    """One run, with the CPU each process group used during it."""
    before, client_before = stack.cpu(), time.process_time()
    run = _run_async(drive())
    after, client_after = stack.cpu(), time.process_time()
    run.cpu = {group: after[group] - before[group] for group in after}
    run.cpu["client"] = client_after - client_before  # the load generator runs in this process
    return run.summary()


def _row(name: str, kind: str, runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, **median_of(runs), **extra}


def limit_rows(s: BenchSettings, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The relay under saturation and with one task in flight."""
    saturated, light = [], []
    for i in range(s.repeat):
        with relay_stack(s.workers, s.concurrency) as stack:
            _run_async(drive_relay(stack.address, min(1000, s.tasks), s.window))  # warm-up
            saturated.append(_measured(stack, lambda: drive_relay(stack.address, s.tasks, s.window)))
            light.append(_measured(stack, lambda: drive_relay(stack.address, s.light_tasks, 1)))
        log(f"  limit run {i + 1}: {saturated[-1]['tasks_per_s']:,.0f} tasks/s, "
            f"one in flight p50 {light[-1]['p50_ms']:.2f} ms")
    note = f"{s.workers} workers x credit {s.concurrency}"
    return [
        _row("limit: bare pyzmq relay", "throughput", saturated, window=s.window, note=f"{s.window} in flight; {note}"),
        _row("limit: one in flight", "light", light, window=1, note=note),
    ]


def cronoq_rows(s: BenchSettings, log: Callable[[str], None],
                variants: list[tuple[str, bool | str, bool]] = CRONOQ_VARIANTS) -> list[dict[str, Any]]:
    """Every cronoq variant under saturation; light-load latency for the first and the last."""
    rows = []
    for index, (name, durable, tokens) in enumerate(variants):
        token = TOKENS["BENCH_CLIENT_TOKEN"] if tokens else None
        with_light = index in (0, len(variants) - 1) or durable == "fsync"
        saturated, light = [], []
        for i in range(s.repeat):
            with cronoq_stack(durable=durable, tokens=tokens, workers=s.workers, concurrency=s.concurrency) as stack:
                # Warm-up: connections, imports and the allocator's pools settle before the clock runs.
                _run_async(_checked(drive_cronoq(stack.address, min(1000, s.tasks), s.window, token=token)))
                saturated.append(_measured(stack, lambda: _checked(drive_cronoq(stack.address, s.tasks, s.window,
                                                                                 token=token))))
                if with_light:
                    light.append(_measured(stack, lambda: _checked(drive_cronoq(stack.address, s.light_tasks, 1,
                                                                                 token=token))))
            log(f"  {name} run {i + 1}: {saturated[-1]['tasks_per_s']:,.0f} tasks/s"
                + (f", one in flight p50 {light[-1]['p50_ms']:.2f} ms" if light else ""))
        base = f"{s.workers} workers x concurrency {s.concurrency}"
        rows.append(_row(name, "throughput", saturated, window=s.window, durable=durable, tokens=tokens,
                         note=f"{s.window} in flight; {base}"))
        if with_light:
            rows.append(_row(f"{name}: one in flight", "light", light, window=1, durable=durable, tokens=tokens,
                             note=base))
    return rows


async def _checked(drive: Coroutine[Any, Any, tuple[Run, list]]) -> Run:
    """The run, after checking that every task came back with its own number."""
    run, results = await drive
    wrong = [n for n, value in enumerate(results) if value != n]
    if wrong or run.tasks != len(results):
        raise RuntimeError(f"{len(wrong)} of {len(results)} tasks came back wrong (first: {wrong[:5]})")
    return run
