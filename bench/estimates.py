"""How good are `explain`'s estimates? Explain a sample of tasks as they are submitted, then compare each estimate
with when the task actually started.

    python bench/estimates.py                   # a real broker and a real worker, about a minute
    python bench/estimates.py --mode core       # the same workload through the pure core, simulated time
    python bench/estimates.py --seconds 6 --json out.json

The workload (one pool, `est`; tenants acme 3 : globex 1 : initech 1, initech under a ceiling of 1; a worker of
4 slots, each task taking `SERVICE` seconds, so the pool serves about 4 / SERVICE tasks a second) runs in three
equal phases, with Poisson arrivals at fractions of that capacity C:

1. steady: normal work at 0.85 C over the three tenants (half acme's), high work (ops) at 0.05 C, low work (acme)
   at 0.03 C;
2. surge: high work at 1.05 C (it outruns the pool: normal and low work starve), normal at 0.3 C;
3. recovery: phase 1's rates, plus deadline tasks of the normal class (globex, 30 s deadline) at 0.05 C.

One task in `--every` is explained right after it is accepted, and again LATER seconds after if it is still
queued. Reported, over all these explanations:

- numeric estimates: the median relative error |estimate - wait| / wait, and the share within 2x of the wait
  (estimate and wait both floored at FLOOR seconds, below which neither means much);
- the share of "cannot tell" answers, and of those the share that started soon anyway (within SOON seconds:
  the answer was needlessly cautious);
- the same two figures for the estimate explain gave before it counted the work arriving ahead of a task
  (recomputed from the counts and rates in the same explanation: `A / r + (q + 1) / (r x share)`).

Tasks that started before they could be explained, expired, or had not started when the run ended are counted
apart. Nothing here is a speed: the broker mode's capacity is whatever the machine gives.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

if __package__ in (None, ""):  # `python bench/estimates.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLOTS = 4
SERVICE = 0.04  # seconds per task
FLOOR = 0.1  # seconds: waits and estimates below this count as this
SOON = 2.0  # seconds: a "cannot tell" task that started within this was needlessly cautious
DEADLINE = 30.0
LATER = 2.0  # seconds: a sampled task still queued this long after it was accepted is explained again
WEIGHTS = {"acme": 3, "globex": 1, "initech": 1}
LIMITS = {"initech": 1}
PRIORITIES = ("critical", "high", "normal", "low")


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the start of the run
    tenant: str
    priority: int
    deadline: float | None  # seconds after arrival


def workload(seconds: float, capacity: float, seed: int = 7) -> list[Arrival]:
    """The three phases' arrivals, in time order (see the module's docstring)."""
    rng = random.Random(seed)
    third = seconds / 3
    streams = [  # (phase, tenant, priority, fraction of capacity, deadline)
        (0, "acme", 2, 0.425, None), (0, "globex", 2, 0.2125, None), (0, "initech", 2, 0.2125, None),
        (0, "ops", 1, 0.05, None), (0, "acme", 3, 0.03, None),
        (1, "ops", 1, 1.05, None), (1, "acme", 2, 0.15, None), (1, "globex", 2, 0.075, None),
        (1, "initech", 2, 0.075, None), (1, "acme", 3, 0.03, None),
        (2, "acme", 2, 0.425, None), (2, "globex", 2, 0.2125, None), (2, "initech", 2, 0.2125, None),
        (2, "ops", 1, 0.05, None), (2, "acme", 3, 0.03, None), (2, "globex", 2, 0.05, DEADLINE),
    ]
    out = []
    for phase, tenant, priority, fraction, deadline in streams:
        rate = fraction * capacity
        t = phase * third + rng.expovariate(rate)
        while t < (phase + 1) * third:
            out.append(Arrival(t, tenant, priority, deadline))
            t += rng.expovariate(rate)
    out.sort(key=lambda a: a.at)
    return out


@dataclass
class Sample:
    """One explained task: what explain said, and when it started (seconds after the explanation; None: never)."""

    priority: str
    estimate: float | None
    note: str
    old_estimate: float | None
    wait: float | None = None
    outcome: str = "started"  # started | expired | not started | started before explain
    when: str = "accepted"  # accepted | waiting (explained again LATER seconds after, still queued)


def old_estimate(waiting: Any, has_deadline: bool) -> float | None:
    """The figure explain gave before it counted new work ahead: from the explanation's own counts and rate."""
    rate = waiting.dispatch_rate
    if (waiting.paused or not waiting.workers or waiting.delayed_for is not None or not rate
            or any(n.ceiling is not None and n.ceiling.capped for n in waiting.nodes)):
        return None
    ahead = waiting.higher_classes_ahead + waiting.deadline_ahead
    if has_deadline or not waiting.fair:
        return (ahead + (waiting.queue_ahead or 0) + 1) / rate
    if not waiting.tenant_share:
        return None
    return ahead / rate + ((waiting.queue_ahead or 0) + 1) / (rate * waiting.tenant_share)


def _sample(priority: int, waiting: Any, has_deadline: bool, when: str = "accepted") -> Sample:
    return Sample(PRIORITIES[priority], waiting.estimate, waiting.estimate_note, old_estimate(waiting, has_deadline),
                  when=when)


