"""A naive reference scheduler: the scheduling rules of docs/api.md, written the slow, obvious way.

No heaps, no lazy deletion, no counters: every decision scans the live tasks.
It keeps only what the rules themselves define as state: the virtual time V
of each class, F[t] and the start tag of each tenant's last dispatch in each
class, and the arrival number each task got when it entered its class.

Tags are exact Fractions here, as the rules' arithmetic is. It relies
on one fact shown in docs/scheduling.md: the start tag of a
tenant's head task equals max(V, F[t]) evaluated at any moment while it is
the head, so no task tag is stored at all. The property tests run this
model and SchedulerCore side by side and demand identical decisions.
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


@dataclass
class MWorker:
    id: Hashable
    pools: list[str]
    free: int
    running: list[str] = field(default_factory=list)
    rr: int = 0


@dataclass
class MPool:
    settings: PoolSettings
    paused: bool = False
    draining: bool = False
    vtime: list[Fraction] = field(default_factory=lambda: [Fraction(0)] * 4)
    last: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # tenant -> S of its last dispatch
    finish: list[dict] = field(default_factory=lambda: [{} for _ in range(4)])  # tenant -> F[t]


class Model:
    def __init__(self, pools: list[PoolSettings]) -> None:
        self.pools: dict[str, MPool] = {}
        self.tasks: dict[str, MTask] = {}
        self.workers: dict[Hashable, MWorker] = {}
        self.ready: list[Hashable] = []  # LRU order, least recently ready first
        self.seq = 0
        self.configure(pools)

    # pools
    def configure(self, pools: list[PoolSettings]) -> None:
        names = [p.name for p in pools]
        for s in pools:
            if s.name in self.pools:
                p = self.pools[s.name]
                if p.settings.fair != s.fair:
                    # A pool that changes its kind of queue starts its fair state afresh.
                    p.vtime = [Fraction(0)] * 4
                    p.last = [{} for _ in range(4)]
                    p.finish = [{} for _ in range(4)]
                elif s.fair:
                    # New weights reach the backlog: F of each backlogged tenant is
                    # recomputed as if its last dispatch had had the new weight.
                    for cls in range(4):
                        for tenant in self._backlogged(s.name, cls):
                            last = p.last[cls].get(tenant)
                            p.finish[cls][tenant] = 0 if last is None else last + _inverse(s, tenant)
                p.settings = s
                p.draining = False
            else:
                self.pools[s.name] = MPool(s)
        for name, p in list(self.pools.items()):
            if name not in names:
                p.draining = True
                self._drop_if_drained(name)

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

    def accepting(self) -> list[str]:
        return [n for n, p in self.pools.items() if not p.draining]

    # tasks
    def submit(self, t: MTask, now: float) -> None:
        self.tasks[t.id] = t
        if t.not_before is not None and t.not_before > now:
            self._delay(t)
        else:
            self._enqueue(t)

    def _enqueue(self, t: MTask) -> None:
        p = self.pools[t.pool]
        cls = t.priority
        if p.settings.fair and t.deadline is None and t.tenant not in self._backlogged(t.pool, cls):
            # The tenant starts a backlogged period; if its F is not ahead of V
            # its past no longer matters (and a reweight must not revive it).
            if p.finish[cls].get(t.tenant, 0) <= p.vtime[cls]:
                p.last[cls].pop(t.tenant, None)
                p.finish[cls][t.tenant] = 0
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
        return t

    def expire(self, now: float) -> list[MTask]:
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
        return out

    def next_wakeup(self) -> float | None:
        times = [_timer_key(t) for t in self.tasks.values() if t.state == DELAYED]
        times += [t.deadline for t in self.tasks.values() if t.state == QUEUED and t.deadline is not None]
        return min(times) if times else None

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
        return t

    # dispatch
    def _can_dispatch(self, name: str) -> bool:
        p = self.pools[name]
        cap = p.settings.max_in_flight
        running = sum(1 for t in self.tasks.values() if t.pool == name and t.state == RUNNING)
        return not p.paused and (cap is None or running < cap)

    def _next(self, name: str, now: float) -> tuple[tuple[int, float], MTask, float | None] | None:
        """(key, task, new V) of the task the pool would dispatch next, without dispatching it."""
        p = self.pools[name]
        s = p.settings
        for cls in range(4):
            queued = [t for t in self.tasks.values() if t.pool == name and t.priority == cls and t.state == QUEUED]
            edf = [t for t in queued if t.deadline is not None and t.deadline > now]
            if edf:
                t = min(edf, key=lambda t: (t.deadline, t.seq))
                return (cls, t.deadline), t, None
            rest = [t for t in queued if t.deadline is None]
            if not rest:
                continue
            if not s.fair:
                return (cls, INF), min(rest, key=lambda t: t.seq), None
            best = None
            for tenant in {t.tenant for t in rest}:
                head = min((t for t in rest if t.tenant == tenant), key=lambda t: t.seq)
                tag = max(p.vtime[cls], p.finish[cls].get(tenant, 0))
                if best is None or (tag, head.seq) < best[0]:
                    best = ((tag, head.seq), head)
            assert best is not None
            return (cls, INF), best[1], best[0][0]
        return None

    def dispatch(self, now: float, limit: int | None) -> list[tuple[Hashable, MTask]]:
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
                _key, t, vtime, name, at = best
                w.rr = at + 1
                if vtime is not None:
                    p = self.pools[name]
                    p.vtime[t.priority] = vtime
                    p.last[t.priority][t.tenant] = vtime
                    p.finish[t.priority][t.tenant] = vtime + _inverse(p.settings, t.tenant)
                t.state = RUNNING
                t.worker = wid
                t.attempts += 1
                w.running.append(t.id)
                w.free -= 1
                self.ready.remove(wid)
                if w.free:
                    self.ready.append(wid)
                out.append((wid, t))
                break
            else:
                break
        return out


def _inverse(s: PoolSettings, tenant: str | None) -> Fraction:
    """1/w exactly, reading the weight as the decimal number it was written as."""
    return 1 / Fraction(repr(float(s.weight(tenant))))


def _timer_key(t: MTask) -> float:
    assert t.not_before is not None
    return t.not_before if t.deadline is None else min(t.not_before, t.deadline)
