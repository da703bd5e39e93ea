"""`python bench/close_to_wire.py`: cronoq beside the bare relay, the four figures of "close to the wire".

    python bench/close_to_wire.py                         # the four figures, about 4 minutes
    python bench/close_to_wire.py --memory-tasks 100000 --probe-seconds 15 --repeat 1   # a quicker look
    python bench/close_to_wire.py --only sequential,throughput

The figures, each taken with the relay and cronoq alternated in one run so
that both see the same machine:

  sequential  one task at a time: p50 of submit -> dispatch -> noop -> result, over --light-tasks tasks
  throughput  --tasks noop tasks with --window in flight, 2 worker processes; the median of --repeat
              alternated runs (relay, cronoq, relay, cronoq ...)
              Both are taken twice on cronoq's side: with `call` (submit and wait in one request, the
              way an interactive caller waits for a value) and with `submit` then `handle.result()`.
              Throughput is also taken with `results_store = false` (and `call`), on a broker of its own in
              each round: what the results store costs, beside the choice that gives it up.
  memory      a durable broker's RSS growth per queued task at --memory-tasks queued (the pool paused),
              payload aside; the relay queues nothing, so this one has no relay figure
  probe       bench/soak.py for --probe-seconds through the relay, then through cronoq: the p99 of a probe
              on another pool while the load runs at full rate

cronoq runs durable (the default durability) with tokens. Writes
bench/results/wire-<stamp>.json, which `python bench/figures.py` turns into
bench/README.md's "close to the wire" table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.append(str(Path(__file__).resolve().parent.parent))  # `python bench/close_to_wire.py` runs from anywhere

from bench import report  # noqa: E402
from bench.common import Children, log_dir  # noqa: E402
from bench.settings import BenchSettings  # noqa: E402

FIGURES = ("sequential", "throughput", "memory", "probe")
RESULTS = Path(__file__).resolve().parent / "results"
# The bounds: cronoq over the relay (sequential p50, probe p99: at most; throughput: at least).
TARGETS = {"sequential": 1.5, "throughput": 0.85, "memory": 600.0, "probe": 1.5}


def _speed_runs(s: BenchSettings, light_tasks: int, figures: set[str], log: Callable[[str], None]) -> dict[str, Any]:
    """Relay and cronoq alternated `s.repeat` times; each turn a saturated run and a sequential one."""
    from bench.load import drive_cronoq
    from bench.relay import drive_relay
    from bench.stacks import TOKENS, cronoq_stack, relay_stack
    from bench.throughput import _checked, _measured, _run_async

    token = TOKENS["BENCH_CLIENT_TOKEN"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        side: {"throughput": [], "sequential": []} for side in ("relay", "cronoq", "cronoq_submit", "cronoq_unstored")}
    for i in range(s.repeat):
        # The order flips each round: neither side always runs on a machine the other has just warmed.
        for side in (("relay", "cronoq") if i % 2 == 0 else ("cronoq", "relay")):
            if side == "relay":
                with relay_stack(s.workers, s.concurrency) as stack:
                    _run_async(drive_relay(stack.address, min(1_000, s.tasks), s.window))  # warm-up
                    if "throughput" in figures:
                        runs[side]["throughput"].append(
                            _measured(stack, lambda: drive_relay(stack.address, s.tasks, s.window)))
                    if "sequential" in figures:
                        runs[side]["sequential"].append(
                            _measured(stack, lambda: drive_relay(stack.address, light_tasks, 1)))
            else:
                with cronoq_stack(durable=True, tokens=True, workers=s.workers, concurrency=s.concurrency) as stack:
                    _run_async(_checked(drive_cronoq(stack.address, min(1_000, s.tasks), s.window, token=token)))
                    # Each way of waiting in turn, on the same broker; which goes first alternates with the rounds
                    # (the first run on a broker that has just warmed up came out slower, whichever way it was).
                    ways = [("cronoq", True), ("cronoq_submit", False)]
                    for way, call in (ways if i % 2 == 0 else ways[::-1]):
                        if "throughput" in figures:
                            runs[way]["throughput"].append(_measured(stack, lambda: _checked(
                                drive_cronoq(stack.address, s.tasks, s.window, token=token, call=call))))
                        if "sequential" in figures:
                            runs[way]["sequential"].append(_measured(stack, lambda: _checked(
                                drive_cronoq(stack.address, light_tasks, 1, token=token, call=call))))
                if "throughput" in figures:  # the choice that gives up the results store: what it costs
                    with cronoq_stack(durable=True, tokens=True, workers=s.workers, concurrency=s.concurrency,
                                      results_store=False) as stack:
                        _run_async(_checked(drive_cronoq(stack.address, min(1_000, s.tasks), s.window, token=token,
                                                         call=True)))
                        runs["cronoq_unstored"]["throughput"].append(_measured(stack, lambda: _checked(
                            drive_cronoq(stack.address, s.tasks, s.window, token=token, call=True))))
            for way in ((side,) if side == "relay" else ("cronoq", "cronoq_submit", "cronoq_unstored")):
                if not runs[way]["throughput"] and not runs[way]["sequential"]:
                    continue
                parts = []
                if runs[way]["throughput"]:
                    parts.append(f"{runs[way]['throughput'][-1]['tasks_per_s']:,.0f} tasks/s")
                if runs[way]["sequential"]:
                    parts.append(f"sequential p50 {runs[way]['sequential'][-1]['p50_ms']:.3f} ms")
                log(f"  round {i + 1} {_SIDE_NAMES.get(way, way)}: " + ", ".join(parts))
    return runs


_SIDE_NAMES = {"cronoq_submit": "cronoq, submit then result", "cronoq_unstored": "cronoq, results_store = false"}


def _ratio_figure(name: str, unit: str, key: str, relay_runs: list[dict], cronoq_runs: list[dict],
                  way: str = "call", results_store: bool = True) -> dict[str, Any]:
    """A figure measured on both sides: the median of each, and cronoq's over the relay's. `way`: how cronoq's
    client waited for each value (`call`, or `submit` then `result`); `results_store`: False for the broker that
    keeps finished tasks in memory instead (a choice beside the figure, not the figure itself)."""
    relay = statistics.median(run[key] for run in relay_runs)
    cronoq = statistics.median(run[key] for run in cronoq_runs)
    extra = {} if results_store else {"results_store": False}
    return {"figure": name, "way": way, **extra, "unit": unit, "relay": relay, "cronoq": cronoq,
            "ratio": cronoq / relay, "target_ratio": TARGETS[name], "relay_runs": [run[key] for run in relay_runs],
            "cronoq_runs": [run[key] for run in cronoq_runs], "runs": {"relay": relay_runs, "cronoq": cronoq_runs}}


def _probe(seconds: float, warmup: float, log: Callable[[str], None]) -> dict[str, Any]:
    """bench/soak.py's probe p99 through the relay, then through cronoq (durable, tokens), the same load."""
    from bench import soak

    found = {}
    for side in ("relay", "cronoq"):
        settings = soak.SoakSettings(seconds=seconds, warmup=warmup, relay=side == "relay",
                                     tokens=side == "cronoq", out=None)  # the relay has no tokens
        summary = soak.run(settings, log=lambda text: None)
        found[side] = summary
        log(f"  probe through {side}: p50 {summary['probe']['p50_ms']:.2f} ms, p99 {summary['probe']['p99_ms']:.2f} ms"
            f" ({summary['probe']['count']:,} round trips) at {summary.get('tasks_per_s', 0):,.0f} tasks/s")
    relay, cronoq = found["relay"]["probe"]["p99_ms"], found["cronoq"]["probe"]["p99_ms"]
    return {"figure": "probe", "unit": "ms", "relay": relay, "cronoq": cronoq, "ratio": cronoq / relay,
            "target_ratio": TARGETS["probe"], "seconds": seconds,
            "relay_probe": found["relay"]["probe"], "cronoq_probe": found["cronoq"]["probe"],
            "relay_tasks_per_s": found["relay"].get("tasks_per_s"),
            "cronoq_tasks_per_s": found["cronoq"].get("tasks_per_s")}


