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

The estimate counts the work that keeps arriving ahead of the task, not
only what is queued now: tasks of higher classes and (for a task without a
deadline) its class's deadline tasks take the pool's dispatches first as
they come, so the task's side of the pool is what is left over, R - A (R
the pool's dispatch rate, A the arrival rate of that work, both measured by
the caller from the core's counters: `SchedulerCore.arrivals`). The work
queued ahead of it drains at R - A, and its tenant's queue then gets its
fair share of that. When A reaches OUTRUN of R, the work ahead arrives as
fast as the pool serves it: the task may never start, and the estimate says
it cannot be told, naming both rates. Other tenants' new work of its own
class is in the fair share: a tenant that stays backlogged gets its share
whatever the others send.

A pinned caller (`scope`: a token pinned to a tenant) learns nothing of
other tenants' tasks: every count covers only the tasks of its subtree; the
shares and lags of the nodes that compete with other tenants (its pinned
node and those above it) are hidden; no rates are shown; and the estimate,
computed from everything, is rounded up to a coarse step, and for a deadline
task counts every deadline task of its class, so that it does not move with
where its deadline falls among other tenants' deadlines.

Cost. Nothing here walks the backlog. Counts per class are kept as tasks
move (O(classes)); the path is O(depth). Two numbers need a walk: how many
deadline tasks of its class come before a deadline task (a walk of the
heaps that only visits entries earlier than the task's), and how many tasks
are ahead of it in its tenant's queue (a walk of that queue from its head).
Both stop after `scan` steps and then report a lower bound ("at least N",
`exact` False). For a pinned caller, the counts of its subtree's tasks in
other classes and queues are walks of the same kind, and its running tasks a
walk of the pool's tenant table.

Nothing is changed: heaps are read in place, stale entries are skipped, not
removed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

from cronoq.answers import CeilingState, NodeState, Waiting
from cronoq.core.ceilings import EdfGroup
from cronoq.core.fairqueue import FairQueue, Flow, flow_lag, flow_share
from cronoq.core.settings import tenant_path
from cronoq.core.task import DELAYED, QUEUED, Task

if TYPE_CHECKING:
    from cronoq.core.pool import ClassQueue, PoolState

EXPLAIN_SCAN = 1000
"""Entries a count looks at, at most, before it settles for a lower bound."""

INF = float("inf")

OUTRUN = 0.95
"""Work ahead of a task arriving at this fraction of the pool's dispatch rate or more outruns the pool: no estimate.
Not 1.0: both rates are counts over the same few seconds, and when the work ahead takes every dispatch they differ
only by how much its backlog grew or shrank meanwhile, a few percent either way."""

COARSE_STEPS = (1.0, 2.0, 5.0)
"""A pinned caller's estimate is rounded up to the next of 1, 2, 5, 10, 20, 50 ... seconds."""


@dataclass(frozen=True)
class ClassRates:
    """How fast tasks have lately become queued in one priority class of a pool, per second, as the caller measured
    it from `SchedulerCore.arrivals`: all of them (submitted, ready after a delay, requeued) and those with a
    deadline."""

    arrivals: float
    deadline_arrivals: float = 0.0


def explain_waiting(pool: PoolState, task: Task, now: float, dispatch_rate: float | None,
                    scan: int = EXPLAIN_SCAN, *, arrival_rates: Sequence[ClassRates] | None = None,
                    scope: str | None = None) -> Waiting:
    """Why `task` (queued or delayed, in `pool`) has not started; see the module's docstring. `arrival_rates`:
    the pool's classes, highest first (None: not measured, taken as no new work); `scope`: the tenant a pinned
    caller may see."""
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
    at_max_in_flight = pool.max_in_flight is not None and pool.running >= pool.max_in_flight
    arriving = _arriving_ahead(task, arrival_rates)
    ahead = higher + deadline_ahead
    if scope is not None and task.deadline is not None:
        # Every deadline task of its class but itself, wherever its deadline falls: otherwise a pinned caller
        # could move its own deadline until the estimate steps, and so find another tenant's deadline.
        ahead = higher + max(0, cls.deadlined - (1 if queued else 0))
        deadline_exact = True
    estimate, note = _estimate(pool, task, nodes, ahead, queue_ahead, share, delayed_for, dispatch_rate, arriving,
                               exact=deadline_exact and queue_exact, coarse=scope is not None, now=now)
    waiting = Waiting(
        fair=fair, higher_classes_ahead=higher, deadline_ahead=deadline_ahead, deadline_ahead_exact=deadline_exact,
        queue_ahead=queue_ahead, queue_ahead_exact=queue_exact, queue_length=queue_length, nodes=tuple(nodes),
        tenant_share=share, paused=pool.paused, workers=len(pool.workers), ready_workers=pool.ready_workers,
        running=pool.running, max_in_flight=pool.max_in_flight, delayed_for=delayed_for,
        retry=task.state is DELAYED and task.attempts > 0, dispatch_rate=dispatch_rate, estimate=estimate,
        estimate_note=note, arrival_rate_ahead=None if arriving is None else arriving.total,
        at_max_in_flight=at_max_in_flight, share_unit=pool.settings.share_unit,
    )
    return waiting if scope is None else _scoped(waiting, pool, task, scope, now, scan)


def _scoped(waiting: Waiting, pool: PoolState, task: Task, scope: str, now: float, scan: int) -> Waiting:
    """`waiting` as a caller pinned to `scope` may read it: the counts of its subtree's tasks only, no rates, no
    share that depends on other tenants (the estimate and its note were made coarse already)."""
    cls = pool.classes[task.priority]
    visible = _in_scope(scope)
    queued = task.state is QUEUED
    higher, higher_exact = _scoped_higher(pool, task, visible, scope, now, scan)
    if task.deadline is not None and queued:
        deadline_ahead, deadline_exact = _earlier_deadlines(cls, task, now, scan, visible)
    else:
        deadline_ahead, deadline_exact = _earlier_deadlines(cls, None, now, scan, visible)
        deadline_exact = deadline_exact and task.deadline is None  # a delayed one's place is not known yet
    queue_ahead, queue_exact, queue_length = waiting.queue_ahead, waiting.queue_ahead_exact, waiting.queue_length
    if task.deadline is not None:
        queue_length = _earlier_deadlines(cls, None, now, scan, visible)[0]
    elif not waiting.fair:  # its class's one queue holds every tenant's tasks: count only the visible ones
        queue_length = _count_in_chain(cls.rest.head, None, scan, visible)[0]  # type: ignore[union-attr]
        if queued:
            queue_ahead, queue_exact = _count_in_chain(cls.rest.head, task, scan, visible)  # type: ignore
    # A walk of the tenant table: a pinned caller's running tasks are not counted anywhere else.
    running = sum(ts.running for ts in pool.tenants.values() if scope in ts.path)
    return replace(
        waiting, higher_classes_ahead=higher, higher_classes_ahead_exact=higher_exact,
        deadline_ahead=deadline_ahead, deadline_ahead_exact=deadline_exact, queue_ahead=queue_ahead,
        queue_ahead_exact=queue_exact, queue_length=queue_length, nodes=tuple(_hide_above(list(waiting.nodes), scope)),
        tenant_share=None, running=running, dispatch_rate=None, arrival_rate_ahead=None, scope=scope,
    )


@dataclass(frozen=True)
class _Arriving:
    """Work that goes before a task, arriving per second: of higher classes, and deadline tasks of its class."""

    higher: float
    deadlines: float

    @property
    def total(self) -> float:
        return self.higher + self.deadlines


def _arriving_ahead(task: Task, rates: Sequence[ClassRates] | None) -> _Arriving | None:
    if not rates:
        return None
    higher = sum(r.arrivals for r in rates[: task.priority])
    # A new deadline task goes before every task of its class without one. Before one with a deadline only if
    # its deadline is earlier, which a rate cannot say: those are left out, and the note says so.
    mine = rates[task.priority] if task.priority < len(rates) else None
    deadlines = mine.deadline_arrivals if mine is not None and task.deadline is None else 0.0
    return _Arriving(max(0.0, higher), max(0.0, deadlines))


def _in_scope(scope: str) -> Callable[[Task], bool]:
    """Whether a task is of `scope`'s subtree (its path from the top passes through `scope`)."""
    return lambda t: scope in t._ts.path  # type: ignore[union-attr]


def _scoped_higher(pool: PoolState, task: Task, visible: Callable[[Task], bool], scope: str, now: float,
                   scan: int) -> tuple[int, bool]:
    """Queued tasks of `scope`'s subtree in classes above the task's, and whether that is exact."""
    total, exact = 0, True
    for cls in pool.classes[: task.priority]:
        if not cls.queued:
            continue
        count, whole = _earlier_deadlines(cls, None, now, scan, visible)
        total += count
        exact = exact and whole
        if isinstance(cls.rest, FairQueue):
            total += _subtree_queued(cls.rest, scope)
        else:
            count, whole = _count_in_chain(cls.rest.head, None, scan, visible)
            total += count
            exact = exact and whole
    return total, exact


def _subtree_queued(root: FairQueue, scope: str) -> int:
    """Queued tasks (without a deadline) of `scope`'s subtree in a class's fair tree, from its node's counts."""
    group: FairQueue | None = root
    flow: Flow | None = None
    for name in tenant_path(scope):
        flow = group.flows.get(name) if group is not None else None
        if flow is None:
            return 0
        group = flow.sub
    assert flow is not None
    return flow.nq if flow.sub is not None else flow.live


def _hide_above(nodes: list[NodeState], scope: str) -> list[NodeState]:
    """The nodes as a caller pinned to `scope` may see them: those above its pin and the pin itself compete with
    other tenants, so their share and lag are hidden, and so are the ceilings of those above (their running
    tasks include tenants outside the scope)."""
    path = tenant_path(scope)
    out = []
    for index, node in enumerate(nodes):
        if index < len(path) and not node.own_tasks:
            above = index < len(path) - 1
            node = replace(node, share=0.0, lag=0.0, hidden=True, ceiling=None if above else node.ceiling)
            if above:  # its bucket and its running count follow other tenants' work too
                node = replace(node, rate_limited_for=None, under_minimum=False)
        out.append(node)
    return out


def _walk_path(pool: PoolState, root: FairQueue, task: Task, now: float, nodes: list[NodeState]) -> Flow | None:
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


def _node(pool: PoolState, name: str | None, flow: Flow | None, now: float, *, own: bool) -> NodeState:
    if flow is None:
        weight = 1.0 if own else pool.weight(name)
        node = NodeState("" if name is None else name, own, weight, False, 0.0, 0.0,
                         None if own else _ceiling(pool, name, now))
    else:
        node = NodeState("" if name is None else name, own, flow.weight, bool(flow.live or flow.nq),
                         flow_share(flow), flow_lag(flow), None if own else _ceiling(pool, name, now))
    limits = None if own else pool.ceilings.get(name)
    if limits is None or (limits.rate is None and limits.minimum is None):
        return node
    limited = limits.limited_until
    return replace(node, rate=limits.rate, rate_limited_for=None if limited is None else max(0.0, limited - now),
                   minimum=limits.minimum, under_minimum=limits.under_minimum())


def _ceiling(pool: PoolState, name: str | None, now: float) -> CeilingState | None:
    ceiling = pool.ceilings.get(name)
    if ceiling is not None and ceiling.limit is None:
        return None  # a rate or a minimum, no ceiling
    if ceiling is None:
        limit = pool.settings.limit(name) if pool.settings.has_ceilings else None
        return None if limit is None else CeilingState(limit, 0, False)
    since = ceiling.since if ceiling.capped else None
    return CeilingState(ceiling.limit, ceiling.running, ceiling.capped, since,
                        None if since is None else max(0.0, now - since))


def _earlier_deadlines(cls: ClassQueue, task: Task | None, now: float, scan: int,
                       visible: Callable[[Task], bool] | None = None) -> tuple[int, bool]:
    """Queued tasks of the class that the EDF order puts before `task` (it has a deadline; None: every deadline
    task of the class), only those `visible` approves when given, and whether that is exact. A heap's entries
    earlier than the task's form a subtree at its top: only those are visited, so the walk costs O(the answer),
    and stops after `scan` entries. Capped nodes' tasks are not counted: they are passed over."""
    key = (INF, INF) if task is None else (task.deadline, task._seq)
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
        elif entry[1] == x._seq and x.state is QUEUED and entry[0] > now and (visible is None or visible(x)):
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


def _count_in_chain(head: Task | None, task: Task | None, scan: int,
                    visible: Callable[[Task], bool]) -> tuple[int, bool]:
    """Queued tasks `visible` approves linked before `task` in a chain (None: in the whole chain), and whether
    that is exact (at most `scan` steps)."""
    count = 0
    current = head
    for _ in range(scan):
        if current is None or current is task:
            return count, True
        if current.state is QUEUED and visible(current):
            count += 1
        current = current._next
    return count, current is None or current is task


def _estimate(pool: PoolState, task: Task, nodes: list[NodeState], ahead: int, queue_ahead: int | None,
              share: float | None, delayed_for: float | None, rate: float | None, arriving: _Arriving | None,
              *, exact: bool, coarse: bool, now: float) -> tuple[float | None, str]:
    """Seconds until the task starts, or None; and a sentence saying why or how. `ahead`: queued tasks of higher
    classes and deadline tasks that go before it; `arriving`: how fast more of those come. With `coarse` (a
    pinned caller) the figure is rounded up and the sentence names no count or rate of other tenants' work."""
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
    limited = [node for node in nodes if node.rate_limited_for is not None]
    if limited:
        # The slowest bucket on its path decides; the tasks ahead of it in its queue each take a token.
        wait = max(node.rate_limited_for for node in limited)  # type: ignore[type-var]
        slowest = min(node.rate for node in limited)  # type: ignore[type-var]
        names = ", ".join(node.name or "(no tenant)" for node in limited)
        seconds = wait + (queue_ahead or 0) / slowest
        return seconds, (f"{names} rate-limited: next start in {wait:.1f} s"
                         + (f", then {queue_ahead} ahead of it at {slowest:g}/s" if queue_ahead else ""))
    if not rate or rate <= 0:
        return None, "unknown: the pool dispatched nothing recently, so there is no rate to go by"
    incoming = arriving.total if arriving is not None else 0.0
    if incoming >= OUTRUN * rate:
        return None, _outrun(arriving, rate, coarse)  # type: ignore[arg-type]
    spare = rate - incoming  # what the pool serves beyond the work that keeps arriving ahead of the task
    fair = task.deadline is None and isinstance(pool.classes[task.priority].rest, FairQueue)
    if fair and (not share or share <= 0):
        return None, "unknown: its tenant has no share of the pool right now"
    pace = (f"the pool's {rate:.3g}/s" if not incoming else
            f"{spare:.3g}/s (the pool's {rate:.3g}/s less the {incoming:.3g}/s of new work that goes before it)")
    if not fair:
        # By deadline, or first come first served: every task ahead takes one of those dispatches.
        total = ahead + (queue_ahead or 0) + 1
        seconds = total / spare
        how = f"{_dispatches(total)} at {pace}"
    else:
        mine = (queue_ahead or 0) + 1
        seconds = ahead / spare + mine / (spare * share)  # type: ignore[operator]
        how = (f"{_dispatches(ahead)} ahead at {pace}, then {_dispatches(mine)} of its tenant's at its "
               f"{share:.0%} share of them")
    if task.deadline is not None and arriving is not None:
        how += " (deadline tasks still to come with an earlier deadline would go first too: not counted)"
    if coarse:
        seconds = _coarsen(seconds)
        note = ("rounded up to a coarse step, if the rates and the shares hold: it counts the pool's whole load, "
                "other tenants' work included, whose counts and rates a token pinned to a tenant is not told")
    else:
        note = f"{'' if exact else 'at least '}{how}, if the rate and the shares hold"
    if task.deadline is not None and now + seconds > task.deadline:
        note += "; that is after its deadline: unless the pool speeds up, it expires first"
    return seconds, note


def _outrun(arriving: _Arriving, rate: float, coarse: bool) -> str:
    """The sentence for work ahead that arrives as fast as the pool serves it, naming what and how fast."""
    parts = [(what, per_second) for what, per_second in (("higher-class work", arriving.higher),
                                                         ("deadline tasks of its class", arriving.deadlines))
             if per_second > 0]
    if coarse:  # a pinned caller: what outruns the pool, but no rate (other tenants' work is in it)
        what = " and ".join(what for what, _ in parts)
        verb = "arrive" if len(parts) > 1 else "arrives"
        return f"cannot tell: {what} {verb} about as fast as the pool serves it, so it may not start at all"
    if len(parts) == 1:
        what, per_second = parts[0]
        return (f"cannot tell: {what} arrives at {per_second:.3g}/s, as fast as the pool serves {rate:.3g}/s, "
                "so it may not start at all")
    what = " and ".join(f"{what} ({per_second:.3g}/s)" for what, per_second in parts)
    return (f"cannot tell: {what} arrive at {arriving.total:.3g}/s together, as fast as the pool serves "
            f"{rate:.3g}/s, so it may not start at all")


def _coarsen(seconds: float) -> float:
    """`seconds` rounded up to the next of 1, 2, 5, 10, 20, 50 ... (at least 1)."""
    scale = 1.0
    while True:
        for step in COARSE_STEPS:
            if seconds <= step * scale:
                return step * scale
        scale *= 10.0


def _dispatches(n: int) -> str:
    return f"{n} dispatch{'' if n == 1 else 'es'}"
