"""Peers on the same machine and work: Celery on Redis and arq on Redis, 2 worker processes each.

The bench sets them up itself: redis-server from Debian's packages (installed
with apt-get when missing), started on a free port of 127.0.0.1 with no
persistence and stopped afterwards; Celery from the `bench` extra; arq in a
virtualenv of its own, bench/.venv-arq, made on first use (arq needs
redis-py < 6, which Celery's kombu refuses). When a peer cannot be set up its
rows say why instead of failing the run.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.common import (ROOT, Children, Run, child_env, cpu_seconds, free_port, log_dir, median_of, process_tree,
                          python, wait_for_line)
from bench.settings import BenchSettings

ARQ_VENV = ROOT / "bench" / ".venv-arq"
ARQ_REQUIREMENT = "arq==0.28.0"


class PeerUnavailable(Exception):
    """A peer could not be installed or started; the message goes into its rows."""


def _ensure_redis(log: Callable[[str], None]) -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise PeerUnavailable("redis-server is not installed and apt-get is not available")
    log("  installing redis-server with apt-get ...")
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "redis-server"]):
        done = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise PeerUnavailable(f"`{' '.join(args)}` failed: {done.stderr.strip()[-300:]}")
    found = shutil.which("redis-server")
    if not found:
        raise PeerUnavailable("apt-get installed redis-server but it is not on PATH")
    return found


@contextlib.contextmanager
def redis_server(log: Callable[[str], None]) -> Iterator[tuple[subprocess.Popen, int]]:
    """A throwaway redis-server on 127.0.0.1 (no snapshots, no AOF); stopped on exit."""
    binary = _ensure_redis(log)
    port = free_port()
    logfile = log_dir() / "redis.log"
    proc = Children.spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                           "--daemonize", "no", "--protected-mode", "yes"], logfile)
    try:
        wait_for_line(proc, logfile, "Ready to accept connections")
        yield proc, port
    finally:
        Children.stop(proc)


def _ensure_arq_venv(log: Callable[[str], None]) -> Path:
    venv_python = ARQ_VENV / "bin" / "python"
    check = [str(venv_python), "-c", "import arq"]
    if venv_python.exists() and subprocess.run(check, capture_output=True, timeout=60).returncode == 0:
        return venv_python
    log(f"  creating {ARQ_VENV.relative_to(ROOT)} with {ARQ_REQUIREMENT} ...")
    steps = [[sys.executable, "-m", "venv", str(ARQ_VENV)],
             [str(venv_python), "-m", "pip", "install", "-q", ARQ_REQUIREMENT]]
    for args in steps:
        done = subprocess.run(args, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise PeerUnavailable(f"`{' '.join(args[-3:])}` failed: {done.stderr.strip()[-300:]}")
    return venv_python


def _drive(client: list[str], env: dict[str, str], pids: list[int], tasks: int, window: int) -> dict[str, Any]:
    """One client run in a child process; CPU of the peer's processes (workers and redis) counted around it."""
    before = cpu_seconds(pids)
    done = subprocess.run([*client, str(tasks), str(window), "600"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    used = cpu_seconds(pids) - before
    if done.returncode != 0:
        raise PeerUnavailable(f"client failed: {done.stderr.strip()[-400:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if len(data["latencies"]) != tasks:
        raise RuntimeError(f"{len(data['latencies'])} of {tasks} results came back")
    run = Run(tasks=tasks, elapsed=data["elapsed"], latencies=data["latencies"], cpu={"peer": used})
    return run.summary()


def _rows(name: str, s: BenchSettings, client: list[str], env: dict[str, str], pids: list[int],
          log: Callable[[str], None], note: str) -> list[dict[str, Any]]:
    _drive(client, env, pids, min(200, s.peer_tasks), s.window)  # warm-up
    saturated, light = [], []
    for i in range(s.repeat):
        saturated.append(_drive(client, env, pids, s.peer_tasks, s.window))
        light.append(_drive(client, env, pids, s.peer_light_tasks, 1))
        log(f"  {name} run {i + 1}: {saturated[-1]['tasks_per_s']:,.0f} tasks/s, "
            f"one in flight p50 {light[-1]['p50_ms']:.2f} ms")
    return [
        {"name": name, "kind": "throughput", "peer": True, "window": s.window, **median_of(saturated),
         "note": f"{s.window} in flight; {note}"},
        {"name": f"{name}: one in flight", "kind": "light", "peer": True, "window": 1, **median_of(light),
         "note": note},
    ]


def _unavailable(name: str, reason: str) -> list[dict[str, Any]]:
    return [{"name": name, "kind": "throughput", "peer": True, "note": f"n/a: {reason}"},
            {"name": f"{name}: one in flight", "kind": "light", "peer": True, "note": f"n/a: {reason}"}]


def celery_rows(s: BenchSettings, log: Callable[[str], None], redis_port: int, redis_pid: int) -> list[dict[str, Any]]:
    name = "Celery on Redis"
    try:
        import celery
    except ImportError:
        return _unavailable(name, "celery is not installed (pip install -e '.[bench]')")
    env = child_env({"BENCH_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"})
    logfile = log_dir() / "celery-worker.log"
    worker = Children.spawn([python(), "-m", "celery", "-A", "bench.peer_celery", "worker", "--pool", "prefork",
                             "--concurrency", "2", "--loglevel", "INFO"], logfile, env=env)
    try:
        wait_for_line(worker, logfile, "ready.", timeout=60)
        pids = process_tree(worker.pid) + [redis_pid]
        return _rows(name, s, [python(), "-m", "bench.peer_celery"], env, pids, log,
                     f"celery {celery.__version__}, prefork 2, defaults")
    except (PeerUnavailable, RuntimeError, subprocess.TimeoutExpired) as exc:
        return _unavailable(name, str(exc).splitlines()[0][:200])
    finally:
        Children.stop(worker)


def arq_rows(s: BenchSettings, log: Callable[[str], None], redis_port: int, redis_pid: int) -> list[dict[str, Any]]:
    name = "arq on Redis"
    try:
        venv_python = str(_ensure_arq_venv(log))
    except (PeerUnavailable, subprocess.TimeoutExpired) as exc:
        return _unavailable(name, str(exc)[:200])
    env = child_env({"BENCH_REDIS_PORT": str(redis_port)})
    workers = []
    try:
        for i in range(2):
            logfile = log_dir() / f"arq-worker-{i}.log"
            workers.append(Children.spawn([venv_python, "-m", "arq", "bench.peer_arq.WorkerSettings"], logfile,
                                          env=env))
            wait_for_line(workers[-1], logfile, "Starting worker", timeout=60)
        pids = [w.pid for w in workers] + [redis_pid]
        version = subprocess.run([venv_python, "-c", "import arq.version as v; print(v.VERSION)"],
                                 capture_output=True, text=True).stdout.strip()
        return _rows(name, s, [venv_python, "-m", "bench.peer_arq"], env, pids, log,
                     f"arq {version}, 2 workers, polls 5 ms / 1 ms")
    except (PeerUnavailable, RuntimeError, subprocess.TimeoutExpired) as exc:
        return _unavailable(name, str(exc).splitlines()[0][:200])
    finally:
        for worker in workers:
            Children.stop(worker)


def peer_rows(s: BenchSettings, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Celery's rows and arq's rows, each on a fresh redis-server."""
    rows = []
    for measure in (celery_rows, arq_rows):
        try:
            with redis_server(log) as (redis, port):
                rows += measure(s, log, port, redis.pid)
        except (PeerUnavailable, RuntimeError) as exc:
            name = "Celery on Redis" if measure is celery_rows else "arq on Redis"
            rows += _unavailable(name, str(exc).splitlines()[0][:200])
    return rows
