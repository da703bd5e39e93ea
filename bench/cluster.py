"""Aggregate throughput of a two-member cluster against one broker, on the same machine, with CPU per task.

    python bench/cluster.py                      # 3 runs each, 20,000 tasks per pool, 500 in flight per pool
    python bench/cluster.py --tasks 5000 --repeat 1

Both setups serve the same two pools (`p0`, `p1`) with the same two `cronoq-worker --concurrency 64`
processes (bench.apps:pair, an async noop) and the same load: one client process driving both pools at once
through the public API (`bench/load.py`: submit, await the result, check it, repeat), 500 in flight per pool.
The cluster pins p0 to member b1 and p1 to b2; the workers and the client are given b1's address only and
learn the rest from the cluster map. Durability is the default (written before `accepted`).

On a machine with few cores the members, the workers and the load generator share them, so tasks/s alone
says little: the table also gives CPU seconds per 1,000 tasks for the brokers, the workers and the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

if __package__ in (None, ""):  # `python bench/cluster.py` from the repository's root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Children, child_env, cpu_seconds, free_port, log_dir, python, wait_for_line
from bench.load import drive_cronoq
from bench.stacks import start_cronoq_worker

POOLS = ("p0", "p1")


def _config(members: list[str]) -> tuple[str, dict[str, tuple[str, str]]]:
    """One config file for a lone broker (members == ["solo"]) or a cluster; returns it and each member's
    (clients, workers) addresses."""
    addresses = {m: (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}") for m in members}
    if members == ["solo"]:
        clients, workers = addresses["solo"]
        text = f'[broker]\nclients = "{clients}"\nworkers = "{workers}"\n'
        text += "".join(f'[[pools]]\nname = "{p}"\n' for p in POOLS)
        return text, addresses
    text = "[cluster]\n" + "".join(
        f'[[cluster.members]]\nname = "{m}"\nclients = "{c}"\nworkers = "{w}"\n' for m, (c, w) in addresses.items())
    text += "".join(f'[[pools]]\nname = "{p}"\nmember = "{members[i % len(members)]}"\n' for i, p in enumerate(POOLS))
    return text, addresses


@contextlib.contextmanager
def setup(members: list[str], workers: int, concurrency: int) -> Iterator[tuple[str, list[int], list[int]]]:
    """The brokers and workers of one setup; yields (the client address, broker pids, worker pids)."""
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-cluster-") as tmp:
        folder = Path(tmp)
        text, addresses = _config(members)
        config = folder / "cronoq.toml"
        config.write_text(text)
        procs: list[subprocess.Popen] = []
        try:
            brokers = []
            for m in members:
                log = log_dir() / f"{folder.name}-{m}.log"
                args = [python(), "-m", "cronoq.broker.cli", "-c", str(config), "--log-level", "WARNING"]
                if m != "solo":
                    args += ["--member", m]
                proc = Children.spawn(args, log, env=child_env(), cwd=folder)
                procs.append(proc)
                brokers.append(proc)
                wait_for_line(proc, log, "cronoq broker ready")
            first = members[0]
            worker_procs = []
            for i in range(workers):
                proc = start_cronoq_worker(addresses[first][1], "bench.apps:pair", concurrency,
                                           log_dir() / f"{folder.name}-worker-{i}.log", tokens=False)
                procs.append(proc)
                worker_procs.append(proc)
            time.sleep(0.5)  # member workers register with the other members too
            yield addresses[first][0], [p.pid for p in brokers], [p.pid for p in worker_procs]
        finally:
            for proc in reversed(procs):
                Children.stop(proc)


async def _load(address: str, tasks: int, window: int) -> float:
    """Both pools at once, `tasks` each; returns the seconds it took."""
    started = time.perf_counter()
    runs = await asyncio.gather(*(drive_cronoq(address, tasks, window, pool=pool) for pool in POOLS))
    elapsed = time.perf_counter() - started
    for run, results in runs:
        assert results == list(range(tasks)), "a task came back with another task's number"
    return elapsed


def measure(members: list[str], tasks: int, window: int, workers: int, concurrency: int) -> dict[str, Any]:
    import uvloop

    with setup(members, workers, concurrency) as (address, brokers, worker_pids):
        uvloop.run(_load(address, min(1000, tasks), window))  # warm-up
        before = (cpu_seconds(brokers), cpu_seconds(worker_pids), time.process_time())
        elapsed = uvloop.run(_load(address, tasks, window))
        after = (cpu_seconds(brokers), cpu_seconds(worker_pids), time.process_time())
    total = tasks * len(POOLS)
    per_k = [1000 * (a - b) / total for a, b in zip(after, before)]
    return {"tasks": total, "seconds": elapsed, "tasks_per_s": total / elapsed,
            "cpu_ms_per_task": {"brokers": per_k[0], "workers": per_k[1], "client": per_k[2]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per pool per run (default 20,000)")
    parser.add_argument("--window", type=int, default=500, help="tasks in flight per pool (default 500)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per setup; the median is reported (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=64, help="each worker's concurrency (default 64)")
    args = parser.parse_args(argv)
    rows = {}
    for name, members in (("one broker", ["solo"]), ("cluster of 2", ["b1", "b2"])):
        runs = []
        for i in range(args.repeat):
            runs.append(measure(members, args.tasks, args.window, args.workers, args.concurrency))
            print(f"{name} run {i + 1}: {runs[-1]['tasks_per_s']:,.0f} tasks/s", flush=True)
        runs.sort(key=lambda r: r["tasks_per_s"])
        rows[name] = {"median": runs[len(runs) // 2], "runs": runs}
    print(f"\n{'setup':<14} {'tasks/s':>9} {'broker CPU':>11} {'worker CPU':>11} {'client CPU':>11}  (ms per task)")
    for name, row in rows.items():
        m = row["median"]
        cpu = m["cpu_ms_per_task"]
        print(f"{name:<14} {m['tasks_per_s']:>9,.0f} {cpu['brokers']:>11.3f} {cpu['workers']:>11.3f} "
              f"{cpu['client']:>11.3f}")
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
               "processor": platform.processor() or platform.machine()}
    out = Path(__file__).resolve().parent / "results" / f"cluster-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps({"args": vars(args), "machine": machine, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
