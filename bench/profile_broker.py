"""`python bench/profile_broker.py`: where a saturated cronoq broker spends its time, per task.

Starts a durable broker with tokens and two workers, keeps the client's
window full, and samples the broker (or, with --process, the client or a
worker) with py-spy (from the `bench` extra) while it runs, on-CPU samples
only. Prints the functions with the most time, inclusive and self, as
microseconds of that process's CPU per task; the raw collapsed stacks go to
bench/results/profile-<timestamp>.txt for flame graphs.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Children, cpu_seconds, log_dir  # noqa: E402
from bench.load import drive_cronoq  # noqa: E402
from bench.stacks import TOKENS, cronoq_stack  # noqa: E402

IDLE_LEAVES = ("select (selectors.py", "run_forever", "epoll")


def _frame_name(frame: str) -> str:
    """'fn (path/to/file.py:123)' -> 'fn (file.py)': lines vary within a function, the function does not."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else name


def summarize(stacks: dict[str, int], tasks: int, cpu_s: float, top: int = 30, process: str = "broker") -> str:
    """Inclusive and self time per function, as a share of on-CPU samples and µs of the process's CPU per task."""
    inclusive: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    busy = 0
    for stack, count in stacks.items():
        frames = [_frame_name(f) for f in stack.split(";")]
        if any(leaf in stack.rsplit(";", 1)[-1] for leaf in IDLE_LEAVES):
            continue
        busy += count
        self_time[frames[-1]] += count
        for name in set(frames[1:]):  # frames[0] is the thread
            inclusive[name] += count
    if not busy:
        return "no busy samples"
    per_task = cpu_s / tasks * 1e6 if tasks else float("nan")
    out = [f"{tasks:,} tasks in the window; {process} CPU {cpu_s:.2f} s = {per_task:.1f} µs/task; {busy:,} on-CPU samples", ""]
    for title, counter in (("inclusive", inclusive), ("self", self_time)):
        out.append(f"{'share':>6} {'µs/task':>8}  {title}")
        for name, count in counter.most_common(top):
            out.append(f"{count / busy:6.1%} {count / busy * per_task:8.2f}  {name}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/profile_broker.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample (default 10)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    parser.add_argument("--window", type=int, default=1000, help="tasks in flight (1: a sequential round trip)")
    parser.add_argument("--durability", choices=("default", "none"), default="default")
    parser.add_argument("--no-tokens", action="store_true")
    parser.add_argument("--process", choices=("broker", "client", "worker"), default="broker",
                        help="which process to sample: the broker (default), the load's client, or the first worker")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    import uvloop

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    raw = ROOT / "bench" / "results" / f"profile-{stamp}.txt"
    raw.parent.mkdir(parents=True, exist_ok=True)
    tokens = not args.no_tokens
    token = TOKENS["BENCH_CLIENT_TOKEN"] if tokens else None
    # Enough tasks to outlast the sampling at the rates this machine reaches (one at a time: ~2,000/s).
    tasks = int(args.seconds * (12_000 if args.window > 1 else 2_500)) + (20_000 if args.window > 1 else 2_000)
    with cronoq_stack(durable=args.durability == "default", tokens=tokens, workers=2, concurrency=64) as stack:
        uvloop.run(drive_cronoq(stack.address, 5_000, args.window, token=token))  # warm-up
        pid = {"broker": stack.broker.pid, "client": os.getpid(), "worker": stack.workers[0].pid}[args.process]
        record = [spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--duration",
                  str(int(args.seconds)), "--format", "raw", "--output", str(raw)]
        counted: dict[str, float] = {}

        def sample() -> None:
            time.sleep(1.0)  # let the load reach saturation first
            cpu0, tasks0 = cpu_seconds([pid]), progress[0]
            spy_proc = Children.spawn(record, log_dir() / "py-spy.log")
            spy_proc.wait(args.seconds + 60)
            counted["cpu"] = cpu_seconds([pid]) - cpu0
            counted["tasks"] = progress[0] - tasks0

        progress = [0]
        watcher = threading.Thread(target=sample)
        watcher.start()
        uvloop.run(drive_cronoq(stack.address, tasks, args.window, token=token, progress=progress))
        watcher.join()
    stacks: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            stacks[stack] = stacks.get(stack, 0) + int(count)
    print(summarize(stacks, int(counted.get("tasks", 0)), counted.get("cpu", 0.0), process=args.process))
    print(f"collapsed stacks: {raw.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
