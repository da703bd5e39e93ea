"""Per-tenant ceilings, rates and minimums: what holds a node's subtree back, or puts it first.

A `Ceiling` counts the running tasks of one node's subtree in one pool, for
every node that has a ceiling, a rate or a minimum. When the count reaches
the limit, or the node's rate bucket is empty, the node is *capped* (held
back; `blocked`): the pool takes it out of
every class's fair tree (fairqueue.py: the node keeps its tasks and tags
but holds no heap entry) and out of every class's deadline order
(`EdfTree` here), so its tasks never block anyone else's. When one of its
tasks ends it is uncapped and rejoins where the rules put it.

`EdfTree` is the deadline order of one class of a pool with ceilings. A
plain EDF heap would have to skip a capped node's tasks one by one at every
dispatch, so the heap is split by ceiling instead: each node with a ceiling
has an `EdfGroup`, a heap of the deadline tasks whose nearest capped-able
ancestor it is, plus one *bundle* entry for each such group just below it.
A bundle entry `(deadline, seq, group)` sits in its parent's heap (the
class's root heap for the top ones) only while the group is not capped, and
its key is never later than the earliest entry inside (it is refreshed
lazily, when it reaches the top). Tasks of nodes without a ceiling above
them stay in the root heap, so the order is plain EDF among every task
whose nodes are all under their ceilings. Push, pop and cap cost
O(depth * log n).

A rate is a token bucket of `max(1, rate)` tokens, refilled at `rate` per
second, kept as one number: the theoretical arrival time of the generic
cell rate algorithm (`tat`). A dispatch takes a token from every rated node
on its path (`tat = max(tat, now) + 1/rate`); the node may start another
task from `tat - (capacity - 1)/rate` on (`next_start`). Until then it is
held back exactly as a capped node is, and the pool wakes it at that time.

A minimum is not a hold but a push: while a node's subtree runs fewer tasks
than its minimum, its class's fair queue serves it ahead of the fair order
(pool.py, fairqueue.py `pop_needy`).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING, AbstractSet

from cronoq.core.task import QUEUED, Task

if TYPE_CHECKING:
    from cronoq.core.pool import ClassQueue

INF = float("inf")

# A group table is swept of empty groups once it has doubled past this size.
_MIN_SWEEP = 64


def next_start(tat: float, rate: float) -> float:
    """When a node whose bucket's theoretical arrival time is `tat` may start its next task: its bucket holds
    max(1, rate) tokens, so it may run that many ahead of the steady pace."""
    capacity = rate if rate > 1.0 else 1.0
    return tat - (capacity - 1.0) / rate


class Ceiling:
    """The ceiling, rate and minimum of one tenant node in one pool (any may be None), and its running count
    (over every class). The node is held back (`blocked`) while at its ceiling (`capped`) or while its rate
    bucket is empty (`limited_until` is when it refills by one token)."""

    __slots__ = ("name", "path", "limit", "running", "capped", "since", "rate", "tat", "limited_until",
                 "minimum")

    def __init__(self, name: str | None, path: tuple[str | None, ...], limit: int | None,
                 rate: float | None = None, minimum: int | None = None) -> None:
        self.name = name
        self.path = path  # the nodes from the top down to this one (settings.tenant_path)
        self.limit = limit
        self.running = 0
        self.capped = False
        self.since: float | None = None  # when it was capped (the caller's clock), while capped
        self.rate = rate
        self.tat = -INF  # its bucket is full
        self.limited_until: float | None = None
        self.minimum = minimum

    @property
    def blocked(self) -> bool:
        """Held back: at its ceiling, or out of tokens."""
        return self.capped or self.limited_until is not None

    def tokens(self, now: float) -> float:
        """Tokens in its bucket at `now` (its capacity when it has no rate)."""
        if self.rate is None:
            return 0.0
        capacity = self.rate if self.rate > 1.0 else 1.0
        if self.tat == -INF:
            return capacity
        return max(0.0, min(capacity, capacity - (self.tat - now) * self.rate))

    def under_minimum(self) -> bool:
        """Whether it runs fewer tasks than its minimum."""
        return self.minimum is not None and self.running < self.minimum



class EdfGroup:
    """The deadline tasks of one capped-able node (and the bundles of the groups below it), in one class."""

    __slots__ = ("name", "parent", "heap", "stale", "entry", "capped")

    def __init__(self, name: str | None, parent: EdfGroup | None, capped: bool) -> None:
        self.name = name
        self.parent = parent
        self.heap: list[tuple] = []
        self.stale = 0
        self.entry: tuple | None = None  # its live bundle entry in the parent's heap, if any
        self.capped = capped

    # Two entries of one heap never tie on (deadline, seq) unless they are the
    # same group's; these keep a tuple comparison from ever raising anyway.
    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


def _live(entry: tuple) -> bool:
    x = entry[2]
    if x.__class__ is EdfGroup:
        return x.entry is entry
    return entry[1] == x._seq and x.state is QUEUED


class EdfTree:
    """Deadline order of one class of a pool with ceilings: EDF among the tasks whose nodes are not capped."""

    __slots__ = ("cls", "groups", "capped", "sweep_at")

    def __init__(self, cls: ClassQueue, capped: AbstractSet[str | None]) -> None:
        self.cls = cls  # its `edf` list is the root heap, `edf_stale` the root's stale count
        self.groups: dict[str | None, EdfGroup] = {}
        self.capped = capped
        self.sweep_at = _MIN_SWEEP

    def push(self, entry: tuple, ceilings: tuple[Ceiling, ...]) -> None:
        """Queue a deadline task's entry (deadline, seq, task) under its deepest ceiling."""
        if not ceilings:
            heappush(self.cls.edf, entry)
            return
        group = self._group(ceilings)
        heappush(group.heap, entry)
        self._offer(group)

    def peek(self, now: float) -> float | None:
        """The deadline of the task pop(now) would return, or None."""
        top = self._clean(None, now)
        return None if top is None else top[0]

    def pop(self, now: float) -> Task | None:
        """Remove and return the earliest-deadline task of no capped node, never one whose deadline <= now."""
        if self._clean(None, now) is None:
            return None
        # _clean left every bundle on the way at the top of its heap, keyed by the task's key.
        chain: list[EdfGroup] = []
        heap = self.cls.edf
        entry = heap[0]
        while entry[2].__class__ is EdfGroup:
            group = entry[2]
            chain.append(group)
            heap = group.heap
            entry = heap[0]
        heappop(heap)
        for group in reversed(chain):
            above = self._heap(group.parent)
            if group.heap:
                top = group.heap[0]
                group.entry = new = (top[0], top[1], group)
                heapreplace(above, new)
            else:
                heappop(above)
                group.entry = None
        return entry[2]

    def discard(self, task: Task) -> None:
        """A queued deadline task left without being popped (cancelled or expired): one more stale entry."""
        ceilings = task._ts.ceilings  # type: ignore[union-attr]
        self._stale(self.groups.get(ceilings[-1].name) if ceilings else None)

    def block(self, name: str | None) -> None:
        """Node `name` is capped: its bundle leaves its parent's heap."""
        group = self.groups.get(name)
        if group is None:
            return
        group.capped = True
        if group.entry is not None:
            group.entry = None
            self._stale(group.parent)

    def unblock(self, name: str | None) -> None:
        """Node `name` is under its ceiling again: its bundle goes back."""
        group = self.groups.get(name)
        if group is None:
            return
        group.capped = False
        self._offer(group)

    def entries(self) -> list[tuple]:
        """Every queued task's entry held here (to rebuild after the ceilings changed)."""
        out = [e for e in self.cls.edf if e[2].__class__ is not EdfGroup and _live(e)]
        for group in self.groups.values():
            out += [e for e in group.heap if e[2].__class__ is not EdfGroup and _live(e)]
        return out

    # -- internals ---------------------------------------------------------

    def _heap(self, group: EdfGroup | None) -> list[tuple]:
        return self.cls.edf if group is None else group.heap

    def _group(self, ceilings: tuple[Ceiling, ...]) -> EdfGroup:
        """The group of the deepest ceiling, made (with its ancestors) if missing."""
        parent: EdfGroup | None = None
        for ceiling in ceilings:
            group = self.groups.get(ceiling.name)
            if group is None:
                if len(self.groups) >= self.sweep_at:
                    self._sweep()
                group = self.groups[ceiling.name] = EdfGroup(ceiling.name, parent, ceiling.name in self.capped)
            parent = group
        return parent  # type: ignore[return-value]

    def _offer(self, group: EdfGroup) -> None:
        """The group's earliest entry may be earlier than its bundle says: re-key the bundles up the tree."""
        while not group.capped and group.heap:
            deadline, seq = group.heap[0][:2]
            current = group.entry
            if current is not None and (current[0], current[1]) <= (deadline, seq):
                return
            parent = group.parent
            group.entry = new = (deadline, seq, group)
            heappush(self._heap(parent), new)
            if current is not None:
                self._stale(parent)
            if parent is None:
                return
            group = parent

    def _clean(self, group: EdfGroup | None, now: float) -> tuple | None:
        """The entry of the task that pop(now) would take from `group`'s subtree (None: the root).

        Drops stale and overdue entries met at the tops, and re-keys bundles
        whose key had fallen behind, so that on return every bundle on the
        way down is at the top of its heap with the task's exact key.
        """
        heap = self._heap(group)
        while heap:
            top = heap[0]
            deadline, seq, x = top
            if x.__class__ is EdfGroup:
                if x.entry is not top:
                    heappop(heap)
                    self._unstale(group)
                    continue
                inner = self._clean(x, now)
                if inner is None:
                    heappop(heap)
                    x.entry = None
                    continue
                if inner[0] != deadline or inner[1] != seq:
                    x.entry = new = (inner[0], inner[1], x)
                    heapreplace(heap, new)
                    continue
                return inner
            if seq != x._seq or x.state is not QUEUED or deadline <= now:
                # Stale, or overdue: an overdue task stays QUEUED for expire()
                # to report, which will count it stale here, so count it now.
                heappop(heap)
                self._unstale(group)
                continue
            return top
        return None

    def _stale(self, group: EdfGroup | None) -> None:
        """One more entry of `group`'s heap (None: the root) is stale; compact before they outnumber the live."""
        if group is None:
            cls = self.cls
            cls.edf_stale += 1
            if cls.edf_stale * 2 > len(cls.edf):
                cls.edf = [e for e in cls.edf if _live(e)]
                heapify(cls.edf)
                cls.edf_stale = 0
            return
        group.stale += 1
        if group.stale * 2 > len(group.heap):
            group.heap = [e for e in group.heap if _live(e)]
            heapify(group.heap)
            group.stale = 0

    def _unstale(self, group: EdfGroup | None) -> None:
        if group is None:
            self.cls.edf_stale -= 1
        else:
            group.stale -= 1

    def _sweep(self) -> None:
        """Forget groups that hold nothing and are no kept group's ancestor."""
        keep: set[int] = set()
        for group in self.groups.values():
            g: EdfGroup | None = group if group.heap else None
            while g is not None and id(g) not in keep:
                keep.add(id(g))
                g = g.parent
        self.groups = {name: g for name, g in self.groups.items() if id(g) in keep}
        self.sweep_at = max(_MIN_SWEEP, 2 * len(self.groups))
