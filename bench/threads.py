"""CPU per task of every thread of the broker, the client and the workers, cronoq's or the bare relay's.

    python bench/threads.py [--tasks 60000] [--window 1000] [--client-gc off]
    python bench/threads.py --window 1 --tasks 3000 --call    # one task at a time, with `call`
    python bench/threads.py --relay --window 1 --tasks 3000   # the same through the relay

One real broker (durable, tokens) and two workers × 64 slots, as the
`cronoq, durable, tokens` row of run.py (or relay.py's broker and workers);
after a warm-up, /proc's per-thread CPU counters (schedstat: nanoseconds)
are read before and after the run. It tells the Python main thread from
libzmq's I/O thread, which a Python profiler cannot see.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Run, archiver_pids  # noqa: E402
from bench.load import drive_cronoq  # noqa: E402
from bench.relay import drive_relay  # noqa: E402
from bench.stacks import TOKENS, cronoq_stack, relay_stack  # noqa: E402


def thread_cpu(pid: int) -> dict[tuple[str, str], float]:
    """CPU seconds so far of each thread of `pid`, by (thread id, thread name)."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            on_cpu = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])  # nanoseconds
        except OSError:
            continue  # the thread ended meanwhile
        seconds[(tid, name)] = on_cpu / 1e9
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/threads.py", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=60_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--client-gc", choices=("on", "off"), default="on",
                        help="off: disable the client's garbage collector during the run, to see what it costs")
    parser.add_argument("--call", action="store_true",
                        help="cronoq's client waits with `call` (default: submit, then result)")
    parser.add_argument("--relay", action="store_true", help="the bare relay (bench/relay.py) instead of cronoq")
    args = parser.parse_args(argv)
    import uvloop

    token = TOKENS["BENCH_CLIENT_TOKEN"]
    if args.relay:
        stack_of, drive = relay_stack(2, 64), lambda stack, tasks: drive_relay(stack.address, tasks, args.window)
    else:
        stack_of = cronoq_stack(durable=True, tokens=True, workers=2, concurrency=64)

        async def drive(stack: Any, tasks: int) -> Run:
            return (await drive_cronoq(stack.address, tasks, args.window, token=token, call=args.call))[0]
    with stack_of as stack:
        uvloop.run(drive(stack, min(5_000, args.tasks)))  # warm-up
        pids = {"broker": stack.broker.pid, "client": os.getpid(),
                **{f"worker {n}": worker.pid for n, worker in enumerate(stack.workers)}}
        if not args.relay:
            pids.update({"archiver": pid for pid in archiver_pids(stack.broker.pid)})
        before = {who: thread_cpu(pid) for who, pid in pids.items()}
        if args.client_gc == "off":
            gc.disable()
        run = uvloop.run(drive(stack, args.tasks))
        gc.enable()
        after = {who: thread_cpu(pid) for who, pid in pids.items()}
    way = "relay" if args.relay else f"cronoq with {'call' if args.call else 'submit, result'}"
    print(f"{way}: {run.tasks / run.elapsed:,.0f} tasks/s over {run.tasks:,} tasks, {args.window} in flight, "
          f"p50 {run.summary()['p50_ms']:.3f} ms; client gc {args.client_gc}")
    for who in pids:
        for (tid, name), seconds in sorted(after[who].items()):
            used = seconds - before[who].get((tid, name), 0.0)
            if used * 1e6 / run.tasks >= 0.05:
                print(f"  {who:<9} {name:<16} {used / run.tasks * 1e6:6.1f} µs/task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