# -- through the pure core, simulated time ------------------------------------------------------------------

def run_core(seconds: float, every: int, seed: int = 7) -> list[Sample]:
    """The workload through SchedulerCore with a fake clock: one worker of SLOTS slots, each task SERVICE s;
    rates sampled once a simulated second, as the broker does at each heartbeat."""
    from cronoq.core import EXPIRED, SUCCEEDED, PoolSettings, SchedulerCore, Task
    from cronoq.book.rates import DispatchRates

    core = SchedulerCore([PoolSettings("est", tenant_weights=WEIGHTS, tenant_limits=LIMITS)])
    core.add_worker("w", ["est"], SLOTS)
    rates = DispatchRates(core)
    rates.sample(0.0)
    next_sample = 1.0
    ends: list[tuple[float, str]] = []  # (when, task id) of running tasks
    later: list[tuple[float, str, int]] = []  # (when, task id, priority) of explains due while waiting
    started: dict[str, float] = {}
    explained: list[tuple[str, float, Sample]] = []
    arrivals = workload(seconds, SLOTS / SERVICE, seed)
    now = 0.0

    def advance(until: float) -> None:
        nonlocal now, next_sample
        while True:
            due = min(ends[0][0] if ends else float("inf"), later[0][0] if later else float("inf"), next_sample)
            if due > until:
                break
            now = due
            if ends and ends[0][0] == due:
                _, task_id = heapq.heappop(ends)
                task = core.get(task_id)
                core.finish(task_id, now, worker_id="w", attempt=task.attempts, state=SUCCEEDED)
                core.grant("w")
            elif later and later[0][0] == due:
                _, task_id, priority = heapq.heappop(later)
                task = core.get(task_id)
                if task is not None and task.state == "queued":
                    waiting = core.explain(task_id, now, *rates.for_explain("est", now))
                    explained.append((task_id, now, _sample(priority, waiting, task.deadline is not None,
                                                            "waiting")))
            else:
                rates.sample(now)
                next_sample += 1.0
            pump()
        now = until

    def pump() -> None:
        core.expire(now)
        for _, task in core.dispatch(now):
            started[task.id] = now
            heapq.heappush(ends, (now + SERVICE, task.id))

    for n, arrival in enumerate(arrivals):
        advance(arrival.at)
        deadline = None if arrival.deadline is None else now + arrival.deadline
        task_id = f"t{n}"
        core.submit(Task(task_id, "est", tenant=arrival.tenant, priority=arrival.priority, deadline=deadline), now)
        pump()
        if n % every == 0:
            waiting = core.explain(task_id, now, *rates.for_explain("est", now))
            if waiting is None:
                explained.append((task_id, now, Sample(PRIORITIES[arrival.priority], None, "", None,
                                                       outcome="started before explain")))
            else:
                explained.append((task_id, now, _sample(arrival.priority, waiting, deadline is not None)))
                heapq.heappush(later, (now + LATER, task_id, arrival.priority))
    advance(now + max(60.0, seconds))  # drain
    for task_id, at, sample in explained:
        if sample.outcome != "started":
            continue
        if task_id in started:
            sample.wait = started[task_id] - at
        else:
            task = core.get(task_id)
            sample.outcome = "expired" if task is None or task.state == EXPIRED else "not started"
    return [sample for _, _, sample in explained]


# -- through a real broker and a real worker ------------------------------------------------------------------

POOLS = (
    '[[pools]]\nname = "est"\n[pools.tenant_weights]\n'
    + "".join(f"{name} = {weight}\n" for name, weight in WEIGHTS.items())
    + "[pools.tenant_limits]\n" + "".join(f"{name} = {limit}\n" for name, limit in LIMITS.items())
)


async def _drive(address: str, seconds: float, every: int, seed: int) -> list[Sample]:
    import cronoq

    arrivals = workload(seconds, SLOTS / SERVICE, seed)
    explained: list[tuple[str, float, Sample]] = []
    pending: set[asyncio.Task] = set()
    async with cronoq.connect(address) as client:
        async def one(n: int, arrival: Arrival) -> None:
            handle = await client.submit({"n": n, "s": SERVICE}, pool="est", tenant=arrival.tenant,
                                         priority=PRIORITIES[arrival.priority], deadline=arrival.deadline)
            if n % every:
                return
            why = await client.explain(handle.id)
            at = time.time()
            if why.waiting is None:
                sample = Sample(PRIORITIES[arrival.priority], None, "", None, outcome="started before explain")
                explained.append((handle.id, at, sample))
                return
            explained.append((handle.id, at, _sample(arrival.priority, why.waiting, arrival.deadline is not None)))
            await asyncio.sleep(LATER)
            why = await client.explain(handle.id)
            if why.state == "queued" and why.waiting is not None:
                explained.append((handle.id, time.time(), _sample(arrival.priority, why.waiting,
                                                                  arrival.deadline is not None, "waiting")))

        start = time.monotonic()
        for n, arrival in enumerate(arrivals):
            delay = start + arrival.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            job = asyncio.get_running_loop().create_task(one(n, arrival))
            pending.add(job)
            job.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
        end = time.monotonic() + max(60.0, seconds)
        for task_id, at, sample in explained:
            if sample.outcome != "started":
                continue
            while True:
                info = await client.status(task_id)
                if info.started_at is not None or info.state in ("expired", "cancelled"):
                    break
                if time.monotonic() > end:
                    break
                await asyncio.sleep(0.2)
            if info.started_at is not None:
                sample.wait = info.started_at - at
            else:
                sample.outcome = "expired" if info.state == "expired" else "not started"
    return [sample for _, _, sample in explained]


