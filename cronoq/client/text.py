"""Text views of the broker's statistics, for `cronoq status` and `cronoq top`.

Pure functions from the stats map (see `Broker.stats`) to text, so the same
frame can be printed once, refreshed live, or compared in a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cronoq.answers import clock_time, duration_text
from cronoq.pool import tenant_path

BAR_WIDTH = 20
CLASSES = ("critical", "high", "normal", "low")


def _tenant_name(tenant: str) -> str:
    return tenant if tenant else "(none)"


@dataclass
class TenantRow:
    """One row of a pool's tenant tree: a node (its whole subtree counted), or a node's own tasks beside its
    sub-tenants (`own`). `fair` is the weighted share the broker computes (None when it sent none, or the pool
    is not fair); `share` the row's part of the dispatches counted."""

    name: str  # the node's full name ("" for the untenanted tasks)
    label: str  # what the row shows: the last segment, indented by depth
    own: bool
    weight: float
    queued: int = 0
    running: int = 0
    dispatched: int = 0
    recent: int = 0
    share: float = 0.0
    fair: float | None = None
    lag: float | None = None


def _path(name: str) -> list[str]:
    """The nodes from the top down to tenant `name`, as the broker builds its tree (`tenant_path`)."""
    return [node or "" for node in tenant_path(name or None)]  # type: ignore[misc]


def tenant_tree(pool: dict[str, Any], previous: dict[str, Any] | None) -> list[TenantRow]:
    """A pool's tenants as the broker shares them: parents above their children (by name), a parent's own
    tasks as a row of their own (`own`) above its children, each row with its dispatches since `previous`
    (the last frame; else all so far) as a share of the pool's, and the broker's weighted share and lag."""
    tenants: dict[str, dict[str, Any]] = pool.get("tenants", {})
    ancestors: dict[str, dict[str, Any]] = pool.get("tree_nodes", {})
    before = (previous or {}).get("tenants", {})
    fair = bool(pool.get("fair"))
    children: dict[str | None, set[str]] = {}
    totals: dict[str, list[int]] = {}  # node -> [queued, running, dispatched, recent] of its subtree
    for name, t in tenants.items():
        recent = t["dispatched"] - before.get(name, {}).get("dispatched", 0)
        if recent < 0:  # the broker forgot an idle tenant and counts from 0 again
            recent = t["dispatched"]
        path = _path(name)
        for depth, node in enumerate(path):
            children.setdefault(path[depth - 1] if depth else None, set()).add(node)
            sums = totals.setdefault(node, [0, 0, 0, 0])
            for i, n in enumerate((t["queued"], t["running"], t["dispatched"], recent)):
                sums[i] += n
    total = sum(totals[node][3] for node in children.get(None, ()))
    rows: list[TenantRow] = []

    def number(entry: dict[str, Any] | None, key: str) -> float | None:
        value = None if entry is None else entry.get(key)
        return None if value is None else float(value)

    def visit(parent: str | None, depth: int) -> None:
        for node in sorted(children.get(parent, ())):
            listed = tenants.get(node)
            entry = listed if listed is not None else ancestors.get(node)
            queued, running, dispatched, recent = totals[node]
            weight = 1.0 if node == "" else number(entry, "weight")
            rows.append(TenantRow(
                node, "  " * depth + (node.rpartition("/")[2] if depth else _tenant_name(node)), False,
                weight if weight is not None else 1.0, queued, running, dispatched, recent,
                recent / total if total else 0.0, number(entry, "weighted_share") if fair else None,
                number(entry, "lag")))
            below = children.get(node)
            if below and listed is not None:
                rows.append(TenantRow(
                    node, "  " * (depth + 1) + node.rpartition("/")[2] + " (own)", True, 1.0, listed["queued"],
                    listed["running"], listed["dispatched"], recent - sum(totals[c][3] for c in below),
                    0.0, number(listed, "own_weighted_share") if fair else None, number(listed, "own_lag")))
                own = rows[-1]
                own.share = own.recent / total if total else 0.0
            if below:
                visit(node, depth + 1)

    visit(None, 0)
    return rows


def _percent(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.1%}"


def cluster_lines(stats: dict[str, Any]) -> list[str]:
    """The members of a cluster (from a client's merged stats), their pools, and which did not answer; nothing
    for a lone broker's stats."""
    members = stats.get("members")
    if not isinstance(members, dict) or "cluster" not in stats:
        return []
    lines = [f"cluster map {stats.get('cluster')}: {len(members)} member{'' if len(members) == 1 else 's'}"]
    for name, answer in members.items():
        if "unreachable" in answer:
            lines.append(f"  member {name}: UNREACHABLE ({answer['unreachable']}); its pools are not served")
            continue
        pools = sorted(pool for pool, p in answer.get("pools", {}).items() if not p.get("draining"))
        draining = sorted(pool for pool, p in answer.get("pools", {}).items() if p.get("draining"))
        drain_text = f", draining {', '.join(draining)}" if draining else ""
        lines.append(f"  member {name}: pools {', '.join(pools) or 'none'}{drain_text}; "
                     f"workers connected {answer.get('workers', 0)}")
    lines.append("")
    return lines


