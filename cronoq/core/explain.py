"""Why a task has not started yet: a pure reading of the core's state, for `cronoq explain`.

`explain_waiting(pool, task, now, dispatch_rate)` looks at one queued or
delayed task and says what stands before it, in the order the rules apply
(docs/api.md, "Scheduling rules"): the queued tasks of higher classes, the
deadline tasks of its own class, then its place in the fair share (each
node of its tenant's path: weight, current share, lag, ceiling) and in its
tenant's own queue; then what holds the whole pool (paused, no worker
serving it, `max_in_flight`) and a delay or retry back-off still pending.
From the pool's recent dispatch rate, which the caller measures (the core
has no clock), it estimates when the task will start, or says it cannot.

Cost. Nothing here walks the backlog. Counts per class are kept as tasks
move (O(classes)); the path is O(depth). Two numbers need a walk: how many
deadline tasks of its class come before a deadline task (a walk of the
heaps that only visits entries earlier than the task's), and how many tasks
are ahead of it in its tenant's queue (a walk of that queue from its head).
Both stop after `scan` steps and then report a lower bound ("at least N",
`exact` False).

Nothing is changed: heaps are read in place, stale entries are skipped, not
removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cronoq.core.ceilings import EdfGroup
from cronoq.core.fairqueue import FairQueue, Flow, flow_lag, flow_share
from cronoq.core.task import DELAYED, QUEUED, Task

if TYPE_CHECKING:
    from cronoq.core.pool import ClassQueue, Pool

EXPLAIN_SCAN = 1000
"""Entries a count looks at, at most, before it settles for a lower bound."""


@dataclass(frozen=True)
class CeilingState:
    """A node's ceiling: its limit, the running tasks of its subtree, and whether (and since when) it is capped.

    `capped_since` is on the caller's clock (Unix seconds in the broker); `capped_for` is the seconds since.
    """

    limit: int
    running: int
    capped: bool
    capped_since: float | None = None
    capped_for: float | None = None


@dataclass(frozen=True)
class NodeState:
    """One node on a task's tenant path, as the fair share of the task's class sees it now.

    `own_tasks` marks the tenant's own tasks where they share with its sub-tenants (as one more child of
    weight 1). `share` is the fraction of its parent's dispatches the node gets now (0 while it has nothing
    queued in the class or is capped); `lag` the dispatches it trails (+) or leads (-) its share, in this class.
    """

    name: str
    own_tasks: bool
    weight: float
    backlogged: bool
    share: float
    lag: float
    ceiling: CeilingState | None = None


@dataclass(frozen=True)
class Waiting:
    """Why a queued or delayed task has not started (every count is of queued tasks of its pool).

    - `higher_classes_ahead`: tasks of higher priority classes, which all go first.
    - `deadline_ahead`: tasks of its own class with a deadline that go before it (all of them for a task without
      a deadline; those with an earlier deadline for one with a deadline); `deadline_ahead_exact` False means
      "at least".
    - `queue_ahead`: tasks ahead of it in its own queue (its tenant's, in a fair pool; its class's otherwise), of
      `queue_length`; None while it is delayed; `queue_ahead_exact` False means "at least".
    - `nodes`: its tenant's path from the top, `tenant_share` the product of their shares: the fraction of the
      class's fair dispatches its queue gets now.
    - `delayed_for`: seconds before it may be dispatched at all (`retry`: that is a retry back-off).
    - `estimate`: seconds from now until it starts, from `dispatch_rate` (the pool's, per second) and its
      share; None when it cannot be told, and `estimate_note` says why (or what the figure assumes).
    """

    fair: bool
    higher_classes_ahead: int
    deadline_ahead: int
    deadline_ahead_exact: bool
    queue_ahead: int | None
    queue_ahead_exact: bool
    queue_length: int
    nodes: tuple[NodeState, ...]
    tenant_share: float | None
    paused: bool
    workers: int
    ready_workers: int
    running: int
    max_in_flight: int | None
    delayed_for: float | None
    retry: bool
    dispatch_rate: float | None
    estimate: float | None
    estimate_note: str


def explain_waiting(pool: Pool, task: Task, now: float, dispatch_rate: float | None,
                    scan: int = EXPLAIN_SCAN) -> Waiting:
    """Why `task` (queued or delayed, in `pool`) has not started; see the module's docstring."""
    cls = pool.classes[task.priority]
    higher = sum(c.queued for c in pool.classes[: task.priority])
    queued = task.state is QUEUED
    if task.deadline is None:
        deadline_ahead, deadline_exact = cls.deadlined, True
    elif queued:
        deadline_ahead, deadline_exact = _earlier_deadlines(cls, task, now, scan)
    else:  # delayed: where it will stand is not known yet; those queued now with an earlier deadline, roughly
        deadline_ahead, deadline_exact = cls.deadlined, False
    fair = isinstance(cls.rest, FairQueue)
    nodes: list[NodeState] = []
    share: float | None = None
    queue_ahead: int | None = None
    queue_exact = True
    queue_length = 0
    if fair:
        leaf = _walk_path(pool, cls.rest, task, now, nodes)  # type: ignore[arg-type]
        if task.deadline is None:  # a deadline task is outside the share: it goes by its deadline alone
            share = 1.0
            for node in nodes:
                share *= node.share
        if leaf is not None:
            queue_length = leaf.live
            if queued and task.deadline is None:
                queue_ahead, queue_exact = _ahead_in_chain(leaf.head, task, scan)
    else:
        queue_length = cls.rest.live  # type: ignore[union-attr]
        if queued and task.deadline is None:
            queue_ahead, queue_exact = _ahead_in_chain(cls.rest.head, task, scan)  # type: ignore[union-attr]
    if task.deadline is not None:
        queue_length = cls.deadlined
    delayed_for = None
    if task.state is DELAYED and task.not_before is not None:
        delayed_for = max(0.0, task.not_before - now)
    estimate, note = _estimate(pool, task, nodes, higher, deadline_ahead, queue_ahead, share, delayed_for,
                               dispatch_rate, exact=deadline_exact and queue_exact)
    return Waiting(
        fair=fair, higher_classes_ahead=higher, deadline_ahead=deadline_ahead, deadline_ahead_exact=deadline_exact,
        queue_ahead=queue_ahead, queue_ahead_exact=queue_exact, queue_length=queue_length, nodes=tuple(nodes),
        tenant_share=share, paused=pool.paused, workers=len(pool.workers), ready_workers=pool.ready_workers,
        running=pool.running, max_in_flight=pool.max_in_flight, delayed_for=delayed_for,
        retry=task.state is DELAYED and task.attempts > 0, dispatch_rate=dispatch_rate, estimate=estimate,
        estimate_note=note,
    )


def _walk_path(pool: Pool, root: FairQueue, task: Task, now: float, nodes: list[NodeState]) -> Flow | None:
    """Fill `nodes` with the task's tenant path in its class's fair tree; return the flow holding its own queue
    (None if its tenant has none in this class yet: it is delayed, or it has a deadline)."""
    path = task._ts.path  # type: ignore[union-attr]
    group: FairQueue | None = root
    flow: Flow | None = None
    for name in path:
        flow = group.flows.get(name) if group is not None else None
        nodes.append(_node(pool, name, flow, now, own=False))
        group = flow.sub if flow is not None else None
    if flow is not None and flow.sub is not None:
        # The tenant has sub-tenants: its own tasks are one more child of its node, named after it.
        flow = flow.sub.flows.get(path[-1])
        nodes.append(_node(pool, path[-1], flow, now, own=True))
    return flow


def _node(pool: Pool, name: str | None, flow: Flow | None, now: float, *, own: bool) -> NodeState:
    if flow is None:
        weight = 1.0 if own else pool.weight(name)
        return NodeState("" if name is None else name, own, weight, False, 0.0, 0.0,
                         None if own else _ceiling(pool, name, now))
    return NodeState("" if name is None else name, own, flow.weight, bool(flow.live or flow.nq), flow_share(flow),
                     flow_lag(flow), None if own else _ceiling(pool, name, now))


def _ceiling(pool: Pool, name: str | None, now: float) -> CeilingState | None:
    ceiling = pool.ceilings.get(name)
    if ceiling is None:
        limit = pool.settings.limit(name) if pool.settings.has_ceilings else None
        return None if limit is None else CeilingState(limit, 0, False)
    since = ceiling.since if ceiling.capped else None
    return CeilingState(ceiling.limit, ceiling.running, ceiling.capped, since,
                        None if since is None else max(0.0, now - since))


def _earlier_deadlines(cls: ClassQueue, task: Task, now: float, scan: int) -> tuple[int, bool]:
    """Queued tasks of the class that the EDF order puts before `task` (it has a deadline), and whether that
    is exact. A heap's entries earlier than the task's form a subtree at its top: only those are visited, so
    the walk costs O(the answer), and stops after `scan` entries. Capped nodes' tasks are not counted: they
    are passed over."""
    key = (task.deadline, task._seq)
    count = visits = 0
    work: list[tuple[list, int]] = [(cls.edf, 0)]
    while work:
        heap, at = work.pop()
        if at >= len(heap):
            continue
        entry = heap[at]
        if (entry[0], entry[1]) >= key:
            continue  # nothing below it in this heap is earlier either
        visits += 1
        if visits > scan:
            return count, False
        work.append((heap, 2 * at + 1))
        work.append((heap, 2 * at + 2))
        x = entry[2]
        if x.__class__ is EdfGroup:
            # A bundle's key is never later than the earliest task inside it; a stale one stands for nothing.
            if x.entry is entry:
                work.append((x.heap, 0))
        elif entry[1] == x._seq and x.state is QUEUED and entry[0] > now:
            count += 1
    return count, True


def _ahead_in_chain(head: Task | None, task: Task, scan: int) -> tuple[int, bool]:
    """Queued tasks linked before `task` in a chain, and whether that is exact (at most `scan` steps)."""
    ahead = 0
    current = head
    for _ in range(scan):
        if current is None or current is task:
            return ahead, current is task
        if current.state is QUEUED:
            ahead += 1
        current = current._next
    return ahead, current is task


def _estimate(pool: Pool, task: Task, nodes: list[NodeState], higher: int, deadline_ahead: int,
              queue_ahead: int | None, share: float | None, delayed_for: float | None,
              rate: float | None, *, exact: bool) -> tuple[float | None, str]:
    """Seconds until the task starts, from the pool's dispatch rate, or None; and a sentence saying why or how."""
    if pool.paused:
        return None, f"pool {pool.name!r} is paused: nothing starts until it is resumed"
    if not pool.workers:
        return None, f"no worker serves pool {pool.name!r}"
    if delayed_for is not None:
        why = "its retry back-off" if task.attempts else "its delay"
        return None, f"it may not start for another {delayed_for:.1f} s ({why}); then it queues"
    capped = [node.name or "(no tenant)" for node in nodes if node.ceiling is not None and node.ceiling.capped]
    if capped:
        return None, (f"{', '.join(capped)} at its ceiling: none of its tasks starts until one of its running "
                      "tasks ends")
    if not rate or rate <= 0:
        return None, "unknown: the pool dispatched nothing recently, so there is no rate to go by"
    ahead = higher + deadline_ahead
    if task.deadline is not None or not isinstance(pool.classes[task.priority].rest, FairQueue):
        # By deadline, or first come first served: every task ahead takes one of the pool's dispatches.
        total = ahead + (queue_ahead or 0) + 1
        seconds = total / rate
        how = f"{_dispatches(total)} at the pool's {rate:.3g}/s"
    elif not share or share <= 0:
        return None, "unknown: its tenant has no share of the pool right now"
    else:
        mine = (queue_ahead or 0) + 1
        seconds = ahead / rate + mine / (rate * share)
        how = (f"{_dispatches(ahead)} ahead at the pool's {rate:.3g}/s, then {_dispatches(mine)} of its "
               f"tenant's at its {share:.0%} share of them")
    bound = "at least " if not exact else ""
    return seconds, f"{bound}{how}, if the rate and the shares hold"


def _dispatches(n: int) -> str:
    return f"{n} dispatch{'' if n == 1 else 'es'}"