def _memory(s: BenchSettings, log: Callable[[str], None]) -> dict[str, Any]:
    from bench import scale

    row = scale.memory_row(s, log)
    return {"figure": "memory", "unit": "B per queued task, payload aside", "relay": None,
            "cronoq": row["bytes_per_task_payload_aside"], "bytes_per_task": row["bytes_per_task"],
            "payload_bytes": row["payload_bytes"], "tasks": row["tasks"], "target_bytes": TARGETS["memory"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/close_to_wire.py", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs of each side (default 3)")
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per throughput run (default 10,000)")
    parser.add_argument("--window", type=int, default=1_000, help="tasks in flight in throughput runs (default 1,000)")
    # 200 round trips (a quarter of a second) moved the p50 from 0.82 to 1.55 ms between rounds of the same code.
    parser.add_argument("--light-tasks", type=int, default=1_000, help="tasks of a sequential run (default 1,000)")
    parser.add_argument("--memory-tasks", type=int, default=1_000_000,
                        help="tasks queued for the memory figure (default 1,000,000)")
    parser.add_argument("--probe-seconds", type=float, default=30.0,
                        help="seconds of each side's soak for the probe (default 30; the first 5 left out)")
    parser.add_argument("--only", help=f"comma-separated figures, from {', '.join(FIGURES)}")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    return parser.parse_args(argv)


def table(figures: list[dict[str, Any]]) -> str:
    """The figures as text: cronoq beside the relay, and the bound."""
    lines = []
    for f in figures:
        if f["figure"] == "memory":
            met = f["cronoq"] <= f["target_bytes"]
            lines.append(f"{f['figure']:<30} cronoq {f['cronoq']:8,.0f} B/task at {f['tasks']:,} queued"
                         f"{'':10} bound {f['target_bytes']:.0f} B: {'met' if met else 'NOT met'}")
            continue
        met = f["ratio"] >= f["target_ratio"] if f["figure"] == "throughput" else f["ratio"] <= f["target_ratio"]
        fmt = ",.0f" if f["figure"] == "throughput" else ".3f"
        name = f["figure"] + ("" if f.get("way", "call") == "call" else " (submit, result)") + (
            "" if f.get("results_store", True) else " (no store)")
        lines.append(f"{name:<30} relay {format(f['relay'], fmt):>8} {f['unit']:<7} cronoq "
                     f"{format(f['cronoq'], fmt):>8}  {f['ratio']:.2f}x  bound {f['target_ratio']}x: "
                     f"{'met' if met else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.run import _busy_seconds, _our_seconds, machine

    args = parse_args(argv)
    chosen = [x.strip() for x in args.only.split(",")] if args.only else list(FIGURES)
    unknown = [x for x in chosen if x not in FIGURES]
    if unknown:
        raise SystemExit(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    for name in ("repeat", "tasks", "window", "light_tasks", "memory_tasks"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.probe_seconds < 10:
        raise SystemExit("--probe-seconds must be at least 10 (the first 5 are left out)")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    s = BenchSettings(repeat=args.repeat, tasks=args.tasks, window=args.window, memory_tasks=args.memory_tasks)
    log(f"close to the wire: {', '.join(chosen)}; child logs in {log_dir()}")
    info = machine()
    if os.environ.get("BENCH_CRONOQ_NOTE"):
        info["cronoq_note"] = os.environ["BENCH_CRONOQ_NOTE"]
    busy0, ours0, wall0 = _busy_seconds(), _our_seconds(), time.perf_counter()
    figures: list[dict[str, Any]] = []
    try:
        if {"sequential", "throughput"} & set(chosen):
            runs = _speed_runs(s, args.light_tasks, set(chosen), log)
            for name, unit, key in (("sequential", "ms p50", "p50_ms"), ("throughput", "tasks/s", "tasks_per_s")):
                if name in chosen:
                    for way, side in (("call", "cronoq"), ("submit", "cronoq_submit")):
                        figures.append(_ratio_figure(name, unit, key, runs["relay"][name], runs[side][name], way))
            if "throughput" in chosen:
                figures.append(_ratio_figure("throughput", "tasks/s", "tasks_per_s", runs["relay"]["throughput"],
                                             runs["cronoq_unstored"]["throughput"], "call", results_store=False))
        if "memory" in chosen:
            figures.append(_memory(s, log))
        if "probe" in chosen:
            figures.append(_probe(args.probe_seconds, 5.0, log))
    finally:
        Children.stop_all()
    wall = time.perf_counter() - wall0
    foreign = max(0.0, (_busy_seconds() - busy0) - (_our_seconds() - ours0)) / wall
    print(f"\nclose to the wire, cronoq durable with tokens beside the bare relay; other processes used "
          f"{foreign:.2f} cores meanwhile\n")
    print(table(figures))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        settings = {"repeat": args.repeat, "tasks": args.tasks, "window": args.window,
                    "light_tasks": args.light_tasks, "memory_tasks": args.memory_tasks,
                    "probe_seconds": args.probe_seconds, "workers": s.workers, "concurrency": s.concurrency,
                    "only": chosen}
        report.write_json(RESULTS / f"wire-{stamp}.json",
                          {"timestamp": stamp, "settings": settings, "machine": info,
                           "foreign_load_cores": foreign, "wall_s": wall, "figures": figures})
        print(f"\nwrote bench/results/wire-{stamp}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
