"""Turn the rows into the printed table, the targets check, the JSON file and the PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TABLE_KINDS = ("throughput", "light")


def _num(value: Any, fmt: str) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return "—"
    return format(value, fmt)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each throughput/latency row's tasks/s as a fraction of the limit's and a multiple of Celery's (same kind)."""
    def base(prefix: str, kind: str) -> float | None:
        for row in rows:
            if row["name"].startswith(prefix) and row["kind"] == kind and "tasks_per_s" in row:
                return row["tasks_per_s"]
        return None

    for row in rows:
        if row["kind"] not in TABLE_KINDS or "tasks_per_s" not in row:
            continue
        limit, celery = base("limit", row["kind"]), base("Celery", row["kind"])
        row["vs_limit"] = row["tasks_per_s"] / limit if limit else None
        row["vs_celery"] = row["tasks_per_s"] / celery if celery else None


def _cpu_text(row: dict[str, Any]) -> str:
    """CPU per task: broker + workers + client for cronoq and the relay; workers and redis for a peer."""
    if "cpu_us_per_task_broker" in row:
        return (f"{row['cpu_us_per_task_broker']:,.0f} + {row.get('cpu_us_per_task_workers', float('nan')):,.0f}"
                f" + {row.get('cpu_us_per_task_client', float('nan')):,.0f}")
    if "cpu_us_per_task_peer" in row:
        return f"{row['cpu_us_per_task_peer']:,.0f}"
    return "—"


