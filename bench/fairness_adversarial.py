"""Fairness against adversarial workloads: cronoq's scheduling core against FIFO and round-robin, simulated.

    python bench/fairness_adversarial.py [--quick] [--only skew,trickle,...] [--png-dir docs/images]
                                         [--json PATH] [--broker]

A discrete-event simulation drives the real scheduling core (cronoq/core, the
state machine the broker and the embedded Scheduler run) with simulated time:
2 workers of 4 slots, each task runs uniform(0.5, 1.5) s, arrivals as each
workload says. The core takes `now` as a parameter, so a run is exact and the
same every time (the harness's randomness is seeded). The same workloads go
through two baselines in the same harness: FIFO (a pool without fair sharing,
in the same core: priority classes, then submission order) and round-robin
between tenant strings (what "group round-robin" in other queues does: each
distinct tenant string is a group, groups take turns; priority classes first,
ceilings respected).

Entitlement. At each dispatch of the measured class (normal), a top-level
tenant is *backlogged* when it has a task of that class queued, and *at its
ceiling* when its subtree runs as many tasks as its `tenant_limits` entry.
A window is W consecutive dispatches of the class; the tenants measured in it
are those backlogged at every one of its dispatches. Their entitlement is the
window's dispatches that went to them, split by weight (the weights in force
at each dispatch), then water-filled for ceilings: a tenant that was at its
ceiling during the window and received less than its weighted part is
entitled to what it received (its ceiling, not the scheduler, held it back)
and the rest goes to the others by weight. The figure reported is the
least-served measured tenant's received / entitled, per window: 1.0 is
exact, 0.5 is half of what its weight promises. Tenants that trickle (one
task at a time, or a steady low rate) are measured by their wait instead,
from submitting a task to its dispatch, and never count as backlogged.

`--broker` also runs the skew workload with weights 3:1:1 and a ceiling of 1
through a real broker and one real worker of 10 slots (bench/stacks.py) and
the simulation of the same shape, and prints each tenant's share in both.
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import json
import random
import statistics
import sys
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cronoq.core import PoolSettings, SchedulerCore, Task  # noqa: E402

NORMAL = 2
HIGH = 1
WORKERS, SLOTS = 2, 4
POOL = "p"


# -- workloads ---------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """What arrives, for whom, and how the pool is configured.

    `backlog` is submitted at time 0 in order; `trickle` tenants keep one task
    at a time (the next submitted when the previous ends); `streams` are
    Poisson arrivals (tenant, class, tasks per second); `reweight` switches
    to new weights once half of the measured dispatches are done. The waits
    of the trickle tenants and of the measured class's streams are reported.
    """

    name: str
    about: str
    weights: Mapping[str, float]
    backlog: list[tuple[str, int]]
    limits: Mapping[str, int] = field(default_factory=dict)
    trickle: tuple[str, ...] = ()
    streams: tuple[tuple[str, int, float], ...] = ()
    reweight: Mapping[str, float] | None = None

    def settings(self, weights: Mapping[str, float] | None = None) -> PoolSettings:
        return PoolSettings(POOL, tenant_weights=dict(weights or self.weights), fair_share=True,
                            tenant_limits=dict(self.limits))


def _mixed(rng: random.Random, counts: Mapping[str, int], priority: int = NORMAL) -> list[tuple[str, int]]:
    """`counts[t]` tasks of each tenant, interleaved at random (seeded): a backlog nobody queued first."""
    tasks = [(t, priority) for t, n in counts.items() for _ in range(n)]
    rng.shuffle(tasks)
    return tasks


def workloads(dispatches: int, skew: int, seed: int = 1) -> list[Workload]:
    """The adversarial workloads; each keeps its heavy tenants backlogged for `dispatches` dispatches."""
    rng = random.Random(seed)
    enough = dispatches + 1_000  # more than any one tenant can be given
    subtenants = 1_000
    per_sub = max(2, enough // subtenants)
    many = [(f"big/u{i % subtenants + 1:04d}", NORMAL) for i in range(subtenants * per_sub)]
    many += [("small", NORMAL)] * len(many)
    rng.shuffle(many)
    return [
        Workload("skew", f"a queues {skew:,} tasks before b's first; weights 1:1",
                 {"a": 1, "b": 1}, [("a", NORMAL)] * skew + [("b", NORMAL)] * enough),
        Workload("trickle", "t: one task at a time, s: 0.5 tasks/s, against a and b backlogged; 1:1:1:1",
                 {"a": 1, "b": 1, "s": 1, "t": 1}, _mixed(rng, {"a": enough, "b": enough}), trickle=("t",),
                 streams=(("s", NORMAL, 0.5),)),
        Workload("many sub-tenants", f"big spreads over {subtenants:,} sub-tenants (big/u0001 ...) against small, "
                 "t trickles; 1:1:1", {"big": 1, "small": 1, "t": 1}, many, trickle=("t",)),
        Workload("ceiling", "weights 3:1:1, c capped at 1 running task of the 8 slots (its share is 1.6)",
                 {"a": 3, "b": 1, "c": 1}, _mixed(rng, {"a": enough, "b": enough, "c": enough}), limits={"c": 1}),
        Workload("priorities", "a and b 1:1 in normal; b also sends high-priority tasks at 2/s (a quarter of the pool)",
                 {"a": 1, "b": 1}, _mixed(rng, {"a": enough, "b": enough}), streams=(("b", HIGH, 2.0),)),
        Workload("reweight", "a:b = 3:1, reloaded to 1:3 halfway",
                 {"a": 3, "b": 1}, _mixed(rng, {"a": enough, "b": enough}), reweight={"a": 1, "b": 3}),
    ]


# -- the disciplines ---------------------------------------------------------

@dataclass(eq=False)
class Job:
    id: str
    tenant: str
    priority: int
    submitted: float
    lease: tuple[Any, int] | None = None

    @property
    def top(self) -> str:
        return self.tenant.split("/", 1)[0]


class Discipline(Protocol):
    def submit(self, job: Job, now: float) -> None: ...
    def take(self, now: float) -> Job | None: ...
    def finish(self, job: Job, now: float) -> None: ...
    def reweight(self, settings: PoolSettings, now: float) -> None: ...


class CoreDiscipline:
    """cronoq's scheduling core itself: fair (the workload's settings) or FIFO (a pool without fair sharing)."""

    def __init__(self, settings: PoolSettings, slots: int) -> None:
        self.core = SchedulerCore([settings])
        for w in range(WORKERS):  # the slots split over the workers, as evenly as they go
            self.core.add_worker(w, [POOL], slots // WORKERS + (w < slots % WORKERS))
        self.jobs: dict[str, Job] = {}

    def submit(self, job: Job, now: float) -> None:
        self.jobs[job.id] = job
        self.core.submit(Task(job.id, POOL, tenant=job.tenant, priority=job.priority), now)

    def take(self, now: float) -> Job | None:
        got = self.core.dispatch(now, limit=1)
        if not got:
            return None
        ((worker, task),) = got
        job = self.jobs.pop(task.id)
        job.lease = (worker, task.attempts)
        return job

    def finish(self, job: Job, now: float) -> None:
        assert job.lease is not None
        worker, attempt = job.lease
        self.core.finish(job.id, now, worker_id=worker, attempt=attempt, state="succeeded")
        self.core.grant(worker)

    def reweight(self, settings: PoolSettings, now: float) -> None:
        self.core.configure([settings], now)  # the reload path: new weights re-tag the backlog at once


class FifoDiscipline(CoreDiscipline):
    """The same core with a pool that does not share fairly: classes, then submission order."""

    def __init__(self, settings: PoolSettings, slots: int) -> None:
        super().__init__(PoolSettings(POOL), slots)

    def reweight(self, settings: PoolSettings, now: float) -> None:
        pass  # no weights to change


class RoundRobin:
    """Round-robin between tenant strings: each distinct string is a group; groups take turns.

    Classes stay strict (every queued higher-class task first), and a group
    whose top-level tenant is at its ceiling is skipped: the baseline gets
    every rule cronoq has except the weights and the tenant tree.
    """

    def __init__(self, limits: Mapping[str, int]) -> None:
        self.classes: list[OrderedDict[str, deque[Job]]] = [OrderedDict() for _ in range(4)]
        self.limits = dict(limits)
        self.running: Counter[str] = Counter()

    def submit(self, job: Job, now: float) -> None:
        groups = self.classes[job.priority]
        queue = groups.get(job.tenant)
        if queue is None:
            queue = groups[job.tenant] = deque()  # a new group joins at the end of the turn
        queue.append(job)

    def take(self, now: float) -> Job | None:
        for groups in self.classes:
            for tenant, queue in groups.items():
                top = tenant.split("/", 1)[0]
                if top in self.limits and self.running[top] >= self.limits[top]:
                    continue
                job = queue.popleft()
                if queue:
                    groups.move_to_end(tenant)
                else:
                    del groups[tenant]
                self.running[top] += 1
                return job
        return None

    def finish(self, job: Job, now: float) -> None:
        self.running[job.top] -= 1

    def reweight(self, settings: PoolSettings, now: float) -> None:
        pass  # round-robin knows no weights


DISCIPLINES: dict[str, Callable[[Workload, int], Discipline]] = {
    "cronoq": lambda w, slots: CoreDiscipline(w.settings(), slots),
    "FIFO": lambda w, slots: FifoDiscipline(w.settings(), slots),
    "round-robin": lambda w, slots: RoundRobin(w.limits),
}


# -- the simulation ----------------------------------------------------------

@dataclass
class Run:
    """What one simulated run records: per dispatch of the measured class, who got it and who could have."""

    tenants: list[str] = field(default_factory=list)
    backlogged: list[frozenset[str]] = field(default_factory=list)
    capped: list[frozenset[str]] = field(default_factory=list)
    weights: list[Mapping[str, float]] = field(default_factory=list)
    waits: dict[str, list[float]] = field(default_factory=dict)
    unstarted: dict[str, list[float]] = field(default_factory=dict)  # how long those still queued at the end waited
    seconds: float = 0.0


def simulate(workload: Workload, make: Callable[[Workload, int], Discipline], dispatches: int, seed: int = 7,
             run_time: Callable[[random.Random], float] = lambda rng: rng.uniform(0.5, 1.5),
             slots: int = WORKERS * SLOTS) -> Run:
    """Run `workload` until `dispatches` tasks of the measured class were dispatched (or nothing is left)."""
    rng = random.Random(seed)
    discipline = make(workload, slots)
    watched = (*workload.trickle, *(t for t, priority, _ in workload.streams if priority == NORMAL))
    run = Run(waits={t: [] for t in watched}, unstarted={t: [] for t in watched})
    weights: Mapping[str, float] = dict(workload.weights)
    queued: Counter[str] = Counter()  # measured-class tasks queued, per top-level tenant
    running: Counter[str] = Counter()
    events: list[tuple[float, int, str, Any]] = []
    counter = 0
    now = 0.0
    free = slots
    sets: dict[tuple[str, ...], frozenset[str]] = {}
    waiting: dict[str, Job] = {}  # the watched tenants' tasks not yet dispatched

    def interned(names: Iterable[str]) -> frozenset[str]:
        key = tuple(sorted(names))
        return sets.setdefault(key, frozenset(key))

    def push(at: float, kind: str, data: Any) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (at, counter, kind, data))

    def submit(tenant: str, priority: int) -> None:
        nonlocal counter
        counter += 1
        job = Job(f"j{counter}", tenant, priority, now)
        if priority == NORMAL:
            queued[job.top] += 1
        if tenant in run.waits:
            waiting[job.id] = job
        discipline.submit(job, now)

    for tenant, priority in workload.backlog:
        submit(tenant, priority)
    for tenant in workload.trickle:
        submit(tenant, NORMAL)
    for tenant, priority, rate in workload.streams:
        push(rng.expovariate(rate), "arrive", (tenant, priority, rate))

    while len(run.tenants) < dispatches:
        while free:
            backlogged = [t for t, n in queued.items() if n and t not in run.waits]  # watched: by their wait
            capped = [t for t, cap in workload.limits.items() if running[t] >= cap]
            job = discipline.take(now)
            if job is None:
                break
            free -= 1
            running[job.top] += 1
            if job.priority == NORMAL:
                queued[job.top] -= 1
                run.tenants.append(job.top)
                run.backlogged.append(interned(backlogged))
                run.capped.append(interned(capped))
                run.weights.append(weights)
                if workload.reweight is not None and len(run.tenants) == dispatches // 2:
                    weights = dict(workload.reweight)
                    discipline.reweight(workload.settings(weights), now)
            if waiting.pop(job.id, None) is not None:
                run.waits[job.tenant].append(now - job.submitted)
            push(now + run_time(rng), "finish", job)
        if not events:
            break
        now, _, kind, data = heapq.heappop(events)
        if kind == "finish":
            discipline.finish(data, now)
            free += 1
            running[data.top] -= 1
            if data.tenant in workload.trickle:
                submit(data.tenant, NORMAL)  # the trickling tenant's next task, at once
        else:
            tenant, priority, rate = data
            submit(tenant, priority)
            push(now + rng.expovariate(rate), "arrive", data)
    run.seconds = now
    for job in waiting.values():
        run.unstarted[job.tenant].append(now - job.submitted)
    return run


# -- the measure -------------------------------------------------------------

def entitlement(received: Mapping[str, int], shares: Mapping[str, float], capped: set[str]) -> dict[str, float]:
    """Each measured tenant's entitled dispatches in a window (see the module docstring).

    `received`: dispatches each measured tenant got; `shares`: its weighted
    part of them (summing to 1); `capped`: those at their ceiling at some
    dispatch of the window. Water-filling: a capped tenant given less than its
    part is entitled to what it got, and the rest is split among the others.
    """
    total = sum(received.values())
    fixed: dict[str, float] = {}
    while True:
        open_ = [t for t in shares if t not in fixed]
        weight = sum(shares[t] for t in open_)
        rest = total - sum(fixed.values())
        entitled = {t: rest * shares[t] / weight for t in open_} if weight else {}
        held = [t for t in open_ if t in capped and received[t] < entitled[t]]
        if not held:
            return {**fixed, **entitled}
        for t in held:
            fixed[t] = received[t]


def window_ratios(run: Run, size: int, step: int) -> list[tuple[int, dict[str, float], dict[str, float]]]:
    """Per window of `size` dispatches (every `step`): its end, each measured tenant's received/entitled, entitled/size.

    Running counts (prefix sums) per tenant make each window cost O(tenants), not O(size).
    """
    names = sorted(set(run.tenants).union(*run.backlogged))
    versions: list[Mapping[str, float]] = []
    for weights in run.weights:
        if not versions or versions[-1] is not weights:
            versions.append(weights)

    def prefix(flags: Iterable[bool]) -> list[int]:
        return [0, *accumulate(int(f) for f in flags)]

    got = {t: prefix(x == t for x in run.tenants) for t in names}
    backlogged = {t: prefix(t in b for b in run.backlogged) for t in names}
    capped = {t: prefix(t in c for c in run.capped) for t in names}
    in_version = [prefix(w is v for w in run.weights) for v in versions]
    out = []
    for start in range(0, len(run.tenants) - size + 1, step):
        end = start + size
        measured = [t for t in names if backlogged[t][end] - backlogged[t][start] == size]
        if not measured:
            continue
        received = {t: got[t][end] - got[t][start] for t in measured}
        shares = dict.fromkeys(measured, 0.0)
        for weights, counts in zip(versions, in_version):
            n = counts[end] - counts[start]
            if n:
                total = sum(weights.get(t, 1.0) for t in measured)
                for t in measured:
                    shares[t] += n * weights.get(t, 1.0) / total / size
        held = {t for t in measured if capped[t][end] > capped[t][start]}
        entitled = entitlement(received, shares, held)
        out.append((end, {t: received[t] / e for t, e in entitled.items() if e > 0},
                    {t: e / size for t, e in entitled.items()}))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(run: Run, windows: tuple[int, int]) -> dict[str, Any]:
    """The figures of one run: least-served ratio per window size (median, worst), the waits of tenants that trickle."""
    out: dict[str, Any] = {"dispatches": len(run.tenants), "simulated_s": round(run.seconds, 1),
                           "shares": {t: round(n / len(run.tenants), 4) for t, n in Counter(run.tenants).items()}}
    for size in windows:
        least = [min(ratios.values()) for _, ratios, _ in window_ratios(run, size, max(1, size // 10)) if ratios]
        out[f"window_{size}"] = ({"median": round(statistics.median(least), 3), "worst": round(min(least), 3),
                                  "windows": len(least)} if least else None)
    for tenant, waits in run.waits.items():
        censored = run.unstarted.get(tenant, [])
        everything = waits + censored
        figures: dict[str, Any] = {"started": len(waits), "still_waiting": len(censored)}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value = _percentile(everything, q) if everything else None
            figures[f"{name}_s"] = None if value is None else round(value, 2)
            # A task still waiting at the end gives only a lower bound on its wait, and so on a percentile it reaches.
            figures[f"{name}_lower_bound"] = value is not None and bool(censored) and max(censored) >= value
        out.setdefault("waits", {})[tenant] = figures
    return out


# -- the report --------------------------------------------------------------

def measure(names: Iterable[str] | None, dispatches: int, skew: int, windows: tuple[int, int],
            log: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[tuple[str, str], Run]]:
    """Every chosen workload through every discipline: one row per pair, and the runs (for the plots)."""
    chosen = workloads(dispatches, skew)
    if names is not None:
        def key(name: str) -> str:  # "many-sub-tenants" spares the shell the quotes "many sub-tenants" needs
            return name.strip().replace(" ", "-")

        wanted = {key(n) for n in names}
        unknown = wanted - {key(w.name) for w in chosen}
        if unknown:
            raise SystemExit(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from "
                             + ", ".join(key(w.name) for w in chosen))
        chosen = [w for w in chosen if key(w.name) in wanted]
    rows, runs = [], {}
    for workload in chosen:
        for label, make in DISCIPLINES.items():
            run = simulate(workload, make, dispatches)
            runs[workload.name, label] = run
            row = {"workload": workload.name, "about": workload.about, "discipline": label,
                   **summarize(run, windows)}
            rows.append(row)
            log(line(row, windows))
    return rows, runs


def _ratio(figures: dict[str, Any] | None) -> str:
    if figures is None:
        return "n/a"
    return " / ".join(f"{v:.2f}" if v >= 0.1 or v == 0 else f"{v:.3f}" for v in (figures["median"], figures["worst"]))


def _wait(waits: dict[str, dict[str, Any]] | None) -> str:
    out = []
    for tenant, w in (waits or {}).items():
        if w["started"] == 0:
            out.append(f"{tenant}: never started (waited ≥ {w['p99_s']:,.0f} s)")
        else:
            p50, p99 = (("≥ " if w[f"{q}_lower_bound"] else "") + f"{w[f'{q}_s']:,.2f}" for q in ("p50", "p99"))
            out.append(f"{tenant}: {p50} / {p99} s")
    return "; ".join(out)


def line(row: dict[str, Any], windows: tuple[int, int]) -> str:
    small, large = windows
    return (f"  {row['workload']:<17} {row['discipline']:<12} least-served/entitled, median/worst: "
            f"{large:,}-dispatch windows {_ratio(row[f'window_{large}'])}, {small:,}: {_ratio(row[f'window_{small}'])}"
            + (f"; wait p50/p99 {_wait(row.get('waits'))}" if row.get("waits") else ""))


def table(rows: list[dict[str, Any]], windows: tuple[int, int]) -> str:
    """A Markdown table: per workload and discipline, the least-served ratios and the trickling tenants' waits."""
    small, large = windows
    out = [f"| workload | discipline | least-served share of entitlement, {large:,}-dispatch windows: median / worst "
           f"| the same, {small:,}-dispatch windows | trickling tenants' wait p50 / p99 |",
           "| --- | --- | --- | --- | --- |"]
    for row in rows:
        out.append(f"| {row['workload']} | {row['discipline']} | {_ratio(row[f'window_{large}'])} "
                   f"| {_ratio(row[f'window_{small}'])} | {_wait(row.get('waits'))} |")
    return "\n".join(out)


