"""What the dashboard shows, as plain data: pure functions of the broker's statistics.

No I/O and no clock: the time is an argument. The input is what
`Broker.stats()` already returns (the counts the core keeps as it goes, at
most STATS_TENANTS tenants per pool); the output is bounded whatever the
broker holds: DASHBOARD_TENANTS tenants per pool (the most active, with
their ancestors in the tenant tree), DASHBOARD_WORKERS workers, and the
failures ring (cronoq.broker.failures).

Shares, per row of the tenant tree:

- `share`: the row's part of the pool's dispatches over the recent window
  (`DispatchHistory`), its whole subtree counted;
- `weighted_share`: what the weights promise it now, as the broker's core
  computes it for every view (the stats' `weighted_share`, or `tree_nodes`
  for an ancestor with no tasks of its own; docs/scheduling.md, "Weighted
  share"). None in a pool without fair sharing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

# Tenants per pool the overview lists (the most active), their ancestors added.
DASHBOARD_TENANTS = 40
# Workers the overview lists (by name; the count covers all).
DASHBOARD_WORKERS = 200
# Seconds over which `share` counts dispatches (about: the window starts at a snapshot).
SHARE_WINDOW = 10.0

NO_TENANT = ""  # how stats name the untenanted tasks, which form one top-level node of weight 1

Counts = dict[str, dict[str, int]]  # pool -> tenant -> dispatched


class DispatchHistory:
    """Each pool's per-tenant dispatch counts at recent snapshots, to tell recent dispatches from old ones.

    Holds the samples of the last SHARE_WINDOW seconds and one before them (the baseline), each at most the
    tenants a `stats` lists: bounded by the snapshot rate, never by the broker's history.
    """

    def __init__(self, window: float = SHARE_WINDOW) -> None:
        self.window = window
        self._samples: deque[tuple[float, Counts]] = deque()

    def recent(self, now: float, counts: Counts) -> tuple[Counts, float | None]:
        """Dispatches per pool and tenant since the baseline, and the seconds that covers (None: since the start,
        for the first snapshot); then `counts` becomes a sample."""
        samples = self._samples
        while len(samples) >= 2 and samples[1][0] <= now - self.window:
            samples.popleft()  # the next one is old enough to be the baseline
        if samples:
            since, before = samples[0]
            recent = {pool: {tenant: _delta(n, before.get(pool, {}).get(tenant)) for tenant, n in tenants.items()}
                      for pool, tenants in counts.items()}
            covers: float | None = now - since
        else:
            recent, covers = counts, None
        samples.append((now, counts))
        return recent, covers


def _delta(now_count: int, before: int | None) -> int:
    # A tenant idle long enough is forgotten by the core and starts again from 0: then all its count is recent.
    return now_count if before is None or before > now_count else now_count - before


def dispatch_counts(stats: dict[str, Any]) -> Counts:
    """The per-tenant dispatch counters of a stats map."""
    return {name: {tenant: t["dispatched"] for tenant, t in pool["tenants"].items()}
            for name, pool in stats.get("pools", {}).items()}


@dataclass
class _Node:
    """A node of a pool's tenant tree, with the counts of its whole subtree."""

    name: str
    queued: int = 0
    delayed: int = 0
    running: int = 0
    dispatched: int = 0
    recent: int = 0

    @property
    def wants(self) -> bool:
        return bool(self.queued or self.running or self.recent)

    @property
    def activity(self) -> int:
        return self.queued + self.running + self.recent


def _parent(node: str) -> str | None:
    return node.rpartition("/")[0] or None if "/" in node else None


