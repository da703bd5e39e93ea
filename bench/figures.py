"""Rewrite the latest-figures tables of bench/README.md (and README.md) from the result files in bench/results/.

    python bench/figures.py            # rewrite the tables
    python bench/figures.py --check    # exit 1, saying which table, if a page is not what this would write

Each table stands between `<!-- figures:start NAME -->` and `<!-- figures:end NAME -->`, NAME one of the
kinds `tables` builds (bench/README.md has every one, README.md some), and is built from the newest result
file of its kind (the UTC stamp in the file name orders them). So a benchmark run is quoted by committing its
file (`git add -f`: bench/results/ is ignored) and running this, never by copying numbers by hand. Only what a
result file records is written: where a file does not say which commit or CPU it ran on, neither does its
table. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
README = BENCH / "README.md"
# Every page with generated tables, and the path from its folder to bench/ (its links to result files go there).
PAGES = {README: "", ROOT / "README.md": "bench/"}

STAMP = re.compile(r"(\d{8}T\d{6}Z)")
BLOCK = re.compile(r"(<!-- figures:start (\w+) -->\n).*?(<!-- figures:end \2 -->)", re.S)


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def _n(value: Any, fmt: str = ",.0f") -> str:
    """A number in `fmt`, or a dash when the file has none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—"
    return format(value, fmt)


def _table(head: list[str], rows: Iterable[list[str]], right: Iterable[int] = ()) -> list[str]:
    """A Markdown table; the columns numbered in `right` are right-aligned."""
    right = set(right)
    rule = ["---:" if i in right else "---" for i in range(len(head))]
    return ["| " + " | ".join(cells) + " |" for cells in [head, rule, *rows]]


def _when(stamp: str) -> str:
    """`20261129T215452Z` -> `2026-11-29 21:54 UTC`."""
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d %H:%M UTC")


def _when_unix(seconds: float) -> str:
    """A unix time as `_when` writes a stamp."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _machine(machine: dict[str, Any]) -> str:
    """What a result file says about the machine and the code, in one phrase."""
    cores = machine.get("cores") or machine.get("cpus")
    parts = []
    if cores:
        parts.append(f"{cores} cores" + (f" ({machine['cpu']})" if machine.get("cpu") else ""))
    if machine.get("python"):
        parts.append(f"Python {machine['python']}")
    if machine.get("pyzmq"):
        parts.append(f"pyzmq {machine['pyzmq']} / libzmq {machine.get('libzmq', '?')}")
    for name in ("msgspec", "uvloop"):
        if machine.get(name):
            parts.append(f"{name} {machine[name]}")
    if machine.get("cronoq_commit"):
        dirty = " with uncommitted changes" if machine.get("cronoq_uncommitted_changes") else ""
        parts.append(f"cronoq at {machine['cronoq_commit']}{dirty}")
    return ", ".join(parts) or "machine not recorded"


def _source(path: Path, when: str, machine: dict[str, Any]) -> str:
    return f"[`results/{path.name}`](results/{path.name}), {when}; {_machine(machine)}."


# ---------------------------------------------------------------------------------------------------------------
# The tables, one function per kind of result file


def run_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/run.py`: throughput and latency rows, then scale, memory, restart and fairness, then the targets."""
    settings = data.get("settings", {})
    lines = [
        _source(path, _when(data["timestamp"]), data.get("machine", {}))
        + f" Medians of {settings.get('repeat', '?')} runs; other processes used"
        f" {_n(data.get('foreign_load_cores'), '.2f')} cores meanwhile.",
        "",
    ]
    speed = [row for row in data["rows"] if row["kind"] in ("throughput", "light")]
    cells = []
    for row in speed:
        if "cpu_us_per_task_broker" in row:
            cpu = " + ".join(_n(row.get(f"cpu_us_per_task_{part}")) for part in ("broker", "workers", "client"))
        else:
            cpu = _n(row.get("cpu_us_per_task_peer")) + (" (all processes)" if "cpu_us_per_task_peer" in row else "")
        cells.append([row["name"], _n(row.get("tasks_per_s")), _n(row.get("p50_ms"), ",.2f"),
                      _n(row.get("p99_ms"), ",.2f"), _n(row.get("p999_ms"), ",.2f"),
                      _n(row.get("vs_limit"), ".2f"), _n(row.get("vs_celery"), ",.1f"), cpu])
    lines += _table(["row", "tasks/s", "p50 ms", "p99 ms", "p99.9 ms", "× limit", "× Celery",
                     "CPU µs/task (broker + workers + client)"], cells, right=range(1, 8))
    others = [[row["name"], row.get("value", "")] for row in data["rows"] if row["kind"] not in ("throughput", "light")]
    if others:
        lines += ["", *_table(["row", "measured"], others)]
    targets = [[t["target"], t["measured"], "met" if t["met"] else "**not met**"] for t in data.get("targets", [])]
    if targets:
        lines += ["", *_table(["target", "measured", ""], targets)]
    return lines