def plot(workload: Workload, runs: dict[str, Run], path: Path, window: int) -> None:
    """Each tenant's share of a trailing window of dispatches (solid) against its entitlement (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(4.0 * len(runs), 2.9), sharey=True, dpi=90)
    colours = dict(zip(sorted({t for r in runs.values() for t in r.tenants} | set(workload.weights)),
                       ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    step = max(1, window // 10)
    for ax, (label, run) in zip(axes, runs.items()):
        measured = window_ratios(run, window, step)
        for tenant, colour in colours.items():
            xs, got = [], []
            for end in range(window, len(run.tenants) + 1, step):
                xs.append(end / 1000)
                got.append(run.tenants[end - window:end].count(tenant) / window)
            ax.plot(xs, got, color=colour, lw=1.4, label=f"{tenant}: got")
            ex = [(end / 1000, shares[tenant]) for end, _, shares in measured if tenant in shares]
            if ex:
                ax.plot(*zip(*ex), color=colour, lw=1.0, ls="--", label=f"{tenant}: entitled")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("dispatches (thousands)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(-0.03, 1.03)  # a share of 0 or 1 stays visible
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"share of the last {window:,}", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right", frameon=False)
    fig.suptitle(f"{workload.name}: {workload.about}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(path)
    plt.close(fig)


# -- the same shape through the real broker -----------------------------------

BROKER_WEIGHTS = {"a": 3, "b": 1, "c": 1}
BROKER_SLOTS = 10


def broker_check(counts: Mapping[str, int], work_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Skew 3:1:1, c capped at 1: each tenant's share while all three are backlogged, broker and simulation.

    The pool is paused while a queues all of its tasks, then b and c theirs,
    and resumed; one worker of BROKER_SLOTS slots runs each task for
    `work_s` seconds and returns the order it started them in (the broker's
    dispatch order). The simulation runs the same shape: the same slots,
    every task the same length.
    """
    import asyncio

    import uvloop

    from bench.stacks import cronoq_stack

    pools = ('[[pools]]\nname = "fair"\n[pools.tenant_weights]\n'
             + "".join(f"{t} = {w}\n" for t, w in BROKER_WEIGHTS.items())
             + "[pools.tenant_limits]\nc = 1\n")
    order = [t for t in ("a", "b", "c") for _ in range(counts[t])]

    async def drive(address: str) -> list[str]:
        import cronoq

        async with cronoq.connect(address, request_timeout=120) as sched:
            await sched.pause("fair")
            handles = []
            for start in range(0, len(order), 500):
                batch = order[start:start + 500]
                handles += await asyncio.gather(*(
                    sched.submit({"n": start + i, "work_s": work_s}, pool="fair", tenant=t)
                    for i, t in enumerate(batch)))
            await sched.resume("fair")
            results = await asyncio.gather(*(h.result(timeout=300) for h in handles))
        started = sorted((seq, n) for seq, n in results)
        return [order[n] for _, n in started]

    with cronoq_stack(durable=False, tokens=False, workers=1, concurrency=BROKER_SLOTS,
                      target="bench.apps:fair_work", pools=pools) as stack:
        real = uvloop.run(drive(stack.address))
    workload = Workload("broker skew", "", BROKER_WEIGHTS, [(t, NORMAL) for t in order], limits={"c": 1})
    simulated = simulate(workload, DISCIPLINES["cronoq"], len(order), run_time=lambda rng: rng.uniform(0.8, 1.2),
                         slots=BROKER_SLOTS).tenants
    out = {}
    for label, sequence in (("broker", real), ("simulation", simulated)):
        prefix = _backlogged_prefix(sequence, counts)
        shares = Counter(sequence[:prefix])
        out[label] = {"dispatches": prefix, **{t: round(shares[t] / prefix, 3) for t in BROKER_WEIGHTS}}
        log(f"  {label:<10} shares while all three are backlogged ({prefix:,} dispatches): "
            + ", ".join(f"{t} {out[label][t]:.3f}" for t in BROKER_WEIGHTS))
    return out


