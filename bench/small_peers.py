"""`python bench/small_peers.py`: many small peers against few large ones, in CPU per task.

    python bench/small_peers.py                       # both comparisons, 2 rounds each, 20 s a run
    python bench/small_peers.py --only workers --repeat 3 --seconds 30
    python bench/small_peers.py --relay --repeat 3 --seconds 15   # the floor: bench/relay.py, 2 x 64 and 40 x 4

A durable broker (built-in durability) with pool `default`, noop tasks and
1,000 tasks in flight in every case:

  workers   2 worker processes x 64 slots   against   40 x 4 (160 slots)
  clients   1 client connection, 1,000 in flight   against   200 connections x 5, from 4 processes

Runs alternate (A B A B ...), since the machine is shared. Each reports
tasks/s, the CPU microseconds per task of the broker, of all workers and
of all client processes, and the context switches per task of the broker
and of all workers (every thread's, voluntary and not), measured from /proc
between a warm-up and the end.

`--relay` runs the worker comparison on the bare relay (`bench/relay.py`,
the same credit per worker, 1,000 requests in flight from this process):
what waking 40 processes costs with no scheduling at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import Children, child_env, cpu_seconds, free_port, log_dir, python, wait_for_line  # noqa: E402
from bench.relay import drive_relay  # noqa: E402
from bench.soak import _count_at, _lines, scrape  # noqa: E402
from bench.stacks import TOKENS, CronoqBroker, broker_config, relay_stack  # noqa: E402

WARMUP = 3.0


@dataclass
class Case:
    name: str
    workers: int
    concurrency: int
    client_processes: int
    connections: int  # per client process
    window: int       # per client process


CASES = {
    "workers": (Case("2 workers x 64", 2, 64, 1, 1, 1000), Case("40 workers x 4", 40, 4, 1, 1, 1000)),
    "clients": (Case("1 client x 1,000", 2, 64, 1, 1, 1000), Case("200 clients x 5", 2, 64, 4, 50, 250)),
}


def _start_workers(address: str, case: Case) -> list[subprocess.Popen]:
    procs, logs = [], []
    for i in range(case.workers):
        log = log_dir() / f"peers-worker-{i}.log"
        procs.append(Children.spawn([python(), "-m", "cronoq.worker.cli", "--broker", address, "--concurrency",
                                     str(case.concurrency), "--log-level", "INFO", "bench.apps:noop"], log,
                                    env=child_env(TOKENS), cwd=log_dir()))
        logs.append(log)
    for proc, log in zip(procs, logs):
        wait_for_line(proc, log, "registered with", timeout=120)
    return procs


def run_case(case: Case, seconds: float) -> dict[str, Any]:
    """One run: tasks/s and CPU µs per task of broker, workers and clients over `seconds` after a warm-up."""
    with tempfile.TemporaryDirectory(prefix="cronoq-peers-") as tmp:
        folder = Path(tmp)
        text, address, workers_address = broker_config(durable=True, tokens=False, data_dir=folder / "data")
        metrics = f"127.0.0.1:{free_port()}"
        text = text.replace("[broker]\n", f'[broker]\nmetrics = "{metrics}"\n', 1)
        broker = CronoqBroker(text, folder)
        workers: list[subprocess.Popen] = []
        clients: list[subprocess.Popen] = []
        try:
            proc = broker.start()
            workers = _start_workers(workers_address, case)
            for i in range(case.client_processes):
                clients.append(Children.spawn(
                    [python(), "-m", "bench.soak_roles", "load", address, str(folder / f"load-{i}.txt"),
                     "--seconds", str(WARMUP + seconds + 2), "--window", str(case.window),
                     "--connections", str(case.connections)], log_dir() / f"peers-load-{i}.log", cwd=log_dir()))
            time.sleep(WARMUP)
            groups = {"broker": [proc.pid], "workers": [w.pid for w in workers], "clients": [c.pid for c in clients]}
            t0, cpu0, passes0 = time.time(), {k: cpu_seconds(v) for k, v in groups.items()}, _passes(metrics)
            switches0 = {k: switches(v) for k, v in groups.items()}
            time.sleep(seconds)
            t1, cpu1, passes1 = time.time(), {k: cpu_seconds(v) for k, v in groups.items()}, _passes(metrics)
            switches1 = {k: switches(v) for k, v in groups.items()}
            for client in clients:
                client.wait(120)
        finally:
            for p in clients + workers:
                Children.stop(p)
            broker.stop()
        tasks = 0.0
        for i in range(case.client_processes):
            progress = [(row[0], row[1]) for row in _lines(folder / f"load-{i}.txt")]
            if progress:
                tasks += _count_at(progress, t1) - _count_at(progress, t0)
    out: dict[str, Any] = {"case": case.name, "tasks": tasks, "tasks_per_s": tasks / (t1 - t0)}
    for group in groups:
        out[f"cpu_us_{group}"] = (cpu1[group] - cpu0[group]) / tasks * 1e6 if tasks else float("nan")
        out[f"switches_{group}"] = (switches1[group] - switches0[group]) / tasks if tasks else float("nan")
    out["cpu_us_total"] = sum(out[f"cpu_us_{g}"] for g in groups)
    out["tasks_per_pass"] = tasks / (passes1 - passes0) if passes1 > passes0 else float("nan")
    return out


def run_relay(case: Case, seconds: float) -> dict[str, Any]:
    """One run of the bare relay with `case`'s workers and credit: as `run_case`, the client being this process."""
    with relay_stack(case.workers, case.concurrency) as stack:
        warmup = asyncio.run(drive_relay(stack.address, 20_000, 1000))
        tasks = max(20_000, int(warmup.tasks / warmup.elapsed * seconds))
        groups = {"broker": [stack.broker.pid], "workers": [w.pid for w in stack.workers]}
        cpu0, switches0 = {k: cpu_seconds(v) for k, v in groups.items()}, {k: switches(v) for k, v in groups.items()}
        own0 = time.process_time()
        run = asyncio.run(drive_relay(stack.address, tasks, 1000))
        own1 = time.process_time()
        cpu1, switches1 = {k: cpu_seconds(v) for k, v in groups.items()}, {k: switches(v) for k, v in groups.items()}
    out: dict[str, Any] = {"case": f"relay {case.workers} x {case.concurrency}", "tasks": run.tasks,
                           "tasks_per_s": run.tasks / run.elapsed, "cpu_us_clients": (own1 - own0) / run.tasks * 1e6}
    for group in groups:
        out[f"cpu_us_{group}"] = (cpu1[group] - cpu0[group]) / run.tasks * 1e6
        out[f"switches_{group}"] = (switches1[group] - switches0[group]) / run.tasks
    out["cpu_us_total"] = out["cpu_us_broker"] + out["cpu_us_workers"] + out["cpu_us_clients"]
    out["tasks_per_pass"] = float("nan")
    return out


