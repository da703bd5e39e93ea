"""SchedulerCore against the reference model with tenant trees and ceilings.

The same state machine as test_against_model.py (every operation, random
interleavings, identical decisions and counts demanded after every step),
with tenants at three levels, weights on inner nodes, and ceilings on nodes
at every level, some of them reloaded while tasks run. On top of agreeing
with the model, the core must never start a task of a node at its ceiling.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cronoq.core import DELAYED, QUEUED, PoolSettings, SchedulerCore
from tests.core import test_against_model as flat
from tests.core.model import Model, prefixes

TENANTS = [None, "a", "a/x", "a/y", "a/x/p", "a/x/q", "b", "b/z", "c"]
NODES = sorted({n for t in TENANTS for n in prefixes(t)}, key=lambda n: (n is not None, n or ""))

WEIGHTS = [
    {"a": 3, "b": 1, "a/x": 2, "a/y": 1},
    {"a/x/p": 4, "a/x": 0.5, "c": 2},
    {"b/z": 3},
]
LIMITS = [
    ({"a": 2}, None),
    ({"a/x": 1, "b": 1}, None),
    ({"a/x/p": 1, "a/y": 1}, 2),
    ({}, 1),
]


RATES = [{}, {"a": 2, "a/x": 0.5}, {"a/x/p": 1, "b": 3}]
MINIMUMS = [{}, {"b": 1, "a/y": 1}, {"a": 1, "a/x": 1}]


@st.composite
def tree_pool_settings(draw: st.DrawFn, name: str) -> PoolSettings:
    kind = draw(st.sampled_from(["weights", "fair_share", "limits", "plain", "rated"]))
    cap = draw(st.sampled_from([None, None, 2, 3]))
    if kind == "plain":
        return PoolSettings(name, max_in_flight=cap)
    if kind == "rated":
        # Rates and minimums on a node and its ancestors at once, with ceilings, in either unit.
        limits, default_limit = draw(st.sampled_from(LIMITS))
        return PoolSettings(
            name,
            tenant_weights=draw(st.sampled_from(WEIGHTS)),
            tenant_limits=limits,
            default_tenant_limit=default_limit,
            tenant_rates=draw(st.sampled_from(RATES)),
            tenant_minimums=draw(st.sampled_from(MINIMUMS)),
            share_by=draw(st.sampled_from(["dispatches", "cost"])),
        )
    weights = draw(st.sampled_from(WEIGHTS)) if kind == "weights" else {}
    limits, default_limit = draw(st.sampled_from(LIMITS)) if kind != "fair_share" else ({}, None)
    return PoolSettings(
        name,
        tenant_weights=weights,
        fair_share=kind == "fair_share",
        max_in_flight=cap,
        tenant_limits=limits,
        default_tenant_limit=default_limit,
        default_weight=draw(st.sampled_from([None, None, 2])),
    )


INITIAL = [
    PoolSettings("fair", tenant_weights={"a": 3, "b": 1, "a/x": 2}, tenant_limits={"a/x": 2, "b": 1}),
    PoolSettings("plain", max_in_flight=2),
    PoolSettings("share", fair_share=True, default_tenant_limit=2, tenant_limits={"a/x/p": 1}),
]


class TreeVersusModel(flat.CoreVersusModel):
    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        self.core = SchedulerCore(INITIAL)
        self.model = Model(list(INITIAL))
        self.now = 0.0
        self.next_id = 0
        self.submitted: set[str] = set()
        self.ended: dict[str, str] = {}
        self.dispatches: dict[str, int] = {}
        for worker, pools, slots in (("w0", ["fair", "plain", "share"], 3), ("w1", ["fair"], 2)):
            self.core.add_worker(worker, pools, slots)
            self.model.add_worker(worker, pools, slots)

    @rule(
        pool=st.sampled_from(flat.POOL_NAMES + ["nope"]),
        tenant=st.sampled_from(TENANTS),
        priority=st.sampled_from([0, 1, 2, 2, 2, 3]),
        deadline=st.none() | st.sampled_from(flat.OFFSETS),
        delay=st.none() | st.sampled_from(flat.OFFSETS),
        attempts=st.sampled_from([0, 0, 0, 2]),
        data=st.data(),
    )
    def submit(self, pool, tenant, priority, deadline, delay, attempts, data) -> None:
        self._submit(pool, tenant, priority, deadline, delay, attempts, data)

    @rule(pool=st.sampled_from(flat.POOL_NAMES), tenants=st.lists(st.sampled_from(TENANTS), min_size=2, max_size=12))
    def burst(self, pool, tenants) -> None:
        for tenant in tenants:
            self._submit(pool, tenant, 2, None, None, 0, None)

    @rule(pool=st.sampled_from(flat.POOL_NAMES), tenant=st.sampled_from(TENANTS), priority=st.integers(0, 3))
    def submit_due_now(self, pool, tenant, priority) -> None:
        self._submit(pool, tenant, priority, 0.0, None, 0, None)

    @rule(
        pool=st.sampled_from(flat.POOL_NAMES),
        tenant=st.sampled_from(TENANTS),
        deadline=st.sampled_from([3.0, 5.0, 9.0]),
        n=st.integers(1, 4),
    )
    def deadline_burst(self, pool, tenant, deadline, n) -> None:
        """Deadline tasks of one node: they must wait while it is capped, and block nobody."""
        for _ in range(n):
            self._submit(pool, tenant, 2, deadline, None, 0, None)

    @rule(data=st.data(), n=st.integers(1, 3))
    def grow(self, data, n) -> None:
        """A sub-tenant appears under a tenant that has tasks waiting (a leaf may become a parent)."""
        waiting = sorted(
            (t.id for t in self.model.tasks.values() if t.state == "queued" and t.tenant and t.deadline is None),
        )
        if not waiting:
            return
        parent = self.model.tasks[data.draw(st.sampled_from(waiting))]
        if parent.tenant.count("/") >= 6:
            return
        event("a sub-tenant appears under a waiting tenant")
        for _ in range(n):
            self._submit(parent.pool, f"{parent.tenant}/g", parent.priority, None, None, 0, None)

    @rule(data=st.data(), deadline=st.sampled_from([None, 3.0, 7.0]))
    def under_a_capped_node(self, data, deadline) -> None:
        """Work arrives for a capped node: it must wait, and block nobody."""
        capped = [(p, n) for p in self.model.accepting() for n in NODES if self.model._capped(p, n)]
        if not capped:
            return
        pool, node = data.draw(st.sampled_from(capped))
        tenant = data.draw(st.sampled_from([t for t in TENANTS if node in prefixes(t)]))
        event("work arrives for a capped node")
        for _ in range(data.draw(st.integers(1, 3))):
            self._submit(pool, tenant, data.draw(st.sampled_from([1, 2])), deadline, None, 0, None)

    @rule(limit=st.sampled_from([None, None, 1, 2, 3]), expire_first=st.booleans())
    def dispatch(self, limit, expire_first) -> None:
        before = self._running_per_node()
        super().dispatch(limit, expire_first)
        for (name, node), running in self._running_per_node().items():
            if running > before.get((name, node), 0):
                ceiling = self.model.pools[name].settings.limit(node)
                assert running <= ceiling, f"{name}: {node} started a task over its ceiling {ceiling}"

    @rule(data=st.data())
    def configure(self, data) -> None:
        keep = data.draw(st.lists(st.sampled_from(flat.POOL_NAMES), min_size=1, max_size=3, unique=True))
        pools = [data.draw(tree_pool_settings(name)) for name in keep]
        self.core.configure(pools, self.now)
        self.model.clock = self.now  # the core reads the buckets at the reload's `now`
        self.model.configure(pools)

    def _running_per_node(self) -> dict:
        return {
            (name, node): self.model._running(name, node)
            for name, mp in self.model.pools.items()
            for node in NODES
            if mp.settings.limit(node) is not None
        }

    def check_stats(self, stats: dict) -> None:
        super().check_stats(stats)
        self.ceilings_agree(stats)

    def ceilings_agree(self, stats: dict) -> None:
        for name, mp in self.model.pools.items():
            for key, c in stats[name]["ceilings"].items():
                node = key or None
                assert c["limit"] == mp.settings.limit(node)
                assert c["running"] == self.model._running(name, node), (name, node)
                # "capped" is the ceiling alone; an empty rate bucket shows under "rates" (below).
                at_limit = c["limit"] is not None and c["running"] >= c["limit"]
                assert c["capped"] == at_limit, (name, node)
                assert (c["capped_since"] is not None) == c["capped"]
            for key, r in stats[name]["rates"].items():
                node = key or None
                assert r["rate"] == mp.settings.tenant_rates[node]
                # The core says "limited" once a dispatch or a wake-up found the bucket empty, and clears it at
                # the refill time it set: it may only say so while the model's bucket is empty at the clock.
                if r["limited"]:
                    assert self.model._next_start(name, node) > self.model.clock, (name, node)

    @invariant()
    def tree_backlogs_agree(self) -> None:
        # max_tenant_backlog caps a top-level tenant's whole tree: its count must follow every move.
        waiting = collections.Counter(
            (t.pool, t.tenant.split("/")[0] if t.tenant else None)
            for t in self.model.tasks.values() if t.state in (QUEUED, DELAYED))
        for name in self.model.pools:
            for node in NODES:
                top = node.split("/")[0] if node else None
                assert self.core.tree_backlog(name, node) == waiting[name, top], (name, node)


TreeVersusModel.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTreeVersusModel = pytest.mark.long_running(TreeVersusModel.TestCase)
