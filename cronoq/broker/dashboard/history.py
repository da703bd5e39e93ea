"""Each pool's shares over the last minutes, for the tenants view's chart: a bounded ring of periodic samples.

The dashboard samples the broker's stats every SAMPLE_INTERVAL seconds (on a
timer of the loop, never on a dispatch; a pool per turn of the loop) and keeps, per pool, the last
HISTORY_SAMPLES samples (ten minutes). A sample holds the pool's dispatch
count and, for at most HISTORY_TENANTS top-level nodes of its tenant tree
(the most active), the dispatch count of the node's subtree and the
weighted share its weights promised it at that moment (`tenant_rows`, the
rule of the tenants table). A token pinned to a tenant is shown its own node
only, which need be neither top-level nor among the busiest, so a sample
also follows, for at most HISTORY_PINNED of the nodes tokens are pinned to
(the most active), the dispatch count of the node's subtree and its
weighted share. So the memory is bounded by pools × samples × (tenants +
pinned nodes) however long the broker runs and however many tenants it
meets.

A point of the served series gives, over the SMOOTHING_SAMPLES samples
before it (about 10 s), the pool's dispatches per second and each node's
part of those dispatches. Counts are cumulative in the samples, so a point
is a difference of two samples: a node missing from the older one (it was
not among the busiest then) has no share at that point, rather than a
wrong one. No I/O and no clock here: the time is an argument.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable

from cronoq.broker.dashboard.tables import tenant_rows

SAMPLE_INTERVAL = 5.0
"""Seconds between samples: a sample walks the tenants the stats list (up to 1,000 a pool, a few ms of the loop each
pool, in a turn of its own), so not every second."""
HISTORY_SECONDS = 600.0
"""How far back the chart reaches."""
HISTORY_SAMPLES = int(HISTORY_SECONDS / SAMPLE_INTERVAL) + 1
HISTORY_TENANTS = 8
"""Top-level nodes per pool a sample follows (the most active): the lines a small chart can tell apart."""
SMOOTHING_SAMPLES = 2
"""Sample intervals a point's share and rate are measured over (10 s): over less, a few dispatches swing a share by
tens of percent."""
HISTORY_PINNED = 32
"""Nodes a sample follows per pool for the tokens pinned to them (the most active, when tokens pin more)."""
HISTORY_POOLS = 64
"""Pools followed (by name): pools come from the config, this only bounds a config of thousands."""


@dataclass(frozen=True)
class Sample:
    """One pool at one moment: cumulative dispatches, and per followed node (cumulative dispatches of its subtree,
    its weighted share then; None in a pool without fair sharing)."""

    at: float
    dispatched: int
    nodes: dict[str, tuple[int, float | None]]
    pinned: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    """The same for the nodes tokens are pinned to, each with its whole subtree: what such a token is shown."""


class ShareHistory:
    """The ring of samples per pool; `sample` adds one from a stats map, `series` serves them."""

    def __init__(self, samples: int = HISTORY_SAMPLES, tenants: int = HISTORY_TENANTS) -> None:
        self.size = samples
        self.tenants = tenants
        self._rings: dict[str, deque[Sample]] = {}
        self._fair: dict[str, bool] = {}
        # Each pool's per-tenant dispatch counts at the last sample: which tenants dispatched since (they want work).
        self._last_counts: dict[str, dict[str, int]] = {}
        self.version = 0
        """Samples taken so far: the series change only when it does (a reader may keep what it made of them)."""

    def sample(self, now: float, stats: dict[str, Any], weight_of: Callable[[str, str], float],
               pins: AbstractSet[str] = frozenset()) -> None:
        """Add a sample of each pool of `stats` (a stats map) taken at `now`; `weight_of(pool, node)` is the configured
        weight of a node the stats do not list; `pins`: the tenants tokens are pinned to."""
        pools = stats.get("pools", {})
        for name in self.followed(pools):
            self.sample_pool(now, name, pools[name], weight_of, pins)

    def followed(self, pools: dict[str, Any]) -> list[str]:
        """Which pools of a stats map's `pools` to sample, and forget those no longer in it (they left the config).
        A caller sampling a pool at a time (Dashboard) calls `sample_pool` for each."""
        for name in [name for name in self._rings if name not in pools]:
            del self._rings[name], self._fair[name], self._last_counts[name]
            self.version += 1
        return sorted(pools)[:HISTORY_POOLS]

    def sample_pool(self, now: float, name: str, pool: dict[str, Any], weight_of: Callable[[str, str], float],
                    pins: AbstractSet[str] = frozenset()) -> None:
        """Add a sample of one pool (its part of a stats map) taken at `now`; `pins`: the tenants tokens are pinned
        to, whose nodes are followed for those tokens' charts."""
        counts = {tenant: t["dispatched"] for tenant, t in pool.get("tenants", {}).items()}
        before = self._last_counts.get(name, {})
        recent = {tenant: n - before[tenant] if before.get(tenant, n + 1) <= n else n
                  for tenant, n in counts.items()}
        top, top_recent = _top_level(pool, recent, lambda node: weight_of(name, node))
        rows = tenant_rows(top, top_recent, lambda node: 1.0, lambda node: 0.0, self.tenants)
        nodes = {row["tenant"]: (row["dispatched"], row["weighted_share"]) for row in rows}
        pinned = _pinned_nodes(pool, counts, recent, pins, HISTORY_PINNED) if pins else {}
        ring = self._rings.setdefault(name, deque(maxlen=self.size))
        ring.append(Sample(now, pool["dispatched"], nodes, pinned))
        self._fair[name] = bool(pool.get("fair"))
        self._last_counts[name] = counts
        self.version += 1

    def pools(self) -> list[str]:
        return sorted(self._rings)

    def series(self, pool: str, pinned: str | None = None) -> dict[str, Any] | None:
        """The chart's data for `pool` (None: not followed): `points`, oldest first, each with `at`, `rate`
        (dispatches per second over the point's span), `dispatches` (in that span) and per node `share` and
        `weighted_share`. With `pinned` (the tenant the viewer's token is pinned to), the one node is the pinned
        one, its whole subtree counted, and the rate, share and weighted share are of its dispatches alone: nothing
        of the others is told. A span at either end of which it was not followed has no point for it."""
        ring = self._rings.get(pool)
        if ring is None:
            return None
        samples = list(ring)
        points = []
        for index in range(1, len(samples)):
            old, new = samples[max(0, index - SMOOTHING_SAMPLES)], samples[index]
            span = new.at - old.at
            if span <= 0:
                continue
            if pinned is None:
                names = list(new.nodes)
                deltas = {n: _delta(new.nodes[n][0], old.nodes.get(n)) for n in names}
                total = _delta(new.dispatched, (old.dispatched, None))
                promised = {n: new.nodes[n][1] for n in names}
            else:
                ours, before = new.pinned.get(pinned), old.pinned.get(pinned)
                if ours is None or before is None:
                    continue  # not among the nodes followed then: no figure rather than a wrong one
                names = [pinned]
                deltas = {pinned: _delta(ours[0], before)}
                total = deltas[pinned]
                promised = _rescaled({pinned: ours[1]})
            nodes = {n: {"share": None if deltas[n] is None or not total else round(deltas[n] / total, 4),
                         "weighted_share": None if promised[n] is None else round(promised[n], 4)} for n in names}
            points.append({"at": new.at, "rate": round(max(total or 0, 0) / span, 3), "dispatches": total,
                           "tenants": nodes})
        return {"pool": pool, "fair": self._fair.get(pool, False), "interval": SAMPLE_INTERVAL,
                "window": HISTORY_SECONDS, "points": points}


