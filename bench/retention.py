"""Retention and the store, measured: `python -m bench.retention COMMAND`.

Commands (each prints its figures; docs/durability.md quotes them):

  soak [--seconds 600]   a default durable broker at full rate (2 workers x 64 slots, one client keeping 1,000
                         noop tasks in flight): every 5 s its RSS, data_dir size, records in memory, rate, and the
                         longest ping the whole time (a stall of the loop shows there)
  restart [--tasks N]    restart a broker holding N queued tasks, then one holding N retained results
  restart-ab COPY...     one data_dir of N queued tasks restarted by each copy of cronoq in turn (its path put first
                         on PYTHONPATH: "Benchmarking a modified copy" in bench/README.md), interleaved A B, B A, ...
  store [--rows N]       the two candidate stores for retained results: SQLite (the one used) and the journal's
                         own frames in segment files with an id index in memory
  archiver [--rows N]    the results store's hand-over, step by step: the broker's side and the archiver's
                         (decode, fields and hashes, insert, filter, retention, commit), CPU per task
  memory [--tasks N]     what a finished record costs in memory (RECORD_MEMORY), in a task book without a store
  thread                 a SQLite writer thread beside a busy loop: why the archiver is a process
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import Children, child_env, log_dir, python, rss_bytes  # noqa: E402
from bench.stacks import TOKENS, CronoqBroker, broker_config, start_cronoq_worker  # noqa: E402


def _children(pid: int) -> list[int]:
    """The broker's child processes now (its archiver, and a compaction child while one runs)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _dir_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


# --------------------------------------------------------------------- soak


async def _load(address: str, seconds: float, window: int) -> None:
    """The client: `window` submit-then-result loops until `seconds` have passed (run as its own process)."""
    import cronoq
    from bench.common import payload

    end = time.monotonic() + seconds
    done = 0

    async def lane(sched: Any) -> None:
        nonlocal done
        n = 0
        while time.monotonic() < end:
            handle = await sched.submit(payload(n))
            await handle.result(timeout=120)
            n += 1
            done += 1

    async with cronoq.connect(address, request_timeout=120) as sched:
        await asyncio.gather(*(lane(sched) for _ in range(window)))
    print(f"load done: {done} tasks", flush=True)


async def _watch(address: str, broker_pid: int, data_dir: Path, seconds: float, every: float) -> list[dict]:
    """Sample the broker every `every` seconds, and ping it every 50 ms meanwhile (the longest wait per sample)."""
    import cronoq
    from bench.common import cpu_seconds

    samples: list[dict] = []
    started = time.monotonic()
    async with cronoq.connect(address, request_timeout=60) as sched:
        last_finished = None
        while time.monotonic() - started < seconds:
            longest = 0.0
            until = time.monotonic() + every
            while time.monotonic() < until:
                sent = time.perf_counter()
                await sched.ping()
                longest = max(longest, time.perf_counter() - sent)
                await asyncio.sleep(0.05)
            stats = await sched.stats()
            finished = sum(pool["dispatched"] for pool in stats["pools"].values())
            sample = {
                "t": round(time.monotonic() - started, 1), "rss": rss_bytes(broker_pid), "data_dir": _dir_bytes(data_dir),
                "cpu": cpu_seconds([broker_pid]), "children_cpu": cpu_seconds(_children(broker_pid)),
                "memory": stats.get("memory", {}), "store": stats.get("store", {}), "longest_ping": longest,
                "rate": 0.0 if last_finished is None else (finished - last_finished) / every,
            }
            last_finished = finished
            samples.append(sample)
            print(f"  t={sample['t']:6.1f}s rss={sample['rss'] / 2**20:7.1f} MiB data_dir="
                  f"{sample['data_dir'] / 2**20:6.1f} MiB in memory={sample['memory'].get('records', '?'):>6} "
                  f"stored rows={sample['store'].get('results', {}).get('rows', '?'):>8} rate={sample['rate']:8.0f}/s "
                  f"longest ping={longest * 1000:6.1f} ms cpu={sample['cpu']:.0f}+{sample['children_cpu']:.0f} s "
                  f"load={os.getloadavg()[0]:.1f}", flush=True)
    return samples


