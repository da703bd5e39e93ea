"""SchedulerCore: the scheduler of cronoq as a pure state machine.

How the pieces fit (the rules are in docs/api.md, "Scheduling rules";
docs/scheduling.md explains them at length):

    SchedulerCore
      _tasks    id -> Task, every live task (queued, delayed, running), but those restored with an
                `index`: the caller's own map of them, which the core reads instead of copying
                (a ShardedMap: a million ids grow it without one long pause, core/shards.py);
                after keep_tasks_in(map), the caller's map holds them all and _tasks stays empty
      _timers   heap of delayed tasks by min(not_before, deadline)
      _expiry   heap of queued tasks that have a deadline, by deadline
      _workers  id -> WorkerState (workers.py): the pools a worker serves, its free slots, its leases
      _ready    the workers with a free slot, least recently ready first
      _pools    name -> PoolState (pool.py)
                  classes[0..3]  critical, high, normal, low: strict order
                    edf   heap (deadline, arrival) of queued deadline tasks
                          (with ceilings: an EdfTree, one heap per capped-able node)
                    rest  FairQueue: the tenant tree; per group of siblings, a heap
                          of their tags (S, arrival); a leaf is a flow of tasks
                          or FifoQueue: one chain in arrival order
                  ceilings   node -> running count of its subtree, capped or not, and its
                             rate bucket and minimum (a node with any of the three)
                  refills    heap of (when, node) of the nodes out of tokens
      _rated    the pools with tenant rates (their refills enter next_wakeup)
      _overruns heap of running tasks of pools that share by run time, by when their run
                passes what they were charged
      (a flow or FifoQueue is a Chain: a FIFO linked through Task._next)

PoolState and WorkerState are what the core keeps of a pool and of a worker;
the public `cronoq.Pool` declares a pool and `cronoq.Worker` is the process
that serves one. `explain` (explain.py) answers in the public answer types
of cronoq.answers, the one module below the core besides cronoq.errors.

A dispatch walks a pool's classes from critical to low and takes the first
task it finds: in a class, the EDF heap goes first (a task with a deadline
is not part of the fair share), then the fair queue. The fair queue is
hierarchical start-time fair queuing with the tags given late: in each
group of siblings (the top-level tenants; the children of a tenant, its
own tasks being one more child of weight 1) only the children that can be
dispatched from hold a start tag `S = max(V, F[c])`, assigned when they
join; `V` per group is the tag of its last dispatch and `F[c] = S + 1/w`.
A dispatch goes down by the smallest tag at each level and back up
re-tagging: O(depth * log siblings). Because only joined children are
tagged, new weights reach the whole backlog by re-tagging (O(nodes)) on a
reload. A tenant at its ceiling leaves every heap it is in (it keeps its
tasks and tags) and rejoins at max(V, F) when one of its tasks ends.

What a fair dispatch adds to the tags is the pool's `share_by`: one step
`1/w`, or `charge/w` for a charge in thousandths of a unit (the task's cost,
or its estimated run time). In a pool that shares by run time the charge is
corrected when the run ends (`finish`, `requeue`, `remove_worker` measure it
from the `now` of its dispatch) and raised while it runs past it (`expire`).
A node out of rate tokens is held back as a capped one is, until `expire` or
`dispatch` reaches its refill time; a node under its minimum is served ahead
of its class's fair order (`FairQueue.pop_needy`).

Deadlines live in two heaps that share each entry tuple: the class's EDF heap
orders dispatch, the core's expiry heap finds what `expire(now)` must remove
in O(log n). A delayed task sits only in the timer heap until `expire(now)`
moves it into its class, where it gets its arrival number (and, in a fair
pool, its tag when it reaches the head of its tenant's flow).

Nothing is removed from the middle of a heap or chain: a task that leaves
early (cancelled, expired, dispatched while also in the expiry heap) leaves a
stale entry behind, recognised because its task's `_seq` or state no longer
matches. Each structure counts its stale entries and rebuilds itself before
they outnumber its live ones.

Time is never read here: every operation that depends on it takes `now`.
"""

from __future__ import annotations

from collections import OrderedDict
from heapq import heappop, heappush
from operator import attrgetter
from typing import Collection, Hashable, Iterable, Iterator, Mapping, MutableMapping, Sequence

from cronoq.core.pool import ClassQueue, PoolState, TenantStats
from cronoq.core.settings import PoolSettings, tenant_path
from cronoq.core.shards import ShardedMap
from cronoq.core.task import (
    CANCELLED,
    DELAYED,
    EXPIRED,
    FAILED,
    QUEUED,
    RUNNING,
    LIVE_STATES,
    SUCCEEDED,
    Task,
)
from cronoq.core.checks import check_settings, check_task, is_time, no_pool_message
from cronoq.core.explain import ClassRates, Waiting, explain_waiting
from cronoq.core.fairqueue import FifoQueue
from cronoq.core.timers import TimerHeap
from cronoq.core.weights import QUANTA_PER_UNIT, quantize
from cronoq.core.workers import WorkerState
from cronoq.errors import InvalidArgument, NotFound

_FINISHED = {SUCCEEDED: SUCCEEDED, FAILED: FAILED}  # maps to our own constants (identity checks)
_NO_RUN = object()  # restore(): the pool name of no run of tasks (no task's pool is this)
_POOL = attrgetter("pool")

RECHARGE_MIN = 1.0
"""Seconds charged ahead, at least, each time a task of a pool that shares by run time runs past what it was
charged: it is charged its time so far plus this or an eighth of that time, whichever is more, so that a task of
hours is re-charged a few dozen times, not at every dispatch."""


