"""`SchedulerCore.restore`: tasks recovered in bulk are scheduled exactly as if each had been submitted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core import PoolSettings, SchedulerCore, Task
from cronoq.errors import InvalidArgument, NotFound

POOLS = [PoolSettings("fifo"), PoolSettings("fair", tenant_weights={"a": 3, "b": 1})]

task_specs = st.lists(
    st.tuples(
        st.sampled_from(["fifo", "fair"]),
        st.sampled_from([None, "a", "b", "c"]),
        st.integers(0, 3),
        st.sampled_from([None, None, 5.0, 20.0, 200.0]),  # deadline
        st.sampled_from([None, None, None, 50.0, 150.0]),  # not_before
        st.integers(0, 3),  # attempts so far
    ),
    max_size=60,
)


def _tasks(specs: list[tuple]) -> list[Task]:
    tasks = []
    for n, (pool, tenant, priority, deadline, not_before, attempts) in enumerate(specs):
        task = Task(f"t{n}", pool, tenant=tenant, priority=priority, deadline=deadline, not_before=not_before)
        task.attempts = attempts
        tasks.append(task)
    return tasks


def _run(core: SchedulerCore) -> list[tuple]:
    """Everything that happens over time: expiries and dispatches, in order, with the stats at the end."""
    core.add_worker("w", ["fifo", "fair"], 2)
    events: list[tuple] = []
    for now in (10.0, 30.0, 60.0, 100.0, 160.0, 250.0):
        events += [("expired", task.id) for task in core.expire(now)]
        while True:
            got = core.dispatch(now)
            if not got:
                break
            for worker, task in got:
                events.append(("ran", task.id, task.attempts))
                core.finish(task.id, now, worker_id=worker, attempt=task.attempts, state="succeeded")
                core.grant(worker)
    return events + [("stats", repr(core.stats()))]


@settings(max_examples=200, deadline=None)
@given(task_specs, st.booleans())
def test_restore_schedules_as_submitting_one_by_one_would(specs, indexed):
    one_by_one, bulk = SchedulerCore(POOLS), SchedulerCore(POOLS)
    for task in _tasks(specs):
        one_by_one.submit(task, 0.0)
    restored = _tasks(specs)
    # With an index, the caller's map (here holding one more task the core never had) serves as the core's.
    index = {task.id: task for task in restored + [Task("stranger", "fifo")]} if indexed else None
    bulk.restore(restored, 0.0, index=index)
    assert len(bulk) == len(one_by_one) and sorted(t.id for t in bulk.tasks()) == sorted(t.id for t in one_by_one.tasks())
    assert "stranger" not in bulk and bulk.get("stranger") is None
    if specs:
        assert bulk.get("t0") is restored[0] and "t0" in bulk
    assert _run(bulk) == _run(one_by_one)
    assert len(bulk) == len(one_by_one) and list(bulk.tasks()) == [] == list(one_by_one.tasks())


def test_a_core_restored_with_an_index_takes_submits_and_refuses_a_held_id():
    core = SchedulerCore(POOLS)
    restored = [Task("a", "fifo"), Task("b", "fifo")]
    core.restore(restored, 0.0, index={task.id: task for task in restored})
    with pytest.raises(InvalidArgument, match="already queued or running"):
        core.submit(Task("a", "fifo"), 0.0)
    core.submit(Task("c", "fifo"), 0.0)
    assert len(core) == 3 and core.cancel("a", 0.0) is restored[0] and len(core) == 2 and "a" not in core
    core.add_worker("w", ["fifo"], 5)
    assert [task.id for _, task in core.dispatch(0.0)] == ["b", "c"]


class _CountingIndex(dict):
    """A caller's map of tasks by id that counts the core's lookups in it."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_a_core_stops_asking_the_index_once_every_restored_task_has_left():
    core = SchedulerCore(POOLS)
    restored = [Task("a", "fifo"), Task("b", "fifo")]
    index = _CountingIndex({task.id: task for task in restored})
    core.restore(restored, 0.0, index=index)
    core.submit(Task("c", "fifo"), 0.0)
    assert index.lookups > 0  # while restored tasks are live, a new id must not be one of theirs
    core.add_worker("w", ["fifo"], 5)
    for worker, task in core.dispatch(0.0)[:2]:
        core.finish(task.id, 0.0, worker_id=worker, attempt=task.attempts, state="succeeded")
    asked = index.lookups
    core.submit(Task("d", "fifo"), 0.0)
    assert core.get("a") is None and core.get("c") is not None and "b" not in core and len(core) == 2
    assert index.lookups == asked  # every live task is the core's own now: the index has nothing to add
    with pytest.raises(InvalidArgument, match="already queued or running"):
        core.submit(Task("c", "fifo"), 0.0)

    empty = _CountingIndex()
    fresh = SchedulerCore(POOLS)
    fresh.restore([], 0.0, index=empty)  # a broker starting on an empty data_dir
    fresh.submit(Task("x", "fifo"), 0.0)
    assert fresh.get("y") is None and fresh.get("x") is not None and empty.lookups == 0


