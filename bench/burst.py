"""How fast a burst is accepted: many submits made in one turn of the caller's loop, none waiting for another.

    python bench/burst.py                       # 5 rounds of 5,000 submits, about 10 s
    python bench/burst.py --tasks 20000 --rounds 3

What an application does with `asyncio.gather(*(client.submit(x) for x in items))`: the client sends the
submits as a few big batches, and the broker takes about a millisecond of each per loop pass, setting the
rest aside for the next pass. The broker is durable with tokens, as in close_to_wire.py, and has no
workers, so nothing but the burst wakes it: a pass that leaves work behind must queue the next one
itself. Prints, per round, the time from the first submit to the last acceptance, and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cronoq  # noqa: E402
from bench.stacks import TOKENS, cronoq_stack  # noqa: E402
from bench.throughput import _run_async  # noqa: E402


async def accept_burst(address: str, tasks: int, token: str) -> float:
    """Seconds from the first of `tasks` submits, all made at once, to the last of their acceptances."""
    async with cronoq.connect(address, token=token) as client:
        await client.ping()  # connected and answered before the clock starts
        started = time.perf_counter()
        handles = await asyncio.gather(*(client.submit(n) for n in range(tasks)))
        seconds = time.perf_counter() - started
    if len({handle.id for handle in handles}) != tasks:
        raise RuntimeError(f"{tasks} submits were accepted as {len({h.id for h in handles})} tasks")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/burst.py", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="submits in each burst (default 5,000)")
    parser.add_argument("--rounds", type=int, default=5, help="bursts, one after another (default 5)")
    args = parser.parse_args(argv)
    token = TOKENS["BENCH_CLIENT_TOKEN"]
    rates = []
    with cronoq_stack(durable=True, tokens=True, workers=0, concurrency=1) as stack:
        for round_number in range(1, args.rounds + 1):
            seconds = _run_async(accept_burst(stack.address, args.tasks, token))
            rates.append(args.tasks / seconds)
            print(f"  round {round_number}: {args.tasks:,} submits accepted in {seconds * 1000:.1f} ms "
                  f"({rates[-1]:,.0f}/s)", file=sys.stderr)
    print(f"A burst of {args.tasks:,} submits, durable with tokens: median {statistics.median(rates):,.0f} "
          f"accepted/s over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
