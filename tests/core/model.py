"""A naive reference scheduler: the scheduling rules of docs/api.md, written the slow, obvious way.

No heaps, no lazy deletion, no counters: every decision scans the live tasks.
It keeps only what the rules themselves define as state: in each class, the
virtual time V of the root and of every tenant node, F and the start tag of
the last dispatch of every node (and of every node's own tasks, one more
child of weight 1), and the arrival number each task got when it entered its
class. Ceilings are not state at all: a node is capped exactly while its
subtree has `limit` tasks running.

Tags are exact Fractions here, as the rules' arithmetic is. It relies
on one fact shown in docs/scheduling.md: the start tag of a child that can
be dispatched from equals max(V, F) evaluated at any moment while it can,
so no tag is stored at all. What a dispatch adds to F is 1/w, or in a pool
that shares by cost, 1/w times the task's cost in whole thousandths (at
least one). A node is held back while at its ceiling or while its rate
bucket is empty: its theoretical arrival time `tat` (one float per rated
node) says when it may start again, against the `now` of the last expire or
dispatch. A node with a minimum that runs fewer tasks than that goes ahead
of its class's fair order, the needy ones among themselves by their
(tag, arrival) compared level by level down their paths; such a dispatch
moves each group's V on its path to no more than the smallest tag there.
When a node gets work after having none (or
can be dispatched from again after being capped) the rules of
docs/scheduling.md decide which of its past it forgets; this model applies
them after every operation by comparing which nodes were backlogged and
which could be dispatched from before and after. The property tests run
this model and SchedulerCore side by side and demand identical decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Hashable

from cronoq.core import (
    CANCELLED,
    DELAYED,
    EXPIRED,
    QUEUED,
    RUNNING,
    PoolSettings,
)

INF = float("inf")


@dataclass
class MTask:
    id: str
    pool: str
    tenant: str | None
    priority: int
    deadline: float | None
    not_before: float | None
    state: str = ""  # set by the model on submit
    attempts: int = 0
    worker: Hashable | None = None
    seq: int = 0
    cost: float | None = None


@dataclass
class MWorker:
    id: Hashable
    pools: list[str]
    free: int
    running: list[str] = field(default_factory=list)
    rr: int = 0


ROOT = ""  # the key of the tree's root in `vtime` (no tenant is named "")


def own(node: str | None) -> tuple[str, str | None]:
    """The key of a node's own tasks, a child of the node."""
    return ("own", node)


def prefixes(tenant: str | None) -> list[str | None]:
    """The nodes from the top down to `tenant`."""
    if tenant is None:
        return [None]
    parts = tenant.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def parent_of(key) -> str | None:
    if isinstance(key, tuple):
        return key[1]
    if key is None or "/" not in key:
        return ROOT
    return key.rsplit("/", 1)[0]


def depth_of(key) -> int:
    if isinstance(key, tuple):
        return depth_of(key[1]) + 1
    return 1 if key is None else key.count("/") + 1


def below(key, node) -> bool:
    """Whether `key` (a node or an own key) is in the subtree of `node`, `node` itself excluded."""
    if isinstance(node, tuple):
        return False
    if isinstance(key, tuple):
        return key[1] == node or below(key[1], node)
    return node is not None and key is not None and key.startswith(node + "/")


@dataclass
class MPool:
    settings: PoolSettings
    paused: bool = False
    draining: bool = False
    vtime: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # node or ROOT -> V
    last: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # key -> S of its last dispatch
    finish: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # key -> F
    backlogged: list[set] = field(default_factory=lambda: [set() for _ in range(4)])  # as of the last settle
    eligible: list[set] = field(default_factory=lambda: [set() for _ in range(4)])
    charge: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # key -> quanta of its last dispatch
    tat: dict = field(default_factory=dict)  # rated node -> theoretical arrival time of its bucket

    def reset(self) -> None:
        """Start the fair state afresh (the pool changed its kind of queue, or the unit of its tags)."""
        fresh = MPool(self.settings)
        self.vtime, self.last, self.finish = fresh.vtime, fresh.last, fresh.finish
        self.backlogged, self.eligible, self.charge = fresh.backlogged, fresh.eligible, fresh.charge


