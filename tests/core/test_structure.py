"""The core's housekeeping: lazy deletion stays bounded, idle state is swept, and the core stays pure."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from cronoq.core import SUCCEEDED, PoolSettings, SchedulerCore, Task
from cronoq.core.fairqueue import Chain, FairQueue

CORE_DIR = Path(__file__).resolve().parents[2] / "cronoq" / "core"


def linked(chain: Chain) -> int:
    """Tasks linked in a chain, cancelled ones included."""
    n, task = 0, chain.head
    while task is not None:
        n, task = n + 1, task._next
    return n


def entries(core: SchedulerCore) -> int:
    """Every entry held in a heap, chain or flow table of the core."""
    n = len(core._timers._heap) + len(core._expiry._heap)
    for pool in core._pools.values():
        for cls in pool.classes:
            n += len(cls.edf)
            rest = cls.rest
            if isinstance(rest, FairQueue):
                n += len(rest.heap) + len(rest.flows) + sum(linked(f) for f in rest.flows.values())
            else:
                n += linked(rest)
    return n


def live_entries(core: SchedulerCore) -> int:
    """What a structure without stale entries would hold: one or two entries per task, one or two per tenant."""
    n = 0
    for task in core.tasks():
        if task.state == "queued":
            n += 2 if task.deadline is not None else 1
        elif task.state == "delayed":
            n += 1
    for pool in core._pools.values():
        for cls in pool.classes:
            if isinstance(cls.rest, FairQueue):
                n += 2 * cls.rest.nback
    return n


@pytest.mark.parametrize("fair", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_stale_entries_never_outnumber_live_ones(fair, seed):
    rng = random.Random(seed)
    core = SchedulerCore([PoolSettings("p", fair_share=fair)])
    core.add_worker("w", ["p"], 10**9)
    now = 0.0
    next_id = 0
    for _round in range(30):
        for _ in range(rng.randint(0, 400)):
            deadline = now + rng.choice([1, 5, 50]) if rng.random() < 0.3 else None
            not_before = now + rng.choice([1, 3]) if rng.random() < 0.2 else None
            core.submit(
                Task(f"t{next_id}", "p", tenant=f"ten{rng.randint(0, 40)}", deadline=deadline, not_before=not_before),
                now,
            )
            next_id += 1
        live = [t.id for t in core.tasks() if t.state != "running"]
        for task_id in rng.sample(live, k=int(len(live) * rng.random())):
            core.cancel(task_id, now)
        now += rng.choice([0.0, 1.0, 2.0])
        core.expire(now)
        for _, task in core.dispatch(now, limit=rng.randint(0, 50)):
            core.finish(task.id, now, worker_id="w", attempt=task.attempts, state=SUCCEEDED)
        # Memory follows the live backlog: stale entries are compacted before
        # they outnumber live ones (per structure; the small slack covers the
        # flow tables, swept by doubling, and empty-structure rounding).
        assert entries(core) <= 2 * live_entries(core) + 2 * 64 + 8


def test_cancelling_a_huge_backlog_releases_its_entries():
    core = SchedulerCore([PoolSettings("fifo"), PoolSettings("fair", fair_share=True)])
    for pool in ("fifo", "fair"):
        for i in range(5000):
            core.submit(Task(f"{pool}{i}", pool, tenant=f"t{i % 100}", deadline=1e9 if i % 3 == 0 else None), 0.0)
    for task in core.tasks():
        core.cancel(task.id, 0.0)
    assert len(core) == 0
    assert entries(core) <= 2 * 64 + 8


def test_idle_tenants_are_swept_from_the_flow_tables():
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    core.add_worker("w", ["p"], 10**9)
    for i in range(20_000):  # a churn of one-off tenants next to a busy one
        core.submit(Task(f"t{i}", "p", tenant=f"tenant-{i}"), 0.0)
        core.submit(Task(f"b{i}", "p", tenant="busy"), 0.0)
        for _, task in core.dispatch(0.0, limit=2):
            core.finish(task.id, 0.0, worker_id="w", attempt=1, state=SUCCEEDED)
    fq = core._pools["p"].classes[2].rest
    assert isinstance(fq, FairQueue)
    # Only flows whose F[t] is still ahead of V are kept (and idle ones link no task).
    assert len(fq.flows) <= 2 * 64 + 2
    assert all(f.live or f.head is None for f in fq.flows.values())
    # The per-tenant counts forget idle tenants past a generous table size.
    assert len(core._pools["p"].tenants) <= 2 * 1024 + 2


def test_a_tenant_served_while_v_stands_still_is_remembered():
    # With one task per tenant V never moves, so each served tenant's F[t] = V + 1
    # still matters (the scheduling rules') and its (small) flow record is kept.
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    core.add_worker("w", ["p"], 10**9)
    for i in range(300):
        core.submit(Task(f"t{i}", "p", tenant=f"tenant-{i}"), 0.0)
        core.dispatch(0.0)
    core.submit(Task("again", "p", tenant="tenant-0"), 0.0)
    core.submit(Task("new", "p", tenant="newcomer"), 0.0)
    assert [t.id for _, t in core.dispatch(0.0)] == ["new", "again"]


FORBIDDEN = {"socket", "asyncio", "uvloop", "time", "random", "threading", "sqlite3", "zmq", "os", "datetime"}


def test_the_core_imports_no_io_clock_or_randomness():
    for path in sorted(CORE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_ended_tasks_do_not_keep_queued_ones_alive():
    # Tasks are chained through Task._next; an ended task must not hold on to the chain.
    for settings in (PoolSettings("p"), PoolSettings("p", fair_share=True)):
        core = SchedulerCore([settings])
        tasks = [Task(f"t{i}", "p", tenant="acme") for i in range(6)]
        for task in tasks:
            core.submit(task, 0.0)
        core.cancel("t2", 0.0)
        core.cancel("t0", 0.0)
        core.add_worker("w", ["p"], 10)
        assert [t.id for _, t in core.dispatch(0.0)] == ["t1", "t3", "t4", "t5"]
        assert all(t._next is None for t in tasks)


def test_the_busiest_tenants_are_found_a_step_at_a_time():
    core = SchedulerCore([PoolSettings("p", fair_share=True)])
    for tenant in range(40):
        for n in range(tenant % 9):
            core.submit(Task(f"{tenant}-{n}", "p", tenant=f"t{tenant}"), 0.0)
    core.submit(Task("untenanted", "p"), 0.0)
    steps = list(core.busiest_tenants("p", 5, 7))
    assert steps[:-1] == [None] * (len(steps) - 1) and len(steps) == 6  # 36 tenants with tasks, 7 at a time
    # The most tasks first; among equals (t8, t17, t26, t35 have 8 each), the first seen.
    assert steps[-1] == ["t8", "t17", "t26", "t35", "t7"]
    listed = core.stats({"p": steps[-1]})["p"]
    assert list(listed["tenants"]) == steps[-1] and listed["tenant_count"] == 36
    assert len(core.stats(limit=10)["p"]["tenants"]) == 10
    assert len(core.stats()["p"]["tenants"]) == 36
