"""Takeover time: kill -9 the broker holding N queued tasks, and time until its standby serves.

    python -m bench.takeover                       # 100,000 queued tasks, 3 takeovers
    python -m bench.takeover --tasks 1000000 --runs 1

Two broker processes share one config (and so one data_dir), on endpoints of
their own (`--clients`/`--workers`): one serves, the other runs with
`--standby`. The pool is paused while N tasks are queued, so they stay
queued. One client is connected to both addresses before the kill; right
after `kill -9` of the serving broker it asks the `status` of the last task
queued, and the takeover time is from the kill to that answer (the first
request the standby serves). The standby's log splits it: until it took the
lock (the kill, the kernel letting go of the lock, the standby's next poll),
until it had recovered (bind, replay), and the rest (the client's
connection, the reply). After each takeover the process that was killed is
started again as the standby, and the roles swap for the next run; every
run checks that all N tasks are still queued.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Children, child_env, cpu_seconds, free_port, log_dir, python, wait_for_line
from bench.stacks import broker_config

LOCK_LINE = "taking over data_dir"
RECOVERED_LINE = "carrying on from"


class Node:
    """One host's broker: the shared config, its own endpoints, started as primary or standby."""

    def __init__(self, config: Path, name: str) -> None:
        self.config = config
        self.name = name
        self.clients = f"tcp://127.0.0.1:{free_port()}"
        self.workers = f"tcp://127.0.0.1:{free_port()}"
        self.log = log_dir() / f"takeover-{os.getpid()}-{name}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, *, standby: bool) -> None:
        self.starts += 1
        self.log = log_dir() / f"takeover-{os.getpid()}-{self.name}-{self.starts}.log"
        args = [python(), "-m", "cronoq.broker.cli", "-c", str(self.config), "--log-level", "INFO",
                "--clients", self.clients, "--workers", self.workers]
        self.proc = Children.spawn(args + (["--standby"] if standby else []), self.log, env=child_env(),
                                   cwd=self.config.parent)
        wait_for_line(self.proc, self.log, "cronoq broker standing by" if standby else "cronoq broker ready",
                      timeout=600)

    def kill(self) -> float:
        """kill -9; returns the wall-clock time of the signal."""
        assert self.proc is not None
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        Children.stop(self.proc)
        return at

    def logged_at(self, text: str) -> float:
        """The wall-clock time of the first log line containing `text` (its ts= field)."""
        line = wait_for_line(self.proc, self.log, text, timeout=600)  # type: ignore[arg-type]
        stamp = line.split()[0].removeprefix("ts=")
        return datetime.datetime.fromisoformat(stamp).timestamp()


async def _queue(address: str, tasks: int, window: int) -> str:
    """Pause pool default and queue `tasks` tasks in it; returns the last one's id."""
    import cronoq
    from bench.load import submit_many

    async with cronoq.connect(address) as sched:
        await sched.pause("default")
    ids = await submit_many(address, tasks, window, timeout=7200)
    return ids[-1]


async def _takeover(serving: Node, standby: Node, probe: str, tasks: int) -> dict[str, float]:
    """Kill `serving`; time until `standby` answers a status; check that every task is still queued."""
    import cronoq

    async with cronoq.connect([serving.clients, standby.clients], request_timeout=600) as sched:
        await sched.ping()  # connected to the serving broker before the kill
        killed = serving.kill()
        info = await sched.status(probe)
        served = time.time()
        queued = (await sched.stats())["pools"]["default"]["queued"]
    if info.state != "queued" or queued != tasks:
        raise AssertionError(f"after the takeover: probe {info.state}, {queued} of {tasks} tasks queued")
    assert standby.proc is not None
    locked, recovered = standby.logged_at(LOCK_LINE), standby.logged_at(RECOVERED_LINE)
    return {"served_s": served - killed, "lock_s": locked - killed, "recovery_s": recovered - locked,
            "answer_s": served - recovered, "standby_cpu_s": cpu_seconds([standby.proc.pid])}


def run(tasks: int, runs: int, window: int) -> dict[str, Any]:
    """`runs` takeovers of a data_dir holding `tasks` queued tasks; every figure of every run."""
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="cronoq-takeover-") as tmp:
        folder = Path(tmp)
        text, _, _ = broker_config(durable=True, tokens=False, data_dir=folder / "data")
        config = folder / "cronoq.toml"
        config.write_text(text)
        a, b = Node(config, "a"), Node(config, "b")
        try:
            a.start(standby=False)
            print(f"  queueing {tasks:,} tasks…", flush=True)
            probe = asyncio.run(_queue(a.clients, tasks, window))
            b.start(standby=True)
            serving, standby = a, b
            for number in range(1, runs + 1):
                figures = asyncio.run(_takeover(serving, standby, probe, tasks))
                results.append(figures)
                print(f"  takeover {number}: served {figures['served_s']:.3f} s after kill -9 (lock "
                      f"{figures['lock_s']:.3f} s, recovery {figures['recovery_s']:.3f} s, answer "
                      f"{figures['answer_s']:.3f} s); standby CPU {figures['standby_cpu_s']:.2f} s; load average "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
                serving.start(standby=True)  # the killed host comes back, as the standby now
                serving, standby = standby, serving
        finally:
            for node in (a, b):
                if node.proc is not None:
                    Children.stop(node.proc)
    return {"tasks": tasks, "runs": results, "machine": _machine()}


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_average": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.takeover", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks queued in the data_dir (default 100,000)")
    parser.add_argument("--runs", type=int, default=3, help="takeovers, the roles swapping each time (default 3)")
    parser.add_argument("--window", type=int, default=1000, help="submits in flight while queueing")
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    args = parser.parse_args(argv)
    out = run(args.tasks, args.runs, args.window)
    served = sorted(r["served_s"] for r in out["runs"])
    print(f"takeover with {args.tasks:,} queued: served after {', '.join(f'{s:.3f}' for s in served)} s "
          f"(median {served[len(served) // 2]:.3f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
