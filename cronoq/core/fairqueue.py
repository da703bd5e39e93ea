"""The part of a priority class that is not ordered by deadline.

Two interchangeable queues hold a class's tasks without a deadline:

- `FairQueue` (fair pools): hierarchical weighted start-time fair queuing
  (SFQ) over the tenant tree, as docs/api.md ("Scheduling rules") and
  docs/scheduling.md define it. A `FairQueue` is one group of siblings
  sharing what their parent gets: the class's root group holds the
  top-level tenants; a tenant with sub-tenants (`acme` of `acme/search`)
  holds a group of its own (`Flow.sub`) in which its own tasks, if any, are
  one more child of weight 1, keyed by its own name.

  Each child is a `Flow`. A leaf flow is a FIFO of its tasks. Inside a
  group, only the children that can be dispatched from hold a start tag,
  given when they join: `S = max(V, F[c])`, where `V` is the group's
  virtual time (the tag of its last dispatch) and `F[c] = S_prev + 1/w`
  is kept per child (0 before its first dispatch). A heap of those
  children keyed by `(S, arrival seq of the task the child would hand out)`
  yields the next child in O(log siblings); a dispatch walks down the tree
  from the root group to a leaf, takes the leaf's head, and walks back up,
  advancing every group's `V` and re-tagging every child on the path:
  O(depth * log siblings).

  With fixed weights this is the rules' order: a child that stays
  backlogged gets successive tags `S, S + 1/w, ...` either way, and a child
  that (re)joins gets `max(V, F[c])` either way. Tagging late is what lets
  a reload re-weight the queued backlog at once: re-tagging every group's
  heap is O(nodes). A cancelled task is never charged: when a head is
  cancelled its successor inherits the head's tag.

  A child at its ceiling (`capped`) keeps its tasks and its tags but holds
  no heap entry, so it blocks nobody; when it is uncapped it rejoins at
  `max(V, F[c])`, banking nothing for the time it was capped. A group whose
  children are all capped or idle leaves its own parent's heap the same way.

  What users watch is read off the same state, in O(1) or O(depth): a
  node's lag is `w * (V - S)` (flow_lag; SFQ keeps it in [-1, 0]), and its
  weighted share the product down its path of `w` over the weights of the
  siblings with tasks queued, capped or not (`bsum`, kept per group).

- `FifoQueue` (pools without fairness): one FIFO, submission order.

Tags are exact integers (see weights.py), so a tie between tags is a true
tie, broken by arrival as the rules say.

What a dispatch charges (`charge_of`, set by the pool from its `share_by`):
one step `1/w` per dispatch (None), or `charge` quanta of a unit, `charge *
(1/w)` at every level of the path (a task's cost, or its estimated run
time). In a pool that shares by run time the charge is corrected when the
task ends (`correct`): the node's F, and its tag while it is in the heap,
move by the difference at every level of its path. A node in the heap keeps
a correction in its favour even below V (it was overcharged while it stayed
backlogged, so it is owed that); V itself never goes back. A node out of
the heap rejoins at max(V, F) as ever: no banked credit.

A node under its minimum (`pop_needy`) is served ahead of the fair order of
its class: the walk goes down its path whatever the tags say, charges every
node on it as usual, and moves each group's V no further than the smallest
tag there (what a fair dispatch would have moved it to).

Both queues keep their tasks in `Chain`s (chain.py), FIFOs threaded through
the tasks themselves, and delete lazily: a cancelled task stays linked until
it reaches the front or the chain is compacted, before its stale tasks
outnumber its live ones.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from typing import AbstractSet, Callable, Iterator, Sequence

from cronoq.core.chain import Chain
from cronoq.core.settings import tenant_path
from cronoq.core.task import Task
from cronoq.core.weights import QUANTA_PER_UNIT, Tag, Weights

ChargeOf = Callable[[Task], int]
"""What a task's dispatch charges, in quanta of a unit (weights.py): the pool's rule for share_by cost or runtime."""

# Idle flows whose F[t] is not ahead of V carry no state worth keeping (V never
# decreases, so a fresh flow would get the same tags); they are swept once the
# flow table has doubled since the last sweep, so churning tenants cost O(1) each.
_MIN_SWEEP = 64

_NO_CAPS: frozenset[str | None] = frozenset()


class Flow(Chain):
    """One node of the tenant tree inside one fair class: its tags, and
    either its FIFO of tasks (a leaf) or the group of its children (`sub`).

    While a leaf is backlogged its `head` is always a live task.
    """

    __slots__ = (
        "tenant",  # the node's full name (its key in its parent group)
        "weight",
        "step",  # 1/weight in tag units
        "tag",  # start tag S (meaningful while `on`)
        "last",  # start tag of its last dispatched task, None before the first
        "finish",  # F: S of its last dispatch + 1/w (0 before the first); kept while idle
        "gen",  # bumped whenever the flow's heap entry is replaced; older entries are stale
        # The tree:
        "parent",  # the FairQueue (group) it is a child of
        "sub",  # the FairQueue of its children, once it has any (None for a leaf)
        "nq",  # queued tasks in its subtree while it has children (its chain is empty then)
        "hseq",  # the arrival seq in its current heap entry (kept for flows with children)
        "on",  # holds a live heap entry and counts in the parent's nback and wsum
        "capped",  # at its ceiling: out of the heap although it may have tasks
        "served",  # dispatched since its past was last forgotten (survives a forget by a ceiling)
        "owed",  # charged pools: quanta F is ahead of `last` (the last charge and corrections since)
    )

    def __init__(self, tenant: str | None, weight: float, step: Tag, parent: FairQueue) -> None:
        super().__init__()
        self.tenant = tenant
        self.weight = weight
        self.step = step
        self.tag: Tag = 0
        self.last: Tag | None = None
        self.finish: Tag = 0
        self.gen = 0
        self.parent = parent
        self.sub: FairQueue | None = None
        self.nq = 0
        self.hseq = 0
        self.on = False
        self.capped = False
        self.served = False
        self.owed = QUANTA_PER_UNIT


def flow_lag(flow: Flow) -> float:
    """Dispatches the node trails (+) or leads (-) its weighted share among its siblings: `w * (V - S)`,
    the service its group's virtual time has entitled it to minus the service its tag has taken (0 while it
    has nothing queued). See docs/scheduling.md, "Lag".

    SFQ keeps `V <= S <= V + 1/w` for every child in the heap, so this lies in [-1, 0]: a node just served
    leads by up to one of its own dispatches, and none can trail unless the fair order itself is broken. A
    node out of the heap while backlogged (capped, or all of its children are) has the lag it would rejoin
    with, `w * (V - max(V, F))`: its lead is kept, its trailing is not banked, as the scheduler does.
    """
    if not (flow.live or flow.nq):
        return 0.0
    group = flow.parent
    vtime = group.vtime
    if flow.on:
        start = flow.tag
    else:
        start = flow.finish if flow.finish > vtime else vtime
    # w * (V - S) in dispatches is (V - S) / (1/w): exact in integer tags up to the one division.
    return (vtime - start) / flow.step


def flow_share(flow: Flow) -> float:
    """The fraction of its parent's dispatches the node gets now: its weight over the weights of the siblings
    that can go; 0 while it cannot go (nothing queued, or capped)."""
    return flow.weight / flow.parent.wsum if flow.on and flow.parent.wsum > 0 else 0.0


HeapEntry = tuple[Tag, int, int, Flow]  # (start tag, arrival seq of the task it would hand out, flow gen, flow)


class FairQueue:
    """Weighted SFQ between siblings: the root group of one priority class of one pool, or the
    children of one tenant node (`owner`)."""

    __slots__ = (
        "weights",
        "flows",
        "heap",
        "heap_stale",
        "vtime",
        "nback",
        "wsum",
        "nbusy",
        "bsum",
        "sweep_at",
        "owner",
        "capped",
        "leaves",
        "leaves_sweep_at",
        "charge_of",
        "charged",
    )

    def __init__(
        self, weights: Weights, owner: Flow | None = None, capped: AbstractSet[str | None] = _NO_CAPS,
        charge_of: ChargeOf | None = None,
    ) -> None:
        self.weights = weights
        self.flows: dict[str | None, Flow] = {}
        self.heap: list[HeapEntry] = []
        self.heap_stale = 0
        self.vtime: Tag = 0 if weights.scale is not None else 0.0  # V: start tag of the last dispatch
        self.nback = 0  # children with a live heap entry (backlogged and not capped)
        self.wsum = 0.0  # sum of their weights
        # Children with queued tasks in their subtree, capped or not, and their weights' sum: what the
        # weighted share divides by (a ceiling holds a node back; it does not shrink what it is promised).
        self.nbusy = 0
        self.bsum = 0.0
        self.sweep_at = _MIN_SWEEP
        self.owner = owner
        # Names of the capped nodes of the pool (shared, kept up to date by the pool).
        self.capped = capped
        # Root group only: tenant -> the leaf flow its tasks last went to, valid while that flow
        # has tasks (a backlogged leaf is never swept, reset or split), so that queueing behind a
        # sub-tenant's waiting tasks skips the walk down the tree.
        self.leaves: dict[str | None, Flow] = {}
        self.leaves_sweep_at = _MIN_SWEEP
        # None: a dispatch charges one step; else the pool's rule for what it charges (shared by the whole tree).
        self.charge_of = charge_of
        self.charged = 0  # root group: the charge of the task it last handed out (with charge_of), in quanta

    def __len__(self) -> int:
        """Queued tasks (O(nodes): for inspection, not for the dispatch path)."""
        return sum(flow.live + flow.nq for flow in self.flows.values())

    def __bool__(self) -> bool:
        """Whether a task can be popped (some child is backlogged and not capped)."""
        return self.nback > 0

    # -- the flat paths (top-level tenants) come first: they are the common case --

    def push(self, task: Task) -> None:
        """Append a queued task (its `_seq` and `_ts` already set) to its tenant's flow."""
        task._next = None
        flow = self.flows.get(task.tenant)
        if flow is not None and flow.live:
            flow.tail._next = task  # type: ignore[union-attr]
            flow.tail = task
            flow.live += 1
            return
        if flow is None or flow.sub is not None:
            leaf = self.leaves.get(task.tenant)
            if leaf is not None and leaf.live:
                # Behind the sub-tenant's waiting tasks: no tag changes, one more task in every node above.
                leaf.tail._next = task  # type: ignore[union-attr]
                leaf.tail = task
                leaf.live += 1
                above = leaf.parent.owner
                while above is not None:
                    above.nq += 1
                    above = above.parent.owner
                return
            if flow is not None or len(task._ts.path) > 1:  # type: ignore[union-attr]
                self._push_deep(task)
                return
            flow = self._new_flow(task.tenant)
        flow.head = flow.tail = task
        flow.live = 1
        self._activate(flow)

    def pop(self) -> Task | None:
        """Remove and return the next task by (S, arrival) at every level, or None if none can go."""
        heap = self.heap
        while heap:
            tag, _seq, gen, flow = heap[0]
            if gen != flow.gen:
                heappop(heap)
                self.heap_stale -= 1
                continue
            if flow.sub is not None:
                return self._pop_deep()
            task = flow.head
            head = task._next  # type: ignore[union-attr]
            task._next = None  # type: ignore[union-attr]
            if tag > self.vtime:  # (only a corrected tag can be below V: V never goes back)
                self.vtime = tag
            flow.last = tag
            flow.live -= 1
            # F[t] = S + 1/w; while the flow stays backlogged V is now S, so
            # max(V, F) is simply F and the next head's tag is F.
            charge_of = self.charge_of
            if charge_of is None:
                flow.finish = tag = tag + flow.step
            else:
                self.charged = flow.owed = charge = charge_of(task)  # type: ignore[arg-type]
                flow.finish = tag = tag + self.weights.advance(flow.step, charge)
            flow.head = head
            if flow.live:
                if flow.stale:
                    flow.skip_stale()  # cancelled tasks left behind the old head
                    if flow.stale > flow.live:
                        flow.compact()
                    head = flow.head
                flow.tag = tag
                heapreplace(heap, (tag, head._seq, gen, flow))  # type: ignore[union-attr]
            else:
                heappop(heap)
                self._deactivate(flow)
            return task  # type: ignore[return-value]
        return None

    def pop_needy(self, paths: Sequence[tuple[str | None, ...]]) -> Task | None:
        """Remove and return the next task of the first of the nodes at `paths` (nodes under their minimum)
        that can be dispatched from here, in the fair order among them: by (S, arrival) compared level by
        level down their paths. None if none of them can. O(len(paths) * depth + depth * log siblings)."""
        best: list[Flow] | None = None
        best_key: list[tuple[Tag, int]] | None = None
        for path in paths:
            flows: list[Flow] = []
            key: list[tuple[Tag, int]] = []
            group: FairQueue | None = self
            for name in path:
                flow = None if group is None else group.flows.get(name)
                if flow is None or not flow.on:
                    break
                flows.append(flow)
                key.append((flow.tag, flow.head._seq if flow.sub is None else flow.hseq))  # type: ignore[union-attr]
                group = flow.sub
            else:
                if best_key is None or key < best_key:
                    best, best_key = flows, key
        if best is None:
            return None
        return self._pop_along(best)

    def _pop_along(self, forced: list[Flow]) -> Task:
        """Pop down the `forced` flows (each in the heap, the first in this group), then by the smallest
        (S, arrival) below the last, and re-tag every node on the way back up."""
        path = list(forced)
        flow = path[-1]
        while flow.sub is not None:
            flow = flow.sub._top()[3]
            path.append(flow)
        task: Task = flow.head  # type: ignore[assignment]
        flow.head = task._next
        task._next = None
        flow.live -= 1
        charge_of = self.charge_of
        charge = 0
        if charge_of is not None:
            self.charged = charge = charge_of(task)
        advance = self.weights.advance
        for flow in reversed(path):
            group = flow.parent
            smallest = group._top()[0]  # a fair dispatch would have moved V to this tag
            if smallest > group.vtime:
                group.vtime = smallest
            tag = flow.tag
            flow.last = tag
            if charge_of is None:
                flow.finish = tag = tag + flow.step
            else:
                flow.owed = charge
                flow.finish = tag = tag + advance(flow.step, charge)
            group._drop_entry(flow)
            sub = flow.sub
            if sub is None:
                if flow.live:
                    if flow.stale:
                        flow.skip_stale()
                        if flow.stale > flow.live:
                            flow.compact()
                    flow.tag = tag
                    heappush(group.heap, (tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
                else:
                    group._deactivate(flow)
                continue
            flow.nq -= 1
            if not flow.nq:
                group._idle(flow)
            if sub.nback:
                flow.tag = tag
                flow.hseq = seq = sub._top()[1]
                heappush(group.heap, (tag, seq, flow.gen, flow))
            else:
                flow.on = False
                group.nback -= 1
                group.wsum = group.wsum - flow.weight if group.nback else 0.0
        return task

    def correct(self, path: tuple[str | None, ...], charge: int) -> None:
        """A task of the node at `path` turned out to cost `charge` more quanta (fewer, if negative) than it was
        charged: move F (and the tag of a node in the heap) by that at every level of its path that still
        remembers its past. O(depth * log siblings)."""
        advance = self.weights.advance
        group: FairQueue | None = self
        depth = 0
        last = len(path) - 1
        while group is not None and depth <= last + 1:
            name = path[depth] if depth <= last else path[last]
            flow = group.flows.get(name)
            if flow is None:
                if charge <= 0 or depth > last:
                    return  # forgotten while idle: it banked nothing, and credit it is not owed
                flow = group._new_flow(name)
            group._correct(flow, charge, advance(flow.step, charge))
            sub = flow.sub
            if depth == last and sub is None:
                return
            if depth > last:
                return
            group = sub
            depth += 1

    def _correct(self, flow: Flow, charge: int, amount: Tag) -> None:
        """Move one child's F (and its tag, if it is in the heap) by `amount` tag units (`charge` quanta)."""
        vtime = self.vtime
        if flow.on:
            if flow.last is None:  # joined at V having forgotten its past: that join is its last start now
                flow.last = flow.tag
                flow.owed = 0
            flow.owed += charge
            flow.tag = flow.finish = flow.tag + amount
            self._drop_entry(flow)
            seq = flow.head._seq if flow.sub is None else flow.hseq  # type: ignore[union-attr]
            heappush(self.heap, (flow.tag, seq, flow.gen, flow))
            if self.owner is not None:
                self._settle()
            return
        if flow.finish > vtime and flow.last is not None:
            flow.owed += charge
            flow.finish += amount
        elif charge > 0:  # it owed nothing: it owes this from now on
            flow.last = vtime
            flow.owed = charge
            flow.finish = vtime + amount

    def discard(self, task: Task) -> None:
        """Forget a task that was queued here and has just left (cancelled); O(1) amortised."""
        flow = self.flows.get(task.tenant)
        if flow is None or flow.sub is not None:
            self._discard_deep(task)
            return
        self._discard_from(flow, task)

    def reweight(self, weights: Weights) -> None:
        """Take new weights and re-tag the backlog of the whole tree at once.

        Each backlogged node gets the tag it would have had under its new
        weight, `max(V, S_prev + 1/w)`; every heap is rebuilt, O(nodes). An
        idle node keeps the F it left with: it has no backlog to re-weight.
        """
        self._rescale(weights)
        self._retag(weights)

    def tasks_in_order(self) -> list[Task]:
        """Every queued task here, in arrival order (used when a pool changes its kind of queue)."""
        out = list(self._tasks())
        out.sort(key=lambda t: t._seq)
        return out

    def lag(self, tenant: str | None) -> float:
        """Dispatches node `tenant` trails (+) or leads (-) its weighted share among its siblings
        (flow_lag: in [-1, 0] in this class)."""
        flow = self.find(tenant_path(tenant))
        return 0.0 if flow is None else flow_lag(flow)

    def weighted_share(self, path: tuple[str | None, ...]) -> tuple[float, float]:
        """(node, its own tasks): the fraction of this class's fair dispatches the weights promise the node at
        the end of `path` (its whole subtree) and its own tasks, while the ceilings do not bind: the product,
        down the path, of each node's weight over the weights of its siblings with tasks queued, capped or not
        (a node's own tasks, beside its children, weigh 1). (0, 0) for a node with nothing queued; O(depth)."""
        group: FairQueue | None = self
        share = 1.0
        flow: Flow | None = None
        for name in path:
            flow = None if group is None else group.flows.get(name)
            if flow is None or not (flow.live or flow.nq):
                return 0.0, 0.0
            share *= flow.weight / group.bsum  # type: ignore[union-attr]
            group = flow.sub
        if flow is None or flow.sub is None:
            return share, share  # a leaf: its own tasks are the node
        own = flow.sub.flows.get(flow.tenant)
        if own is None or not own.live:
            return share, 0.0
        return share, share * own.weight / flow.sub.bsum

    def own_lag(self, tenant: str | None) -> float:
        """The lag of node `tenant`'s own tasks among its children (its own lag when it has none)."""
        flow = self.find(tenant_path(tenant))
        if flow is None:
            return 0.0
        if flow.sub is not None:
            own = flow.sub.flows.get(flow.tenant)
            return 0.0 if own is None else flow_lag(own)
        return flow_lag(flow)

    def virtual_time(self) -> float:
        """V of this group in dispatches of a weight-1 tenant."""
        return self.weights.to_dispatches(self.vtime)

    def iter_flows(self) -> Iterator[Flow]:
        """The flows of this group (backlogged ones and recently idle ones)."""
        return iter(self.flows.values())

    def find(self, path: tuple[str | None, ...]) -> Flow | None:
        """The flow of the node at the end of `path` (from tenant_path), or None if it has none here."""
        group: FairQueue | None = self
        flow = None
        for name in path:
            if group is None:
                return None
            flow = group.flows.get(name)
            if flow is None:
                return None
            group = flow.sub
        return flow

    # -- ceilings ------------------------------------------------------------

    def block(self, path: tuple[str | None, ...]) -> None:
        """The node at `path` reached its ceiling: take it out of its parent's heap, tasks and tags kept."""
        flow = self.find(path)
        if flow is None:
            return
        flow.capped = True
        if flow.on:
            group = flow.parent
            group._off(flow)
            group._settle()

    def unblock(self, path: tuple[str | None, ...]) -> None:
        """The node at `path` is under its ceiling again: it rejoins at max(V, F) if it has work."""
        flow = self.find(path)
        if flow is None:
            return
        flow.capped = False
        if not flow.on and (flow.live or (flow.sub is not None and flow.sub.nback)):
            group = flow.parent
            group._on(flow)
            group._settle()

    # -- internals: joining and leaving the heap ----------------------------

    def _new_flow(self, tenant: str | None) -> Flow:
        if len(self.flows) >= self.sweep_at:
            self._sweep()
        owner = self.owner
        if owner is not None and tenant == owner.tenant:
            # The owner's own tasks: one more child, of weight 1, never capped on its own.
            flow = Flow(tenant, 1.0, self.weights.unit_step, self)
        else:
            flow = Flow(tenant, self.weights.weight(tenant), self.weights.step(tenant), self)
            if self.capped and tenant in self.capped:
                flow.capped = True
        self.flows[tenant] = flow
        return flow

    def _activate(self, flow: Flow) -> None:
        """A leaf became backlogged: forget its past if it banked nothing, and join."""
        self._busy(flow)
        finish = flow.finish
        vtime = self.vtime
        if finish > vtime:
            flow.tag = finish
        else:
            # It banked nothing and owes nothing: forget its past, as a fresh
            # flow (or one swept away meanwhile) would, so that a reweight
            # during this period cannot charge it for an earlier one.
            flow.tag = vtime
            flow.last = None
            flow.finish = 0
            flow.served = False
        if flow.capped:
            return
        flow.gen += 1
        heappush(self.heap, (flow.tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
        flow.on = True
        self.nback += 1
        self.wsum += flow.weight
        if self.owner is not None:
            self._settle()

    def _deactivate(self, flow: Flow) -> None:
        """A leaf has nothing queued any more (its entry already gone): unlink what is left."""
        if flow.stale:
            flow.compact()  # only cancelled tasks are left
        flow.head = flow.tail = None
        flow.on = False
        self.nback -= 1
        # Reset exactly at zero so float drift in the running sum cannot build up.
        self.wsum = self.wsum - flow.weight if self.nback else 0.0
        self._idle(flow)

    def _busy(self, flow: Flow) -> None:
        """A child got queued tasks in its subtree after having none."""
        self.nbusy += 1
        self.bsum += flow.weight

    def _idle(self, flow: Flow) -> None:
        """A child has no queued task left in its subtree."""
        self.nbusy -= 1
        self.bsum = self.bsum - flow.weight if self.nbusy else 0.0

    def _on(self, flow: Flow) -> None:
        """A backlogged child that can be dispatched from (again) joins the heap at max(V, F)."""
        finish = flow.finish
        if finish > self.vtime:
            flow.tag = finish
        else:
            # It banked nothing: forget its past (but remember that its own
            # tasks were served, which matters if it later gets children).
            flow.tag = self.vtime
            flow.served = flow.served or flow.last is not None
            flow.last = None
            flow.finish = 0
        flow.gen += 1
        sub = flow.sub
        seq = flow.head._seq if sub is None else sub._top()[1]  # type: ignore[union-attr]
        flow.hseq = seq
        heappush(self.heap, (flow.tag, seq, flow.gen, flow))
        flow.on = True
        self.nback += 1
        self.wsum += flow.weight

    def _off(self, flow: Flow) -> None:
        """A child still backlogged (or just idle) leaves the heap."""
        self._drop_entry(flow)
        flow.on = False
        self.nback -= 1
        self.wsum = self.wsum - flow.weight if self.nback else 0.0

    def _settle(self) -> None:
        """This group's heap changed: bring the owner's entry in its parent (and so on up) in line."""
        group = self
        while True:
            flow = group.owner
            if flow is None:
                return
            parent = flow.parent
            if flow.on:
                if flow.capped or not group.nback:
                    parent._off(flow)
                else:
                    seq = group._top()[1]
                    if seq == flow.hseq:
                        return
                    # Same tag, new tie-break: the task the owner would hand out changed.
                    parent._drop_entry(flow)
                    flow.hseq = seq
                    heappush(parent.heap, (flow.tag, seq, flow.gen, flow))
            elif flow.capped or not group.nback:
                return
            else:
                parent._on(flow)
            group = parent

    def _top(self) -> HeapEntry:
        """The live entry at the top of the heap (there must be one: nback > 0)."""
        heap = self.heap
        while heap[0][2] != heap[0][3].gen:
            heappop(heap)
            self.heap_stale -= 1
        return heap[0]

    def _drop_entry(self, flow: Flow) -> None:
        """The flow's live heap entry becomes stale (it stays in the heap until popped or compacted)."""
        flow.gen += 1
        self.heap_stale += 1
        if self.heap_stale * 2 > len(self.heap):
            heap = [e for e in self.heap if e[2] == e[3].gen]
            heapify(heap)
            self.heap = heap
            self.heap_stale = 0

    # -- internals: the tree ---------------------------------------------------

    def _push_deep(self, task: Task) -> None:
        """Queue a task of a sub-tenant, or of a tenant that has sub-tenants: route it down the tree."""
        path = task._ts.path  # type: ignore[union-attr]
        group = self
        leaf = path[-1]
        for name in path:
            flow = group.flows.get(name)
            if flow is None:
                flow = group._new_flow(name)
            sub = flow.sub
            if not (flow.live or flow.nq):
                group._wake(flow)
                sub = flow.sub
            if sub is None:
                if name == leaf:
                    break  # a leaf: the task joins its chain
                group._split(flow)
                sub = flow.sub
            flow.nq += 1
            group = sub  # type: ignore[assignment]
            if name == leaf:
                # A tenant with sub-tenants: its own tasks are the child named after it.
                flow = group.flows.get(name)
                if flow is None:
                    flow = group._new_flow(name)
                if not flow.live:
                    group._wake(flow)
        flow.append(task)
        leaves = self.leaves
        if len(leaves) >= self.leaves_sweep_at:
            self.leaves = leaves = {tenant: leaf for tenant, leaf in leaves.items() if leaf.live}
            self.leaves_sweep_at = max(_MIN_SWEEP, 2 * len(leaves))
        leaves[task.tenant] = flow
        if flow.live == 1 and not flow.capped:
            group._on(flow)
            group._settle()

    def _wake(self, flow: Flow) -> None:
        """An idle child gets work: if it banked nothing, forget its whole past (and its subtree's)."""
        self._busy(flow)
        if flow.finish <= self.vtime:
            flow.last = None
            flow.finish = 0
            flow.served = False
            flow.sub = None  # every node below is idle too: a fresh node is the same

    def _split(self, flow: Flow) -> None:
        """A leaf gets its first sub-tenant: its chain becomes its own child, of weight 1.

        That child takes over where the leaf's own tasks stood among
        themselves: if they were served since the leaf's past was last
        forgotten, the next one is one step behind the last one (V = 0,
        F = one weight-1 step), as if it had always been a child.
        """
        sub = flow.sub = FairQueue(self.weights, flow, self.capped, self.charge_of)
        served = flow.served or flow.last is not None
        if not (flow.live or served):
            return
        own = sub._new_flow(flow.tenant)
        if served:
            own.last = sub.vtime
            if self.charge_of is None:
                own.finish = sub.vtime + own.step
            else:  # one step of what its last own task was charged
                own.owed = flow.owed
                own.finish = sub.vtime + self.weights.advance(own.step, own.owed)
        if not flow.live:
            return
        own.head, own.tail, own.live, own.stale = flow.head, flow.tail, flow.live, flow.stale
        sub._busy(own)
        flow.nq = flow.live
        flow.head = flow.tail = None
        flow.live = flow.stale = 0
        sub._on(own)
        flow.hseq = own.head._seq  # type: ignore[union-attr]  # what its entry (if any) already says

    def _pop_deep(self) -> Task:
        """Pop through the tree: down by the smallest (S, arrival) at each level, then back up."""
        group = self
        while True:
            entry = group.heap[0]
            if entry[2] != entry[3].gen:
                entry = group._top()
            flow = entry[3]
            sub = flow.sub
            if sub is None:
                break
            group = sub
        # The leaf: hand out its head, re-tag it in its group.
        task: Task = flow.head  # type: ignore[assignment]
        flow.head = task._next
        task._next = None
        flow.live -= 1
        tag = flow.tag
        if tag > group.vtime:
            group.vtime = tag
        flow.last = tag
        charge_of = self.charge_of
        charge = 0
        if charge_of is None:
            flow.finish = tag = tag + flow.step
        else:
            self.charged = flow.owed = charge = charge_of(task)
            flow.finish = tag = tag + self.weights.advance(flow.step, charge)
        if flow.live:
            if flow.stale:
                flow.skip_stale()
                if flow.stale > flow.live:
                    flow.compact()
            flow.tag = tag
            heapreplace(group.heap, (tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
        else:
            heappop(group.heap)
            group._deactivate(flow)
        # Then every node above it, up to the root: each was at the top of its group's heap.
        flow = group.owner  # type: ignore[assignment]
        while flow is not None:
            sub = group
            group = flow.parent
            tag = flow.tag
            if tag > group.vtime:
                group.vtime = tag
            flow.last = tag
            if charge_of is None:
                flow.finish = tag = tag + flow.step
            else:
                flow.owed = charge
                flow.finish = tag = tag + self.weights.advance(flow.step, charge)
            flow.nq -= 1
            if not flow.nq:
                group._idle(flow)
            if sub.nback:
                entry = sub.heap[0]
                if entry[2] != entry[3].gen:
                    entry = sub._top()
                flow.tag = tag
                flow.hseq = seq = entry[1]
                heapreplace(group.heap, (tag, seq, flow.gen, flow))
            else:
                # Out of work, or what is left is capped: out of the heap either way.
                heappop(group.heap)
                flow.on = False
                group.nback -= 1
                group.wsum = group.wsum - flow.weight if group.nback else 0.0
            flow = group.owner  # type: ignore[assignment]
        return task

    def _discard_deep(self, task: Task) -> None:
        group = self
        path = task._ts.path  # type: ignore[union-attr]
        last = len(path) - 1
        for depth, name in enumerate(path):
            flow = group.flows[name]
            if flow.sub is None:
                break
            flow.nq -= 1
            if not flow.nq:
                group._idle(flow)
            group = flow.sub
            if depth == last:
                flow = group.flows[name]
        group._discard_from(flow, task)

    def _discard_from(self, flow: Flow, task: Task) -> None:
        """`task` of leaf `flow` (a child of this group) left the queue."""
        flow.live -= 1
        flow.stale += 1
        if not flow.live:
            if flow.on:
                self._drop_entry(flow)
                self._deactivate(flow)
            else:
                flow.compact()  # capped: only cancelled tasks are left
                flow.head = flow.tail = None
                self._idle(flow)
        elif flow.head is task:
            # The successor inherits the head's tag (the cancelled task is not
            # charged); only the tie-break seq changes, so the entry is replaced.
            flow.skip_stale()
            if flow.on:
                self._drop_entry(flow)
                heappush(self.heap, (flow.tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
            else:
                return
        else:
            if flow.stale > flow.live:
                flow.compact()
            return
        if self.owner is not None:
            self._settle()

    def _tasks(self) -> Iterator[Task]:
        for flow in self.flows.values():
            yield from flow
            if flow.sub is not None:
                yield from flow.sub._tasks()

    def _sweep(self) -> None:
        vtime = self.vtime
        self.flows = {
            tenant: flow
            for tenant, flow in self.flows.items()
            if flow.live or flow.nq or flow.finish > vtime
        }
        self.sweep_at = max(_MIN_SWEEP, 2 * len(self.flows))

    def _retag(self, weights: Weights) -> None:
        """New weights for every node of this group and below; heaps rebuilt bottom-up."""
        self.weights = weights
        vtime = self.vtime
        owner = self.owner
        wsum = bsum = 0.0
        entries: list[HeapEntry] = []
        for key, flow in self.flows.items():
            sub = flow.sub
            if sub is not None:
                sub._retag(weights)
            if owner is not None and key == owner.tenant:
                weight, step = 1.0, weights.unit_step
            else:
                weight, step = weights.weight(key), weights.step(key)
            if flow.on:
                wsum += weight
            flow.weight = weight
            flow.step = step
            if flow.live or flow.nq:
                bsum += weight
                if flow.last is not None:
                    flow.finish = flow.last + (step if self.charge_of is None else weights.advance(step, flow.owed))
                if flow.on:
                    flow.tag = flow.finish if flow.finish > vtime else vtime
                    flow.gen += 1
                    seq = flow.head._seq if sub is None else sub._top()[1]  # type: ignore[union-attr]
                    flow.hseq = seq
                    entries.append((flow.tag, seq, flow.gen, flow))
        heapify(entries)
        self.heap = entries
        self.heap_stale = 0
        self.wsum = wsum
        self.bsum = bsum

    def _rescale(self, weights: Weights) -> None:
        """Convert every stored tag of this group and below to the units of `weights`
        (exactly, unless going to floats)."""
        old, new = self.weights.scale, weights.scale
        if old == new:
            return
        if new is None:
            factor: Tag = 1.0 / old  # type: ignore[operator]
        else:
            factor = new // old  # type: ignore[operator]
        self._scale_by(factor)

    def _scale_by(self, factor: Tag) -> None:
        self.vtime = self.vtime * factor
        for flow in self.flows.values():
            flow.tag = flow.tag * factor
            flow.finish = flow.finish * factor
            if flow.last is not None:
                flow.last = flow.last * factor
            if flow.sub is not None:
                flow.sub._scale_by(factor)


class FifoQueue(Chain):
    """The tasks of one priority class of a pool without fairness, in arrival order."""

    __slots__ = ()

    def __len__(self) -> int:
        return self.live

    def __bool__(self) -> bool:
        return self.live > 0

    def push(self, task: Task) -> None:
        """Append a queued task."""
        self.append(task)

    def pop(self) -> Task | None:
        """Remove and return the oldest queued task, or None if empty."""
        if not self.live:
            return None
        if self.stale:
            self.skip_stale()
        task = self.head
        self.head = task._next  # type: ignore[union-attr]
        task._next = None  # type: ignore[union-attr]
        if self.head is None:
            self.tail = None
        self.live -= 1
        if self.stale and self.stale > self.live:
            self.compact()
        return task

    def discard(self, task: Task) -> None:
        """Forget a task that was queued here and has just left (cancelled)."""
        self.live -= 1
        self.stale += 1
        if self.stale > self.live:
            self.compact()

    def tasks_in_order(self) -> list[Task]:
        """Every queued task here, in arrival order."""
        return list(self)

    def lag(self, tenant: str | None) -> float:
        """Always 0: without fair sharing no tenant has a share to trail."""
        return 0.0

    def own_lag(self, tenant: str | None) -> float:
        """Always 0, as `lag`."""
        return 0.0
