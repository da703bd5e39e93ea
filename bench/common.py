"""What every bench section shares: child processes that always get cleaned up, ports, stats.

Only stdlib here, so the peers' client scripts (run in other virtualenvs)
can import it too.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0

# ~100 bytes once msgpack-encoded: the payload every system in the bench carries.
PAD = "x" * 78


def payload(n: int) -> dict[str, Any]:
    """The task payload: its sequence number plus padding; handlers return `n` so we can check every result."""
    return {"n": n, "op": "noop", "pad": PAD}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: the repo on PYTHONPATH (so `bench.*` imports), unbuffered output."""
    env = dict(os.environ)
    # The repo goes last: PYTHONPATH=/some/copy runs the bench against a modified copy of cronoq.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


class Children:
    """Every process the bench starts, so that all of them die with the bench, even on errors.

    `stop_all` runs at exit and on SIGTERM/SIGINT of the bench process; each
    child gets SIGTERM, then SIGKILL if it has not gone within a grace period.
    """

    _live: list[subprocess.Popen] = []
    _installed = False

    @classmethod
    def spawn(cls, args: Sequence[str], log: Path, *, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        cls._install()
        with open(log, "w") as out:
            proc = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, text=True,
                                    env=env or child_env(), cwd=cwd or ROOT, stdin=subprocess.DEVNULL)
        cls._live.append(proc)
        return proc

    @classmethod
    def stop(cls, proc: subprocess.Popen, *, sig: int = signal.SIGTERM, grace: float = 10.0) -> int:
        """Signal one child and wait for it (SIGKILL after `grace` s); returns its exit code."""
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc in cls._live:
            cls._live.remove(proc)
        return proc.returncode

    @classmethod
    def stop_all(cls) -> None:
        for proc in list(cls._live):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in list(cls._live):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        cls._live.clear()

    @classmethod
    def _install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True
        atexit.register(cls.stop_all)
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit still cleans up
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: Any, previous: Any = previous) -> None:
                cls.stop_all()
                if callable(previous):
                    previous(signum, frame)
                raise SystemExit(128 + signum)

            signal.signal(sig, handler)


def wait_for_line(proc: subprocess.Popen, log: Path, text: str, *, timeout: float = START_TIMEOUT,
                  count: int = 1) -> str:
    """Poll a child's log until `count` lines contain `text`; returns the last such line."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hits = [line for line in log.read_text(errors="replace").splitlines() if text in line]
        if len(hits) >= count:
            return hits[count - 1]
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"{' '.join(map(str, proc.args))} never printed {text!r} (exit {proc.poll()}); "
                       f"its log {log}:\n{log.read_text(errors='replace')[-3000:]}")


def cpu_seconds(pids: Iterable[int]) -> float:
    """User+system CPU seconds used so far by these processes (from /proc; 0 for any that is gone)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def archiver_pids(broker_pid: int) -> list[int]:
    """The broker's results-store archiver process (cronoq.store.results.archiver), as a list: empty if there is none."""
    found = []
    for task in Path(f"/proc/{broker_pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            try:
                if b"cronoq.store.results.archiver" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                pass
    return found


def thread_schedstats(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """Per thread of `pid` (by TID): its name and, from /proc/PID/task/TID/schedstat, the nanoseconds it ran,
    the nanoseconds it waited for a CPU while runnable (the run queue), and how many times it was given one.
    Empty if the process is gone; a thread that ends while being read is left out."""
    out: dict[str, tuple[str, int, int, int]] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            ran, waited, slices = (int(x) for x in Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except (OSError, ValueError):
            continue
        out[tid] = (name, ran, waited, slices)
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, nearest-rank (no interpolation)."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]


@dataclass
class Run:
    """One measured run: how many tasks came back, how long it took, and each task's latency."""

    tasks: int
    elapsed: float
    latencies: list[float] = field(default_factory=list)  # seconds, submit to result
    cpu: dict[str, float] = field(default_factory=dict)   # process group -> CPU seconds used during the run

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.elapsed if self.elapsed > 0 else float("nan")

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        out: dict[str, Any] = {
            "tasks": self.tasks, "elapsed_s": self.elapsed, "tasks_per_s": self.tasks_per_s,
            "p50_ms": percentile(lat, 0.50) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3,
            "p999_ms": percentile(lat, 0.999) * 1e3,
        }
        for group, seconds in self.cpu.items():
            out[f"cpu_us_per_task_{group}"] = seconds / self.tasks * 1e6 if self.tasks else float("nan")
        return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median over runs of every numeric field, plus the runs themselves and the tasks/s range."""
    out: dict[str, Any] = {}
    keys = {k for run in runs for k, v in run.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for key in sorted(keys):
        values = [run[key] for run in runs if key in run]
        out[key] = statistics.median(values)
    if runs and "tasks_per_s" in runs[0]:
        rates = [run["tasks_per_s"] for run in runs]
        out["tasks_per_s_min"], out["tasks_per_s_max"] = min(rates), max(rates)
    out["runs"] = runs
    return out


def log_dir() -> Path:
    """Where child logs go: a per-run temp folder, kept when something fails."""
    path = Path(os.environ.get("BENCH_LOG_DIR") or f"/tmp/cronoq-bench-{os.getpid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def python() -> str:
    return sys.executable


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc), e.g. a Celery worker and its prefork children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out