def _check_ran_for(ran_for: object) -> None:
    if ran_for is not None and not (is_time(ran_for) and ran_for >= 0):  # type: ignore[operator]
        raise InvalidArgument(f"ran_for must be a number of seconds >= 0 or None, got {ran_for!r}")


class SchedulerCore:
    """Decides which task each worker runs next, for every pool. Pure: no I/O, no clock.

    Drive it with `now` from any monotonic clock: `submit` tasks, `add_worker`
    and `grant` slots as workers report, then `expire(now)` and
    `dispatch(now)` (in that order, with the same `now`) whenever something
    changes or `next_wakeup()` comes. Leases are closed with `finish` or
    `requeue`; a lost worker's leases come back with `remove_worker`.
    """

    def __init__(self, pools: Iterable[PoolSettings]) -> None:
        self._pools: dict[str, PoolState] = {}
        self._tasks: ShardedMap[str, Task] = ShardedMap()
        self._index: Mapping[str, Task] | None = None
        self._indexed = 0  # live tasks found through _index rather than _tasks
        # Whether `_index` is the caller's map that every submitted task goes into (keep_tasks_in), rather than
        # one that only holds tasks restored from it.
        self._shared = False
        self._workers: dict[Hashable, WorkerState] = {}
        self._ready: OrderedDict[Hashable, WorkerState] = OrderedDict()
        self._timers = TimerHeap(DELAYED)
        self._expiry = TimerHeap(QUEUED)
        self._seq = 0
        self._now: float | None = None  # the last `now` given to expire() or dispatch(), for configure()
        # Pools with tenant rates: their nodes out of tokens are let go at expire()/dispatch() when due.
        self._rated: list[PoolState] = []
        # Running tasks of pools that share by run time: id -> [the `now` of their dispatch, what their tenant is
        # charged for the run so far, in quanta]. As many as run at once: a queued task carries none of it.
        self._runs: dict[str, list] = {}
        # (charged until, seq, task): those runs by when they pass what they were charged; re-charged at
        # expire()/dispatch() (stale entries are skipped).
        self._overruns: list[tuple[float, int, Task]] = []
        # Pools that are dispatchable and have a ready worker: 0 means dispatch()
        # can return [] at once, which is the common case for an idle broker.
        self._matchable = 0
        self.configure(pools)

    # -- pools -------------------------------------------------------------

    def configure(self, pools: Iterable[PoolSettings], now: float | None = None) -> None:
        """Apply a (re)loaded list of pools.

        New pools appear; existing pools take their new settings, and new
        weights re-order the queued backlog at once, new ceilings cap and
        uncap at once (a node capped by the change counts as capped since
        `now`; None: the last `now` given to `expire`). Pools not listed stop
        accepting tasks (draining) and disappear once they hold no task.
        Raises InvalidArgument (changing nothing) on a duplicate name or an
        invalid setting.
        """
        settings = list(pools)
        names: set[str] = set()
        for s in settings:
            check_settings(s)
            if s.name in names:
                raise InvalidArgument(f"pool {s.name!r} is declared twice; give each pool one entry")
            names.add(s.name)
        for s in settings:
            pool = self._pools.get(s.name)
            if pool is None:
                self._pools[s.name] = PoolState(s)
            else:
                pool.draining = False
                pool.apply(s, self._now if now is None else now)
                self._refresh(pool)
        for pool in list(self._pools.values()):
            if pool.name not in names:
                pool.draining = True
                self._drop_if_drained(pool)
        self._rated = [pool for pool in self._pools.values() if pool.settings.tenant_rates]

    def pool_names(self) -> list[str]:
        """Names of the pools that accept tasks (draining pools excluded)."""
        return [name for name, pool in self._pools.items() if not pool.draining]

    def all_pool_names(self) -> list[str]:
        """Names of every pool, draining ones too, in the order `stats` lists them."""
        return list(self._pools)

    def draining_pools(self) -> list[str]:
        """Names of the pools a reload left out that still hold tasks (they accept none, and go once empty)."""
        return [name for name, pool in self._pools.items() if pool.draining]

    def pause(self, pool: str) -> None:
        """Stop dispatching from `pool`; it still accepts tasks and deadlines still expire."""
        p = self._pool(pool)
        p.paused = True
        self._refresh(p)

    def resume(self, pool: str) -> None:
        """Dispatch from `pool` again."""
        p = self._pool(pool)
        p.paused = False
        self._refresh(p)

    def is_paused(self, pool: str) -> bool:
        """Whether `pool` is paused."""
        return self._pool(pool).paused

    # -- tasks -------------------------------------------------------------

    def submit(self, task: Task, now: float) -> None:
        """Accept a task: DELAYED until `not_before` if that is later than `now`, else QUEUED.

        Raises NotFound for an unknown or draining pool, InvalidArgument for a
        duplicate live id or a malformed field. A deadline already past is
        accepted and reported by the next `expire(now)`. `attempts` is kept.
        """
        pool = self._pools.get(task.pool)
        if pool is None or pool.draining:
            raise NotFound(no_pool_message(task.pool, pool, self.pool_names()))
        task_id = task.id
        # The common shape (plain priority, str or no tenant, no times) is
        # checked inline; anything else goes through the full check.
        priority = task.priority
        tenant = task.tenant
        deadline = task.deadline
        not_before = task.not_before
        attempts = task.attempts
        if (
            task_id.__class__ is not str
            or not task_id
            or priority.__class__ is not int
            or not 0 <= priority <= 3
            or not (tenant is None or (tenant.__class__ is str and tenant))
            or deadline is not None
            or not_before is not None
            or attempts.__class__ is not int
            or attempts < 0
            or task.cost is not None
        ):
            check_task(task)
        if task._seq:
            raise InvalidArgument(f"task {task_id!r} was submitted before; submit a new Task to run it again")
        if self._shared:
            # Into the caller's map (keep_tasks_in), which may hold an ended task of this id: a live one is a duplicate.
            tasks = self._index  # type: ignore[assignment]
            shard = tasks.whole or tasks.shards[hash(task_id) % tasks.count]  # type: ignore[union-attr]
            held = shard.get(task_id)
            if held is not None and held._ts is not None and held.state in LIVE_STATES:
                raise InvalidArgument(f"a task with id {task_id!r} is already queued or running; use another id")
            shard[task_id] = task
            self._indexed += 1
        else:
            if self._index is not None and self._in_index(task_id) is not None:  # restored, and live
                raise InvalidArgument(f"a task with id {task_id!r} is already queued or running; use another id")
            tasks = self._tasks  # tasks.setdefault(task_id, task), inline (core/shards.py)
            shard = tasks.whole or tasks.shards[hash(task_id) % tasks.count]
            if shard.setdefault(task_id, task) is not task:  # one lookup both checks and inserts
                raise InvalidArgument(f"a task with id {task_id!r} is already queued or running; use another id")
        if len(shard) > tasks.split_at:  # type: ignore[union-attr]
            tasks.split()  # type: ignore[union-attr]
        ts = pool.tenants.get(tenant)
        if ts is None:
            ts = pool.tenant_stats(tenant)
        task._ts = ts
        # The task points at the core's own strings for its pool and tenant, which all their tasks share: names
        # read from each message are strings of their own, about 60 bytes per queued task each.
        task.pool = pool.name
        if tenant is not None:
            task.tenant = ts.tenant
        if not_before is not None and not_before > now:
            self._delay(pool, task)
            return
        # _enqueue and ClassQueue.push, inline: this is half of every task's trip through the core.
        self._seq = seq = self._seq + 1
        task._seq = seq
        task.state = QUEUED
        cls = pool.classes[priority]
        if deadline is None:
            cls.rest.push(task)
        else:
            entry = (deadline, seq, task)
            if cls.tree is None:
                heappush(cls.edf, entry)
            else:
                cls.tree.push(entry, ts.ceilings)
            self._expiry.push(entry)
            cls.deadlined += 1
            cls.deadline_arrived += 1
        cls.arrived += 1
        cls.queued += 1
        pool.queued += 1
        ts.queued += 1
        pool.tree_backlog[ts.top] = pool.tree_backlog.get(ts.top, 0) + 1
        if not pool.dispatchable:
            pool.stuck = False
            self._refresh(pool)

    def restore(self, tasks: list[Task], now: float, *, index: Mapping[str, Task] | None = None) -> None:
        """Take back tasks recovered from durable state, in the order they last entered their queues.

        Each as `submit` would, without the checks a fresh submission needs
        (they were made when it was first submitted): a broker restarting
        with a million queued tasks spends its time here. With `index`, a
        mapping by id that holds every one of `tasks` (and may hold others,
        which the core ignores) and that the caller keeps, into a core that
        holds nothing yet, the core reads that mapping instead of building a
        map of its own: the caller must not take out of it a task the core
        still holds. Raises NotFound, taking nothing, if a task names an
        unknown or draining pool, and InvalidArgument if an id is already
        held.
        """
        pools = self._pools
        for name in set(map(_POOL, tasks)):  # at C speed: a restart's backlog is a million tasks
            pool = pools.get(name)
            if pool is None or pool.draining:
                raise NotFound(no_pool_message(name, pool, self.pool_names()))
        held: MutableMapping[str, Task] | None
        if self._shared:
            # Every task this core holds is in the caller's map: restored ones must be there too.
            if index is not None and index is not self._index:
                raise InvalidArgument("restore() of a core that keeps its tasks in a map takes that map or none")
            held = None if index is not None else self._index  # type: ignore[assignment]
            self._indexed += len(tasks)
        elif index is not None:
            if self._tasks or self._index is not None:
                raise InvalidArgument("restore() with an index is for a core that holds no task yet")
            # Nothing restored, nothing to find there: submits and lookups then skip the index altogether.
            if tasks:
                self._index, self._indexed = index, len(tasks)
            held = None
        else:
            held = self._tasks
        count = 0 if held is None else len(held)
        seq = self._seq
        # A run of tasks that go to the end of one FIFO class, of one tenant (most often a pool's whole backlog),
        # is appended with its count kept here: the class's, pool's and tenant's counts take it when it ends.
        run_pool: object = _NO_RUN
        run_tenant = run_priority = None
        run = 0
        tail: Task | None = None
        for task in tasks:
            if held is not None:
                held[task.id] = task
            not_before = task.not_before
            if (task.deadline is None and (not_before is None or not_before <= now) and task.pool == run_pool
                    and task.tenant == run_tenant and task.priority == run_priority):
                task._ts = ts
                task.pool, task.tenant = run_pool, run_tenant  # shared strings, as in `submit`
                seq += 1
                task._seq = seq
                task.state = QUEUED
                tail._next = task  # type: ignore[union-attr]  # (the run's last task's _next: set when it ends)
                tail = task
                run += 1
                continue
            if run:
                self._end_run(pool, ts, cls, tail, run)  # type: ignore[arg-type]
                run = 0
            run_pool = _NO_RUN
            pool = pools[task.pool]
            tenant = task.tenant
            ts = pool.tenants.get(tenant)
            if ts is None:
                ts = pool.tenant_stats(tenant)
            task._ts = ts
            task.pool, task.tenant = pool.name, ts.tenant  # shared strings, as in `submit`
            if not_before is not None and not_before > now:
                self._seq = seq
                self._delay(pool, task)
                seq = self._seq
                continue
            seq += 1
            task._seq = seq
            task.state = QUEUED
            cls = pool.classes[task.priority]
            deadline = task.deadline
            if deadline is not None:
                entry = (deadline, seq, task)
                heappush(cls.edf, entry)
                self._expiry.push(entry)
                cls.deadlined += 1
            elif cls.rest.__class__ is FifoQueue:  # Chain.append, inline; and the start of a run
                rest = cls.rest
                task._next = None
                if rest.tail is None:
                    rest.head = task
                else:
                    rest.tail._next = task
                rest.tail = tail = task
                rest.live += 1
                run_pool, run_tenant, run_priority = task.pool, task.tenant, task.priority  # the shared strings
            else:
                cls.rest.push(task)
            cls.queued += 1
            pool.queued += 1
            ts.queued += 1
            pool.tree_backlog[ts.top] = pool.tree_backlog.get(ts.top, 0) + 1
        if run:
            self._end_run(pool, ts, cls, tail, run)  # type: ignore[arg-type]
        self._seq = seq
        if held is not None and len(held) != count + len(tasks):
            raise InvalidArgument("restore() was given a task id twice, or one already held")
        for pool in pools.values():
            self._refresh(pool)

    @staticmethod
    def _end_run(pool: PoolState, ts: TenantStats, cls: ClassQueue, tail: Task, run: int) -> None:
        """`restore` appended `run` more tasks to `cls`'s FIFO chain, the last one `tail`: count them."""
        tail._next = None
        cls.rest.tail = tail  # type: ignore[union-attr]
        cls.rest.live += run  # type: ignore[union-attr]
        cls.queued += run
        pool.queued += run
        ts.queued += run
        pool.tree_backlog[ts.top] += run

    def cancel(self, task_id: str, now: float) -> Task | None:
        """Cancel a queued or delayed task and return it; None if it is running or unknown."""
        task = self.get(task_id)
        if task is None or task.state is RUNNING:
            return None
        pool = self._pools[task.pool]
        self._unqueue(pool, task, CANCELLED)
        self._refresh(pool)
        self._drop_if_drained(pool)
        return task

    def expire(self, now: float) -> list[Task]:
        """Release delayed tasks that are due and expire every task whose deadline <= now.

        Returns the expired tasks (state EXPIRED, no longer held).
        """
        self._now = now
        self._catch_up(now)
        expired: list[Task] = []
        touched: set[PoolState] = set()
        for task in self._timers.pop_due(now):
            pool = self._pools[task.pool]
            touched.add(pool)
            pool.classes[task.priority].delayed -= 1
            pool.delayed -= 1
            task._ts.delayed -= 1  # type: ignore[union-attr]
            pool.tree_backlog[task._ts.top] -= 1  # type: ignore[union-attr]
            deadline = task.deadline
            if deadline is not None and deadline <= now:
                self._forget(task, EXPIRED)
                expired.append(task)
            else:
                self._enqueue(pool, task)
        for task in self._expiry.pop_due(now):
            pool = self._pools[task.pool]
            touched.add(pool)
            cls = pool.classes[task.priority]
            cls.queued -= 1
            cls.deadlined -= 1  # the expiry heap holds only tasks with a deadline
            pool.queued -= 1
            task._ts.queued -= 1  # type: ignore[union-attr]
            pool.tree_backlog[task._ts.top] -= 1  # type: ignore[union-attr]
            self._forget(task, EXPIRED)
            cls.discard(task)
            expired.append(task)
        for pool in touched:
            self._refresh(pool)
            self._drop_if_drained(pool)
        return expired

    def next_wakeup(self) -> float | None:
        """The earliest time a delayed task becomes due, a queued/delayed task's deadline passes, or a tenant out
        of tokens may start again."""
        timer = self._timers.peek_key()
        deadline = self._expiry.peek_key()
        for pool in self._rated:
            refill = pool.next_refill() if pool.queued else None  # a tenant with nothing queued need not wake
            if refill is not None and (timer is None or refill < timer):
                timer = refill
        if timer is None:
            return deadline
        if deadline is None:
            return timer
        return min(timer, deadline)

    def keep_tasks_in(self, index: ShardedMap[str, Task]) -> None:
        """Keep the live tasks in the caller's `index` (by id) instead of a map of the core's own.

        From now on `submit` adds each task to `index`, and an ended task stays
        there: the caller, which keeps its ended tasks in the same map (the task
        book's records), lets them go. So a queued task costs one map entry
        rather than two. The caller must not take out of `index` a task the
        core still holds. For a core that holds no task; a later call moves the
        core to another (empty-handed) map.
        """
        if len(self):
            raise InvalidArgument("keep_tasks_in() is for a core that holds no task")
        self._index, self._shared = index, True

    def get(self, task_id: str) -> Task | None:
        """The live (queued, delayed or running) task with this id, or None."""
        tasks = self._tasks  # tasks.get(task_id), inline (core/shards.py)
        task = (tasks.whole or tasks.shards[hash(task_id) % tasks.count]).get(task_id)
        if task is None and self._index is not None:
            return self._in_index(task_id)
        return task

    def tasks(self) -> Iterator[Task]:
        """Every live task, in no particular order."""
        found = list(self._tasks.values())
        if self._index is not None:
            found += [task for task in self._index.values() if task._ts is not None and task.state in LIVE_STATES]
        return iter(found)

    def __len__(self) -> int:
        return len(self._tasks) + self._indexed

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and self.get(task_id) is not None

    def _in_index(self, task_id: str) -> Task | None:
        """A live task restored with an index (the index also holds tasks this core never had, or let go)."""
        task = self._index.get(task_id)  # type: ignore[union-attr]
        if task is None or task._ts is None or task.state not in LIVE_STATES:
            return None
        return task

    # -- workers -----------------------------------------------------------

    def add_worker(self, worker_id: Hashable, pools: Iterable[str], free_slots: int, *,
                   draining_ok: bool = False) -> None:
        """Register a worker (or replace a known one's pools and slots, keeping its leases).

        Raises NotFound naming the first pool that does not accept tasks (with
        `draining_ok`, a draining pool is served until it is empty). With
        free slots it becomes the most recently ready worker.
        """
        wanted: list[PoolState] = []
        for name in pools:
            pool = self._pools.get(name)
            if pool is None or (pool.draining and not draining_ok):
                raise NotFound(no_pool_message(name, pool, self.pool_names()))
            if pool not in wanted:
                wanted.append(pool)
        if type(free_slots) is not int or free_slots < 0:
            raise InvalidArgument(f"free_slots must be an int >= 0, got {free_slots!r}")
        worker = self._workers.get(worker_id)
        if worker is None:
            worker = self._workers[worker_id] = WorkerState(worker_id)
        else:
            if worker.free:
                self._unready(worker)
            for pool in worker.pools:
                pool.workers.discard(worker)
        worker.pools = wanted
        worker.rr = 0
        worker.free = free_slots
        for pool in wanted:
            pool.workers.add(worker)
        if free_slots:
            self._make_ready(worker)

    def grant(self, worker_id: Hashable, slots: int = 1) -> None:
        """The worker reports `slots` more free slots (unknown workers are ignored)."""
        if type(slots) is not int or slots < 0:
            raise InvalidArgument(f"slots must be an int >= 0, got {slots!r}")
        worker = self._workers.get(worker_id)
        if worker is None or not slots:
            return
        was_free = worker.free
        worker.free = was_free + slots
        if not was_free:
            self._make_ready(worker)

    def remove_worker(self, worker_id: Hashable, now: float) -> list[Task]:
        """Forget a worker; its running tasks go back to their class (QUEUED) and are returned. In a pool that
        shares by run time, each lost run is charged from its dispatch to `now` (the slot was held that long)."""
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return []
        if worker.free:
            self._unready(worker)
        for pool in worker.pools:
            pool.workers.discard(worker)
        back = list(worker.running.values())
        worker.running.clear()
        for task in back:
            pool = self._pools[task.pool]
            self._release(pool, task, now)
            self._enqueue(pool, task)
            self._refresh(pool)
        return back

    def workers(self) -> list[Hashable]:
        """Ids of the known workers."""
        return list(self._workers)

    def free_slots(self, worker_id: Hashable) -> int:
        """The free slots the core counts for a worker (0 if unknown)."""
        worker = self._workers.get(worker_id)
        return worker.free if worker is not None else 0

    def worker_tasks(self, worker_id: Hashable) -> list[Task]:
        """The tasks a worker holds, in dispatch order ([] if unknown)."""
        worker = self._workers.get(worker_id)
        return list(worker.running.values()) if worker is not None else []

    # -- dispatch and leases -----------------------------------------------

    def dispatch(self, now: float, limit: int | None = None) -> list[tuple[Hashable, Task]]:
        """Hand out tasks to workers with free slots; returns (worker id, task) pairs.

        Each assignment goes to the least recently ready worker that has a
        free slot and serves a pool with a task to give; that worker then
        becomes the most recently ready. At most `limit` assignments (None: as
        many as possible). Returned tasks are RUNNING with `worker` set and
        `attempts` incremented.
        """
        self._now = now
        if self._rated or self._overruns:
            self._catch_up(now)
        if not self._matchable or limit == 0:
            return []
        remaining = -1 if limit is None else limit
        out: list[tuple[Hashable, Task]] = []
        ready = self._ready
        candidates: Iterable[WorkerState] = ready.values()
        while True:
            # One round: each candidate, in LRU order, gets at most one task.
            # `_ready` is not reordered during the round (it is being iterated);
            # the workers served move to its back afterwards, in the order
            # served, which is exactly where one-at-a-time dispatch puts them.
            served: list[WorkerState] | None = None  # made only if a second task is wanted
            for worker in candidates:
                pools = worker.pools
                if len(pools) == 1:
                    pool = pools[0]
                    if not pool.dispatchable:
                        continue
                else:
                    pool = self._choose_pool(worker, now)  # type: ignore[assignment]
                    if pool is None:
                        continue
                task = pool.take(now)
                if task is None:
                    # Only overdue tasks (expire() will report them) or capped
                    # tenants' tasks are left: skip the pool until that changes.
                    pool.stuck = True
                    self._refresh(pool)
                    continue
                task.state = RUNNING
                task.worker = worker_id = worker.id
                task.attempts += 1
                if pool.by_runtime:
                    self._watch_run(pool, task, now)
                worker.free -= 1
                worker.running[task.id] = task
                if task.deadline is not None:
                    self._expiry.stale()
                cap = pool.max_in_flight
                if not pool.queued or (cap is not None and pool.running >= cap):
                    self._refresh(pool)
                out.append((worker_id, task))
                remaining -= 1
                if served is None:
                    if not remaining:
                        # One task asked for (the common call): no second round to prepare.
                        if worker.free:
                            ready.move_to_end(worker_id)
                        else:
                            self._unready(worker)
                        return out
                    served = [worker]
                else:
                    served.append(worker)
                if not remaining or not self._matchable:
                    break
            if not served:
                break
            for worker in served:
                if worker.free:
                    ready.move_to_end(worker.id)
                else:
                    self._unready(worker)
            if not remaining or not self._matchable:
                break
            # Workers skipped this round had nothing to take, and dispatching
            # only makes less available: only the ones served can take more.
            candidates = [w for w in served if w.free]
        return out

    def finish(self, task_id: str, now: float, *, worker_id: Hashable, attempt: int, state: str,
               ran_for: float | None = None) -> Task | None:
        """Close the lease (task_id, attempt) of worker_id as SUCCEEDED or FAILED and return the task.

        A stale lease (the task is not running that attempt on that worker)
        returns None and changes nothing. Does not grant slots. In a pool
        that shares by run time the task's tenant is charged the run's time:
        `ran_for` seconds, or when None, `now` less the `now` it was
        dispatched at (docs/scheduling.md, "Sharing by run time").
        """
        final = _FINISHED.get(state)
        if final is None:
            raise InvalidArgument(f"a finished task is {SUCCEEDED!r} or {FAILED!r}, not {state!r}")
        _check_ran_for(ran_for)
        task = self._lease(task_id, worker_id, attempt)
        if task is None:
            return None
        pool = self._pools[task.pool]
        self._release(pool, task, now, ran_for)
        self._forget(task, final)
        self._refresh(pool)
        self._drop_if_drained(pool)
        return task

    def requeue(
        self,
        task_id: str,
        now: float,
        *,
        worker_id: Hashable,
        attempt: int,
        not_before: float | None = None,
        ran_for: float | None = None,
    ) -> Task | None:
        """Send a running lease back to run again: QUEUED now, or DELAYED until `not_before`.

        The task keeps its deadline and attempts and gets a fresh arrival (and
        start tag). A stale lease returns None and changes nothing. The run
        that ended is charged as `finish` charges it; the next run is charged
        again when it is dispatched.
        """
        if not_before is not None and not is_time(not_before):
            raise InvalidArgument(f"not_before must be a number or None, got {not_before!r}")
        _check_ran_for(ran_for)
        task = self._lease(task_id, worker_id, attempt)
        if task is None:
            return None
        pool = self._pools[task.pool]
        self._release(pool, task, now, ran_for)
        if not_before is not None:
            task.not_before = not_before
        if not_before is not None and not_before > now:
            self._delay(pool, task)
        else:
            self._enqueue(pool, task)
        self._refresh(pool)
        return task

    # -- counts ------------------------------------------------------------

    def backlog(self, pool: str) -> int:
        """Tasks of `pool` not yet running (queued + delayed), O(1)."""
        p = self._pool(pool)
        return p.queued + p.delayed

    def queued(self, pool: str) -> int:
        """Queued tasks of `pool`."""
        return self._pool(pool).queued

    def delayed(self, pool: str) -> int:
        """Delayed tasks of `pool`."""
        return self._pool(pool).delayed

    def running(self, pool: str) -> int:
        """Running tasks of `pool`."""
        return self._pool(pool).running

    def dispatched(self, pool: str) -> int:
        """Tasks of `pool` dispatched so far (re-dispatches included), O(classes)."""
        return self._pool(pool).dispatched()

    def arrivals(self, pool: str) -> tuple[tuple[int, int], ...]:
        """For each priority class of `pool`, highest first: tasks that have become queued in it so far
        (submitted ready, ready after a delay or back-off, requeued), and those of them with a deadline.
        Counters the shell samples over time (cronoq.book.rates) for `explain`'s arrival rates; O(classes)."""
        return tuple((cls.arrived, cls.deadline_arrived) for cls in self._pool(pool).classes)

    def tenant_backlog(self, pool: str, tenant: str | None) -> int:
        """Tasks of `tenant` in `pool` not yet running (queued + delayed), O(1)."""
        ts = self._pool(pool).tenants.get(tenant or None)  # "" names the untenanted, as in stats()
        return ts.queued + ts.delayed if ts is not None else 0

    def tree_backlog(self, pool: str, tenant: str | None) -> int:
        """Tasks not yet running (queued + delayed) in `pool` of the whole tree of `tenant`'s top-level tenant
        (`acme` for `acme/search/alice`; for a flat name, the tenant's own), O(1)."""
        return self._pool(pool).tree_backlog.get(tenant_path(tenant or None)[0], 0)

    def lag(self, pool: str, tenant: str | None) -> float:
        """Dispatches `tenant`'s node trails (+) or leads (-) its place in `pool`'s fair order: w * (V - S) among
        its siblings, summed over the classes; in [-1, 0] per class (docs/scheduling.md, "Lag")."""
        return self._pool(pool).lag(tenant)

    def stats(self, tenants: Mapping[str, Collection[str | None]] | None = None,
              limit: int | None = None, now: float | None = None,
              pools: Collection[str] | None = None) -> dict[str, dict]:
        """A JSON-friendly picture of every pool: flags, counts per class and per tenant, lag.

        {pool: {"paused", "draining", "fair", "max_in_flight", "running",
        "queued", "delayed", "dispatched", "workers", "ready_workers",
        "classes": {"critical": {"queued", "delayed", "running", "dispatched"
        [, "virtual_time"]}, ...}, "tenants": {tenant or "": {"weight",
        "queued", "delayed", "running", "dispatched", "lag", "weighted_share",
        "own_weighted_share", "own_lag"}}, "tree_nodes": {node: {"weight", "lag",
        "weighted_share"}}, "tenant_count", "ceilings": {node or "": {"limit", "running", "capped", "capped_since",
        "capped_for"}}, "ceiling_count", "share_by", "share_unit", "rates": {node: {"rate", "tokens", "limited",
        "next_start_in"}}, "minimums": {node: {"minimum", "running", "under"}}}}

        `tenants` names, for some pools, the only tenants to list (None in
        it stands for the untenanted); the other pools list all of theirs,
        or their first `limit` when given ("tenant_count" tells how many
        there are in all). A tenant's weight and lag are its node's (the lag
        among its siblings); its weighted share is its node's whole subtree's,
        the own_ figures those of its own tasks beside its sub-tenants
        (docs/scheduling.md, "Weighted share"); "tree_nodes" gives the
        ancestors of listed tenants that are not listed themselves; "ceilings" lists every node with a ceiling the
        pool has met (with `limit`, at most that many, the capped ones first;
        "ceiling_count" counts them all), with the running tasks of its
        subtree and, while it is capped, since when (on the caller's clock)
        and, given `now`, for how many seconds so far ("capped_for"; None
        otherwise). With `pools`, only the pools named (a caller building the picture a pool at a time).
        """
        chosen = tenants or {}
        return {name: pool.stats(chosen.get(name), limit, now) for name, pool in self._pools.items()
                if pools is None or name in pools}

    def explain(self, task_id: str, now: float, dispatch_rate: float | None = None,
                arrival_rates: Sequence[ClassRates] | None = None, scope: str | None = None) -> Waiting | None:
        """Why a queued or delayed task has not started (cronoq.core.explain); None if the core holds no such
        task or it is running. `dispatch_rate` is the pool's recent dispatches per second and `arrival_rates`
        its classes' recent arrivals per second (highest class first; see `arrivals`), both measured by the
        caller; None when it has none. `scope` names the tenant a pinned caller may see (its subtree): then
        nothing of other tenants' tasks is told, and the estimate is coarse. O(classes + depth), plus walks
        bounded by EXPLAIN_SCAN steps (and, with a scope, one of the pool's tenant table)."""
        task = self.get(task_id)
        if task is None or task.state is RUNNING:
            return None
        return explain_waiting(self._pools[task.pool], task, now, dispatch_rate, arrival_rates=arrival_rates,
                               scope=scope)

    def tenant_count(self, pool: str) -> int:
        """Tenants of `pool` that have counts: those with tasks, and recently idle ones."""
        return len(self._pool(pool).tenants)

    def busiest_tenants(self, pool: str, limit: int, step: int) -> Iterator[list[str | None] | None]:
        """The `limit` tenants of `pool` with the most tasks queued, delayed and running, busiest first, found
        `step` tenants at a time: the iterator yields None after each step but the last, then the names.
        A caller that must not hold its thread for long takes one step at a time."""
        return self._pool(pool).busiest_tenants(limit, step)

    # -- internals ---------------------------------------------------------

    def _pool(self, name: str) -> PoolState:
        pool = self._pools.get(name)
        if pool is None:
            raise NotFound(f"no pool named {name!r}; known pools: {list(self._pools)}")
        return pool

    def _enqueue(self, pool: PoolState, task: Task) -> None:
        """Put a held task into its class as QUEUED with a fresh arrival number."""
        self._seq = seq = self._seq + 1
        task._seq = seq
        task.state = QUEUED
        cls = pool.classes[task.priority]
        entry = cls.push(task)
        if entry is not None:
            self._expiry.push(entry)
            cls.deadlined += 1
            cls.deadline_arrived += 1
        cls.arrived += 1
        cls.queued += 1
        pool.queued += 1
        task._ts.queued += 1  # type: ignore[union-attr]
        top = task._ts.top  # type: ignore[union-attr]
        pool.tree_backlog[top] = pool.tree_backlog.get(top, 0) + 1
        if not pool.dispatchable:
            pool.stuck = False
            self._refresh(pool)

    def _delay(self, pool: PoolState, task: Task) -> None:
        """Hold a task as DELAYED until its not_before (or its deadline, if that comes first)."""
        self._seq += 1
        task._seq = self._seq
        task.state = DELAYED
        due = task.not_before
        deadline = task.deadline
        if deadline is not None and deadline < due:  # type: ignore[operator]
            due = deadline
        self._timers.push((due, task._seq, task))  # type: ignore[arg-type]
        pool.classes[task.priority].delayed += 1
        pool.delayed += 1
        task._ts.delayed += 1  # type: ignore[union-attr]
        top = task._ts.top  # type: ignore[union-attr]
        pool.tree_backlog[top] = pool.tree_backlog.get(top, 0) + 1

    def _unqueue(self, pool: PoolState, task: Task, state: str) -> None:
        """Remove a queued or delayed task from its structures (lazily) and end it in `state`."""
        cls = pool.classes[task.priority]
        ts = task._ts
        if task.state is QUEUED:
            cls.queued -= 1
            pool.queued -= 1
            ts.queued -= 1  # type: ignore[union-attr]
            pool.tree_backlog[ts.top] -= 1  # type: ignore[union-attr]
            self._forget(task, state)
            cls.discard(task)
            if task.deadline is not None:
                cls.deadlined -= 1
                self._expiry.stale()
        else:
            cls.delayed -= 1
            pool.delayed -= 1
            ts.delayed -= 1  # type: ignore[union-attr]
            pool.tree_backlog[ts.top] -= 1  # type: ignore[union-attr]
            self._forget(task, state)
            self._timers.stale()

    def _forget(self, task: Task, state: str) -> None:
        task.state = state
        task.worker = None
        tasks = self._tasks  # tasks.pop(task.id, None), inline (core/shards.py)
        if (tasks.whole or tasks.shards[hash(task.id) % tasks.count]).pop(task.id, None) is None:
            self._indexed -= 1  # it was found through the index, which its owner keeps
            if not self._indexed and not self._shared:
                # The last restored task has left: every live task is in `_tasks` now, and each submit and each
                # lookup of a task the core does not hold would ask the index for nothing.
                self._index = None

    def _lease(self, task_id: str, worker_id: Hashable, attempt: int) -> Task | None:
        """The running task if (task_id, attempt) is a current lease of worker_id, else None."""
        task = self.get(task_id)
        if task is None or task.state is not RUNNING or task.attempts != attempt or task.worker != worker_id:
            return None
        return task

    def _release(self, pool: PoolState, task: Task, now: float, ran_for: float | None = None) -> None:
        """A running task leaves its worker: uncount it as running, and charge its run where runs are charged."""
        run = self._runs.pop(task.id, None) if self._runs else None
        if run is not None and pool.by_runtime:
            started, charged = run
            seconds = ran_for if ran_for is not None else max(0.0, now - started)
            pool.correct(task, charged, quantize(seconds))
            pool.observe(task._ts, seconds)  # type: ignore[arg-type]
        worker = self._workers.get(task.worker)
        if worker is not None:
            worker.running.pop(task.id, None)
        task.worker = None
        pool.classes[task.priority].running -= 1
        pool.running -= 1
        ts = task._ts
        ts.running -= 1  # type: ignore[union-attr]
        if ts.ceilings:  # type: ignore[union-attr]
            pool.uncharge(ts.ceilings)  # type: ignore[union-attr]

    def _catch_up(self, now: float) -> None:
        """Let go the tenants whose rate bucket has refilled by `now`, and charge the running tasks of pools that
        share by run time for the time they have run past their charge."""
        for pool in self._rated:
            if pool.refills and pool.refills[0][0] <= now and pool.refill(now):
                self._refresh(pool)
        overruns = self._overruns
        while overruns and overruns[0][0] < now:
            due, seq, task = heappop(overruns)
            run = self._runs.get(task.id)
            if run is None or task.state is not RUNNING or task._seq != seq or \
                    run[0] + run[1] / QUANTA_PER_UNIT != due:
                continue  # ended, re-dispatched or re-charged since: stale
            pool = self._pools.get(task.pool)
            if pool is None or not pool.by_runtime:
                continue  # a reload changed what the pool charges: its tags are no longer in seconds
            started, charged = run
            ran = quantize(now - started)
            run[1] = charge = ran + max(quantize(RECHARGE_MIN), ran // 8)
            pool.correct(task, charged, charge)
            heappush(overruns, (started + charge / QUANTA_PER_UNIT, seq, task))

    def _watch_run(self, pool: PoolState, task: Task, now: float) -> None:
        """A task of a pool that shares by run time started: remember when, and what it was charged."""
        charged = pool.charged(task)
        if charged is not None:
            self._runs[task.id] = [now, charged]
            heappush(self._overruns, (now + charged / QUANTA_PER_UNIT, task._seq, task))

    def charged_for(self, task_id: str) -> float | None:
        """Seconds the running task `task_id`'s tenant is charged for its run so far, in a pool that shares by run
        time (its estimate, or more once it has run longer); None for any other task."""
        run = self._runs.get(task_id)
        return None if run is None else run[1] / QUANTA_PER_UNIT

    def _choose_pool(self, worker: WorkerState, now: float) -> PoolState | None:
        """Of the worker's pools, the one whose next task has the best class, then the
        earliest deadline; ties go round-robin, starting after the pool chosen last."""
        pools = worker.pools
        n = len(pools)
        best: PoolState | None = None
        best_key: tuple[int, float] | None = None
        best_at = 0
        for i in range(n):
            at = (worker.rr + i) % n
            pool = pools[at]
            if not pool.dispatchable:
                continue
            key = pool.peek_key(now)
            if key is not None and (best_key is None or key < best_key):
                best, best_key, best_at = pool, key, at
        if best is not None:
            worker.rr = best_at + 1
        return best

    def _refresh(self, pool: PoolState) -> None:
        """Recompute whether `pool` can be dispatched from and keep `_matchable` in step."""
        dispatchable = pool.should_dispatch()
        if dispatchable is not pool.dispatchable:
            pool.dispatchable = dispatchable
            if pool.ready_workers:
                self._matchable += 1 if dispatchable else -1

    def _make_ready(self, worker: WorkerState) -> None:
        self._ready[worker.id] = worker
        for pool in worker.pools:
            pool.ready_workers += 1
            if pool.ready_workers == 1 and pool.dispatchable:
                self._matchable += 1

    def _unready(self, worker: WorkerState) -> None:
        del self._ready[worker.id]
        for pool in worker.pools:
            pool.ready_workers -= 1
            if not pool.ready_workers and pool.dispatchable:
                self._matchable -= 1

    def _drop_if_drained(self, pool: PoolState) -> None:
        """A draining pool disappears once it holds no task."""
        if not pool.draining or pool.live():
            return
        del self._pools[pool.name]
        # An empty pool is not dispatchable, so it counts in no `_matchable`;
        # its workers keep their place in the ready order.
        for worker in pool.workers:
            worker.pools.remove(pool)
            worker.rr = 0
        pool.workers.clear()