def table(rows: list[dict[str, Any]]) -> str:
    """One fixed-width table: throughput and latency rows first, then scale and fairness rows."""
    head = ["row", "tasks/s", "p50 ms", "p99 ms", "p99.9 ms", "x limit", "x Celery", "CPU µs/task", "notes"]
    lines = []
    for row in rows:
        if row["kind"] in TABLE_KINDS:
            cpu_text = _cpu_text(row)
            lines.append([
                row["name"], _num(row.get("tasks_per_s"), ",.0f"), _num(row.get("p50_ms"), ".2f"),
                _num(row.get("p99_ms"), ".2f"), _num(row.get("p999_ms"), ".2f"),
                _num(row.get("vs_limit"), ".2f"), _num(row.get("vs_celery"), ",.1f"), cpu_text, row.get("note", ""),
            ])
        else:
            lines.append([row["name"], _num(row.get("tasks_per_s"), ",.0f") if row["kind"] == "dispatch" else "",
                          "", "", "", "", "", "", row.get("value", "")])
    widths = [max(len(str(line[i])) for line in [head, *lines]) for i in range(len(head))]
    fmt = " | ".join(f"{{:{'<' if i in (0, len(head) - 1) else '>'}{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The performance targets, each with what this run measured and whether it holds."""
    by_name = {row["name"]: row for row in rows}
    out: list[dict[str, Any]] = []

    def check(what: str, measured: Any, ok: bool | None) -> None:
        out.append({"target": what, "measured": measured, "met": ok})

    target_row = by_name.get("cronoq, durable, tokens", {})
    if target_row.get("vs_limit") is not None:
        check("durable+tokens >= 50% of the limit", f"{target_row['vs_limit']:.0%}", target_row["vs_limit"] >= 0.5)
    if target_row.get("vs_celery") is not None:
        check("durable+tokens > 20x Celery", f"{target_row['vs_celery']:.1f}x", target_row["vs_celery"] > 20)
    light = by_name.get("cronoq, durable, tokens: one in flight", {})
    if "p50_ms" in light:
        check("p50 at light load < 1 ms", f"{light['p50_ms']:.2f} ms", light["p50_ms"] < 1.0)
        check("p99 at light load < 3 ms", f"{light['p99_ms']:.2f} ms", light["p99_ms"] < 3.0)
    dispatch = [row for row in rows if row["kind"] == "dispatch"]
    biggest = [row for row in dispatch if row["backlog"] == max(r["backlog"] for r in dispatch)]
    if dispatch and biggest:
        same_tenants = [row for row in biggest if row["tenants"] == dispatch[0]["tenants"]]
        row = same_tenants[0] if same_tenants else biggest[0]
        check(f"dispatch at {row['backlog']:,} within 3x of {dispatch[0]['backlog']:,}",
              f"{row['vs_smallest_backlog']:.2f}x", row["vs_smallest_backlog"] <= 3.0)
    memory = next((row for row in rows if row["kind"] == "memory"), None)
    if memory and "bytes_per_task_payload_aside" in memory:
        check("broker memory < 1 KiB per queued task, payload aside",
              f"{memory['bytes_per_task_payload_aside']:,.0f} B", memory["bytes_per_task_payload_aside"] < 1024)
    recovery = next((row for row in rows if row["kind"] == "recovery"), None)
    if recovery:
        serving = recovery.get("serving_s")
        check(f"restart with {recovery.get('tasks', 0):,} queued < 20 s",
              f"{serving:.1f} s" if serving is not None else recovery.get("value"),
              None if serving is None else serving < 20)
    for row in rows:
        if row["kind"] == "fairness":
            check(f"fairness within the SFQ bound, tenant {row['tenant']}",
                  f"{row['deviation']:.2f} <= {row['bound']:.2f}", row["within_bound"])
    return out


def targets_text(checks: list[dict[str, Any]]) -> str:
    mark = {True: "met", False: "NOT met", None: "n/a"}
    return "\n".join(f"  {mark[c['met']]:>7}  {c['target']}: {c['measured']}" for c in checks)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def draw(path: Path, rows: list[dict[str, Any]], sequence: list[str], weights: dict[str, float]) -> None:
    """Four panels: tasks/s per row, latency percentiles per row, dispatch cost vs backlog, fairness shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    measured = [r for r in rows if r["kind"] in TABLE_KINDS and isinstance(r.get("tasks_per_s"), float)]

    ax = axes[0][0]
    names = [r["name"] for r in measured]
    ax.barh(names, [r["tasks_per_s"] for r in measured],
            color=["#888" if r["name"].startswith("limit") else "#c44" if r.get("peer") else "#37a" for r in measured])
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.invert_yaxis()
    ax.set_xlabel("tasks/s (log)")
    ax.set_title("Throughput: noop tasks, 2 worker processes")
    for i, r in enumerate(measured):
        ax.text(r["tasks_per_s"], i, f" {r['tasks_per_s']:,.0f}", va="center", fontsize=8)

    ax = axes[0][1]
    for offset, (key, label) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"))):
        ax.scatter([r[key] for r in measured], [i + (offset - 1) * 0.2 for i in range(len(measured))], label=label, s=18)
    ax.set_yticks(range(len(measured)), names)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.invert_yaxis()
    ax.set_xlabel("submit-to-result latency, ms (log)")
    ax.set_title("Latency: one in flight, and under saturation")
    ax.legend()

    ax = axes[1][0]
    dispatch = [r for r in rows if r["kind"] == "dispatch"]
    if dispatch:
        base_tenants = dispatch[0]["tenants"]
        line = [r for r in dispatch if r["tenants"] == base_tenants]
        ax.plot([r["backlog"] for r in line], [r["ns_per_cycle"] / 1000 for r in line], "o-",
                label=f"{base_tenants:,} tenants")
        for r in dispatch:
            if r["tenants"] != base_tenants:
                ax.plot([r["backlog"]], [r["ns_per_cycle"] / 1000], "s", label=f"{r['tenants']:,} tenants")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("queued tasks (backlog)")
        ax.set_ylabel(f"µs per {dispatch[0].get('operation', 'cycle').split(' (')[0]}")
        ax.set_title("Core dispatch cost as the backlog grows")
        ax.legend()

    ax = axes[1][1]
    if sequence:
        total = sum(weights.values())
        counts = dict.fromkeys(weights, 0)
        shares: dict[str, list[float]] = {t: [] for t in weights}
        for n, tenant in enumerate(sequence, start=1):
            counts[tenant] += 1
            for t in weights:
                shares[t].append(counts[t] / n)
        for t, w in weights.items():
            (drawn,) = ax.plot(range(1, len(sequence) + 1), shares[t], label=f"tenant {t} (weight {w:g})")
            ax.axhline(w / total, color=drawn.get_color(), linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("dispatches so far")
        ax.set_ylabel("share of dispatches")
        ax.set_title("Fairness under load, weights 3:1:1 (dotted: share)")
        ax.legend()

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