def switches(pids: list[int]) -> int:
    """Context switches so far (voluntary and not) of every thread of these processes (0 for any that is gone)."""
    total = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            for row in text.splitlines():
                if row.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(row.split()[1])
    return total


def _passes(address: str) -> float:
    """Passes of the broker's loop so far (from its metrics; 0 for a broker that does not count them)."""
    for line in scrape(address).splitlines():
        if line.startswith("cronoq_loop_pass_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def line(row: dict[str, Any]) -> str:
    return (f"  {row['case']:<18} {row['tasks_per_s']:>8,.0f} tasks/s   CPU us/task: broker {row['cpu_us_broker']:5.1f}"
            f"  workers {row['cpu_us_workers']:5.1f}  clients {row['cpu_us_clients']:5.1f}  total {row['cpu_us_total']:5.1f}"
            f"   switches/task: broker {row['switches_broker']:.2f}  workers {row['switches_workers']:.2f}"
            f"   {row['tasks_per_pass']:.1f} tasks/pass")


def row_name(relay: bool, case: Case) -> str:
    return f"relay {case.workers} x {case.concurrency}" if relay else case.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/small_peers.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run (default 20)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of A B (default 2)")
    parser.add_argument("--only", choices=sorted(CASES), help="one comparison only")
    parser.add_argument("--relay", action="store_true", help="the worker comparison on the bare relay instead")
    args = parser.parse_args(argv)
    note = os.environ.get("BENCH_CRONOQ_NOTE", "")
    names = ["workers"] if args.relay else [args.only] if args.only else sorted(CASES, reverse=True)
    run = run_relay if args.relay else run_case
    for name in names:
        print(f"{name}{' — ' + note if note else ''}:", flush=True)
        rows: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for case in CASES[name]:
                row = run(case, args.seconds)
                rows.setdefault(row["case"], []).append(row)
                print(line(row), flush=True)
        small, large = (row_name(args.relay, c) for c in (CASES[name][1], CASES[name][0]))
        for key in ("cpu_us_total", "cpu_us_broker", "cpu_us_workers", "switches_workers"):
            ratio = sorted(r[key] for r in rows[small])[len(rows[small]) // 2] / \
                sorted(r[key] for r in rows[large])[len(rows[large]) // 2]
            print(f"  {small} / {large}, {key.removeprefix('cpu_us_')}: {ratio:.2f}x (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