def test_restore_refuses_an_unknown_pool_or_a_held_id_and_takes_nothing_on_an_unknown_pool():
    core = SchedulerCore(POOLS)
    with pytest.raises(NotFound, match="nope"):
        core.restore([Task("x", "fifo"), Task("y", "nope")], 0.0)
    assert len(core) == 0
    core.submit(Task("x", "fifo"), 0.0)
    with pytest.raises(InvalidArgument, match="twice"):
        core.restore([Task("x", "fifo")], 0.0)


def test_a_core_keeping_its_tasks_in_the_callers_map_schedules_as_one_with_its_own():
    from cronoq.core.shards import ShardedMap

    own, keeping = SchedulerCore(POOLS), SchedulerCore(POOLS)
    records: ShardedMap[str, Task] = ShardedMap(split_at=4)  # splits early: both shapes of the map are used
    keeping.keep_tasks_in(records)
    specs = [("fifo", None, 2, None, None, 0), ("fair", "a", 2, 20.0, None, 0), ("fair", "b", 1, None, 50.0, 1),
             ("fifo", None, 0, None, None, 0), ("fair", "a", 2, None, None, 0), ("fair", "b", 2, None, None, 0)]
    for task in _tasks(specs):
        own.submit(task, 0.0)
    kept = _tasks(specs)
    for task in kept:
        keeping.submit(task, 0.0)
    assert set(records) == {task.id for task in kept} and len(keeping) == len(own) == 6
    with pytest.raises(InvalidArgument, match="already queued or running"):
        keeping.submit(Task("t0", "fifo"), 0.0)
    assert _run(keeping) == _run(own)
    # Ended tasks stay in the caller's map (the caller lets them go), and the core no longer counts or finds them.
    assert set(records) == {task.id for task in kept} and len(keeping) == 0
    assert keeping.get("t0") is None and "t1" not in keeping and list(keeping.tasks()) == []
    again = Task("t0", "fifo")  # an ended task's id may be used again
    keeping.submit(again, 300.0)
    assert records["t0"] is again and keeping.get("t0") is again and len(keeping) == 1
    with pytest.raises(InvalidArgument, match="holds no task"):
        keeping.keep_tasks_in(ShardedMap())


def test_a_core_keeping_its_tasks_in_a_map_restores_into_it():
    from cronoq.core.shards import ShardedMap

    core = SchedulerCore(POOLS)
    records: ShardedMap[str, Task] = ShardedMap()
    core.keep_tasks_in(records)
    restored = [Task("a", "fifo"), Task("b", "fifo")]
    records.update({task.id: task for task in restored})
    core.restore(restored, 0.0, index=records)
    core.restore([Task("c", "fifo")], 0.0)  # without the map: the core puts them there
    assert sorted(records) == ["a", "b", "c"] and len(core) == 3 and core.get("c") is records["c"]
    with pytest.raises(InvalidArgument, match="takes that map or none"):
        core.restore([Task("d", "fifo")], 0.0, index={})
    core.add_worker("w", ["fifo"], 5)
    assert [task.id for _, task in core.dispatch(0.0)] == ["a", "b", "c"]


def test_queued_tasks_share_the_cores_strings_for_their_pool_and_tenant():
    # Names read from each message are strings of their own: a million queued tasks would hold a million copies.
    core = SchedulerCore(POOLS)
    first, second = Task("x", "".join(["fa", "ir"]), tenant="".join(["a", "/u"])), Task("y", "fair", tenant="a/u")
    core.submit(first, 0.0)
    core.submit(second, 0.0)
    assert first.pool == "fair" and first.pool is second.pool and first.tenant is second.tenant == "a/u"
    restored = [Task("r", "".join(["fi", "fo"])), Task("s", "fifo"), Task("t", "".join(["fa", "ir"]), tenant="a")]
    core.restore(restored, 0.0)
    assert restored[0].pool is restored[1].pool == "fifo" and restored[2].pool is first.pool