def _probe(probe: dict[str, Any]) -> str:
    return f"{_n(probe.get('p50_ms'), '.2f')} / {_n(probe.get('p99_ms'), '.2f')} / {_n(probe.get('max_ms'), '.1f')} ms"


def _soak_options(settings: dict[str, Any]) -> str:
    """The options a soak ran with, as `bench/soak.py` takes them."""
    options = [f"--seconds {settings['seconds']:g}"] if not settings.get("fill_drain") else []
    if settings.get("fill_drain"):
        options.append(f"--fill-drain {settings['fill_drain']}")
    if settings.get("result_ttl") is not None:
        options.append(f"--result-ttl {settings['result_ttl']:g}")
    if settings.get("payload_bytes"):
        options.append(f"--payload-bytes {settings['payload_bytes']}")
    if settings.get("load_rate"):
        options.append(f"--load-rate {settings['load_rate']:g}")
    for flag in ("slow_reader", "relay", "isolate_load", "tokens"):
        if settings.get(flag):
            options.append("--" + flag.replace("_", "-"))
    if settings.get("broker_nice"):
        options.append(f"--broker-nice {settings['broker_nice']}")
    return "`python bench/soak.py " + " ".join(options) + "`"


def soak_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/soak.py`: the plain soak at full rate, a probe on another pool."""
    summary = data["summary"]
    cpu = summary.get("cpu_us_per_task", {})
    rss, disk = summary.get("rss_mib", {}), summary.get("data_dir_mib", {})
    passes = summary.get("loop", {}).get("pass cpu", {})
    rows = [
        ["tasks/s", _n(summary.get("tasks_per_s"))],
        ["CPU µs/task: broker, workers, archiver",
         ", ".join(_n(cpu.get(part), ".1f") for part in ("broker", "workers", "archiver"))],
        [f"probe p50 / p99 / worst ({_n(summary['probe'].get('count'))} round trips)", _probe(summary["probe"])],
        ["broker RSS: first / max / last", " / ".join(_n(rss.get(k)) for k in ("first", "max", "last")) + " MiB"],
        ["data_dir: max", _n(disk.get("max")) + " MiB"],
    ]
    if passes:
        over = passes.get("over_ms", {})
        rows.append(["loop passes; over 4 ms of the loop's CPU",
                     f"{_n(passes.get('count'))}; {_n(over.get('4'))}"])
    rows.append(["CPUs busy, all processes / other processes", f"{_n(summary.get('machine_busy_cores'), '.2f')}"
                 f" / {_n(summary.get('foreign_load_cores'), '.2f')} cores"])
    head = _source(path, _when_unix(data["started"]), data.get("machine", {}))
    return [head + f" {_soak_options(data['settings'])}.", "", *_table(["measure", "figure"], rows)]


def filldrain_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/soak.py --fill-drain N`: queue N with the pool paused, drain them, the probe throughout."""
    summary = data["summary"]
    rows = []
    for name, phase in summary["phases"].items():
        rows.append([name, _n(phase.get("seconds"), ".1f"), _n(phase.get("tasks_per_s")),
                     _probe(phase["probe"]), _n(phase.get("rss_growth_mib"), "+,.0f") + " MiB"])
    head = _source(path, _when_unix(data["started"]), data.get("machine", {}))
    return [head + f" {_soak_options(data['settings'])}; broker RSS at most {_n(summary['rss_mib'].get('max'))} MiB,"
            f" data_dir at most {_n(summary['data_dir_mib'].get('max'))} MiB; other processes used"
            f" {_n(summary.get('foreign_load_cores'), '.2f')} cores.",
            "", *_table(["phase", "seconds", "tasks/s", "probe p50 / p99 / worst", "broker RSS growth"], rows,
                        right=(1, 2))]


def cluster_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/cluster.py`: two pools on one broker against the same pools on a cluster of two."""
    rows = []
    for name, row in data["rows"].items():
        median = row["median"]
        cpu = median.get("cpu_ms_per_task", {})
        rows.append([name, _n(median.get("tasks_per_s"))]
                    + [_n(cpu.get(part, 0) * 1000, ".1f") for part in ("brokers", "workers", "client")])
    args = data.get("args", {})
    stamp = STAMP.search(path.name).group(1)
    head = _source(path, _when(stamp), data.get("machine", {}))
    return [head + f" Medians of {args.get('repeat', '?')} runs of {_n(args.get('tasks'))} tasks per pool,"
            f" {_n(args.get('window'))} in flight per pool.", "",
            *_table(["setup", "tasks/s", "CPU µs/task: brokers", "workers", "client"], rows, right=range(1, 5))]


