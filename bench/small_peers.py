"""`python bench/small_peers.py`: many small peers against few large ones, in CPU per task.

    python bench/small_peers.py                       # both comparisons, 2 rounds each, 20 s a run
    python bench/small_peers.py --only workers --repeat 3 --seconds 30

A durable broker (built-in durability) with pool `default`, noop tasks and
1,000 tasks in flight in every case:

  workers   2 worker processes x 64 slots   against   40 x 4 (160 slots)
  clients   1 client connection, 1,000 in flight   against   200 connections x 5, from 4 processes

Runs alternate (A B A B ...), since the machine is shared. Each reports
tasks/s and the CPU microseconds per task of the broker, of all workers and
of all client processes, measured from /proc between a warm-up and the end.
"""

from __future__ import annotations

import argparse
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
from bench.soak import _count_at, _lines, scrape  # noqa: E402
from bench.stacks import TOKENS, CronoqBroker, broker_config  # noqa: E402

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
            time.sleep(seconds)
            t1, cpu1, passes1 = time.time(), {k: cpu_seconds(v) for k, v in groups.items()}, _passes(metrics)
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
    out["cpu_us_total"] = sum(out[f"cpu_us_{g}"] for g in groups)
    out["tasks_per_pass"] = tasks / (passes1 - passes0) if passes1 > passes0 else float("nan")
    return out


def _passes(address: str) -> float:
    """Passes of the broker's loop so far (from its metrics; 0 for a broker that does not count them)."""
    for line in scrape(address).splitlines():
        if line.startswith("cronoq_loop_pass_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def line(row: dict[str, Any]) -> str:
    return (f"  {row['case']:<18} {row['tasks_per_s']:>8,.0f} tasks/s   CPU us/task: broker {row['cpu_us_broker']:5.1f}"
            f"  workers {row['cpu_us_workers']:5.1f}  clients {row['cpu_us_clients']:5.1f}  total {row['cpu_us_total']:5.1f}"
            f"   {row['tasks_per_pass']:.1f} tasks/pass")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/small_peers.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run (default 20)")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of A B (default 2)")
    parser.add_argument("--only", choices=sorted(CASES), help="one comparison only")
    args = parser.parse_args(argv)
    note = os.environ.get("BENCH_CRONOQ_NOTE", "")
    for name in [args.only] if args.only else sorted(CASES, reverse=True):
        print(f"{name}{' — ' + note if note else ''}:", flush=True)
        rows: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for case in CASES[name]:
                row = run_case(case, args.seconds)
                rows.setdefault(case.name, []).append(row)
                print(line(row), flush=True)
        small, large = CASES[name][1].name, CASES[name][0].name
        for key in ("cpu_us_total", "cpu_us_broker", "cpu_us_workers"):
            ratio = sorted(r[key] for r in rows[small])[len(rows[small]) // 2] / \
                sorted(r[key] for r in rows[large])[len(rows[large]) // 2]
            print(f"  {small} / {large}, {key[4:]}: {ratio:.2f}x (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