def status_text(stats: dict[str, Any]) -> str:
    """`cronoq status`: per pool, backlog by class and tenant, running, workers and shares (and, for a
    cluster, each member first)."""
    lines = cluster_lines(stats) + [f"workers connected: {stats.get('workers', 0)}"]
    if stats.get("tenant") is not None:  # the stats of a token pinned to a tenant (Broker's visible_stats)
        lines.append(f"as seen by a token pinned to {stats['tenant']}: the counts are of its subtree only")
    for name, pool in sorted(stats.get("pools", {}).items()):
        flags = [word for word, on in (("paused", pool.get("paused")), ("draining", pool.get("draining")),
                                       ("fair", pool.get("fair"))) if on]
        if pool.get("member"):
            flags.insert(0, f"member {pool['member']}")
        cap = pool.get("max_in_flight")
        lines.append("")
        lines.append(
            f"pool {name}{' [' + ', '.join(flags) + ']' if flags else ''}: queued {pool['queued']}, "
            f"delayed {pool['delayed']}, running {pool['running']}{f'/{cap}' if cap else ''}, "
            f"workers {pool.get('workers', 0)}, dispatched {pool['dispatched']}"
            + (f" ({pool['dispatch_rate']:.1f}/s over the last 10 s)" if "dispatch_rate" in pool else "")
        )
        classes = pool.get("classes", {})
        backlog = ", ".join(f"{cls} {classes[cls]['queued']}" for cls in CLASSES
                            if classes.get(cls, {}).get("queued")) if classes else "not shown to a pinned token"
        lines.append(f"  queued by class: {backlog or 'none'}")
        rows = tenant_tree(pool, None)
        width = max([16] + [len(row.label) for row in rows])
        unit = pool.get("share_unit", "dispatches")
        if unit != "dispatches":
            lines.append(f"  shares by {pool.get('share_by', unit)}: weights share out {_UNIT_WORDS.get(unit, unit)}; "
                         f"lag in {unit}")
        if rows:
            lines.append(f"  {'tenant':<{width}} {'weight':>6} {'queued':>7} {'running':>7} {'dispatched':>10} "
                         f"{'share':>6} {'fair':>6} {'lag':>5}")
        for row in rows:
            lag = f"{'-':>5}" if row.lag is None else f"{row.lag:>+5.1f}"
            lines.append(
                f"  {row.label:<{width}} {row.weight:>6g} {row.queued:>7} {row.running:>7} {row.dispatched:>10} "
                f"{row.share:>6.1%} {_percent(row.fair, 6)} {lag}"
            )
        lines += _more_tenants(pool, "  ")
        averages = [f"{_tenant_name(name)} {t['average_runtime']:.2f}" for name, t in pool.get("tenants", {}).items()
                    if t.get("average_runtime") is not None]
        if averages:  # what each tenant's next task will be charged at its dispatch (run-time pools)
            lines.append(f"  average run (s), each tenant's next estimate: {', '.join(averages)}")
        lines += _ceiling_lines(pool, capped_only=False)
        lines += _rate_lines(pool, limited_only=False)
        lines += _minimum_lines(pool, under_only=False)
    schedules = stats.get("schedules", {})
    if schedules:
        lines += ["", "schedules:"]
    for name, schedule in sorted(schedules.items()):
        last = "never" if schedule["last_fired"] is None else clock_time(schedule["last_fired"])
        lines.append(f"  {name:<16} {schedule['cron']!r} ({schedule['timezone']}) -> pool {schedule['pool']}, "
                     f"last fired {last}, next {clock_time(schedule['next_tick'])}")
    return "\n".join(lines)


def _more_tenants(pool: dict[str, Any], indent: str) -> list[str]:
    """A line saying how many tenants a large pool's stats left out (they list the busiest only)."""
    shown, count = len(pool.get("tenants", {})), pool.get("tenant_count", 0)
    if count <= shown:
        return []
    return [f"{indent}... and {count - shown:,} more tenants (the {shown:,} busiest are shown)"]


