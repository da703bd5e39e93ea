"""The part of a priority class that is not ordered by deadline.

Two interchangeable queues hold a class's tasks without a deadline:

- `FairQueue` (pools with `tenant_weights` or `fair_share`): weighted
  start-time fair queuing (SFQ) between tenants, as docs/api.md
  ("Scheduling rules") defines it. Each tenant is a *flow*: a FIFO of its tasks. Only the head of
  each backlogged flow carries a start tag, given when that task becomes the
  head: `S = max(V, F[t])`, where `F[t] = S_prev + 1/w` is kept per flow (0
  before its first dispatch). A heap of heads keyed by `(S, arrival seq)`
  yields the next task in O(log tenants); `V` becomes the `S` dispatched.

  With fixed weights this is the rules' order: a flow that stays
  backlogged gets successive tags `S, S + 1/w, ...` either way, and a flow
  that (re)starts gets `max(V, F[t])` either way. Tagging heads late is what
  lets a reload re-weight the queued backlog at once: only heads hold tags,
  so re-tagging them is O(tenants). A cancelled task is never charged: when
  a head is cancelled its successor inherits the head's tag.

- `FifoQueue` (pools without fairness): one FIFO, submission order.

Tags are exact integers (see weights.py), so a tie between tags is a true
tie, broken by arrival as the rules say.

Both queues keep their tasks in a `Chain` (chain.py), a FIFO threaded through
the tasks themselves, and delete lazily: a cancelled task stays linked until
it reaches the front or the chain is compacted, before its stale tasks
outnumber its live ones.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from typing import Iterator

from cronoq.core.chain import Chain
from cronoq.core.task import Task
from cronoq.core.weights import Tag, Weights

# Idle flows whose F[t] is not ahead of V carry no state worth keeping (V never
# decreases, so a fresh flow would get the same tags); they are swept once the
# flow table has doubled since the last sweep, so churning tenants cost O(1) each.
_MIN_SWEEP = 64


class Flow(Chain):
    """One tenant inside one fair class: its FIFO of tasks, its tags and its share accounting.

    While the flow is backlogged its `head` is always a live task (the one
    that holds the start tag).
    """

    __slots__ = (
        "tenant",
        "weight",
        "step",  # 1/weight in tag units
        "tag",  # start tag S of the head task (meaningful while live > 0)
        "last",  # start tag of its last dispatched task, None before the first
        "finish",  # F[t]: S of its last dispatch + 1/w (0 before the first); kept while idle
        "gen",  # bumped whenever the flow's heap entry is replaced; older entries are stale
        # Lag over the current backlogged period, in dispatches (see docs/scheduling.md):
        "rmark",  # FairQueue.rsum when the period (or the current weight) started
        "share",  # weighted share earned in the period before `rmark`
        "got",  # dispatches in the period
    )

    def __init__(self, tenant: str | None, weight: float, step: Tag) -> None:
        super().__init__()
        self.tenant = tenant
        self.weight = weight
        self.step = step
        self.tag: Tag = 0
        self.last: Tag | None = None
        self.finish: Tag = 0
        self.gen = 0
        self.rmark = 0.0
        self.share = 0.0
        self.got = 0


HeapEntry = tuple[Tag, int, int, Flow]  # (start tag, arrival seq of the head, flow gen, flow)


class FairQueue:
    """Weighted SFQ between the tenants of one priority class of one pool."""

    __slots__ = (
        "weights",
        "flows",
        "heap",
        "heap_stale",
        "vtime",
        "nback",
        "wsum",
        "rsum",
        "sweep_at",
    )

    def __init__(self, weights: Weights) -> None:
        self.weights = weights
        self.flows: dict[str | None, Flow] = {}
        self.heap: list[HeapEntry] = []
        self.heap_stale = 0
        self.vtime: Tag = 0 if weights.scale is not None else 0.0  # V: start tag of the last dispatch
        self.nback = 0  # backlogged flows
        self.wsum = 0.0  # sum of the weights of backlogged flows
        # Sum over dispatches of 1/wsum: a backlogged flow of weight w earns a
        # share of w * (increase of rsum) dispatches; this makes lag O(1).
        self.rsum = 0.0
        self.sweep_at = _MIN_SWEEP

    def __len__(self) -> int:
        """Queued tasks (O(tenants): for inspection, not for the dispatch path)."""
        return sum(flow.live for flow in self.flows.values())

    def __bool__(self) -> bool:
        return self.nback > 0

    def push(self, task: Task) -> None:
        """Append a queued task (its `_seq` already set) to its tenant's flow."""
        task._next = None
        flow = self.flows.get(task.tenant)
        if flow is not None and flow.live:
            flow.tail._next = task  # type: ignore[union-attr]
            flow.tail = task
            flow.live += 1
            return
        if flow is None:
            flow = self._new_flow(task.tenant)
        flow.head = flow.tail = task
        flow.live = 1
        self._activate(flow)

    def pop(self) -> Task | None:
        """Remove and return the task with the smallest (S, arrival), or None if empty."""
        heap = self.heap
        while heap:
            tag, _seq, gen, flow = heap[0]
            if gen != flow.gen:
                heappop(heap)
                self.heap_stale -= 1
                continue
            task = flow.head
            head = task._next  # type: ignore[union-attr]
            task._next = None  # type: ignore[union-attr]
            self.vtime = tag
            flow.last = tag
            self.rsum += 1.0 / self.wsum
            flow.got += 1
            flow.live -= 1
            # F[t] = S + 1/w; while the flow stays backlogged V is now S, so
            # max(V, F) is simply F and the next head's tag is F.
            flow.finish = tag = tag + flow.step
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

    def discard(self, task: Task) -> None:
        """Forget a task that was queued here and has just left (cancelled); O(1) amortised."""
        flow = self.flows[task.tenant]
        flow.live -= 1
        flow.stale += 1
        if not flow.live:
            self._drop_entry(flow)
            self._deactivate(flow)
        elif flow.head is task:
            # The successor inherits the head's tag (the cancelled task is not
            # charged); only the tie-break seq changes, so the entry is replaced.
            flow.skip_stale()
            self._drop_entry(flow)
            heappush(self.heap, (flow.tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
        elif flow.stale > flow.live:
            flow.compact()

    def reweight(self, weights: Weights) -> None:
        """Take new weights and re-tag the backlog at once.

        Each backlogged head gets the tag it would have had under its new
        weight, `max(V, S_prev + 1/w)`; the heap is rebuilt, O(tenants). An
        idle tenant keeps the F[t] it left with: it has no backlog to re-weight.
        """
        self._rescale(weights)
        self.weights = weights
        rsum = self.rsum
        vtime = self.vtime
        wsum = 0.0
        entries: list[HeapEntry] = []
        for flow in self.flows.values():
            weight = weights.weight(flow.tenant)
            if flow.live:
                # Close the lag sub-period at the old weight.
                flow.share += flow.weight * (rsum - flow.rmark)
                flow.rmark = rsum
                wsum += weight
            flow.weight = weight
            flow.step = weights.step(flow.tenant)
            if flow.live:
                if flow.last is not None:
                    flow.finish = flow.last + flow.step
                flow.tag = flow.finish if flow.finish > vtime else vtime
                flow.gen += 1
                entries.append((flow.tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
        heapify(entries)
        self.heap = entries
        self.heap_stale = 0
        self.wsum = wsum

    def tasks_in_order(self) -> list[Task]:
        """Every queued task here, in arrival order (used when a pool changes its kind of queue)."""
        out = [t for flow in self.flows.values() for t in flow]
        out.sort(key=lambda t: t._seq)
        return out

    def lag(self, tenant: str | None) -> float:
        """Dispatches `tenant` trails (+) or leads (-) its weighted share in its current backlogged period."""
        flow = self.flows.get(tenant)
        if flow is None or not flow.live:
            return 0.0
        return flow.share + flow.weight * (self.rsum - flow.rmark) - flow.got

    def virtual_time(self) -> float:
        """V in dispatches of a weight-1 tenant."""
        return self.weights.to_dispatches(self.vtime)

    def iter_flows(self) -> Iterator[Flow]:
        """The flows currently held (backlogged ones and recently idle ones)."""
        return iter(self.flows.values())

    # -- internals ---------------------------------------------------------

    def _new_flow(self, tenant: str | None) -> Flow:
        if len(self.flows) >= self.sweep_at:
            self._sweep()
        flow = Flow(tenant, self.weights.weight(tenant), self.weights.step(tenant))
        self.flows[tenant] = flow
        return flow

    def _activate(self, flow: Flow) -> None:
        """The flow became backlogged: tag its head and start a lag period."""
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
        flow.gen += 1
        heappush(self.heap, (flow.tag, flow.head._seq, flow.gen, flow))  # type: ignore[union-attr]
        flow.rmark = self.rsum
        flow.share = 0.0
        flow.got = 0
        self.nback += 1
        self.wsum += flow.weight

    def _deactivate(self, flow: Flow) -> None:
        """The flow has nothing queued any more: unlink what is left, end its lag period."""
        if flow.stale:
            flow.compact()  # only cancelled tasks are left
        flow.head = flow.tail = None
        self.nback -= 1
        # Reset exactly at zero so float drift in the running sum cannot build up.
        self.wsum = self.wsum - flow.weight if self.nback else 0.0

    def _drop_entry(self, flow: Flow) -> None:
        """The flow's live heap entry becomes stale (it stays in the heap until popped or compacted)."""
        flow.gen += 1
        self.heap_stale += 1
        if self.heap_stale * 2 > len(self.heap):
            heap = [e for e in self.heap if e[2] == e[3].gen]
            heapify(heap)
            self.heap = heap
            self.heap_stale = 0

    def _sweep(self) -> None:
        vtime = self.vtime
        self.flows = {tenant: flow for tenant, flow in self.flows.items() if flow.live or flow.finish > vtime}
        self.sweep_at = max(_MIN_SWEEP, 2 * len(self.flows))

    def _rescale(self, weights: Weights) -> None:
        """Convert every stored tag to the units of `weights` (exactly, unless going to floats)."""
        old, new = self.weights.scale, weights.scale
        if old == new:
            return
        if new is None:
            factor: Tag = 1.0 / old  # type: ignore[operator]
        else:
            factor = new // old  # type: ignore[operator]
        self.vtime = self.vtime * factor
        for flow in self.flows.values():
            flow.tag = flow.tag * factor
            flow.finish = flow.finish * factor
            if flow.last is not None:
                flow.last = flow.last * factor


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
