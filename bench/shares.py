"""What a share counts, tenant rates and minimums, shown: shares, rates, floors and the dispatch cost of each mode.

    python bench/shares.py            # everything, a result file and a PNG in bench/results/ (~2 min)
    python bench/shares.py --quick    # a smoke run: shorter, smaller, no broker, writes nothing unless asked

Four parts run on the pure scheduling core with simulated time (tests/core/simulation.py: workers whose
tasks take exactly the time given, the clock jumping from event to event), so their shares are exact and the
same on every machine:

1. **modes**: two tenants weighted 1 : 1, `fast` whose tasks take 10 ms and `slow` 100 ms, 4 workers, both
   backlogged, under share_by "dispatches", "runtime" and "cost" (fast's tasks declare cost 1, slow's 10),
   and "runtime" again with fast's tasks spread over ten sub-tenants (fast/u0 …). Each top-level tenant's
   share of the dispatches, of the worker time and of the summed cost.
2. **rates**: `limited` at tenant_rates 5/s beside `a` and `b`, all weighted 1 and backlogged, 10 ms tasks,
   4 workers: limited's starts per second (over the run and in its busiest second) against its limit, and
   the others' throughput against what the workers leave them.
3. **minimums**: `light` weighted 1 with tenant_minimums 2 beside `heavy` weighted 10, 100 ms tasks,
   8 workers, with and without the minimum: light's running tasks (mean and least) and its share.
4. **dispatch cost**: CPU µs per round (submit + finish + grant + dispatch, one worker slot, the clock moving
   1 ms a round) at backlogs of 10^3, 10^4 and 10^5 spread over 1,000 tenants, for "dispatches" (as before),
   "cost", "runtime", "dispatches" with a rate on every tenant, and with minimums on 10 tenants. Best of 3.

Rates and minimums run under "dispatches" and again under "runtime". One part needs the real thing:

5. **broker**: part 1's two tenants through a real broker and one real worker process of 4 slots whose
   handler sleeps 10 ms or 100 ms, for `--broker-seconds` (default 8) per mode, "dispatches" then
   "runtime": the worker time each tenant had, measured by the worker's clock around each run, over the
   window in which both were backlogged. Then part 2's rate the same way: `limited` at 5/s beside `a` and
   `b`, all 10 ms tasks, its starts per second and theirs.

The result file is `bench/results/shares-<UTC stamp>.json` with its PNG beside it; `python bench/figures.py`
writes its table into bench/README.md and README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import platform
import random
import sys
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task  # noqa: E402
from tests.core.simulation import Simulation  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DURATION = {"fast": 0.010, "slow": 0.100}
COST = {"fast": 1.0, "slow": 10.0}
MODES = ("dispatches", "runtime", "cost")
_ids = itertools.count()


# ---------------------------------------------------------------------------------------------------------------
# Simulated: shares, rates and minimums


def _fill(core: SchedulerCore, pool: str, counts: dict[str, int], cost: dict[str, float] | None = None) -> None:
    for tenant, count in counts.items():
        for _ in range(count):
            core.submit(Task(f"{tenant}-{next(_ids)}", pool, tenant=tenant,
                             cost=None if cost is None else cost[tenant]), 0.0)


def _backlogged_until(sim: Simulation, tenants: list[str]) -> float:
    """The first time after which one of `tenants` had nothing queued (the run's end if none ran out)."""
    counts = sim.core.stats()["p"]["tenants"]
    if all(counts.get(t, {}).get("queued", 0) for t in tenants):
        return sim.now
    out: dict[str, float] = {}
    remaining = Counter({t: counts.get(t, {}).get("queued", 0) for t in tenants})
    for started, task in reversed(sim.run.starts):  # the last start of a tenant that ran out is when it did
        if task.tenant in tenants and not remaining[task.tenant] and task.tenant not in out:
            out[task.tenant] = started
    return min(out.values(), default=sim.now)


def _worker_time(starts: list[tuple[float, Task]], duration: Callable[[Task], float], until: float,
                 ) -> dict[str, float]:
    """Worker time per tenant in [0, until]: every run's part of it."""
    out: dict[str, float] = defaultdict(float)
    for started, task in starts:
        if started < until:
            out[task.tenant] += min(started + duration(task), until) - started
    return out


def _shares(values: dict[str, float]) -> dict[str, float]:
    total = sum(values.values())
    return {k: round(v / total, 4) if total else 0.0 for k, v in sorted(values.items())}


TREE_LEAVES = 10
"""In the "runtime, tenant tree" row, fast's tasks are spread over fast/u0 … fast/u9."""


def _top(tenant: str) -> str:
    return tenant.split("/", 1)[0]


def modes(seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Part 1: two tenants 1 : 1, 10 ms against 100 ms tasks, under each share_by; then share_by "runtime" with
    fast's tasks spread over sub-tenants (the share is its whole subtree's)."""
    out: dict[str, Any] = {}
    per_slot = {tenant: seconds / d for tenant, d in DURATION.items()}  # enough for each to stay backlogged
    for label, mode, tree in (*((m, m, False) for m in MODES), ("runtime, tenant tree", "runtime", True)):
        core = SchedulerCore([PoolSettings("p", fair_share=True, share_by=mode)])
        counts = {t: int(4 * n) + 10 for t, n in per_slot.items()}
        if tree:
            fast = counts.pop("fast")
            counts.update({f"fast/u{i}": fast // TREE_LEAVES + 10 for i in range(TREE_LEAVES)})
        _fill(core, "p", counts, {t: COST[_top(t)] for t in counts} if mode == "cost" else None)
        duration = lambda task: DURATION[_top(task.tenant)]  # noqa: E731
        sim = Simulation(core, "p", workers=4, duration=duration)
        sim.run_until(seconds)
        until = _backlogged_until(sim, list(counts))
        starts = [(t, task) for t, task in sim.run.starts if t < until]
        time_of: dict[str, float] = defaultdict(float)
        for tenant, spent in _worker_time(starts, duration, until).items():
            time_of[_top(tenant)] += spent
        dispatched = Counter(_top(task.tenant) for _, task in starts)
        cost = Counter()
        for _, task in starts:
            cost[_top(task.tenant)] += COST[_top(task.tenant)]
        # The slow tenant's share of the worker time since the start, once a simulated second (for the PNG).
        timeline = []
        for tick in range(1, int(until) + 1):
            part = _worker_time(starts, duration, float(tick))
            timeline.append(round(part["slow"] / sum(part.values()), 4))
        out[label] = {"seconds": round(until, 3), "dispatches": _shares(dict(dispatched)),
                     "worker_time": _shares(time_of), "cost": _shares(dict(cost)),
                     "dispatch_count": dict(sorted(dispatched.items())), "slow_time_share_by_second": timeline}
        row = out[label]
        log(f"  {label:<10} over {until:.0f} s: worker time fast/slow {row['worker_time']['fast']:.3f} / "
            f"{row['worker_time']['slow']:.3f}; dispatches {row['dispatches']['fast']:.3f} / "
            f"{row['dispatches']['slow']:.3f}; cost {row['cost']['fast']:.3f} / {row['cost']['slow']:.3f}")
    return out


def rates(seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Part 2: a tenant limited to 5 starts a second beside two backlogged ones, 10 ms tasks, 4 workers."""
    limit, workers, task_s = 5.0, 4, 0.010
    out: dict[str, Any] = {"limit": limit, "workers": workers, "task_seconds": task_s}
    for mode in ("dispatches", "runtime"):
        core = SchedulerCore([PoolSettings("p", fair_share=True, share_by=mode, tenant_rates={"limited": limit})])
        _fill(core, "p", {"limited": int(seconds * limit * 2) + 10,
                          "a": int(seconds * workers / task_s) + 10, "b": int(seconds * workers / task_s) + 10})
        sim = Simulation(core, "p", workers=workers, duration=lambda task: task_s)
        sim.run_until(seconds)
        per_second = Counter(int(t) for t, task in sim.run.starts if task.tenant == "limited" and t < seconds)
        others = sum(1 for t, task in sim.run.starts if task.tenant != "limited" and t < seconds)
        # The busiest window of one second anywhere (not only whole seconds): the bucket's burst shows there.
        times = [t for t, task in sim.run.starts if task.tenant == "limited"]
        busiest = max((sum(1 for u in times[i:] if u < t + 1.0) for i, t in enumerate(times)), default=0)
        row = {"limited_per_s": round(sum(per_second.values()) / seconds, 3),
               "limited_first_second": per_second.get(0, 0),
               "limited_busiest_later_second": max((c for s, c in per_second.items() if s > 0), default=0),
               "limited_busiest_1s_window": busiest,
               "others_per_s": round(others / seconds, 1),
               "others_capacity_per_s": round(workers / task_s - limit, 1)}
        out[mode] = row
        log(f"  {mode:<10} limited {row['limited_per_s']:.2f}/s (limit {limit:g}; first second "
            f"{row['limited_first_second']}, busiest later second {row['limited_busiest_later_second']}, any 1-s "
            f"window {busiest}); a + b {row['others_per_s']:.1f}/s "
            f"of the {row['others_capacity_per_s']:.0f}/s the workers leave them")
    return out


def minimums(seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Part 3: light (weight 1, minimum 2) beside heavy (weight 10), 100 ms tasks, 8 workers."""
    workers, task_s = 8, 0.100
    out: dict[str, Any] = {"workers": workers, "task_seconds": task_s, "weights": {"heavy": 10, "light": 1},
                           "minimum": 2, "rows": {}}
    rows = out["rows"]
    for mode in ("dispatches", "runtime"):
        for with_minimum in (False, True):
            core = SchedulerCore([PoolSettings("p", fair_share=True, share_by=mode,
                                               tenant_weights={"heavy": 10, "light": 1},
                                               tenant_minimums={"light": 2} if with_minimum else {})])
            _fill(core, "p", {t: int(seconds * workers / task_s) + 10 for t in ("heavy", "light")})
            sim = Simulation(core, "p", workers=workers, duration=lambda task: task_s)
            least = [workers]

            def watch(s: Simulation) -> None:
                if s.now > 0:  # after the first dispatch round, while both are backlogged
                    running = sum(1 for task_id in s.running if s.core.get(task_id).tenant == "light")
                    least[0] = min(least[0], running)

            sim.run_until(seconds, watch)
            time_of = _worker_time(sim.run.starts, lambda task: task_s, seconds)
            key = f"{mode}, {'minimum 2' if with_minimum else 'no minimum'}"
            rows[key] = {"light_mean_running": round(time_of["light"] / seconds, 3),
                        "light_least_running": least[0],
                        "light_time_share": _shares(time_of)["light"]}
            log(f"  {key:<24} light runs {rows[key]['light_mean_running']:.2f} tasks on average, never fewer than "
                f"{least[0]}; {rows[key]['light_time_share']:.1%} of the worker time")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Simulated: what a dispatch costs in each mode


DISPATCH_MODES: dict[str, Callable[[list[str]], PoolSettings]] = {
    "dispatches": lambda names: PoolSettings("p", fair_share=True),
    "cost": lambda names: PoolSettings("p", fair_share=True, share_by="cost"),
    "runtime": lambda names: PoolSettings("p", fair_share=True, share_by="runtime"),
    "dispatches + rates": lambda names: PoolSettings("p", fair_share=True,
                                                     tenant_rates={name: 1000.0 for name in names}),
    "dispatches + 10 minimums": lambda names: PoolSettings("p", fair_share=True,
                                                           tenant_minimums={name: 1 for name in names[:10]}),
}


def _rounds(core: SchedulerCore, names: list[str], rng: random.Random, n: int, now: float,
            costs: bool) -> tuple[float, float]:
    """CPU seconds of n rounds of submit + finish + grant + dispatch to a worker of one slot, the clock moving
    1 ms a round; returns (seconds, the clock after)."""
    core.add_worker("one", ["p"], 1)
    (_w, running), = core.dispatch(now, 1)
    tasks = [Task(f"c{next(_ids)}", "p", tenant=names[rng.randrange(len(names))],
                  cost=rng.choice((1.0, 2.5, 10.0)) if costs else None) for _ in range(n)]
    submit, dispatch, finish, grant = core.submit, core.dispatch, core.finish, core.grant
    cpu = time.process_time()
    for task in tasks:
        now += 0.001
        submit(task, now)
        finish(running.id, now, worker_id="one", attempt=running.attempts, state=SUCCEEDED)
        grant("one", 1)
        (_w, running), = dispatch(now)
    cpu = time.process_time() - cpu
    core.remove_worker("one", now)
    return cpu, now


def dispatch_cost(backlogs: list[int], n: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Part 4: µs of CPU per round, best of 3, per mode and backlog (1,000 tenants)."""
    rows = []
    names = [f"tenant-{i}" for i in range(1000)]
    for backlog in backlogs:
        row: dict[str, Any] = {"backlog": backlog, "tenants": len(names)}
        for mode, settings in DISPATCH_MODES.items():
            core = SchedulerCore([settings(names)])
            rng = random.Random(1)
            costs = mode == "cost"
            for i in range(backlog):
                core.submit(Task(f"q{i}", "p", tenant=names[rng.randrange(len(names))],
                                 cost=rng.choice((1.0, 2.5, 10.0)) if costs else None), 0.0)
            gc.collect()
            gc.disable()  # as bench/core_dispatch.py: the collector's passes are the process's cost, not the core's
            try:
                now, best = 0.0, float("inf")
                for _ in range(3):
                    cpu, now = _rounds(core, names, rng, n, now, costs)
                    best = min(best, cpu)
            finally:
                gc.enable()
            assert core.backlog("p") == backlog, "the backlog drifted"
            row[mode] = round(best / n * 1e6, 2)
        rows.append(row)
        log(f"  backlog {backlog:>7,}: " + ", ".join(f"{m} {row[m]:.1f}" for m in DISPATCH_MODES) + " µs/round")
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Through a real broker


def broker(seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Part 5: fast (10 ms) and slow (100 ms) at 1 : 1 through a real broker and worker, per share_by; then a
    tenant rated 5 starts a second beside two backlogged ones."""
    import uvloop

    from bench.stacks import cronoq_stack

    out: dict[str, Any] = {"seconds": seconds, "slots": 4}
    for mode in ("dispatches", "runtime"):
        pools = f'[[pools]]\nname = "shares"\nfair_share = true\nshare_by = "{mode}"\n'
        with cronoq_stack(durable=False, tokens=False, workers=1, concurrency=4, target="bench.apps:timed",
                          pools=pools) as stack:
            # Enough of each for both to stay backlogged whatever the mode: 4 slots of either.
            counts = {tenant: int(4 * seconds / d * 1.2) + 20 for tenant, d in DURATION.items()}
            runs, first, stopped = uvloop.run(_backlog_run(stack.address, DURATION, counts, seconds))
        out[mode] = row = _time_shares(runs, first, stopped)
        log(f"  {mode:<10} worker time fast/slow {row['worker_time']['fast']:.3f} / {row['worker_time']['slow']:.3f}"
            f" over {row['window_s']:.1f} s ({row['runs']['fast']} and {row['runs']['slow']} runs; a run took "
            f"{row['worker_average_run_ms']} ms on the worker's clock)")
    limit, task_s = 5.0, 0.010
    pools = ('[[pools]]\nname = "shares"\nfair_share = true\n'
             f"[pools.tenant_rates]\nlimited = {limit}\n")
    durations = {"limited": task_s, "a": task_s, "b": task_s}
    counts = {"limited": int(2 * limit * seconds) + 20, "a": int(4 * seconds / task_s) + 20,
              "b": int(4 * seconds / task_s) + 20}
    with cronoq_stack(durable=False, tokens=False, workers=1, concurrency=4, target="bench.apps:timed",
                      pools=pools) as stack:
        runs, first, stopped = uvloop.run(_backlog_run(stack.address, durations, counts, seconds))
    per_second = Counter(int(began - first) for began, _ in runs["limited"] if began < stopped)
    window = stopped - first
    out["rates"] = row = {
        "limit": limit, "window_s": round(window, 3),
        "limited_per_s": round(sum(per_second.values()) / window, 2),
        "limited_first_second": per_second.get(0, 0),
        "limited_busiest_later_second": max((c for s, c in per_second.items() if 0 < s < int(window)), default=0),
        "others_per_s": round(sum(1 for t in ("a", "b") for began, _ in runs[t] if began < stopped) / window, 1)}
    log(f"  rates      limited {row['limited_per_s']:.2f}/s (limit {limit:g}; first second "
        f"{row['limited_first_second']}, busiest later second {row['limited_busiest_later_second']}); a + b "
        f"{row['others_per_s']:.1f}/s on 4 slots of 10 ms tasks, over {window:.1f} s")
    return out


async def _backlog_run(address: str, durations: dict[str, float], counts: dict[str, int],
                       seconds: float) -> tuple[dict[str, list[tuple[float, float]]], float, float]:
    """Queue `counts` tasks of each tenant (each sleeping its `durations`) in the paused pool `shares`, let it run
    for `seconds`, pause it, and cancel what did not start. Returns each tenant's runs as (began, ended) on the
    worker's clock, the first start and when the pool was paused again."""
    import cronoq

    async with cronoq.connect(address, request_timeout=60) as sched:
        await sched.pause("shares")
        handles: dict[str, list[Any]] = {tenant: [] for tenant in counts}
        for tenant, count in counts.items():
            for start in range(0, count, 500):
                handles[tenant] += await asyncio.gather(*(
                    sched.submit({"s": durations[tenant]}, pool="shares", tenant=tenant)
                    for _ in range(start, min(count, start + 500))))
        await sched.resume("shares")
        await asyncio.sleep(seconds)
        await sched.pause("shares")
        stopped = time.time()
        while (await sched.stats())["pools"]["shares"]["running"]:
            await asyncio.sleep(0.05)
        runs: dict[str, list[tuple[float, float]]] = {}
        for tenant, mine in handles.items():
            cancelled = await asyncio.gather(*(h.cancel() for h in mine))
            if all(not gone for gone in cancelled):
                raise RuntimeError(f"tenant {tenant} ran out of tasks before the pause: queue more")
            ran = [h for h, gone in zip(mine, cancelled) if not gone]
            runs[tenant] = [tuple(r) for r in await asyncio.gather(*(h.result(timeout=30) for h in ran))]
    first = min(start for spans in runs.values() for start, _ in spans)
    return runs, first, stopped


def _time_shares(runs: dict[str, list[tuple[float, float]]], first: float, stopped: float) -> dict[str, Any]:
    """Each tenant's worker time from the first start to the pause (every tenant stayed backlogged: each had
    tasks left to cancel)."""
    time_of = {tenant: sum(max(0.0, min(end, stopped) - max(start, first)) for start, end in spans)
               for tenant, spans in runs.items()}
    return {"window_s": round(stopped - first, 3), "worker_time": _shares(time_of),
            "runs": {tenant: len(spans) for tenant, spans in runs.items()},
            "worker_seconds": {tenant: round(v, 3) for tenant, v in time_of.items()},
            "worker_average_run_ms": {tenant: round(1000 * sum(end - start for start, end in spans) / len(spans), 1)
                                      for tenant, spans in runs.items() if spans}}


# ---------------------------------------------------------------------------------------------------------------
# The figure and the file


def plot(result: dict[str, Any], path: Path) -> None:
    """Four panels: the slow tenant's share by mode over time, the limited tenant's starts per second, the
    light tenant's running tasks with and without its minimum, and the dispatch cost by backlog."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), dpi=90)
    ax = axes[0][0]
    for mode, colour, style in zip(MODES, ("tab:red", "tab:blue", "tab:green"), ("-", "-", ":")):
        line = result["modes"][mode]["slow_time_share_by_second"]
        ax.plot(range(1, len(line) + 1), line, color=colour, lw=2.0, ls=style, label=f'share_by "{mode}"')
    for mode, colour in (("dispatches", "tab:red"), ("runtime", "tab:blue")):
        real = (result.get("broker") or {}).get(mode)
        if real:
            ax.plot([len(result["modes"][mode]["slow_time_share_by_second"])], [real["worker_time"]["slow"]],
                    marker="D", color=colour, ls="none",
                    label=f'"{mode}", real broker, {real["window_s"]:.0f} s')
    ax.axhline(0.5, color="grey", ls="--", lw=1, label="weights 1 : 1")
    ax.set_ylim(0, 1)
    ax.set_title("slow tenant (100 ms tasks) beside fast (10 ms):\nits share of the worker time so far", fontsize=9)
    ax.set_xlabel("simulated seconds", fontsize=8)
    ax.legend(fontsize=7)

    ax = axes[0][1]
    rated = result["rates"]
    labels = ["dispatches", "runtime"]
    ax.bar([0, 1], [rated[m]["limited_per_s"] for m in labels], color="tab:blue", width=0.35, label="limited: mean")
    ax.bar([0.35, 1.35], [rated[m]["limited_first_second"] for m in labels], color="tab:cyan", width=0.35,
           label="limited: first second (a full bucket)")
    ax.bar([0.7, 1.7], [rated[m]["limited_busiest_later_second"] for m in labels], color="tab:purple", width=0.35,
           label="limited: busiest later second")
    ax.axhline(rated["limit"], color="grey", ls="--", lw=1, label=f"its rate, {rated['limit']:g}/s")
    ax.set_xticks([0.35, 1.35], [f'"{m}"\na + b: {rated[m]["others_per_s"]:.0f}/s of '
                                 f'{rated[m]["others_capacity_per_s"]:.0f}' for m in labels], fontsize=8)
    ax.set_title("a tenant rated 5 starts/s beside two backlogged ones", fontsize=9)
    ax.set_ylabel("starts per second", fontsize=8)
    ax.set_ylim(0, 2.6 * rated["limit"])
    ax.legend(fontsize=7, ncol=2, loc="upper center")

    ax = axes[1][0]
    floors = result["minimums"]["rows"]
    keys = list(floors)
    ax.bar(range(len(keys)), [floors[k]["light_mean_running"] for k in keys], color="tab:orange")
    ax.axhline(2, color="grey", ls="--", lw=1, label="light's minimum, 2")
    ax.set_xticks(range(len(keys)), [k.replace(", ", "\n") for k in keys], fontsize=7)
    ax.set_title("light (weight 1) beside heavy (weight 10), 8 workers:\nlight's running tasks on average",
                 fontsize=9)
    ax.legend(fontsize=7)

    ax = axes[1][1]
    rows = result["dispatch_cost"]
    for mode in DISPATCH_MODES:
        ax.plot([r["backlog"] for r in rows], [r[mode] for r in rows], marker="o", lw=1.2, label=mode)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_title("CPU per round (submit, finish, dispatch), 1,000 tenants", fontsize=9)
    ax.set_xlabel("backlog (queued tasks)", fontsize=8)
    ax.set_ylabel("µs", fontsize=8)
    ax.legend(fontsize=7)
    for row in axes:
        for a in row:
            a.tick_params(labelsize=7)
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def machine() -> dict[str, Any]:
    from bench.run import machine as full

    info = full()
    info.pop("redis_server", None)
    info.pop("celery", None)
    return info


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 10 simulated seconds, backlogs 10^3 and 10^4, no broker, no file")
    parser.add_argument("--no-broker", action="store_true", help="skip part 5 (the real broker)")
    parser.add_argument("--broker-seconds", type=float, default=8.0, help="seconds per mode through the broker")
    parser.add_argument("--json", type=Path, help="write the result here (default: bench/results/shares-STAMP.json,"
                                                   " not with --quick)")
    parser.add_argument("--png", type=Path, help="draw the figure here (default: beside the result file)")
    args = parser.parse_args(argv)
    if args.broker_seconds <= 0:
        parser.error("--broker-seconds must be a positive number of seconds")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    seconds = 10.0 if args.quick else 60.0
    result: dict[str, Any] = {"timestamp": stamp, "quick": args.quick, "simulated_seconds": seconds}
    log(f"1. modes: fast 10 ms and slow 100 ms at 1 : 1, 4 workers, {seconds:g} simulated seconds")
    result["modes"] = modes(seconds, log)
    log("2. rates: limited at 5/s beside a and b, 10 ms tasks, 4 workers")
    result["rates"] = rates(seconds, log)
    log("3. minimums: light (1, minimum 2) beside heavy (10), 100 ms tasks, 8 workers")
    result["minimums"] = minimums(seconds, log)
    backlogs, n = ([1_000, 10_000], 2_000) if args.quick else ([1_000, 10_000, 100_000], 20_000)
    log(f"4. dispatch cost: CPU µs per round, best of 3 runs of {n:,}")
    result["dispatch_cost"] = dispatch_cost(backlogs, n, log)
    if not (args.quick or args.no_broker):
        log(f"5. broker: fast and slow at 1 : 1 through a real broker and worker (4 slots), "
            f"{args.broker_seconds:g} s per mode")
        result["broker"] = broker(args.broker_seconds, log)
    result["machine"] = machine()
    path = args.json or (None if args.quick else RESULTS / f"shares-{stamp}.json")
    png = args.png or (path.with_suffix(".png") if path else None)
    if png:
        plot(result, png)
        result["png"] = png.name
        log(f"drew {png}")
    if path:
        path.write_text(json.dumps(result, indent=1) + "\n")
        log(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
