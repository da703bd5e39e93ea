"""Fairness under load: tenants weighing 3, 1 and 1 saturate one pool through the real broker.

The pool is paused while 3k, 1k and 1k tasks are queued (the light tenants
first, so the heavy one cannot win by arriving early), then resumed. One
worker process with many slots records the order it started tasks in,
which is the broker's dispatch order (one connection delivers in order).

For every prefix of n dispatches while all three are backlogged, each
tenant's count c(n) is compared with its weighted share n*w/W. Start-time
fair queuing guarantees |c_i/w_i - c_j/w_j| <= 1/w_i + 1/w_j for unit
tasks over any interval where both are backlogged (Goyal, Vin and Cheng,
1996); summed over the other tenants this bounds the deviation from the
share at (sum over j != i of (w_i + w_j)) / W.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from bench.settings import BenchSettings
from bench.stacks import cronoq_stack

WEIGHTS = {"a": 3, "b": 1, "c": 1}
POOLS = '[[pools]]\nname = "fair"\n[pools.tenant_weights]\n' + "".join(f"{t} = {w}\n" for t, w in WEIGHTS.items())


def sfq_bound(weights: dict[str, float]) -> dict[str, float]:
    """The largest deviation of each tenant's dispatch count from its weighted share that SFQ allows."""
    total = sum(weights.values())
    return {t: sum(w + weights[j] for j in weights if j != t) / total for t, w in weights.items()}


def deviations(sequence: list[str], weights: dict[str, float]) -> tuple[dict[str, float], int]:
    """Largest |c_t(n) - n*w_t/W| over prefixes while every tenant still has work; and that prefix length."""
    last = {t: max(i for i, s in enumerate(sequence) if s == t) for t in weights}
    backlogged = min(last.values()) + 1  # the earliest-draining tenant's last dispatch still counts
    total = sum(weights.values())
    counts = dict.fromkeys(weights, 0)
    worst = dict.fromkeys(weights, 0.0)
    for n, tenant in enumerate(sequence[:backlogged], start=1):
        counts[tenant] += 1
        for t, w in weights.items():
            worst[t] = max(worst[t], abs(counts[t] - n * w / total))
    return worst, backlogged


async def _drive(address: str, unit: int) -> list[str]:
    import cronoq
    from bench.common import payload

    order = [t for t in ("c", "b", "a") for _ in range(WEIGHTS[t] * unit)]
    async with cronoq.connect(address, request_timeout=120) as sched:
        await sched.pause("fair")
        handles = []
        for start in range(0, len(order), 500):  # 500 submits in flight at a time
            batch = order[start:start + 500]
            handles += await asyncio.gather(*(sched.submit(payload(start + i), pool="fair", tenant=t)
                                              for i, t in enumerate(batch)))
        await sched.resume("fair")
        results = await asyncio.gather(*(h.result(timeout=300) for h in handles))
    started = sorted((seq, n) for seq, n in results)
    if [seq for seq, _ in started] != list(range(len(order))):
        raise RuntimeError("the fairness worker's start counter has gaps: a task ran twice or not at all")
    return [order[n] for _, n in started]


def fairness_rows(s: BenchSettings, log: Callable[[str], None]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per tenant (deviation vs bound, median over runs) and the last run's dispatch sequence."""
    import uvloop

    bound = sfq_bound(WEIGHTS)
    runs: list[dict[str, float]] = []
    sequence: list[str] = []
    prefix = 0
    for i in range(s.repeat):
        with cronoq_stack(durable=True, tokens=False, workers=1, concurrency=s.concurrency,
                          target="bench.apps:fair", pools=POOLS) as stack:
            sequence = uvloop.run(_drive(stack.address, s.fair_unit))
        worst, prefix = deviations(sequence, WEIGHTS)
        runs.append(worst)
        log(f"  fairness run {i + 1}: largest deviation " + ", ".join(f"{t} {v:.2f}" for t, v in worst.items())
            + f" over {prefix:,} dispatches (SFQ bound " + ", ".join(f"{t} {v:.2f}" for t, v in bound.items()) + ")")
    rows = []
    for t, w in WEIGHTS.items():
        worst_over_runs = max(run[t] for run in runs)
        rows.append({
            "name": f"fairness: tenant {t} (weight {w})", "kind": "fairness", "tenant": t, "weight": w,
            "deviation": worst_over_runs, "deviation_runs": [run[t] for run in runs], "bound": bound[t],
            "within_bound": worst_over_runs <= bound[t] + 1e-9, "prefix": prefix,
            "value": f"max deviation {worst_over_runs:.2f} tasks (SFQ bound {bound[t]:.2f}) over {prefix:,} dispatches",
        })
    return rows, sequence