def _ceiling_lines(pool: dict[str, Any], *, capped_only: bool) -> list[str]:
    """The pool's ceilings (`top`: only the nodes at theirs), capped ones first, longest capped first."""
    ceilings = pool.get("ceilings") or {}
    shown = [(name, c) for name, c in ceilings.items() if c.get("capped") or not capped_only]
    if not shown:
        return []
    shown.sort(key=lambda item: (not item[1].get("capped"), -(item[1].get("capped_for") or 0.0), item[0]))
    lines = ["  at their ceilings:" if capped_only else "  ceilings (running of limit):"]
    for name, c in shown:
        text = f"    {_tenant_name(name):<16} {c['running']:>5} of {c['limit']:<5}"
        if c.get("capped"):
            since = c.get("capped_for")
            text += " capped" + (f" for {duration_text(since)}" if since is not None else "")
        lines.append(text.rstrip())
    more = pool.get("ceiling_count", len(ceilings)) - len(ceilings)
    if more > 0:
        lines.append(f"    ... and {more:,} more ceilings (the capped ones are shown first)")
    return lines


_UNIT_WORDS = {"cost": "the summed cost of tasks", "seconds": "worker time"}
_LAG_SUFFIX = {"cost": " cost", "seconds": " s"}


def _rate_lines(pool: dict[str, Any], *, limited_only: bool) -> list[str]:
    """The pool's tenant rates (`top`: only the nodes out of tokens now), the limited ones first."""
    rates = pool.get("rates") or {}
    shown = [(name, r) for name, r in rates.items() if r.get("limited") or not limited_only]
    if not shown:
        return []
    shown.sort(key=lambda item: (not item[1].get("limited"), item[0]))
    lines = ["  rate-limited:" if limited_only else "  rates (starts per second):"]
    for name, r in shown:
        text = f"    {_tenant_name(name):<16} {r['rate']:>6g}/s"
        if r.get("tokens") is not None and not r.get("limited"):
            text += f", {r['tokens']:.1f} to start at once"
        if r.get("limited"):
            wait = r.get("next_start_in")
            text += " rate-limited" + (f": next start in {wait:.1f} s" if wait is not None else "")
        lines.append(text)
    return lines


def _minimum_lines(pool: dict[str, Any], *, under_only: bool) -> list[str]:
    """The pool's tenant minimums (`top`: only the nodes under theirs now), the ones under first."""
    minimums = pool.get("minimums") or {}
    shown = [(name, m) for name, m in minimums.items() if m.get("under") or not under_only]
    if not shown:
        return []
    shown.sort(key=lambda item: (not item[1].get("under"), item[0]))
    lines = ["  under their minimums (go first):" if under_only else "  minimums (running of minimum):"]
    for name, m in shown:
        text = f"    {_tenant_name(name):<16} {m['running']:>5} of {m['minimum']:<5}"
        if m.get("under"):
            text += " under its minimum: its tasks go first"
        lines.append(text.rstrip())
    return lines


def _bar(fraction: float) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * BAR_WIDTH)
    return "#" * filled + "." * (BAR_WIDTH - filled)


def top_frame(stats: dict[str, Any], previous: dict[str, Any] | None, interval: float) -> str:
    """`cronoq top`: one frame; with the previous frame, rates and shares are over the interval between them."""
    lines = [f"cronoq top — workers {stats.get('workers', 0)}"]
    unreachable = [name for name, answer in stats.get("members", {}).items()
                   if isinstance(answer, dict) and "unreachable" in answer] if "cluster" in stats else []
    if unreachable:
        lines.append(f"unreachable cluster members: {', '.join(unreachable)}")
    before_pools = (previous or {}).get("pools", {})
    for name, pool in sorted(stats.get("pools", {}).items()):
        before = before_pools.get(name)
        rate = ""
        if before is not None and interval > 0:
            rate = f", {(pool['dispatched'] - before['dispatched']) / interval:.1f} dispatches/s"
        state = " (paused)" if pool.get("paused") else ""
        if pool.get("member"):
            state += f" [member {pool['member']}]"
        lines.append("")
        lines.append(
            f"{name}{state}: queued {pool['queued']}, delayed {pool['delayed']}, running {pool['running']}, "
            f"workers {pool.get('workers', 0)}{rate}"
        )
        rows = tenant_tree(pool, before)
        width = max([14] + [len(row.label) for row in rows])
        for row in rows:
            if not pool.get("fair"):
                target = "first come, first served"
            else:
                target = f"fair {_percent(row.fair, 6).strip()} (weight {row.weight:g})"
            lag = "" if row.lag is None else f", lag {row.lag:+.1f}{_LAG_SUFFIX.get(pool.get('share_unit'), '')}"
            lines.append(
                f"  {row.label:<{width}} {_bar(row.share)} {row.share:>6.1%} of dispatches, "
                f"{target}, queued {row.queued}{lag}"
            )
        lines += _more_tenants(pool, "  ")
        lines += _ceiling_lines(pool, capped_only=True)
        lines += _rate_lines(pool, limited_only=True)
        lines += _minimum_lines(pool, under_only=True)
    return "\n".join(lines)