def _backlogged_prefix(sequence: list[str], counts: Mapping[str, int]) -> int:
    """Dispatches up to the first one after which some tenant had nothing left."""
    seen: Counter[str] = Counter()
    for n, tenant in enumerate(sequence, start=1):
        seen[tenant] += 1
        if seen[tenant] == counts[tenant]:
            return n
    return len(sequence)


# -- entry point -------------------------------------------------------------

def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 dispatches per run and a skew of 10^4 (seconds)")
    parser.add_argument("--only", help="comma-separated workloads: skew, trickle, many-sub-tenants, ceiling, "
                                       "priorities, reweight")
    parser.add_argument("--png-dir", type=Path, help="draw one PNG per workload here (needs matplotlib)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--broker", action="store_true",
                        help="also run skew 3:1:1 with a ceiling through a real broker")
    args = parser.parse_args(argv)
    dispatches, skew = (2_000, 10_000) if args.quick else (20_000, 100_000)
    windows = (100, 1_000) if not args.quick else (50, 500)
    log(f"simulated: {WORKERS} workers x {SLOTS} slots, tasks of uniform(0.5, 1.5) s, "
        f"{dispatches:,} dispatches of the measured class per run")
    if args.png_dir and importlib.util.find_spec("matplotlib") is None:
        parser.error("--png-dir draws with matplotlib, which is not installed (pip install -e '.[bench]')")
    rows, runs = measure(args.only.split(",") if args.only else None, dispatches, skew, windows, log)
    result: dict[str, Any] = {"dispatches": dispatches, "skew": skew, "windows": list(windows), "rows": rows}
    log(table(rows, windows))
    if args.png_dir:
        args.png_dir.mkdir(parents=True, exist_ok=True)
        result["png"] = []
        for workload in workloads(dispatches, skew):
            mine = {label: run for (name, label), run in runs.items() if name == workload.name}
            if mine:
                path = args.png_dir / f"fairness-{workload.name.replace(' ', '-')}.png"
                plot(workload, mine, path, windows[1])
                result["png"].append(str(path))
                log(f"  drew {path}")
    if args.broker:
        counts = {"a": 600, "b": 300, "c": 150} if args.quick else {"a": 3_000, "b": 1_100, "c": 500}
        result["broker"] = broker_check(counts, 0.01, log)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
