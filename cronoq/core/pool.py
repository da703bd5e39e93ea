"""A pool inside the core: four strict priority classes and the counts around them.

Each `ClassQueue` holds one priority class of one pool: an EDF heap of its
queued tasks that have a deadline, ahead of a `FairQueue` or `FifoQueue` for
the rest. A `PoolState` walks its classes from critical to low and takes the
first task it finds. Counts (per class, per tenant, per pool) are kept as tasks
move so that stats and the broker's backlog limits cost O(1).

A pool with tenant ceilings (ceilings.py) also counts the running tasks of
every node that has one, and caps and uncaps nodes as tasks start and end;
its classes then keep their deadline tasks in an `EdfTree` so that a capped
node's tasks are passed over without blocking anyone.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from itertools import islice
from typing import TYPE_CHECKING, Collection, Iterator

from cronoq.core.ceilings import Ceiling, EdfTree
from cronoq.core.fairqueue import FairQueue, FifoQueue
from cronoq.core.settings import PRIORITIES, PoolSettings, tenant_path
from cronoq.core.task import QUEUED, Task
from cronoq.core.timers import TimedEntry
from cronoq.core.weights import Weights

if TYPE_CHECKING:
    from cronoq.core.workers import WorkerState

INF = float("inf")

# Counts of tenants with no task left are dropped once the table has doubled
# past this size, so a churn of one-off tenants cannot grow it without bound
# while ordinary pools (fewer tenants than this) keep every tenant's counters.
_KEEP_IDLE_TENANTS = 1024


class TenantStats:
    """Counts of one tenant's tasks in one pool (untenanted tasks count under None), its place in
    the tenant tree and the ceilings its tasks count against."""

    __slots__ = ("tenant", "path", "top", "ceilings", "queued", "delayed", "running", "dispatched")

    def __init__(self, tenant: str | None, ceilings: tuple[Ceiling, ...] = ()) -> None:
        self.tenant = tenant
        self.path = tenant_path(tenant)  # the nodes from the top down to this tenant
        self.top = self.path[0]  # the top-level tenant whose tree this one is in
        self.ceilings = ceilings  # of the nodes on its path that have one, top first
        self.queued = 0
        self.delayed = 0
        self.running = 0
        self.dispatched = 0


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

    def pop(self, now: float) -> Task | None:
        """Remove and return the next task of this class, never one whose deadline <= now."""
        if self.tree is not None:
            task = self.tree.pop(now)
            return task if task is not None else self.rest.pop()
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
        return self.rest.pop()

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
    )

    def __init__(self, settings: PoolSettings) -> None:
        self.name = settings.name
        self.settings = settings
        self.weights = Weights(settings.tenant_weights, default=settings.default_weight)
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
        if settings.has_ceilings:
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
            if self.settings.has_ceilings:
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
        for cls in self.classes:
            if cls.queued:
                # Most classes hold no deadline task: go straight to the fair/FIFO part.
                task = cls.pop(now) if cls.edf else cls.rest.pop()
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
            if ceiling.capped and ceiling.running < ceiling.limit:
                ceiling.capped = False
                ceiling.since = None
                self._unblock(ceiling)

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
        had_ceilings = self.settings.has_ceilings
        self.settings = settings
        self.weights = Weights(settings.tenant_weights, self.weights, settings.default_weight)
        self.fair = settings.fair
        self.max_in_flight = settings.max_in_flight
        for cls in self.classes:
            if self.fair != was_fair:
                # The kind of queue changes: move the backlog over in arrival
                # order; a new fair queue starts from V = 0.
                backlog = cls.rest.tasks_in_order()
                cls.rest = self._new_rest()
                for task in backlog:
                    cls.rest.push(task)
            elif isinstance(cls.rest, FairQueue):
                cls.rest.reweight(self.weights)
        if had_ceilings or settings.has_ceilings:
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
            "ceiling_count": len(self.ceilings),
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
            return list(self.ceilings.values())
        names = list(islice(self.capped, limit))
        if len(names) < limit:
            names += islice((name for name in self.ceilings if name not in self.capped), limit - len(names))
        return [self.ceilings[name] for name in names]

    # -- ceilings ------------------------------------------------------------

    def _charge(self, ceilings: tuple[Ceiling, ...], now: float) -> None:
        """A task under these ceilings started running: cap the nodes that reach their limit."""
        for ceiling in ceilings:
            ceiling.running += 1
            if ceiling.running >= ceiling.limit and not ceiling.capped:
                ceiling.capped = True
                ceiling.since = now
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
            limit = self.settings.limit(name)
            if limit is None:
                return None
            ceiling = self.ceilings[name] = Ceiling(name, path, limit)
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
        listed = self.settings.tenant_limits
        kept = {name: c for name, c in self.ceilings.items() if name in listed}
        for ts in self.tenants.values():
            for c in ts.ceilings:
                kept[c.name] = c
        self.ceilings = kept

    def _apply_ceilings(self, now: float | None) -> None:
        """(Re)build the ceilings from the settings: recount, cap and uncap, re-sort the deadline tasks."""
        with_ceilings = self.settings.has_ceilings
        old = self.ceilings
        self.ceilings = {}
        for ts in self.tenants.values():
            ts.ceilings = self._ceilings_on(ts.path) if with_ceilings else ()
            for ceiling in ts.ceilings:
                ceiling.running += ts.running
        for tenant in self.settings.tenant_limits:
            self._ceiling(tenant, tenant_path(tenant))
        capped: set[str | None] = set()
        for name, ceiling in self.ceilings.items():
            if ceiling.running >= ceiling.limit:
                capped.add(name)
                before = old.get(name)
                ceiling.capped = True
                ceiling.since = before.since if before is not None and before.capped else now
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
            if with_ceilings:
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
        return FairQueue(self.weights, capped=self.capped) if self.fair else FifoQueue()