def tenant_rows(pool: dict[str, Any], recent: dict[str, int], weight_of: Callable[[str], float],
                lag_of: Callable[[str], float], limit: int = DASHBOARD_TENANTS) -> list[dict[str, Any]]:
    """The rows of a pool's tenant tree for its `limit` most active tenants and their ancestors, in tree order.

    `pool` is one pool of a stats map, `recent` its tenants' dispatches in the window; `weight_of` and
    `lag_of` give a node's weight and lag when the stats do not list it (an ancestor with no tasks of its own).
    """
    tenants: dict[str, dict[str, Any]] = pool.get("tenants", {})
    nodes: dict[str, _Node] = {}
    children: dict[str | None, list[str]] = {}
    for name, t in tenants.items():
        got = recent.get(name, 0)
        node_name: str | None = name
        while node_name is not None:
            node = nodes.get(node_name)
            if node is None:
                node = nodes[node_name] = _Node(node_name)
                children.setdefault(_parent(node_name), []).append(node_name)
            node.queued += t["queued"]
            node.delayed += t["delayed"]
            node.running += t["running"]
            node.dispatched += t["dispatched"]
            node.recent += got
            node_name = _parent(node_name)

    def weight(name: str) -> float:
        listed = tenants.get(name)
        return 1.0 if name == NO_TENANT else float(listed["weight"]) if listed is not None else weight_of(name)

    ancestors: dict[str, dict[str, Any]] = pool.get("tree_nodes", {})

    def promised(name: str) -> float:
        entry = tenants.get(name) or ancestors.get(name) or {}
        return float(entry.get("weighted_share", 0.0))
    total_recent = sum(node.recent for name, node in nodes.items() if _parent(name) is None)
    shown = sorted(tenants, key=lambda name: (-nodes[name].activity, -nodes[name].dispatched, name))[:limit]
    keep: set[str] = set()
    for name in shown:
        node_name: str | None = name
        while node_name is not None and node_name not in keep:
            keep.add(node_name)
            node_name = _parent(node_name)
    ceilings = pool.get("ceilings", {})
    rates, minimums = pool.get("rates") or {}, pool.get("minimums") or {}
    rows: list[dict[str, Any]] = []

    def visit(parent: str | None, depth: int) -> None:
        for name in sorted(n for n in children.get(parent, ()) if n in keep):
            node = nodes[name]
            listed = tenants.get(name)
            ceiling = ceilings.get(name)
            rows.append({
                "tenant": name,
                "label": name.rpartition("/")[2] if name else "(none)",
                "depth": depth,
                "weight": weight(name),
                "queued": node.queued,
                "delayed": node.delayed,
                "running": node.running,
                "dispatched": node.dispatched,
                "recent_dispatches": node.recent,
                "share": node.recent / total_recent if total_recent else 0.0,
                "weighted_share": promised(name) if pool.get("fair") else None,
                "lag": float(listed["lag"]) if listed is not None else lag_of(name),
                "ceiling": None if ceiling is None else {
                    "limit": ceiling["limit"], "running": ceiling["running"], "capped": ceiling["capped"]},
                "rate": _rate(rates.get(name)),
                "minimum": _minimum(minimums.get(name)),
            })
            if name != NO_TENANT:
                visit(name, depth + 1)

    visit(None, 0)
    return rows


def _rate(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A node's rate as a row shows it: starts per second, whether it is out of tokens, and for how long."""
    if entry is None:
        return None
    return {"rate": entry["rate"], "limited": bool(entry.get("limited")), "next_start_in": entry.get("next_start_in")}


def _minimum(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A node's minimum as a row shows it: the guarantee, its running tasks, and whether it is under it."""
    if entry is None:
        return None
    return {"minimum": entry["minimum"], "running": entry["running"], "under": bool(entry.get("under"))}


def pool_view(name: str, pool: dict[str, Any], recent: dict[str, int], weight_of: Callable[[str], float],
              lag_of: Callable[[str], float], limit: int = DASHBOARD_TENANTS) -> dict[str, Any]:
    """One pool of the overview: its counts and flags, and its tenant tree's rows."""
    rows = tenant_rows(pool, recent, weight_of, lag_of, limit)
    return {
        "name": name,
        "paused": pool["paused"],
        "draining": pool["draining"],
        "fair": pool["fair"],
        "share_by": pool.get("share_by", "dispatches"),
        "share_unit": pool.get("share_unit", "dispatches"),
        "max_in_flight": pool["max_in_flight"],
        "queued": pool["queued"],
        "delayed": pool["delayed"],
        "running": pool["running"],
        "dispatched": pool["dispatched"],
        "dispatch_rate": pool.get("dispatch_rate", 0.0),
        "workers": pool.get("workers", 0),
        "tenant_count": pool.get("tenant_count", len(pool.get("tenants", {}))),
        "tenants": rows,
    }


def worker_rows(workers: Iterable[dict[str, Any]], now: float, limit: int = DASHBOARD_WORKERS) -> list[dict[str, Any]]:
    """The first `limit` workers by name, each with its pools, slots used of its concurrency, and the seconds since
    the broker last heard from it."""
    rows = sorted(workers, key=lambda w: w["name"])[:limit]
    return [{**{key: value for key, value in w.items() if key != "last_seen_at"},
             "last_seen": max(0.0, now - w["last_seen_at"])} for w in rows]


def failure_row(failure: Any, *, with_traceback: bool = False) -> dict[str, Any]:
    """A failure of the ring as the overview lists it (the traceback only when asked for one)."""
    row = {"id": failure.id, "pool": failure.pool, "tenant": failure.tenant, "error_type": failure.error_type,
           "message": failure.message, "attempts": failure.attempts, "finished_at": failure.finished_at}
    if with_traceback:
        row["traceback"] = failure.traceback
    return row
