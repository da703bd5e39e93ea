"""`python bench/ab.py A B`: two versions of cronoq taking turns on the same machine, beside the relay.

    python bench/ab.py 50ba7fc HEAD                                 # one task at a time, `call`, 4 rounds
    python bench/ab.py 50ba7fc HEAD --window 1000 --tasks 10000    # at full rate
    python bench/ab.py HEAD /tmp/copy --no-relay                    # a commit against a modified copy

A side is a git revision (its `cronoq` package is taken with `git archive`
into a folder of its own) or a folder that holds a `cronoq` package. Each
round runs the relay and both sides once, each in a process of its own with
its copy first on PYTHONPATH, so that the broker, its archiver, the workers
and the client all run that copy; the order turns round every round, so
that neither side always follows the other. Each run is printed as it
ends (p50, tasks/s, CPU per task of every process, the hypervisor's share
of the machine meanwhile), then the medians, each over the relay's.

On this shared 2-core VM one run moves by a third; a difference is worth
believing when it holds in most pairs of rounds, not in the medians alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # `python bench/ab.py` runs from anywhere

from bench.common import ROOT, Children, archiver_pids, cpu_seconds  # noqa: E402

RELAY = "relay"


def steal_counters() -> tuple[int, int]:
    """(steal, all) jiffies of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7], sum(fields)


def measure(side: str, tasks: int, window: int, call: bool) -> dict[str, Any]:
    """One run in this process: the relay, or the cronoq on PYTHONPATH (durable, tokens, 2 workers x 64)."""
    from bench.load import drive_cronoq
    from bench.relay import drive_relay
    from bench.stacks import TOKENS, cronoq_stack, relay_stack
    from bench.throughput import _run_async

    def client_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    if side == RELAY:
        stack_of, drive = relay_stack(2, 64), lambda stack, n: drive_relay(stack.address, n, window)
    else:
        token = TOKENS["BENCH_CLIENT_TOKEN"]
        stack_of = cronoq_stack(durable=True, tokens=True, workers=2, concurrency=64)

        async def drive(stack: Any, n: int) -> Any:
            return (await drive_cronoq(stack.address, n, window, token=token, call=call))[0]
    with stack_of as stack:
        _run_async(drive(stack, min(tasks, 1_000)))  # warm-up
        archiver = [] if side == RELAY else archiver_pids(stack.broker.pid)
        groups = {"broker": [stack.broker.pid], "workers": [w.pid for w in stack.workers], "archiver": archiver}
        before = {group: cpu_seconds(pids) for group, pids in groups.items()}
        client_before, steal_before = client_cpu(), steal_counters()
        run = _run_async(drive(stack, tasks))
        after = {group: cpu_seconds(pids) for group, pids in groups.items()}
        client_after, steal_after = client_cpu(), steal_counters()
    cpu = {group: (after[group] - before[group]) / run.tasks * 1e6 for group in groups}
    cpu["client"] = (client_after - client_before) / run.tasks * 1e6
    import cronoq

    return {"p50_ms": run.summary()["p50_ms"], "tasks_per_s": run.tasks / run.elapsed, "cpu_us": cpu,
            "steal": (steal_after[0] - steal_before[0]) / max(1, steal_after[1] - steal_before[1]),
            "cronoq_from": str(Path(cronoq.__file__).resolve().parent.parent)}