def run_broker(seconds: float, every: int, seed: int = 7) -> list[Sample]:
    """The workload through a real broker (durability none) and one real worker process of SLOTS slots."""
    from bench.stacks import cronoq_stack

    with cronoq_stack(durable=False, tokens=False, workers=1, concurrency=SLOTS, target="bench.apps:service",
                      pools=POOLS) as stack:
        return asyncio.run(_drive(stack.address, seconds, every, seed))


# -- the report ---------------------------------------------------------------------------------------------------

def _within(estimate: float, wait: float) -> bool:
    ratio = max(estimate, FLOOR) / max(wait, FLOOR)
    return 0.5 <= ratio <= 2.0


def _error(estimate: float, wait: float) -> float:
    return abs(max(estimate, FLOOR) - max(wait, FLOOR)) / max(wait, FLOOR)


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """The figures of the module's docstring, for explain now (`new`) and as it was (`old`)."""
    judged = [s for s in samples if s.outcome in ("started", "not started")]

    def figures(pick) -> dict[str, Any]:
        numeric = [(pick(s), s.wait) for s in judged if pick(s) is not None and s.wait is not None]
        cannot = [s for s in judged if pick(s) is None and s.note.startswith("cannot tell")]
        soon = [s for s in cannot if s.wait is not None and s.wait <= SOON]
        return {
            "numeric": len(numeric),
            "median_relative_error": statistics.median(_error(e, w) for e, w in numeric) if numeric else None,
            "within_2x": sum(_within(e, w) for e, w in numeric) / len(numeric) if numeric else None,
            "cannot_tell": len(cannot) / len(judged) if judged else None,
            "cannot_tell_started_soon": len(soon) / len(cannot) if cannot else None,
        }

    new = figures(lambda s: s.estimate)
    old = figures(lambda s: s.old_estimate)
    # The old figure never said "cannot tell"; where the new one does, the old one gave a number: judge those.
    old_where_cannot = [(s.old_estimate, s.wait) for s in judged
                        if s.estimate is None and s.note.startswith("cannot tell") and s.old_estimate is not None]
    old["cannot_tell"] = 0.0
    old["cannot_tell_started_soon"] = None
    old["on_cannot_tell_within_2x"] = (sum(w is not None and _within(e, w) for e, w in old_where_cannot)
                                       / len(old_where_cannot) if old_where_cannot else None)
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.outcome] = counts.get(s.outcome, 0) + 1
    waiting = sum(s.when == "waiting" for s in samples)
    return {"explained": len(samples), "explained_while_waiting": waiting, "outcomes": counts, "new": new,
            "old": old}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def table(summary: dict[str, Any]) -> Iterator[str]:
    yield (f"{summary['explained']} explanations ({summary['explained_while_waiting']} of tasks still queued "
           f"{LATER:g} s after they were accepted); outcomes: ") + ", ".join(
        f"{k} {v}" for k, v in sorted(summary["outcomes"].items()))
    yield f"{'':28} {'numeric':>8} {'median err':>11} {'within 2x':>10} {'cannot tell':>12} {'  of those soon':>15}"
    for label, key in (("explain now", "new"), ("before (queued work only)", "old")):
        f = summary[key]
        err = "-" if f["median_relative_error"] is None else f"{f['median_relative_error']:.0%}"
        yield (f"{label:28} {f['numeric']:>8} {err:>11} {_pct(f['within_2x']):>10} {_pct(f['cannot_tell']):>12} "
               f"{_pct(f['cannot_tell_started_soon']):>15}")
    old = summary["old"]
    if old.get("on_cannot_tell_within_2x") is not None:
        yield (f"where explain now cannot tell, the old figure was within 2x of the wait for "
               f"{_pct(old['on_cannot_tell_within_2x'])} of the tasks that started")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("broker", "core"), default="broker")
    parser.add_argument("--seconds", type=float, default=45.0, help="the three phases together (default 45)")
    parser.add_argument("--every", type=int, default=10, help="explain one task in this many (default 10)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the summary and every sample here")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.every < 1:
        parser.error("--seconds must be positive and --every at least 1")
    run = run_core if args.mode == "core" else run_broker
    samples = run(args.seconds, args.every, args.seed)
    summary = summarize(samples)
    print(f"explain estimates, {args.mode} mode, {args.seconds:g} s of arrivals, capacity {SLOTS / SERVICE:g}/s "
          f"nominal ({SLOTS} slots x {SERVICE} s)")
    for line in table(summary):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps({**summary, "samples": [asdict(s) for s in samples]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