def rust_table(files: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """`bench/rust.py`: the newest run of each part (a run with `--only` writes one part)."""
    lines: list[str] = []
    clients = next(((p, d) for p, d in reversed(files) if d.get("clients")), None)
    dispatch = next(((p, d) for p, d in reversed(files) if d.get("dispatch")), None)
    if clients:
        path, data = clients
        rows = [[row["name"].replace(" client, call", ", `call`").removesuffix(" client"), _n(row["in_flight"]),
                 _n(row.get("tasks_per_s")), _n(row.get("p50_ms"), ".2f"),
                 _n(row.get("cpu_us_per_task_client"), ",.1f"), _n(row.get("cpu_us_per_task_broker"), ",.1f")]
                for row in data["clients"]]
        lines += [f"Clients: {_source(path, _when(STAMP.search(path.name).group(1)), data.get('machine', {}))}", "",
                  *_table(["client", "in flight", "tasks/s", "p50 ms", "client CPU µs/task", "broker CPU µs/task"],
                          rows, right=range(1, 6)), ""]
    if dispatch:
        path, data = dispatch
        rows = [[_n(row["backlog"]), _n(row["tenants"]), row["pool"], _n(row["python_ns"]), _n(row["rust_ns"]),
                 _n(row["ratio"], ".1f") + "×"] for row in data["dispatch"]]
        lines += [f"Dispatch: {_source(path, _when(STAMP.search(path.name).group(1)), data.get('machine', {}))}", "",
                  *_table(["backlog", "tenants", "pool", "Python ns", "Rust ns", "Python ÷ Rust"], rows,
                          right=(0, 1, 3, 4, 5))]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _share(value: Any) -> str:
    """A share of entitlement: two decimals, three when it would read 0.00 but is not."""
    return _n(value, ".3f" if isinstance(value, float) and 0 < value < 0.005 else ".2f")


def _waits(row: dict[str, Any]) -> str:
    parts = []
    for tenant, wait in row.get("waits", {}).items():
        if not wait.get("started"):
            parts.append(f"{tenant}: never started (waited ≥ {_n(wait.get('p99_s'))} s)")
            continue
        p50 = ("≥ " if wait.get("p50_lower_bound") else "") + _n(wait.get("p50_s"), ",.2f")
        p99 = ("≥ " if wait.get("p99_lower_bound") else "") + _n(wait.get("p99_s"), ",.2f")
        parts.append(f"{tenant}: {p50} / {p99} s")
    return "; ".join(parts)


def fairness_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/fairness_adversarial.py`: cronoq's core against FIFO and round-robin, simulated."""
    rows = []
    for row in data["rows"]:
        wide, narrow = row["window_1000"], row["window_100"]
        rows.append([row["workload"], row["discipline"], f"{_share(wide['median'])} / {_share(wide['worst'])}",
                     f"{_share(narrow['median'])} / {_share(narrow['worst'])}", _waits(row)])
    when = _when(data["timestamp"]) if "timestamp" in data else "date not recorded"
    lines = [_source(path, when, data.get("machine", {})) + f" {_n(data.get('dispatches'))} `normal` dispatches"
             " per run.", "",
             *_table(["workload", "discipline", "least-served share of entitlement, 1,000-dispatch windows:"
                      " median / worst", "100-dispatch windows", "trickling tenants' wait p50 / p99"], rows)]
    broker = data.get("broker")
    if broker:
        def shares(part: dict[str, Any]) -> str:
            names = sorted(k for k in part if k != "dispatches")
            return " / ".join(names) + " " + " / ".join(_n(part[k], ".3f") for k in names)
        lines += ["", f"`--broker` (skew, 3:1:1, c capped at 1, through a real broker): shares"
                      f" {shares(broker['broker'])} over {_n(broker['broker']['dispatches'])} dispatches; the"
                      f" simulation of the same shape {shares(broker['simulation'])} over"
                      f" {_n(broker['simulation']['dispatches'])}."]
    return lines


def _pair(shares: dict[str, Any], first: str, second: str) -> str:
    return f"{_n(shares.get(first), '.3f')} / {_n(shares.get(second), '.3f')}"


def shares_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/shares.py`: what a share counts, rates, minimums and the dispatch cost of each mode; its PNG."""
    lines = [_source(path, _when(data["timestamp"]), data.get("machine", {}))
             + f" Parts 1–3 simulated over {_n(data.get('simulated_seconds'))} s (exact);"
             " part 4 CPU time, best of 3.",
             ""]
    rows = []
    for mode, row in data["modes"].items():
        share_by, _, variant = mode.partition(", ")
        rows.append([f'"{share_by}"' + (f", {variant}" if variant else "") + ", simulated",
                     _pair(row["dispatches"], "fast", "slow"),
                     _pair(row["worker_time"], "fast", "slow"), _pair(row["cost"], "fast", "slow")])
    real = data.get("broker") or {}
    for mode, row in real.items():
        if isinstance(row, dict) and "worker_time" in row:
            runs = row["runs"]
            total = sum(runs.values()) or 1
            rows.append([f'"{mode}", real broker, {_n(row["window_s"], ".1f")} s',
                         _pair({k: v / total for k, v in runs.items()}, "fast", "slow")
                         + f" ({_n(runs.get('fast'))} / {_n(runs.get('slow'))} runs)",
                         _pair(row["worker_time"], "fast", "slow"), "—"])
    lines += ["Two tenants at 1 : 1, fast (10 ms tasks, cost 1) and slow (100 ms, cost 10), 4 workers, fast / slow:",
              "", *_table(["share_by", "dispatches", "worker time", "summed cost"], rows), ""]
    rated = data["rates"]
    rows = [[f'"{mode}", simulated', _n(row["limited_per_s"], ".2f"), _n(row["limited_first_second"]),
             _n(row["limited_busiest_later_second"]),
             f"{_n(row['others_per_s'], ',.1f')} of {_n(row['others_capacity_per_s'], ',.0f')}"]
            for mode, row in rated.items() if isinstance(row, dict)]
    if real.get("rates"):
        row = real["rates"]
        rows.append([f'"dispatches", real broker, {_n(row["window_s"], ".1f")} s', _n(row["limited_per_s"], ".2f"),
                     _n(row["limited_first_second"]), _n(row["limited_busiest_later_second"]),
                     f"{_n(row['others_per_s'], ',.1f')} on 4 slots"])
    lines += [f"`limited` at tenant_rates {_n(rated['limit'], 'g')}/s beside `a` and `b` (1 : 1 : 1, all backlogged,"
              f" {_n(rated['task_seconds'] * 1000)} ms tasks, {rated['workers']} workers):", "",
              *_table(["share_by", "limited: starts/s", "in its first second", "in its busiest later second",
                       "a + b: starts/s of what the workers leave"], rows, right=range(1, 5)), ""]
    floors = data["minimums"]
    rows = [[key, _n(row["light_mean_running"], ".2f"), _n(row["light_least_running"]),
             f"{_n(row['light_time_share'] * 100, '.1f')} %"] for key, row in floors["rows"].items()]
    lines += [f"`light` (weight 1) beside `heavy` (weight 10), both backlogged, {_n(floors['task_seconds'] * 1000)} ms"
              f" tasks, {floors['workers']} workers:", "",
              *_table(["share_by, tenant_minimums", "light: running on average", "least", "light's worker time"],
                      rows, right=(1, 2, 3)), ""]
    modes = [key for key in data["dispatch_cost"][0] if key not in ("backlog", "tenants")]
    rows = [[_n(row["backlog"])] + [_n(row[mode], ".1f") for mode in modes] for row in data["dispatch_cost"]]
    tenants = _n(data["dispatch_cost"][0]["tenants"])
    lines += [f"CPU µs per round (submit, finish, grant, dispatch; {tenants} tenants):",
              "", *_table(["backlog", *modes], rows, right=range(len(modes) + 1))]
    if data.get("png"):
        lines += ["", f"![shares by mode, a rate, a minimum and the dispatch cost](results/{data['png']})"]
    return lines


def wire_table(path: Path, data: dict[str, Any]) -> list[str]:
    """`bench/close_to_wire.py`: cronoq (durable, tokens) beside the bare relay, each figure against its bound."""
    settings = data.get("settings", {})
    what = {"sequential": f"one task at a time: round trip p50 ms ({_n(settings.get('light_tasks'))} tasks)",
            "throughput": f"tasks/s, {_n(settings.get('tasks'))} tasks, {_n(settings.get('window'))} in flight"
                          f" (median of {settings.get('repeat', '?')} alternated runs)",
            "memory": f"broker RSS per queued task, payload aside, B ({_n(settings.get('memory_tasks'))} queued)",
            "probe": f"probe on another pool at full rate: p99 ms ({_n(settings.get('probe_seconds'), 'g')} s each)"}
    rows = []
    for f in data["figures"]:
        name = f["figure"]
        way = f.get("way")  # how cronoq's client waited (files before `call` existed have none)
        label = what.get(name, name) + (", `submit` then `result`" if way == "submit" else
                                        ", `call`" if way == "call" else "") + (
            "" if f.get("results_store", True) else ", `results_store = false` (the choice, not the bound's figure)")
        if name == "memory":
            met = f["cronoq"] <= f["target_bytes"]
            rows.append([what[name], "—", _n(f["cronoq"]), "—", f"≤ {_n(f['target_bytes'])} B",
                         "met" if met else "**not met**"])
            continue
        fmt = ",.0f" if name == "throughput" else ".3f" if name == "sequential" else ".2f"
        met = f["ratio"] >= f["target_ratio"] if name == "throughput" else f["ratio"] <= f["target_ratio"]
        bound = ("≥ " if name == "throughput" else "≤ ") + f"{f['target_ratio']:g}×"
        rows.append([label, _n(f["relay"], fmt), _n(f["cronoq"], fmt), _n(f["ratio"], ".2f") + "×", bound,
                     "met" if met else "**not met**"])
    head = _source(path, _when(data["timestamp"]), data.get("machine", {}))
    return [head + f" Other processes used {_n(data.get('foreign_load_cores'), '.2f')} cores meanwhile.", "",
            *_table(["figure", "relay", "cronoq", "cronoq ÷ relay", "bound", ""], rows, right=(1, 2, 3))]


# ---------------------------------------------------------------------------------------------------------------
# Which file feeds which table


def _stamped(names: Iterable[str], prefix: str) -> list[str]:
    """File names `<prefix><stamp>.json`, oldest first."""
    pattern = re.compile(re.escape(prefix) + r"\d{8}T\d{6}Z\.json$")
    return sorted((n for n in names if pattern.match(n)), key=lambda n: STAMP.search(n).group(1))


def _plain_soak(settings: dict[str, Any]) -> bool:
    """A soak at full rate with the broker's defaults: the one the README's soak figures are about."""
    variations = ("fill_drain", "slow_reader", "relay", "isolate_load", "load_rate", "broker_nice",
                  "payload_bytes", "tokens")
    return not any(settings.get(key) for key in variations) and settings.get("result_ttl") is None


def _newest(names: list[str], load: Callable[[str], tuple[Path, dict[str, Any]]],
            wanted: Callable[[dict[str, Any]], bool]) -> tuple[Path, dict[str, Any]] | None:
    for name in reversed(names):
        path, data = load(name)
        if wanted(data):
            return path, data
    return None


def tables(names: Iterable[str], results: Path = RESULTS) -> dict[str, list[str]]:
    """Every table's lines, built from the result files of these names in `results`."""
    names = sorted(set(names))
    cache: dict[str, tuple[Path, dict[str, Any]]] = {}

    def load(name: str) -> tuple[Path, dict[str, Any]]:
        if name not in cache:
            cache[name] = results / name, json.loads((results / name).read_text())
        return cache[name]

    out: dict[str, list[str]] = {}
    found = _newest(_stamped(names, ""), load, lambda d: not d.get("quick"))
    if found:
        out["run"] = run_table(*found)
    found = _newest(_stamped(names, "soak-"), load, lambda d: _plain_soak(d.get("settings", {})))
    if found:
        out["soak"] = soak_table(*found)
    found = _newest(_stamped(names, "filldrain-"), load, lambda d: True)
    if found:
        out["filldrain"] = filldrain_table(*found)
    found = _newest(_stamped(names, "cluster-"), load, lambda d: True)
    if found:
        out["cluster"] = cluster_table(*found)
    rust = [load(name) for name in _stamped(names, "rust-")]
    if rust:
        out["rust"] = rust_table([(path, data) for path, data in rust if not data.get("quick")])
    found = _newest(_stamped(names, "shares-"), load, lambda d: not d.get("quick"))
    if found:
        out["shares"] = shares_table(*found)
    found = _newest(_stamped(names, "wire-"), load, lambda d: True)
    if found:
        out["wire"] = wire_table(*found)
    if "fairness-adversarial.json" in names:
        out["fairness"] = fairness_table(*load("fairness-adversarial.json"))
    return out


def for_page(built: dict[str, list[str]], bench: str) -> dict[str, list[str]]:
    """The tables as a page in another folder links them: `bench` is the path from that page to bench/."""
    if not bench:
        return built
    return {name: [line.replace("results/", bench + "results/") for line in lines] for name, lines in built.items()}


def rewrite(text: str, built: dict[str, list[str]]) -> str:
    """`text` with every marked block that has a table replaced by it; blocks without one are left as they are."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in built:
            return match.group(0)
        return match.group(1) + "\n".join(built[name]) + "\n" + match.group(3)
    return BLOCK.sub(replace, text)


def differences(text: str, built: dict[str, list[str]], *, every: bool = False) -> list[str]:
    """The names of the marked blocks whose content is not what `rewrite` would write; with `every`, also the
    tables the text has no block for."""
    current = {m.group(2): m.group(0) for m in BLOCK.finditer(text)}
    wanted = {m.group(2): m.group(0) for m in BLOCK.finditer(rewrite(text, built))}
    missing = sorted(set(built) - set(current)) if every else []
    return missing + sorted(name for name in current if current[name] != wanted[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    built = tables(p.name for p in RESULTS.glob("*.json"))
    out_of_date = False
    for page, bench in PAGES.items():
        name = page.relative_to(ROOT).as_posix()
        text, mine = page.read_text(), for_page(built, bench)
        stale = differences(text, mine, every=page == README)
        out_of_date = out_of_date or bool(stale)
        if args.check:
            for table in stale:
                print(f"{name}: the {table!r} table is not what bench/figures.py writes", file=sys.stderr)
            continue
        page.write_text(rewrite(text, mine))
        print(f"{name}: " + (f"rewrote {', '.join(stale)}" if stale else "every table was up to date"))
    return 1 if args.check and out_of_date else 0


if __name__ == "__main__":
    sys.exit(main())