def _top_level(pool: dict[str, Any], recent: dict[str, int],
               weight_of: Callable[[str], float]) -> tuple[dict[str, Any], dict[str, int]]:
    """The pool with its tenants summed into their top-level nodes, and their recent dispatches likewise. The top
    level's weighted shares depend only on which top-level nodes want work and on their weights, so the shared rule
    (`tenant_rows`) gives the same shares from these few nodes as from the whole tree, at a fraction of the cost."""
    listed = pool.get("tenants", {})
    ancestors = pool.get("tree_nodes", {})  # the core's entries of nodes without tasks of their own, when it lists them
    top: dict[str, dict[str, Any]] = {}
    top_recent: dict[str, int] = {}
    for name, t in listed.items():
        root = name.partition("/")[0]
        node = top.get(root)
        if node is None:
            entry = listed.get(root) or ancestors.get(root) or {}
            weight = entry.get("weight", 1.0 if root == "" else weight_of(root))
            node = top[root] = {"weight": weight, "queued": 0, "delayed": 0, "running": 0, "dispatched": 0, "lag": 0.0}
            if "weighted_share" in entry:  # the core's own figure for the node: the summed node's, whole and own
                node["weighted_share"] = node["own_weighted_share"] = entry["weighted_share"]
                node["own_lag"] = 0.0
        for key in ("queued", "delayed", "running", "dispatched"):
            node[key] += t[key]
        top_recent[root] = top_recent.get(root, 0) + recent.get(name, 0)
    return {**pool, "tenants": top, "ceilings": {}}, top_recent


