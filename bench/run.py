"""`python bench/run.py [--quick] [--repeat N] ...`: every benchmark of cronoq in one go, one table.

Sections, each a median of --repeat runs on this machine:
  limit     a bare pyzmq relay with cronoq's socket pattern and no scheduling
  cronoq    end to end through a real cronoq-broker and two cronoq-worker processes
  peers     Celery on Redis and arq on Redis, two worker processes each
  scale     core dispatch cost vs backlog and tenants, broker memory per task, restart time
  fairness  tenants weighing 3:1:1 saturating one pool through the broker
Writes bench/results/<timestamp>.json and .png, and latest.json / latest.png.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.append(str(Path(__file__).resolve().parent.parent))  # `python bench/run.py` runs from anywhere

from bench import report  # noqa: E402
from bench.common import ROOT, Children, log_dir  # noqa: E402
from bench.settings import BenchSettings  # noqa: E402

SECTIONS = ("limit", "cronoq", "peers", "scale", "fairness")
RESULTS = ROOT / "bench" / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/run.py", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few hundred tasks (well under a minute)")
    parser.add_argument("--repeat", type=int, help="runs per row; the table shows medians (default 3, quick 1)")
    parser.add_argument("--tasks", type=int, help="tasks per saturation run (default 50,000)")
    parser.add_argument("--window", type=int, help="tasks in flight from the client (default 1,000)")
    parser.add_argument("--concurrency", type=int, help="slots per worker process (default 64)")
    parser.add_argument("--peer-tasks", type=int, help="tasks per Celery/arq saturation run (default 5,000)")
    parser.add_argument("--memory-tasks", type=int, help="tasks queued for the memory row (default 200,000)")
    parser.add_argument("--recovery-tasks", type=int, help="tasks queued for the restart row (default 1,000,000)")
    parser.add_argument("--only", help=f"comma-separated sections to run, from {', '.join(SECTIONS)}")
    parser.add_argument("--skip", help="comma-separated sections to leave out")
    parser.add_argument("--no-write", action="store_true", help="print the table only; write no JSON or PNG")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> BenchSettings:
    s = BenchSettings.quick_settings() if args.quick else BenchSettings()
    for name in ("repeat", "tasks", "window", "concurrency", "peer_tasks", "memory_tasks", "recovery_tasks"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
            setattr(s, name, value)
    return s


def _version(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "n/a"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import cronoq
    import msgspec
    import uvloop
    import zmq

    cpu_model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())
    info: dict[str, Any] = {
        "cores": os.cpu_count(), "cpu": cpu_model, "python": platform.python_version(), "os": platform.platform(),
        "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
        "msgspec": msgspec.__version__, "uvloop": uvloop.__version__,
        "redis_server": _version(["redis-server", "--version"]),
        "cronoq_commit": _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        # Which cronoq ran: the repo's, or a copy put first on PYTHONPATH (see bench/README.md).
        "cronoq_path": str(Path(cronoq.__file__).resolve().parent.parent),
        "cronoq_uncommitted_changes": bool(_version(["git", "-C", str(ROOT), "status", "--porcelain", "cronoq"])),
    }
    try:
        import celery

        info["celery"] = celery.__version__
    except ImportError:
        info["celery"] = "not installed"
    return info


def _busy_seconds() -> float:
    """CPU seconds all processes on the machine have spent busy since boot (from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _our_seconds() -> float:
    """CPU seconds of this process and every child it has reaped (the whole bench)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def run_sections(s: BenchSettings, sections: list[str], log: Callable[[str], None]) -> tuple[list[dict], list[str], list[str]]:
    """Run the chosen sections in order; a section that fails becomes a row saying so."""
    from bench import fairness, peers, scale, throughput

    rows: list[dict[str, Any]] = []
    sequence: list[str] = []
    failures: list[str] = []
    steps: dict[str, Callable[[], None]] = {
        "limit": lambda: rows.extend(throughput.limit_rows(s, log)),
        "cronoq": lambda: rows.extend(throughput.cronoq_rows(s, log)),
        "peers": lambda: rows.extend(peers.peer_rows(s, log)),
        "scale": lambda: rows.extend([*scale.dispatch_rows(s, log), scale.memory_row(s, log),
                                      scale.recovery_row(s, log), scale.retained_row(s, log)]),
        "fairness": lambda: _fairness(rows, sequence, s, log),
    }
    for name in sections:
        log(f"[{name}] load average {os.getloadavg()[0]:.2f}")
        started = time.perf_counter()
        try:
            steps[name]()
        except Exception as exc:  # one broken section must not cost the others' numbers
            traceback.print_exc()
            failures.append(name)
            rows.append({"name": f"{name}: FAILED", "kind": "error", "value": f"{type(exc).__name__}: {exc}"[:300]})
        log(f"[{name}] done in {time.perf_counter() - started:.1f} s")
    return rows, sequence, failures


def _fairness(rows: list[dict], sequence: list[str], s: BenchSettings, log: Callable[[str], None]) -> None:
    from bench import fairness

    found, order = fairness.fairness_rows(s, log)
    rows.extend(found)
    sequence.extend(order)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    s = settings_from(args)
    sections = [x.strip() for x in args.only.split(",")] if args.only else list(SECTIONS)
    skipped = {x.strip() for x in args.skip.split(",")} if args.skip else set()
    unknown = [x for x in [*sections, *skipped] if x not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    sections = [x for x in sections if x not in skipped]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    log(f"cronoq bench: {', '.join(sections)}; {'quick' if s.quick else 'full'} run, repeat {s.repeat}; "
        f"child logs in {log_dir()}")
    info = machine()  # before the run: the commit is the one we started on, even if others commit meanwhile
    if os.environ.get("BENCH_CRONOQ_NOTE"):
        info["cronoq_note"] = os.environ["BENCH_CRONOQ_NOTE"]  # e.g. how a copy on PYTHONPATH was made
    busy0, ours0, wall0 = _busy_seconds(), _our_seconds(), time.perf_counter()
    try:
        rows, sequence, failures = run_sections(s, sections, log)
    finally:
        Children.stop_all()
    wall = time.perf_counter() - wall0
    # CPU that processes outside this bench used meanwhile: measurements share the 2 cores with it.
    foreign_cores = max(0.0, (_busy_seconds() - busy0) - (_our_seconds() - ours0)) / wall

    report.add_ratios(rows)
    checks = report.targets(rows)
    print(f"\ncronoq bench ({'quick' if s.quick else 'full'}, medians of {s.repeat}) on {info['cores']} cores, "
          f"Python {info['python']}; other processes used {foreign_cores:.2f} cores on average meanwhile\n")
    print(report.table(rows))
    if checks:
        print("\nTargets:\n" + report.targets_text(checks))

    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        data = {"timestamp": stamp, "quick": s.quick, "settings": vars(s), "machine": info,
                "foreign_load_cores": foreign_cores, "wall_s": wall, "rows": rows, "targets": checks,
                "fairness_sequence": "".join(sequence)}
        for name in (stamp, "latest"):
            report.write_json(RESULTS / f"{name}.json", data)
        try:
            report.draw(RESULTS / f"{stamp}.png", rows, sequence, _weights())
            (RESULTS / "latest.png").write_bytes((RESULTS / f"{stamp}.png").read_bytes())
        except ImportError:
            log("matplotlib is not installed (pip install -e '.[bench]'): no PNG drawn")
        print(f"\nwrote {RESULTS.relative_to(ROOT)}/{stamp}.json and .png (and latest.*)")
    return 1 if failures else 0


def _weights() -> dict[str, float]:
    from bench.fairness import WEIGHTS

    return dict(WEIGHTS)


if __name__ == "__main__":
    sys.exit(main())