def checkout(side: str, into: Path) -> Path:
    """The folder whose `cronoq` package is `side`: the folder itself, or a revision's package put in `into`."""
    folder = Path(side)
    if (folder / "cronoq" / "__init__.py").is_file():
        return folder.resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", side, "cronoq"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"{side!r} is neither a folder holding a cronoq package nor a revision git knows: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_side(label: str, folder: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """One run of one side, in a child process with that side's cronoq first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (folder, ROOT) if p is not None)
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", RELAY if folder is None else "cronoq",
               "--tasks", str(args.tasks), "--window", str(args.window)] + (["--submit"] if args.submit else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {label} run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    run = json.loads(lines[-1])
    if folder is not None and Path(run["cronoq_from"]) != folder:
        raise SystemExit(f"side {label} ran the cronoq in {run['cronoq_from']}, not the one in {folder}")
    return run


def line(label: str, run: dict[str, Any]) -> str:
    cpu = run["cpu_us"]
    text = (f"{label:<6} p50 {run['p50_ms']:8.3f} ms  {run['tasks_per_s']:9,.0f}/s  CPU µs/task: broker "
            f"{cpu['broker']:6.1f} workers {cpu['workers']:6.1f} client {cpu['client']:6.1f} archiver "
            f"{cpu['archiver']:5.1f}")
    return text if "steal" not in run else text + f"  steal {run['steal'] * 100:4.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/ab.py", description=__doc__.split("\n")[0])
    parser.add_argument("sides", nargs="*", metavar="A B", help="two git revisions or folders holding `cronoq`")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; each runs every side once (default 4)")
    parser.add_argument("--tasks", type=int, default=2_000, help="tasks per run (default 2,000)")
    parser.add_argument("--window", type=int, default=1, help="tasks in flight (default 1: one at a time)")
    parser.add_argument("--submit", action="store_true", help="cronoq's client submits, then awaits the result "
                                                              "(default: `call`)")
    parser.add_argument("--no-relay", action="store_true", help="leave the relay out of the rounds")
    parser.add_argument("--measure", choices=(RELAY, "cronoq"), help=argparse.SUPPRESS)  # a child's one run
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.tasks, args.window, call=not args.submit)), flush=True)
        return 0
    if len(args.sides) != 2:
        parser.error("name two sides: git revisions or folders holding a cronoq package")
    for name in ("rounds", "tasks", "window"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cronoq-ab-") as tmp:
        sides: list[tuple[str, Path | None]] = [] if args.no_relay else [(RELAY, None)]
        for label, side in zip("AB", args.sides):
            sides.append((label, checkout(side, Path(tmp) / label)))
        print(f"{args.rounds} rounds of {args.tasks:,} tasks, {args.window:,} in flight, "
              f"{'submit then result' if args.submit else 'call'}; A = {args.sides[0]}, B = {args.sides[1]}",
              flush=True)
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
        started = time.perf_counter()
        try:
            for round_ in range(args.rounds):
                for label, folder in (sides if round_ % 2 == 0 else sides[::-1]):
                    runs[label].append(run_side(label, folder, args))
                    print(f"  round {round_ + 1}  " + line(label, runs[label][-1]), flush=True)
        finally:
            Children.stop_all()
    print(f"\nmedians ({time.perf_counter() - started:.0f} s):")
    relay = runs.get(RELAY)
    for label, side_runs in runs.items():
        p50 = statistics.median(run["p50_ms"] for run in side_runs)
        rate = statistics.median(run["tasks_per_s"] for run in side_runs)
        cpu = {group: statistics.median(run["cpu_us"][group] for run in side_runs)
               for group in side_runs[0]["cpu_us"]}
        summary = {"p50_ms": p50, "tasks_per_s": rate, "cpu_us": cpu}
        versus = ""
        if relay is not None and label != RELAY:
            versus = (f"  = {p50 / statistics.median(r['p50_ms'] for r in relay):.2f}x the relay's p50, "
                      f"{rate / statistics.median(r['tasks_per_s'] for r in relay):.2f}x its rate")
        print(line(label, summary) + versus)
    a, b = runs["A"], runs["B"]
    wins = sum(y["p50_ms"] < x["p50_ms"] for x, y in zip(a, b))
    print(f"B's p50 below A's in {wins} of {len(a)} rounds; B's rate above A's in "
          f"{sum(y['tasks_per_s'] > x['tasks_per_s'] for x, y in zip(a, b))} of {len(a)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