def _pinned_nodes(pool: dict[str, Any], counts: dict[str, int], recent: dict[str, int], pins: AbstractSet[str],
                  most: int) -> dict[str, tuple[int, float | None]]:
    """For the `most` most active of `pins` (tenants' nodes): the dispatch count of the node's subtree and the node's
    weighted share (None in a pool without fair sharing, or for a node the stats do not list). Each listed tenant is
    walked up its own path, so the cost is the tenants times their depth, not times the pins. A pin no listed tenant
    falls under counts 0 when the stats list all the pool's tenants, and is left out when they list only the busiest
    (its tenants may be among those left out)."""
    listed, ancestors = pool.get("tenants", {}), pool.get("tree_nodes", {})
    dispatched: dict[str, int] = {}
    active: dict[str, int] = {}
    if pool.get("tenant_count", len(listed)) <= len(listed):
        dispatched = dict.fromkeys(pins, 0)
        active = dict.fromkeys(pins, 0)
    for tenant, count in counts.items():
        node = tenant
        while True:
            if node in pins:
                dispatched[node] = dispatched.get(node, 0) + count
                active[node] = active.get(node, 0) + recent.get(tenant, 0)
            cut = node.rfind("/")
            if cut < 0:
                break
            node = node[:cut]
    chosen = heapq.nsmallest(most, dispatched, key=lambda node: (-active[node], node))
    fair = bool(pool.get("fair"))
    shares = {}
    for node in chosen:
        entry = listed.get(node) or ancestors.get(node) or {}
        share = entry.get("weighted_share") if fair else None
        shares[node] = (dispatched[node], share)
    return shares


def _delta(now_count: int, before: tuple[int, float | None] | None) -> int | None:
    """Dispatches between two cumulative counts; None when the older sample did not follow the node. A count that
    went down was started again (the core forgets a tenant idle long enough): all of it is recent."""
    if before is None:
        return None
    return now_count if before[0] > now_count else now_count - before[0]


def _rescaled(promised: dict[str, float | None]) -> dict[str, float | None]:
    """Weighted shares among these nodes alone (each over their sum), so they tell nothing of the others."""
    total = sum(share for share in promised.values() if share)
    return {n: (share / total if share and total else share) for n, share in promised.items()}


__all__ = ["HISTORY_PINNED", "HISTORY_SAMPLES", "HISTORY_SECONDS", "HISTORY_TENANTS", "SAMPLE_INTERVAL", "ShareHistory"]