def soak(seconds: float, window: int, workers: int, concurrency: int, every: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cronoq-soak-") as tmp:
        folder = Path(tmp)
        text, clients, workers_address = broker_config(durable=True, tokens=False, data_dir=folder / "data")
        broker = CronoqBroker(text, folder)
        procs: list[subprocess.Popen] = []
        try:
            proc = broker.start()
            for i in range(workers):
                procs.append(start_cronoq_worker(workers_address, "bench.apps:noop", concurrency,
                                                 log_dir() / f"soak-worker-{i}.log", tokens=False))
            load = Children.spawn([python(), "-m", "bench.retention", "load", clients, str(seconds), str(window)],
                                  log_dir() / "soak-load.log", env=child_env(TOKENS))
            procs.append(load)
            samples = asyncio.run(_watch(clients, proc.pid, folder / "data", seconds, every))
        finally:
            for child in procs:
                Children.stop(child)
            broker.stop()
    after_minute = [s for s in samples if s["t"] >= 60.0] or samples
    rates = [s["rate"] for s in samples[1:]]
    summary = {
        "seconds": seconds, "rate_median": statistics.median(rates) if rates else 0.0,
        "rss_first": samples[0]["rss"], "rss_at_1min": after_minute[0]["rss"], "rss_max": max(s["rss"] for s in samples),
        "rss_last": samples[-1]["rss"], "rss_growth_after_1min": max(s["rss"] for s in after_minute) - after_minute[0]["rss"],
        "data_dir_max": max(s["data_dir"] for s in samples),
        "memory_records_max": max(s["memory"].get("records", 0) for s in samples),
        "longest_ping": max(s["longest_ping"] for s in samples),
        "broker_cpu_per_task_us": (samples[-1]["cpu"] - samples[0]["cpu"]) / max(1.0, sum(rates) * every) * 1e6,
        "archiver_cpu_per_task_us": (samples[-1]["children_cpu"] - samples[0]["children_cpu"])
        / max(1.0, sum(rates) * every) * 1e6,
    }
    print("soak:", " ".join(f"{k}={v / 2**20:.1f}MiB" if k.startswith(("rss", "data")) else f"{k}={v:.3g}"
                           for k, v in summary.items()))
    return {"summary": summary, "samples": samples}


# --------------------------------------------------------------------- restart


def _restart_seconds(broker: CronoqBroker, clients: str, probe_id: str) -> tuple[float, float, float]:
    """(s to the ready line, s until `status` of `probe_id` answered, CPU s the broker used by then) for a start
    of `broker`. The CPU time is what a busy machine cannot inflate much: the broker's own work."""
    import cronoq
    from bench.common import cpu_seconds

    started = time.perf_counter()
    proc = broker.start(timeout=600)
    ready = time.perf_counter() - started

    async def status() -> str:
        async with cronoq.connect(clients, request_timeout=120) as sched:
            return (await sched.status(probe_id)).state

    state = asyncio.run(status())
    serving = time.perf_counter() - started
    cpu = cpu_seconds([proc.pid])
    print(f"    ready line {ready:.2f} s, status of {probe_id[:8]}… ({state}) answered {serving:.2f} s after start; "
          f"broker CPU {cpu:.2f} s; load average {os.getloadavg()[0]:.1f}", flush=True)
    return ready, serving, cpu


RETAIN_BYTES = 1 << 30
"""The retention budget for the restart with retained results: room for all of them (the default keeps ~450,000)."""


def restart(tasks: int, window: int, runs: int) -> dict[str, Any]:
    from bench.load import drive_cronoq, submit_many
    from bench.scale import _pause

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cronoq-restart-") as tmp:
        folder = Path(tmp)
        text, clients, workers_address = broker_config(durable=True, tokens=False, data_dir=folder / "data")
        broker = CronoqBroker(text, folder)
        broker.start()
        asyncio.run(_pause(clients))
        print(f"  queueing {tasks:,} tasks…", flush=True)
        ids = asyncio.run(submit_many(clients, tasks, window, timeout=7200))
        times = []
        for _ in range(runs):
            broker.stop(grace=600)
            times.append(_restart_seconds(broker, clients, ids[-1]))
        print(f"  data_dir {_dir_bytes(folder / 'data') / 2**20:.0f} MiB")
        broker.stop(grace=600)
        out["queued"] = {"tasks": tasks, "runs": times}
    with tempfile.TemporaryDirectory(prefix="cronoq-restart-") as tmp:
        folder = Path(tmp)
        text, clients, workers_address = broker_config(durable=True, tokens=False, data_dir=folder / "data")
        text = text.replace("[broker]\n", f"[broker]\nresult_retention_bytes = {RETAIN_BYTES}\n", 1)
        broker = CronoqBroker(text, folder)
        broker.start()
        worker = start_cronoq_worker(workers_address, "bench.apps:noop", 64, log_dir() / "restart-worker.log",
                                     tokens=False)
        try:
            print(f"  running {tasks:,} tasks…", flush=True)
            first = asyncio.run(submit_many(clients, 1, 1))[0]
            asyncio.run(drive_cronoq(clients, tasks, window, timeout=7200))
        finally:
            Children.stop(worker)
        times = []
        for _ in range(runs):
            broker.stop(grace=600)
            times.append(_restart_seconds(broker, clients, first))
        print(f"  data_dir {_dir_bytes(folder / 'data') / 2**20:.0f} MiB")
        broker.stop(grace=600)
        out["retained"] = {"tasks": tasks, "runs": times}
    return out


def restart_ab(copies: list[Path], tasks: int, window: int, runs: int) -> dict[str, Any]:
    """Queue `tasks` tasks once (with this repository's cronoq), then start a fresh copy of that data_dir with
    each copy of cronoq in turn, `runs` times each, in the order A B, B A, A B ...: a change to the restart
    against the code before it, on the same bytes and as close in time as can be."""
    import shutil

    from bench.load import submit_many
    from bench.scale import _pause

    labels = [chr(ord("A") + n) for n in range(len(copies))]
    times: dict[str, list[tuple[float, float, float]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="cronoq-restart-ab-") as tmp:
        folder = Path(tmp)
        filled, data = folder / "filled", folder / "data"
        text, clients, _ = broker_config(durable=True, tokens=False, data_dir=data)
        broker = CronoqBroker(text, folder)
        broker.start()
        asyncio.run(_pause(clients))
        print(f"  queueing {tasks:,} tasks…", flush=True)
        probe = asyncio.run(submit_many(clients, tasks, window, timeout=7200))[-1]
        broker.stop(grace=600)
        data.rename(filled)
        print(f"  data_dir {_dir_bytes(filled) / 2**20:.0f} MiB", flush=True)
        before = os.environ.get("PYTHONPATH")
        try:
            for run in range(runs):
                for label in labels if run % 2 == 0 else labels[::-1]:
                    shutil.rmtree(data, ignore_errors=True)
                    shutil.copytree(filled, data)  # each start reads the same bytes, from the page cache
                    os.environ["PYTHONPATH"] = str(copies[labels.index(label)])  # child_env puts it first
                    print(f"  {label} ({copies[labels.index(label)]}):", flush=True)
                    times[label].append(_restart_seconds(broker, clients, probe))
                    broker.stop(grace=600)
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
    for label, copy in zip(labels, copies):
        serving = sorted(f"{t[1]:.2f}" for t in times[label])
        cpu = sorted(f"{t[2]:.2f}" for t in times[label])
        print(f"  {label} {copy}: served again after {', '.join(serving)} s; broker CPU {', '.join(cpu)} s")
    return {"tasks": tasks, "copies": [str(copy) for copy in copies], "runs": times}


# --------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("soak")
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--every", type=float, default=5.0)
    p = sub.add_parser("load")
    p.add_argument("address")
    p.add_argument("seconds", type=float)
    p.add_argument("window", type=int)
    p = sub.add_parser("restart")
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("restart-ab")
    p.add_argument("copies", nargs="+", type=Path, help="directories that each hold a cronoq package")
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("store")
    p.add_argument("--rows", type=int, default=200_000)
    p = sub.add_parser("archiver")
    p.add_argument("--rows", type=int, default=900_000)
    p.add_argument("--batch", type=int, default=5_600)
    p = sub.add_parser("memory")
    p.add_argument("--tasks", type=int, default=100_000)
    sub.add_parser("thread")
    args = parser.parse_args(argv)
    if args.command == "soak":
        soak(args.seconds, args.window, args.workers, args.concurrency, args.every)
    elif args.command == "load":
        asyncio.run(_load(args.address, args.seconds, args.window))
    elif args.command == "restart":
        restart(args.tasks, args.window, args.runs)
    elif args.command == "restart-ab":
        restart_ab(args.copies, args.tasks, args.window, args.runs)
    elif args.command == "store":
        from bench.retention_store import compare
        compare(args.rows)
    elif args.command == "archiver":
        from bench.retention_store import archiver_steps
        archiver_steps(args.rows, args.batch)
    elif args.command == "memory":
        from bench.retention_store import record_memory
        record_memory(args.tasks)
    elif args.command == "thread":
        from bench.retention_store import writer_thread
        writer_thread()


if __name__ == "__main__":
    gc.collect()
    main()
