"""CPU per task of every thread of the broker, the client and one worker, in a saturated run.

    python bench/threads.py [--tasks 60000] [--window 1000] [--client-gc off]

One real broker (durable, tokens) and two workers × 64 slots, as the
`cronoq, durable, tokens` row of run.py; after a warm-up, /proc's per-thread
CPU counters are read before and after the run. It tells the Python main
thread from libzmq's I/O thread, which a Python profiler cannot see.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import drive_cronoq  # noqa: E402
from bench.stacks import TOKENS, cronoq_stack  # noqa: E402


def thread_cpu(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds so far of each thread of `pid`, by (thread id, thread name)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds[(tid, name)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/threads.py", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=60_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--client-gc", choices=("on", "off"), default="on",
                        help="off: disable the client's garbage collector during the run, to see what it costs")
    args = parser.parse_args(argv)
    import uvloop

    token = TOKENS["BENCH_CLIENT_TOKEN"]
    with cronoq_stack(durable=True, tokens=True, workers=2, concurrency=64) as stack:
        uvloop.run(drive_cronoq(stack.address, 5_000, args.window, token=token))  # warm-up
        pids = {"broker": stack.broker.pid, "client": os.getpid(), "worker 0": stack.workers[0].pid}
        before = {who: thread_cpu(pid) for who, pid in pids.items()}
        if args.client_gc == "off":
            gc.disable()
        run, _ = uvloop.run(drive_cronoq(stack.address, args.tasks, args.window, token=token))
        gc.enable()
        after = {who: thread_cpu(pid) for who, pid in pids.items()}
    print(f"{run.tasks / run.elapsed:,.0f} tasks/s over {run.tasks:,} tasks; client gc {args.client_gc}")
    for who in pids:
        for (tid, name), seconds in sorted(after[who].items()):
            used = seconds - before[who].get((tid, name), 0.0)  # /proc counts in ticks of 10 ms: 0 is "under one"
            print(f"  {who:<9} {name:<16} {used / run.tasks * 1e6:6.1f} µs/task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
