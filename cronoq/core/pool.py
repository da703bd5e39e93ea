"""A pool inside the core: four strict priority classes and the counts around them.

Each `ClassQueue` holds one priority class of one pool: an EDF heap of its
queued tasks that have a deadline, ahead of a `FairQueue` or `FifoQueue` for
the rest. A `PoolState` walks its classes from critical to low and takes the
first task it finds. Counts (per class, per tenant, per pool) are kept as tasks
move so that stats and the broker's backlog limits cost O(1).

A pool with tenant ceilings (ceilings.py) also counts the running tasks of
every node that has one, and caps and uncaps nodes as tasks start and end;
its classes then keep their deadline tasks in an `EdfTree` so that a capped
node's tasks are passed over without blocking anyone. Rates hold a node
back the same way while its bucket is empty (`refills` says when to let it
go); minimums put a node under its minimum ahead of its class's fair order.

What a fair dispatch charges its tenant (`share_by`) is the pool's too:
one dispatch, the task's cost, or its run time: estimated from the
tenant's recent average when dispatched (`estimate`), then corrected by
the core when the task ends, or while it runs past what it was charged.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from itertools import islice
from typing import TYPE_CHECKING, Collection, Iterator

from cronoq.core.ceilings import Ceiling, EdfTree, next_start
from cronoq.core.fairqueue import FairQueue, FifoQueue
from cronoq.core.settings import PRIORITIES, PoolSettings, tenant_path
from cronoq.core.task import QUEUED, Task
from cronoq.core.timers import TimedEntry
from cronoq.core.weights import QUANTA_PER_UNIT, Weights, quantize

if TYPE_CHECKING:
    from cronoq.core.workers import WorkerState

INF = float("inf")

# Counts of tenants with no task left are dropped once the table has doubled
# past this size, so a churn of one-off tenants cannot grow it without bound
# while ordinary pools (fewer tenants than this) keep every tenant's counters.
_KEEP_IDLE_TENANTS = 1024

FIRST_ESTIMATE = 1.0
"""Seconds a task is estimated to run, in a pool that shares by run time, when neither it (no cost), its tenant
nor the pool has finished a task yet."""

AVERAGE_WEIGHT = 1 / 8
"""How much each finished run moves a tenant's (and the pool's) average run time: about its last 8 runs."""


class TenantStats:
    """Counts of one tenant's tasks in one pool (untenanted tasks count under None), its place in
    the tenant tree and the ceilings its tasks count against."""

    __slots__ = ("tenant", "path", "top", "ceilings", "queued", "delayed", "running", "dispatched", "average")

    def __init__(self, tenant: str | None, ceilings: tuple[Ceiling, ...] = ()) -> None:
        self.tenant = tenant
        self.path = tenant_path(tenant)  # the nodes from the top down to this tenant
        self.top = self.path[0]  # the top-level tenant whose tree this one is in
        self.ceilings = ceilings  # of the nodes on its path that have one, top first
        self.queued = 0
        self.delayed = 0
        self.running = 0
        self.dispatched = 0
        self.average: float | None = None  # its recent average run time, in a pool that shares by run time


class ClassQueue:
    """One priority class of one pool: deadline tasks by EDF, then the rest."""

    __slots__ = ("edf", "edf_stale", "tree", "rest", "queued", "deadlined", "delayed", "running", "dispatched",
                 "arrived", "deadline_arrived")

    def __init__(self, rest: FairQueue | FifoQueue) -> None:
        # (deadline, arrival seq, task): earliest deadline first, ties by arrival.
        self.edf: list[TimedEntry] = []
        self.edf_stale = 0
        # With ceilings: the deadline tasks by node (its root heap is `edf`).
        self.tree: EdfTree | None = None
        self.rest = rest
        self.queued = 0  # tasks in state QUEUED in this class
        self.deadlined = 0  # those of them that have a deadline (so `explain` counts them in O(1))
        self.delayed = 0
        self.running = 0
        self.dispatched = 0
        # Tasks that have become queued here (submitted ready, ready after a delay or back-off, requeued after a
        # lost worker), and those of them with a deadline: the shell samples them over time, so that `explain`
        # knows how fast work that goes before a task keeps arriving. Plain counters: the core has no clock.
        self.arrived = 0
        self.deadline_arrived = 0

    def push(self, task: Task) -> TimedEntry | None:
        """Queue a task (state and `_seq` already set); returns its EDF entry if it has a deadline."""
        deadline = task.deadline
        if deadline is None:
            self.rest.push(task)
            return None
        entry = (deadline, task._seq, task)
        if self.tree is None:
            heappush(self.edf, entry)
        else:
            self.tree.push(entry, task._ts.ceilings)  # type: ignore[union-attr]
        return entry

    def pop(self, now: float, needy: list[Ceiling] | None = None) -> Task | None:
        """Remove and return the next task of this class, never one whose deadline <= now. After the deadline
        tasks, a node of `needy` (under its minimum) goes ahead of the fair order."""
        if needy and self.rest.__class__ is FairQueue:
            if self.tree is not None:
                task = self.tree.pop(now)
            else:
                task = self._pop_edf(now)
            if task is not None:
                return task
            task = self.rest.pop_needy([c.path for c in needy])  # type: ignore[union-attr]
            return task if task is not None else self.rest.pop()
        if self.tree is not None:
            task = self.tree.pop(now)
            return task if task is not None else self.rest.pop()
        task = self._pop_edf(now)
        return task if task is not None else self.rest.pop()

    def _pop_edf(self, now: float) -> Task | None:
        edf = self.edf
        while edf:
            deadline, seq, task = edf[0]
            heappop(edf)
            if seq != task._seq or task.state is not QUEUED:
                self.edf_stale -= 1
                continue
            if deadline <= now:
                # Overdue: it stays QUEUED for expire() to report, but leaves the
                # heap now. expire()/cancel() will count it stale as if it were
                # still here, so count that in advance.
                self.edf_stale -= 1
                continue
            return task
        return None

    def peek_deadline(self, now: float) -> float | None:
        """Deadline of the task pop(now) would return (inf if it has none), None if nothing is ready."""
        if self.tree is not None:
            deadline = self.tree.peek(now)
            if deadline is not None:
                return deadline
            return INF if self.rest else None
        edf = self.edf
        while edf:
            deadline, seq, task = edf[0]
            if seq == task._seq and task.state is QUEUED and deadline > now:
                return deadline
            heappop(edf)
            self.edf_stale -= 1
        return INF if self.rest else None

    def discard(self, task: Task) -> None:
        """Forget a queued task that just left without being popped (cancelled or expired)."""
        if task.deadline is None:
            self.rest.discard(task)
            return
        if self.tree is not None:
            self.tree.discard(task)
            return
        self.edf_stale += 1
        if self.edf_stale * 2 > len(self.edf):
            self.edf = [e for e in self.edf if e[1] == e[2]._seq and e[2].state is QUEUED]
            heapify(self.edf)
            self.edf_stale = 0


class PoolState:
    """One pool as the core keeps it: its settings, its four classes, its counts, its ceilings and its place in
    dispatch (the public `cronoq.Pool` only declares a pool and its handler)."""

    __slots__ = (
        "name",
        "settings",
        "weights",
        "fair",
        "max_in_flight",
        "paused",
        "draining",
        "classes",
        "queued",
        "delayed",
        "running",
        "tenants",
        "tenant_order",
        "tenants_sweep_at",
        "tree_backlog",
        "ceilings",
        "capped",
        "stuck",
        "dispatchable",
        "ready_workers",
        "workers",
        "refills",
        "minimum_nodes",
        "average",
        "by_runtime",
    )

    def __init__(self, settings: PoolSettings) -> None:
        self.name = settings.name
        self.settings = settings
        self.weights = Weights(settings.tenant_weights, default=settings.default_weight,
                               charged=settings.share_by != "dispatches")
        self.fair = settings.fair
        self.max_in_flight = settings.max_in_flight
        self.paused = False
        self.draining = False
        # Names of the capped nodes: shared with every fair queue, which
        # consults it when it makes a node's flow.
        self.capped: set[str | None] = set()
        self.classes: tuple[ClassQueue, ...] = tuple(ClassQueue(self._new_rest()) for _ in PRIORITIES)
        self.queued = 0
        self.delayed = 0
        self.running = 0
        self.tenants: dict[str | None, TenantStats] = {}
        # The same records in the order they came: walked by index, a step at a time, without a copy.
        self.tenant_order: list[TenantStats] = []
        self.tenants_sweep_at = _KEEP_IDLE_TENANTS
        self.ceilings: dict[str | None, Ceiling] = {}
        # Waiting (queued + delayed) tasks of each top-level tenant's whole tree: what max_tenant_backlog caps,
        # so that a token pinned to `acme` cannot pass it by spreading tasks over `acme/...` names.
        self.tree_backlog: dict[str | None, int] = {}
        # Set when take() found nothing it may hand out although tasks are
        # queued (all overdue or capped); cleared by anything that could change that.
        self.stuck = False
        # Maintained by SchedulerCore: a queued task, not paused, under max_in_flight.
        self.dispatchable = False
        self.ready_workers = 0  # workers serving this pool that have a free slot
        self.workers: set[WorkerState] = set()
        # (time, node) of the nodes out of tokens, when each may start again: a heap, stale entries allowed.
        self.refills: list[tuple[float, str | None]] = []
        self.minimum_nodes: list[Ceiling] = []  # the nodes with a minimum
        self.average: float | None = None  # the pool's recent average run time (share_by="runtime")
        self.by_runtime = settings.share_by == "runtime"
        if settings.has_node_limits:
            self._apply_ceilings(None)

    def weight(self, tenant: str | None) -> float:
        """The current weight of node `tenant` in this pool."""
        return self.weights.weight(tenant)

    def tenant_stats(self, tenant: str | None) -> TenantStats:
        """The counts record of `tenant`, created on first use."""
        ts = self.tenants.get(tenant)
        if ts is None:
            if len(self.tenants) >= self.tenants_sweep_at:
                self.tenants = {
                    t: rec for t, rec in self.tenants.items() if rec.queued or rec.delayed or rec.running
                }
                self.tenants_sweep_at = max(_KEEP_IDLE_TENANTS, 2 * len(self.tenants))
                self.tenant_order = list(self.tenants.values())
                self.tree_backlog = {top: count for top, count in self.tree_backlog.items() if count}
                if self.ceilings:
                    self._sweep_ceilings()
            ts = self.tenants[tenant] = TenantStats(tenant)
            self.tenant_order.append(ts)
            if self.settings.has_node_limits:
                ts.ceilings = self._ceilings_on(ts.path)
        return ts

    def dispatched(self) -> int:
        """Tasks dispatched from this pool so far (re-dispatches included)."""
        return sum(cls.dispatched for cls in self.classes)

    def live(self) -> int:
        """Tasks of this pool the core still holds (queued, delayed or running)."""
        return self.queued + self.delayed + self.running

    def should_dispatch(self) -> bool:
        """Whether a worker may be given a task of this pool now (before looking at deadlines)."""
        cap = self.max_in_flight
        return self.queued > 0 and not self.paused and not self.stuck and (cap is None or self.running < cap)

    def take(self, now: float) -> Task | None:
        """Pop the next task by class, then EDF, then fair share or FIFO, and count it as running."""
        needy = [c for c in self.minimum_nodes if c.running < c.minimum and not c.blocked] \
            if self.minimum_nodes else None  # type: ignore[operator]
        for cls in self.classes:
            if cls.queued:
                # Most classes hold no deadline task: go straight to the fair/FIFO part.
                task = cls.pop(now, needy) if cls.edf or needy else cls.rest.pop()
                if task is not None:
                    cls.queued -= 1
                    if task.deadline is not None:
                        cls.deadlined -= 1
                    cls.running += 1
                    cls.dispatched += 1
                    self.queued -= 1
                    self.running += 1
                    ts = task._ts
                    ts.queued -= 1  # type: ignore[union-attr]
                    self.tree_backlog[ts.top] -= 1  # type: ignore[union-attr]
                    ts.running += 1  # type: ignore[union-attr]
                    ts.dispatched += 1  # type: ignore[union-attr]
                    if ts.ceilings:  # type: ignore[union-attr]
                        self._charge(ts.ceilings, now)  # type: ignore[union-attr]
                    return task
        return None

    def uncharge(self, ceilings: tuple[Ceiling, ...]) -> None:
        """A task under these ceilings stopped running: uncap the nodes it frees."""
        for ceiling in ceilings:
            ceiling.running -= 1
            if ceiling.capped and ceiling.running < ceiling.limit:  # type: ignore[operator]
                ceiling.capped = False
                ceiling.since = None
                if ceiling.limited_until is None:
                    self._unblock(ceiling)

    def refill(self, now: float) -> bool:
        """Let go the nodes whose rate bucket has a token again by `now`; whether any was let go."""
        refills = self.refills
        freed = False
        while refills and refills[0][0] <= now:
            due, name = heappop(refills)
            ceiling = self.ceilings.get(name)
            if ceiling is None or ceiling.limited_until != due:
                continue  # stale: the node was rebuilt or re-timed by a reload
            ceiling.limited_until = None
            if not ceiling.capped:
                self._unblock(ceiling)
                freed = True
        return freed

    def next_refill(self) -> float | None:
        """When the next node out of tokens may start again (perhaps a stale time: an early wake-up), or None."""
        return self.refills[0][0] if self.refills else None

    # -- what a fair dispatch charges -----------------------------------------

    def _charge_cost(self, task: Task) -> int:
        """share_by="cost": the task's cost (1 when unset), in quanta, at least one."""
        cost = task.cost
        return QUANTA_PER_UNIT if cost is None else max(1, quantize(cost))

    def _charge_estimate(self, task: Task) -> int:
        """share_by="runtime": the task's estimated run time in quanta (at least one): see `estimate`."""
        return max(1, quantize(self.estimate(task)))

    def estimate(self, task: Task) -> float:
        """Seconds `task` is expected to run: its cost when given, else its tenant's recent average, else the
        pool's, else FIRST_ESTIMATE."""
        if task.cost is not None:
            return float(task.cost)
        average = task._ts.average  # type: ignore[union-attr]
        if average is None:
            average = self.average
        return FIRST_ESTIMATE if average is None else average

    def observe(self, ts: TenantStats, seconds: float) -> None:
        """A run of `seconds` ended: move the tenant's and the pool's averages."""
        ts.average = seconds if ts.average is None else ts.average + (seconds - ts.average) * AVERAGE_WEIGHT
        self.average = seconds if self.average is None else self.average + (seconds - self.average) * AVERAGE_WEIGHT

    def charged(self, task: Task) -> int | None:
        """What the fair dispatch that just handed out `task` (from take) charged its tenant, in quanta; None if it
        was not charged (a deadline task, or a pool that counts dispatches)."""
        if task.deadline is not None:
            return None
        rest = self.classes[task.priority].rest
        return rest.charged if rest.__class__ is FairQueue and rest.charge_of is not None else None  # type: ignore

    def correct(self, task: Task, charged: int, charge: int) -> None:
        """The running `task` was charged `charged` quanta; charge it `charge` instead (its tenant's tags at
        every level of its path, in its class)."""
        delta = charge - charged
        rest = self.classes[task.priority].rest
        if delta and rest.__class__ is FairQueue:
            rest.correct(task._ts.path, delta)  # type: ignore[union-attr]

    def peek_key(self, now: float) -> tuple[int, float] | None:
        """(class, deadline or inf) of the task take(now) would return, or None."""
        for number, cls in enumerate(self.classes):
            if cls.queued:
                deadline = cls.peek_deadline(now)
                if deadline is not None:
                    return (number, deadline)
        return None

    def apply(self, settings: PoolSettings, now: float | None) -> None:
        """Take new settings: new weights re-tag the queued backlog at once, new ceilings cap and
        uncap at once (`now` stamps the nodes capped by it)."""
        was_fair = self.fair
        had_limits = self.settings.has_node_limits
        was_charged = self.settings.share_by
        self.settings = settings
        self.weights = Weights(settings.tenant_weights, self.weights, settings.default_weight,
                               charged=settings.share_by != "dispatches")
        self.fair = settings.fair
        self.max_in_flight = settings.max_in_flight
        self.by_runtime = settings.share_by == "runtime"
        for cls in self.classes:
            if self.fair != was_fair or settings.share_by != was_charged:
                # The kind of queue, or the unit of its tags, changes: move the backlog over in
                # arrival order; a new fair queue starts from V = 0.
                backlog = cls.rest.tasks_in_order()
                cls.rest = self._new_rest()
                for task in backlog:
                    cls.rest.push(task)
            elif isinstance(cls.rest, FairQueue):
                cls.rest.reweight(self.weights)
        if had_limits or settings.has_node_limits:
            self._apply_ceilings(now)
        self.stuck = False

    def lag(self, tenant: str | None) -> float:
        """The node's lag among its siblings, summed over the classes (see docs/scheduling.md)."""
        return sum(cls.rest.lag(tenant) for cls in self.classes)

    def own_lag(self, tenant: str | None) -> float:
        """The lag of the node's own tasks among its children (its lag when it has none), summed over the
        classes."""
        return sum(cls.rest.own_lag(tenant) for cls in self.classes)

    def served_class(self) -> FairQueue | None:
        """The fair queue whose order the pool's fair dispatches follow now: that of the highest class that
        can dispatch (classes are strict), else of the highest class with tasks queued (all capped), else
        None (nothing queued, or the pool is not fair)."""
        waiting = None
        for cls in self.classes:
            rest = cls.rest
            if isinstance(rest, FairQueue):
                if rest:
                    return rest
                if waiting is None and rest.nbusy:
                    waiting = rest
        return waiting

    def weighted_share(self, tenant: str | None, served: FairQueue | None = None) -> tuple[float, float]:
        """(node, its own tasks): the weighted share of the pool's fair dispatches node `tenant` is promised
        now, in the served class (see `served_class`; pass it to save the look-up). (0, 0) in a pool without
        fairness."""
        rest = self.served_class() if served is None else served
        return (0.0, 0.0) if rest is None else rest.weighted_share(tenant_path(tenant))

    def busiest_tenants(self, limit: int, step: int) -> Iterator[list[str | None] | None]:
        """The `limit` tenants with the most tasks queued, delayed and running (ties: the most dispatched,
        then the first seen), busiest first, found `step` tenants at a time: yields None after each step
        but the last, then the list. Counts are read as the walk reaches them."""
        # Tenants that come after the first step are left out; a sweep between steps replaces the list, and
        # this walk finishes the one it started with.
        tenants = self.tenant_order
        count = len(tenants)
        heap: list[tuple[int, int, int, TenantStats]] = []
        for start in range(0, count, step):
            for index in range(start, min(start + step, count)):
                ts = tenants[index]
                entry = (ts.queued + ts.delayed + ts.running, ts.dispatched, -index, ts)
                if len(heap) < limit:
                    heappush(heap, entry)
                elif entry[:3] > heap[0][:3]:
                    heapreplace(heap, entry)
            if start + step < count:
                yield None
        heap.sort(key=lambda entry: entry[:3], reverse=True)
        yield [entry[3].tenant for entry in heap]

    def stats(self, tenants: Collection[str | None] | None = None, limit: int | None = None,
              now: float | None = None) -> dict[str, object]:
        """This pool's part of SchedulerCore.stats(): plain dicts, ints, floats and bools. With `tenants`,
        only those tenants (the ones that still have counts) are listed, else the first `limit` (None: all);
        "tenant_count" counts them all. `now` gives each capped node's "capped_for"."""
        if tenants is None and limit is not None and len(self.tenants) > limit:
            tenants = list(islice(self.tenants, limit))
        classes: dict[str, dict[str, object]] = {}
        for name, cls in zip(PRIORITIES, self.classes):
            entry: dict[str, object] = {
                "queued": cls.queued,
                "delayed": cls.delayed,
                "running": cls.running,
                "dispatched": cls.dispatched,
            }
            if isinstance(cls.rest, FairQueue):
                entry["virtual_time"] = cls.rest.virtual_time()
            classes[name] = entry
        served = self.served_class()
        tenant_entries = {
            "" if tenant is None else tenant: self._tenant_entry(tenant, ts, served)
            for tenant, ts in (self.tenants.items() if tenants is None else
                               ((t, self.tenants[t]) for t in tenants if t in self.tenants))
        }
        ceilings = {
            "" if c.name is None else c.name: {
                "limit": c.limit,
                "running": c.running,
                "capped": c.capped,
                "capped_since": c.since,
                "capped_for": None if now is None or c.since is None else max(0.0, now - c.since),
            }
            for c in self._ceilings_to_list(limit)
        }
        return {
            "paused": self.paused,
            "draining": self.draining,
            "fair": self.fair,
            "max_in_flight": self.max_in_flight,
            "running": self.running,
            "queued": self.queued,
            "delayed": self.delayed,
            "dispatched": self.dispatched(),
            "workers": len(self.workers),
            "ready_workers": self.ready_workers,
            "classes": classes,
            "tenants": tenant_entries,
            "tree_nodes": self._tree_nodes(tenant_entries, served),
            "tenant_count": len(self.tenants),
            "ceilings": ceilings,
            "ceiling_count": len(self.ceilings) - self._uncapped_limits(),
            "share_by": self.settings.share_by,
            "share_unit": self.settings.share_unit,
            "rates": {
                "" if c.name is None else c.name: {
                    "rate": c.rate,
                    "tokens": None if now is None else c.tokens(now),
                    "limited": c.limited_until is not None,
                    "next_start_in": None if now is None or c.limited_until is None
                    else max(0.0, c.limited_until - now),
                }
                for c in self._listed(self.settings.tenant_rates)
            },
            "minimums": {
                "" if c.name is None else c.name: {
                    "minimum": c.minimum,
                    "running": c.running,
                    "under": c.under_minimum(),
                }
                for c in self.minimum_nodes
            },
        }

    def _tenant_entry(self, tenant: str | None, ts: TenantStats, served: FairQueue | None) -> dict[str, object]:
        share, own_share = (0.0, 0.0) if served is None else served.weighted_share(tenant_path(tenant))
        return {
            "weight": self.weight(tenant),
            "queued": ts.queued,
            "delayed": ts.delayed,
            "running": ts.running,
            "dispatched": ts.dispatched,
            "lag": self.lag(tenant),
            # The node's whole subtree, then its own tasks alone (the same for a node without sub-tenants).
            "weighted_share": share,
            "own_weighted_share": own_share,
            "own_lag": self.own_lag(tenant),
            # share_by="runtime": what its next task will be charged at dispatch (its recent average run time).
            "average_runtime": ts.average,
        }

    def _tree_nodes(self, listed: dict[str, object], served: FairQueue | None) -> dict[str, dict[str, object]]:
        """The ancestors of the listed tenants that are not listed themselves (they have no tasks of their
        own), with what a tree view needs of them: weight, lag and weighted share."""
        out: dict[str, dict[str, object]] = {}
        for name in listed:
            path = tenant_path(name or None)
            for depth in range(len(path) - 1):
                node = path[depth]
                if node in listed or node in out:
                    continue
                share = 0.0 if served is None else served.weighted_share(path[: depth + 1])[0]
                out[node] = {"weight": self.weight(node), "lag": self.lag(node),  # type: ignore[index]
                             "weighted_share": share}
        return out

    def _ceilings_to_list(self, limit: int | None) -> list[Ceiling]:
        """Every ceiling met, or with `limit`, at most that many: the capped ones first (a default ceiling per
        tenant may make a million of them; this costs O(limit), not O(ceilings))."""
        if limit is None or len(self.ceilings) <= limit:
            return [c for c in self.ceilings.values() if c.limit is not None]
        capped = (c for c in (self.ceilings[name] for name in self.capped) if c.capped)
        out = list(islice(capped, limit))
        if len(out) < limit:
            rest = (c for c in self.ceilings.values() if c.limit is not None and not c.capped)
            out += islice(rest, limit - len(out))
        return out

    def _listed(self, names: Collection[str]) -> list[Ceiling]:
        return [self.ceilings[name] for name in names if name in self.ceilings]

    def _uncapped_limits(self) -> int:
        """Nodes that have a rate or a minimum but no ceiling (only listed nodes have those: O(listed))."""
        listed = set(self.settings.tenant_rates) | set(self.settings.tenant_minimums)
        return sum(1 for name in listed if name in self.ceilings and self.ceilings[name].limit is None)

    # -- ceilings ------------------------------------------------------------

    def _charge(self, ceilings: tuple[Ceiling, ...], now: float) -> None:
        """A task under these ceilings started running: cap the nodes that reach their limit, take a token from
        every rated one and hold back those left without."""
        for ceiling in ceilings:
            ceiling.running += 1
            was_blocked = ceiling.blocked
            limit = ceiling.limit
            if limit is not None and ceiling.running >= limit and not ceiling.capped:
                ceiling.capped = True
                ceiling.since = now
            rate = ceiling.rate
            if rate is not None:
                tat = ceiling.tat
                ceiling.tat = tat = (tat if tat > now else now) + 1.0 / rate
                start = next_start(tat, rate)
                if start > now:
                    ceiling.limited_until = start
                    heappush(self.refills, (start, ceiling.name))  # type: ignore[misc]
            if not was_blocked and ceiling.blocked:
                self._block(ceiling)

    def _block(self, ceiling: Ceiling) -> None:
        self.capped.add(ceiling.name)
        for cls in self.classes:
            if cls.tree is not None:
                cls.tree.block(ceiling.name)
            if isinstance(cls.rest, FairQueue):
                cls.rest.block(ceiling.path)

    def _unblock(self, ceiling: Ceiling) -> None:
        self.capped.discard(ceiling.name)
        for cls in self.classes:
            if cls.tree is not None:
                cls.tree.unblock(ceiling.name)
            if isinstance(cls.rest, FairQueue):
                cls.rest.unblock(ceiling.path)
        self.stuck = False

    def _ceiling(self, name: str | None, path: tuple[str | None, ...]) -> Ceiling | None:
        ceiling = self.ceilings.get(name)
        if ceiling is None:
            settings = self.settings
            limit, rate, minimum = settings.limit(name), settings.rate(name), settings.minimum(name)
            if limit is None and rate is None and minimum is None:
                return None
            ceiling = self.ceilings[name] = Ceiling(name, path, limit, rate, minimum)
        return ceiling

    def _ceilings_on(self, path: tuple[str | None, ...]) -> tuple[Ceiling, ...]:
        """The ceilings of the nodes on `path`, top first (made on first use)."""
        out = []
        for depth, name in enumerate(path):
            ceiling = self._ceiling(name, path[: depth + 1])
            if ceiling is not None:
                out.append(ceiling)
        return tuple(out)

    def _sweep_ceilings(self) -> None:
        """Keep the listed ceilings and those a kept tenant counts against (default ones come and go)."""
        s = self.settings
        kept = {name: c for name, c in self.ceilings.items()
                if name in s.tenant_limits or name in s.tenant_rates or name in s.tenant_minimums}
        for ts in self.tenants.values():
            for c in ts.ceilings:
                kept[c.name] = c
        self.ceilings = kept

    def _apply_ceilings(self, now: float | None) -> None:
        """(Re)build the ceilings, rates and minimums from the settings: recount, cap and uncap, carry each rated
        node's bucket over at its new rate, re-sort the deadline tasks."""
        settings = self.settings
        with_limits = settings.has_node_limits
        old = self.ceilings
        self.ceilings = {}
        for ts in self.tenants.values():
            ts.ceilings = self._ceilings_on(ts.path) if with_limits else ()
            for ceiling in ts.ceilings:
                ceiling.running += ts.running
        for listed in (settings.tenant_limits, settings.tenant_rates, settings.tenant_minimums):
            for tenant in listed:
                self._ceiling(tenant, tenant_path(tenant))
        capped: set[str | None] = set()
        self.refills = []
        for name, ceiling in self.ceilings.items():
            before = old.get(name)
            if ceiling.limit is not None and ceiling.running >= ceiling.limit:
                ceiling.capped = True
                ceiling.since = before.since if before is not None and before.capped else now
            if ceiling.rate is not None and before is not None and before.rate is not None:
                # The bucket keeps the tokens it had spent, repaid at the new rate: its debt, (tat - now) seconds
                # at the old rate, is (tat - now) * old / new at the new one. A node just out of tokens stays out
                # until its next token at the new pace, and a raised rate frees a backlog at once.
                ceiling.tat = before.tat
                if now is not None and before.tat > now:
                    ceiling.tat = now + (before.tat - now) * before.rate / ceiling.rate
                start = next_start(ceiling.tat, ceiling.rate)
                if (start > now) if now is not None else before.limited_until is not None:
                    ceiling.limited_until = start
                    self.refills.append((start, name))  # type: ignore[arg-type]
            if ceiling.blocked:
                capped.add(name)
        heapify(self.refills)
        self.minimum_nodes = [c for c in self.ceilings.values() if c.minimum is not None]
        unblocked = self.capped - capped
        blocked = capped - self.capped
        self.capped.clear()
        self.capped.update(capped)
        for cls in self.classes:
            if isinstance(cls.rest, FairQueue):
                for name in unblocked:
                    cls.rest.unblock(tenant_path(name))
                for name in blocked:
                    cls.rest.block(tenant_path(name))
            # Re-sort the deadline tasks under the new ceilings (O(deadline backlog)).
            entries = cls.tree.entries() if cls.tree is not None else cls.edf
            entries = [e for e in entries if e[1] == e[2]._seq and e[2].state is QUEUED]
            cls.edf_stale = 0
            if with_limits:
                cls.edf = []
                cls.tree = EdfTree(cls, self.capped)
                for entry in entries:
                    cls.tree.push(entry, entry[2]._ts.ceilings)
            else:
                cls.tree = None
                heapify(entries)
                cls.edf = entries
        self.stuck = False

    def _new_rest(self) -> FairQueue | FifoQueue:
        if not self.fair:
            return FifoQueue()
        share_by = self.settings.share_by
        charge_of = (None if share_by == "dispatches" else
                     self._charge_cost if share_by == "cost" else self._charge_estimate)
        return FairQueue(self.weights, capped=self.capped, charge_of=charge_of)