class Model:
    def __init__(self, pools: list[PoolSettings]) -> None:
        self.pools: dict[str, MPool] = {}
        self.tasks: dict[str, MTask] = {}
        self.workers: dict[Hashable, MWorker] = {}
        self.ready: list[Hashable] = []  # LRU order, least recently ready first
        self.seq = 0
        self.clock = -INF  # the `now` of the last expire or dispatch: what rate buckets are read against
        self.configure(pools)

    # pools
    def configure(self, pools: list[PoolSettings]) -> None:
        names = [p.name for p in pools]
        for s in pools:
            if s.name in self.pools:
                p = self.pools[s.name]
                if p.settings.fair != s.fair or p.settings.share_by != s.share_by:
                    # A pool that changes its kind of queue, or the unit of its tags, starts its fair state afresh.
                    p.reset()
                elif s.fair:
                    # New weights reach the backlog: F of each backlogged node is
                    # recomputed as if its last dispatch had had the new weight.
                    for cls in range(4):
                        for key in p.backlogged[cls]:
                            last = p.last[cls].get(key)
                            p.finish[cls][key] = (0 if last is None else
                                                  last + _inverse(s, key) * _units(s, p.charge[cls].get(key)))
                # A bucket is kept, counted at its new rate, while the node keeps a rate.
                p.tat = {node: tat for node, tat in p.tat.items() if node in s.tenant_rates}
                p.settings = s
                p.draining = False
            else:
                self.pools[s.name] = MPool(s)
        for name, p in list(self.pools.items()):
            if name not in names:
                p.draining = True
                self._drop_if_drained(name)
        self._settle()

    def _drop_if_drained(self, name: str) -> None:
        p = self.pools.get(name)
        if p is None or not p.draining:
            return
        if any(t.pool == name for t in self.tasks.values()):
            return
        del self.pools[name]
        for w in self.workers.values():
            if name in w.pools:
                w.pools.remove(name)
                w.rr = 0

    def _backlogged(self, name: str, cls: int) -> set[str | None]:
        return {
            t.tenant
            for t in self.tasks.values()
            if t.pool == name and t.priority == cls and t.state == QUEUED and t.deadline is None
        }

    def lag(self, name: str, node: str | None) -> Fraction:
        """The lag of docs/scheduling.md, from the rules' own state: in each class where the node has queued
        work, w * (V - max(V, F)) with V its parent's virtual time (its start tag while it can be dispatched
        from, the tag it would rejoin with while it cannot), summed over the classes."""
        p = self.pools.get(name)
        if p is None or not p.settings.fair:
            return Fraction(0)
        total = Fraction(0)
        for cls in range(4):
            if node not in p.backlogged[cls]:
                continue
            vtime = p.vtime[cls].get(parent_of(node), Fraction(0))
            start = max(vtime, p.finish[cls].get(node, Fraction(0)))
            total += (vtime - start) / _inverse(p.settings, node)
        return total

    def weighted_shares(self, name: str) -> dict:
        """node -> (node, its own tasks), for every node with queued work: in the class the pool's fair
        dispatches serve now (the highest that can dispatch, else the highest with queued work), the product
        down the node's path of its weight over the weights of its siblings with queued work, capped or not
        (own tasks weigh 1 among a node's children). Nodes not listed are promised (0, 0)."""
        p = self.pools.get(name)
        if p is None or not p.settings.fair:
            return {}
        classes = [c for c in range(4) if any(parent_of(k) == ROOT for k in p.eligible[c])]
        classes += [c for c in range(4) if p.backlogged[c]]
        if not classes:
            return {}
        backlogged = p.backlogged[classes[0]]
        weight = {k: 1 / _inverse(p.settings, k) for k in backlogged}
        siblings: dict = {}
        for k in backlogged:
            siblings[parent_of(k)] = siblings.get(parent_of(k), 0) + weight[k]
        part = {k: weight[k] / siblings[parent_of(k)] for k in backlogged}
        out = {}
        for node in (k for k in backlogged if not isinstance(k, tuple)):
            share = Fraction(1)
            for key in prefixes(node):
                share *= part[key]
            mine = own(node)
            out[node] = (share, share * part[mine] if mine in part else Fraction(0))
        return out

    def lag_bound(self, name: str, node: str | None) -> Fraction:
        """How far below 0 the node's lag may be (docs/scheduling.md, "Lag"): one of its dispatches in each
        class where it has queued work, or, where it came back after a reload re-weighted it while it was
        idle, one dispatch at the weight its F was computed with: w_now / w_then of its current dispatches."""
        p = self.pools.get(name)
        if p is None:
            return Fraction(0)
        bound = Fraction(0)
        for cls in range(4):
            if node not in p.backlogged[cls]:
                continue
            last = p.last[cls].get(node)
            then = Fraction(1) if last is None else (p.finish[cls][node] - last) / _inverse(p.settings, node)
            bound += max(Fraction(1), then)
        return bound

    def accepting(self) -> list[str]:
        return [n for n, p in self.pools.items() if not p.draining]

    # tasks
    def submit(self, t: MTask, now: float) -> None:
        self.tasks[t.id] = t
        if t.not_before is not None and t.not_before > now:
            self._delay(t)
        else:
            self._enqueue(t)
        self._settle()

    def _enqueue(self, t: MTask) -> None:
        self.seq += 1
        t.seq = self.seq
        t.state = QUEUED

    def _delay(self, t: MTask) -> None:
        self.seq += 1
        t.seq = self.seq
        t.state = DELAYED

    def cancel(self, task_id: str) -> MTask | None:
        t = self.tasks.get(task_id)
        if t is None or t.state == RUNNING:
            return None
        t.state = CANCELLED
        del self.tasks[task_id]
        self._drop_if_drained(t.pool)
        self._settle()
        return t

    def expire(self, now: float) -> list[MTask]:
        self.clock = now
        out = []
        due = [t for t in self.tasks.values() if t.state == DELAYED and _timer_key(t) <= now]
        due.sort(key=lambda t: (_timer_key(t), t.seq))
        for t in due:
            if t.deadline is not None and t.deadline <= now:
                t.state = EXPIRED
                del self.tasks[t.id]
                out.append(t)
            else:
                self._enqueue(t)
        late = [t for t in self.tasks.values() if t.state == QUEUED and t.deadline is not None and t.deadline <= now]
        for t in late:
            t.state = EXPIRED
            del self.tasks[t.id]
            out.append(t)
        for t in out:
            self._drop_if_drained(t.pool)
        self._settle()
        return out

    def next_wakeup(self) -> float | None:
        times = [_timer_key(t) for t in self.tasks.values() if t.state == DELAYED]
        times += [t.deadline for t in self.tasks.values() if t.state == QUEUED and t.deadline is not None]
        for name, p in self.pools.items():
            if any(t.pool == name and t.state == QUEUED for t in self.tasks.values()):
                times += [start for node in p.tat if (start := self._next_start(name, node)) > self.clock]
        return min(times) if times else None

    def _next_start(self, name: str, node) -> float:
        rate = self.pools[name].settings.tenant_rates[node]
        capacity = rate if rate > 1.0 else 1.0
        return self.pools[name].tat.get(node, -INF) - (capacity - 1.0) / rate

    # workers
    def add_worker(self, wid: Hashable, pools: list[str], free: int) -> None:
        uniq: list[str] = []
        for p in pools:
            if p not in uniq:
                uniq.append(p)
        w = self.workers.get(wid)
        if w is None:
            w = self.workers[wid] = MWorker(wid, uniq, free)
        else:
            w.pools, w.free, w.rr = uniq, free, 0
        if wid in self.ready:
            self.ready.remove(wid)
        if free > 0:
            self.ready.append(wid)

    def grant(self, wid: Hashable, slots: int) -> None:
        w = self.workers.get(wid)
        if w is None or slots == 0:
            return
        if w.free == 0:
            self.ready.append(wid)
        w.free += slots

    def remove_worker(self, wid: Hashable) -> list[MTask]:
        w = self.workers.pop(wid, None)
        if w is None:
            return []
        if wid in self.ready:
            self.ready.remove(wid)
        back = [self.tasks[i] for i in w.running]
        for t in back:
            t.worker = None
            self._enqueue(t)
        self._settle()
        return back

    # leases
    def _lease(self, task_id: str, wid: Hashable, attempt: int) -> MTask | None:
        t = self.tasks.get(task_id)
        if t is None or t.state != RUNNING or t.worker != wid or t.attempts != attempt:
            return None
        return t

    def finish(self, task_id: str, wid: Hashable, attempt: int, state: str) -> MTask | None:
        t = self._lease(task_id, wid, attempt)
        if t is None:
            return None
        self.workers[wid].running.remove(task_id)
        t.state = state
        t.worker = None
        del self.tasks[task_id]
        self._drop_if_drained(t.pool)
        self._settle()
        return t

    def requeue(self, task_id: str, now: float, wid: Hashable, attempt: int, not_before: float | None) -> MTask | None:
        t = self._lease(task_id, wid, attempt)
        if t is None:
            return None
        self.workers[wid].running.remove(task_id)
        t.worker = None
        if not_before is not None:
            t.not_before = not_before
        if not_before is not None and not_before > now:
            self._delay(t)
        else:
            self._enqueue(t)
        self._settle()
        return t

    # dispatch
    def _can_dispatch(self, name: str) -> bool:
        p = self.pools[name]
        cap = p.settings.max_in_flight
        running = sum(1 for t in self.tasks.values() if t.pool == name and t.state == RUNNING)
        return not p.paused and (cap is None or running < cap)

    def _next(self, name: str, now: float) -> tuple[tuple[int, float], MTask, list | None] | None:
        """(key, task, [(key, tag) on the way down]) of the task the pool would dispatch next, without
        dispatching it."""
        p = self.pools[name]
        s = p.settings
        for cls in range(4):
            queued = [t for t in self.tasks.values() if t.pool == name and t.priority == cls and t.state == QUEUED]
            edf = [
                t for t in queued if t.deadline is not None and t.deadline > now and not self._blocked(name, t.tenant)
            ]
            if edf:
                t = min(edf, key=lambda t: (t.deadline, t.seq))
                return (cls, t.deadline), t, None
            rest = [t for t in queued if t.deadline is None]
            if not rest:
                continue
            if not s.fair:
                return (cls, INF), min(rest, key=lambda t: t.seq), None
            needy = self._pick_needy(name, cls, rest)
            if needy is not None:
                return (cls, INF), needy[0], needy[1]
            picked = self._pick(name, cls, ROOT, rest)
            if picked is None:
                continue  # everything left is capped
            task, tags = picked
            return (cls, INF), task, tags
        return None

    def _pick(self, name: str, cls: int, node, rest: list[MTask]) -> tuple[MTask, list] | None:
        """Hierarchical SFQ: the child of `node` with the smallest (max(V, F), arrival of what it would
        hand out), recursively; returns that task and the (key, tag) of each level."""
        p = self.pools[name]
        best = None
        for child in p.eligible[cls]:
            if parent_of(child) != node:
                continue
            if isinstance(child, tuple):
                task = min((t for t in rest if t.tenant == child[1]), key=lambda t: t.seq)
                below_tags: list = []
            else:
                sub = self._pick(name, cls, child, rest)
                assert sub is not None, f"{child} is eligible but has nothing to give"
                task, below_tags = sub
            tag = max(p.vtime[cls].get(node, Fraction(0)), p.finish[cls].get(child, Fraction(0)))
            if best is None or (tag, task.seq) < best[0]:
                best = ((tag, task.seq), task, [(child, tag)] + below_tags)
        if best is None:
            return None
        return best[1], best[2]

    def _pick_needy(self, name: str, cls: int, rest: list[MTask]) -> tuple[MTask, list] | None:
        """The task of the first node under its minimum in the fair order among them, with the (key, tag,
        forced) of each level: forced down to the needy node, by the fair order below it."""
        p = self.pools[name]
        best = None
        for node, minimum in p.settings.tenant_minimums.items():
            if self._running(name, node) >= minimum:
                continue
            path = prefixes(node)
            if not all(k in p.eligible[cls] for k in path):
                continue
            key, tags = [], []
            for k in path:
                tag = max(p.vtime[cls].get(parent_of(k), Fraction(0)), p.finish[cls].get(k, Fraction(0)))
                task, _below = self._pick(name, cls, k, rest)  # what the node would hand out
                key.append((tag, task.seq))
                tags.append((k, tag, True))
            if best is None or key < best[0]:
                best = (key, tags, path[-1])
        if best is None:
            return None
        _key, tags, node = best
        task, below_tags = self._pick(name, cls, node, rest)
        return task, tags + [(k, tag, False) for k, tag in below_tags]

    # ceilings and the tree's transitions
    def _running(self, name: str, node) -> int:
        return sum(
            1 for t in self.tasks.values() if t.pool == name and t.state == RUNNING and node in prefixes(t.tenant)
        )

    def _capped(self, name: str, node) -> bool:
        """Held back: at its ceiling, or its rate bucket is empty at the clock."""
        limit = self.pools[name].settings.limit(node)
        if limit is not None and self._running(name, node) >= limit:
            return True
        return node in self.pools[name].settings.tenant_rates and self._next_start(name, node) > self.clock

    def _blocked(self, name: str, tenant: str | None) -> bool:
        return any(self._capped(name, node) for node in prefixes(tenant))

    def _tree(self, name: str, cls: int) -> tuple[set, set]:
        """(backlogged keys, keys that can be dispatched from) of one fair class, as things stand."""
        rest = [
            t
            for t in self.tasks.values()
            if t.pool == name and t.priority == cls and t.state == QUEUED and t.deadline is None
        ]
        backlogged: set = set()
        for t in rest:
            backlogged.update(prefixes(t.tenant))
            backlogged.add(own(t.tenant))
        eligible = {k for k in backlogged if isinstance(k, tuple)}
        for key in sorted((k for k in backlogged if not isinstance(k, tuple)), key=depth_of, reverse=True):
            if not self._capped(name, key) and any(parent_of(k) == key for k in eligible):
                eligible.add(key)
        return backlogged, eligible

    def _settle(self) -> None:
        """Apply what the rules say happens to nodes that got work, or can be dispatched from again."""
        for name, p in self.pools.items():
            if not p.settings.fair:
                continue
            for cls in range(4):
                backlogged, eligible = self._tree(name, cls)
                vtime, finish, last = p.vtime[cls], p.finish[cls], p.last[cls]
                # A node that had no work and banked nothing forgets its past, and its subtree's.
                for key in sorted(backlogged - p.backlogged[cls], key=depth_of):
                    if finish.get(key, 0) <= vtime.get(parent_of(key), 0):
                        for table in (vtime, finish, last):
                            for k in [k for k in table if k == key or below(k, key)]:
                                del table[k]
                # A node that joins its siblings at V (it banked nothing) forgets its own past.
                for key in eligible - p.eligible[cls]:
                    if finish.get(key, 0) <= vtime.get(parent_of(key), 0):
                        finish.pop(key, None)
                        last.pop(key, None)
                p.backlogged[cls], p.eligible[cls] = backlogged, eligible

    def dispatch(self, now: float, limit: int | None) -> list[tuple[Hashable, MTask]]:
        self.clock = now
        self._settle()  # buckets refilled by now let their nodes go
        out: list[tuple[Hashable, MTask]] = []
        while limit is None or len(out) < limit:
            for wid in list(self.ready):
                w = self.workers[wid]
                n = len(w.pools)
                best = None
                for i in range(n):
                    at = (w.rr + i) % n
                    name = w.pools[at]
                    if not self._can_dispatch(name):
                        continue
                    nxt = self._next(name, now)
                    if nxt is not None and (best is None or nxt[0] < best[0]):
                        best = (nxt[0], nxt[1], nxt[2], name, at)
                if best is None:
                    continue
                _key, t, tags, name, at = best
                w.rr = at + 1
                p = self.pools[name]
                if tags is not None:
                    cls = t.priority
                    charge = _charge(p.settings, t)
                    # A forced level (a node under its minimum) moves V only to the smallest tag of its group.
                    smallest = {}
                    for key, tag, *forced in tags:
                        if forced and forced[0]:
                            parent = parent_of(key)
                            smallest[key] = min(
                                max(p.vtime[cls].get(parent, Fraction(0)), p.finish[cls].get(k, Fraction(0)))
                                for k in p.eligible[cls] if parent_of(k) == parent
                            )
                    for key, tag, *forced in tags:
                        parent = parent_of(key)
                        vtime = p.vtime[cls].get(parent, Fraction(0))
                        p.vtime[cls][parent] = max(vtime, smallest.get(key, tag))
                        p.last[cls][key] = tag
                        p.charge[cls][key] = charge
                        p.finish[cls][key] = tag + _inverse(p.settings, key) * _units(p.settings, charge)
                for node in prefixes(t.tenant):
                    rate = p.settings.tenant_rates.get(node) if node is not None else None
                    if rate is not None:
                        tat = p.tat.get(node, -INF)
                        p.tat[node] = (tat if tat > now else now) + 1.0 / rate
                t.state = RUNNING
                t.worker = wid
                t.attempts += 1
                w.running.append(t.id)
                w.free -= 1
                self.ready.remove(wid)
                if w.free:
                    self.ready.append(wid)
                out.append((wid, t))
                self._settle()
                break
            else:
                break
        return out


def _inverse(s: PoolSettings, key) -> Fraction:
    """1/w exactly, reading the weight as the decimal number it was written as (own tasks weigh 1)."""
    if isinstance(key, tuple):
        return Fraction(1)
    return 1 / Fraction(repr(float(s.weight(key))))


QUANTA = 1000  # a charge is whole thousandths of a unit


def _charge(s: PoolSettings, t: MTask) -> int | None:
    """What a dispatch of `t` charges in quanta: None (one step) unless the pool shares by cost."""
    if s.share_by != "cost":
        return None
    return QUANTA if t.cost is None else max(1, round(t.cost * QUANTA))


def _units(s: PoolSettings, charge: int | None) -> Fraction:
    """A charge as a multiple of 1/w."""
    return Fraction(1) if charge is None or s.share_by == "dispatches" else Fraction(charge, QUANTA)


def _timer_key(t: MTask) -> float:
    assert t.not_before is not None
    return t.not_before if t.deadline is None else min(t.not_before, t.deadline)
