"""Where one task's round trip goes, hop by hop: the relay's and cronoq's, from timestamps in every process.

    python bench/hops.py                      # 2 rounds of 2,000 one-at-a-time tasks each side, about 1 minute
    python bench/hops.py --tasks 5000 --rounds 3
    python bench/hops.py --time cronoq.store.journal.fence:Fence.check,cronoq.book.taskbook:TaskBook.submit

One task at a time, the relay (bench/relay.py) and cronoq (durable, tokens, `call`) taking turns, two
workers of 64 slots each, as in close_to_wire.py's sequential figure. Every process notes when it receives
and sends a message (bench/hop_trace.py, put in by bench/tracing/sitecustomize.py; cronoq's code is not
changed), and a cronoq broker also when each step of its loop pass ends. With one task in flight the
events of the processes follow one another, so each round trip splits into the time a message travels
(libzmq's I/O threads, TCP over loopback, the receiver's wake-up and whatever it runs before its receive)
and the time each process holds it (from its receive to its send). It prints the median of each part over
all round trips of each side. The notes cost a few µs a round trip; the round trip it reports beside them is
the traced one. `--time` also times each call of the functions named, in every cronoq process that calls
them (the warm-up's calls included in the children's).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hop_trace, relay  # noqa: E402
from bench.load import drive_cronoq  # noqa: E402
from bench.stacks import TOKENS, cronoq_stack, relay_stack  # noqa: E402
from bench.throughput import _run_async  # noqa: E402

WARM_UP = 200
TRACING = ROOT / "bench" / "tracing"

# (label, from event, to event): the parts of a round trip, in order; the events are named below (`_split`).
HOPS = [
    ("client → broker", "client sent", "broker received request"),
    ("broker holds the request", "broker received request", "broker sent task"),
    ("broker → worker", "broker sent task", "worker received"),
    ("worker holds the task", "worker received", "worker sent result"),
    ("worker → broker", "worker sent result", "broker received result"),
    ("broker holds the result", "broker received result", "broker sent reply"),
    ("broker → client", "broker sent reply", "client received"),
]
ROUND_TRIP = ("client sent → client received", "client sent", "client received")
# A cronoq transit, split where the receiver's loop woke for the message (the relay's processes note no wake-up).
TRANSITS = [
    ("client → broker", "client sent", "broker woken for request", "broker received request"),
    ("broker → worker", "broker sent task", "worker woken", "worker received"),
    ("worker → broker", "worker sent result", "broker woken for result", "broker received result"),
    ("broker → client", "broker sent reply", "client woken", "client received"),
]
# Inside a cronoq broker's hold: the steps of its loop pass (`Broker._pump`), each up to the end of the step.
BROKER_STEPS = [
    ("request: handled (token, decode, the book)", "broker received request", "request handled"),
    ("request: dispatched", "request handled", "request dispatched"),
    ("request: committed (the journal)", "request dispatched", "request committed"),
    ("request: sent (monitors, encode, send)", "request committed", "broker sent task"),
    ("result: handled (token, decode, the book, outcome)", "broker received result", "result handled"),
    ("result: dispatched", "result handled", "result dispatched"),
    ("result: committed (the journal)", "result dispatched", "result committed"),
    ("result: sent (monitors, encode, send)", "result committed", "broker sent reply"),
]


class Timeline:
    """One process's events: the times of each kind, in order."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        self.times: dict[str, list[int]] = {}
        for kind, at in events:
            self.times.setdefault(kind, []).append(at)
        for times in self.times.values():
            times.sort()

    def first(self, kind: str, at_or_after: int) -> int | None:
        times = self.times.get(kind, [])
        index = bisect.bisect_left(times, at_or_after)
        return times[index] if index < len(times) else None

    def last(self, kind: str, at_or_before: int) -> int | None:
        times = self.times.get(kind, [])
        index = bisect.bisect_right(times, at_or_before)
        return times[index - 1] if index else None


def _split(sent: int, next_sent: int | None, client: Timeline, broker: Timeline, workers: list[Timeline]
           ) -> dict[str, int] | None:
    """The events of the round trip whose request the client sent at `sent`, or None if one is missing (a
    heartbeat in between, the last task)."""
    at: dict[str, int | None] = {"client sent": sent}
    at["broker received request"] = broker.first("recv", sent)
    if at["broker received request"] is None:
        return None
    at["broker sent task"] = broker.first("send", at["broker received request"])
    if at["broker sent task"] is None:
        return None
    found = [(t, w) for w in workers if (t := w.first("recv", at["broker sent task"])) is not None]
    if not found:
        return None
    at["worker received"], worker = min(found, key=lambda pair: pair[0])
    at["worker sent result"] = worker.first("send", at["worker received"])
    if at["worker sent result"] is None:
        return None
    at["broker received result"] = broker.first("recv", at["worker sent result"])
    if at["broker received result"] is None:
        return None
    at["broker sent reply"] = broker.first("send", at["broker received result"])
    if at["broker sent reply"] is None:
        return None
    at["client received"] = client.first("recv", at["broker sent reply"])
    if at["client received"] is None or (next_sent is not None and at["client received"] > next_sent):
        return None
    at["worker woken"] = worker.last("wake", at["worker received"])
    at["client woken"] = client.last("wake", at["client received"])
    for which in ("request", "result"):
        received = at[f"broker received {which}"]
        assert received is not None
        at[f"broker woken for {which}"] = broker.last("wake", received)
        at[f"{which} handled"] = broker.first("handled", received)
        at[f"{which} dispatched"] = broker.first("dispatched", at[f"{which} handled"] or received)
        at[f"{which} committed"] = broker.first("committed", at[f"{which} dispatched"] or received)
    return {name: t for name, t in at.items() if t is not None}


def _read(folder: Path, pid: int) -> tuple[Timeline, dict[str, list[int]]]:
    path = folder / f"{pid}.json"
    if not path.exists():
        return Timeline([]), {}
    saved = json.loads(path.read_text())
    return Timeline([tuple(event) for event in saved["events"]]), saved.get("timed", {})


class Side:
    """What the runs of one side found: each round trip's events, the driver's p50s, and the timed calls
    by process ("client", "broker", "worker") with how many tasks their counts cover."""

    def __init__(self) -> None:
        self.trips: list[dict[str, int]] = []
        self.p50s: list[float] = []
        self.timed: dict[tuple[str, str], list[int]] = {}
        self.tasks_timed: dict[str, int] = {}

    def add_timed(self, process: str, timed: dict[str, list[int]], tasks: int) -> None:
        for name, durations in timed.items():
            self.timed.setdefault((name, process), []).extend(durations)
        self.tasks_timed[process] = self.tasks_timed.get(process, 0) + tasks


def run_side(side: str, tasks: int, found: Side) -> None:
    """One run of `tasks` one-at-a-time tasks through `side` ("relay" or "cronoq"), traced, added to `found`."""
    with tempfile.TemporaryDirectory(prefix="cronoq-hops-") as tmp:
        folder = Path(tmp)
        os.environ[hop_trace.TRACE_ENV] = str(folder)
        # The children start with bench/tracing/sitecustomize.py first on their path.
        path_before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRACING), path_before]))
        try:
            if side == "relay":
                relay_namespace = vars(relay)
                hop_trace.trace_relay(relay_namespace, save=False)
                with relay_stack(2, 64) as stack:
                    _run_async(relay.drive_relay(stack.address, WARM_UP, 1))
                    hop_trace.take_events()
                    run = _run_async(relay.drive_relay(stack.address, tasks, 1))
                    client, client_timed = Timeline(hop_trace.take_events()), {}
                    pids = stack.broker.pid, [w.pid for w in stack.workers]
            else:
                hop_trace.install(save=False)
                token = TOKENS["BENCH_CLIENT_TOKEN"]
                with cronoq_stack(durable=True, tokens=True, workers=2, concurrency=64) as stack:
                    _run_async(drive_cronoq(stack.address, WARM_UP, 1, token=token, call=True))
                    hop_trace.take_events()
                    run, _ = _run_async(drive_cronoq(stack.address, tasks, 1, token=token, call=True))
                    client_timed = hop_trace.take_timed()
                    client = Timeline(hop_trace.take_events())
                    pids = stack.broker.pid, [w.pid for w in stack.workers]
        finally:
            del os.environ[hop_trace.TRACE_ENV]
            if path_before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = path_before
        # The stack has stopped: every child wrote its events on the way out.
        broker, broker_timed = _read(folder, pids[0])
        workers_read = [_read(folder, pid) for pid in pids[1]]
    workers = [timeline for timeline, _ in workers_read]
    found.add_timed("client", client_timed, tasks)
    found.add_timed("broker", broker_timed, tasks + WARM_UP)
    for _, timed in workers_read:
        found.add_timed("worker", timed, 0)
    found.tasks_timed["worker"] = found.tasks_timed.get("worker", 0) + tasks + WARM_UP  # the workers share them
    sends = client.times.get("send", [])
    before = len(found.trips)
    for index, sent in enumerate(sends):
        trip = _split(sent, sends[index + 1] if index + 1 < len(sends) else None, client, broker, workers)
        if trip is not None:
            found.trips.append(trip)
    found.p50s.append(run.summary()["p50_ms"])
    print(f"{side}: p50 {found.p50s[-1]:.3f} ms, {len(found.trips) - before:,} of {tasks:,} round trips traced",
          file=sys.stderr)


def _median_us(trips: list[dict[str, int]], start: str, end: str) -> float | None:
    spans = [trip[end] - trip[start] for trip in trips if start in trip and end in trip]
    return statistics.median(spans) / 1e3 if spans else None


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/hops.py", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="round trips per run (default 2,000)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, taking turns (default 2)")
    parser.add_argument("--time", default="", metavar="NAMES",
                        help="also time each call of these functions in cronoq's processes: module:Class.method "
                             "or module:function, comma-separated (of a coroutine function, only the making of "
                             "its coroutine is timed)")
    args = parser.parse_args(argv)
    if args.time:
        os.environ[hop_trace.TIMED_ENV] = args.time
    sides = {"relay": Side(), "cronoq": Side()}
    for round_number in range(args.rounds):
        order = ("relay", "cronoq") if round_number % 2 == 0 else ("cronoq", "relay")
        for side in order:
            print(f"  round {round_number + 1} ", end="", file=sys.stderr)
            run_side(side, args.tasks, sides[side])
    trips = {name: side.trips for name, side in sides.items()}
    p50s = {name: side.p50s for name, side in sides.items()}
    print(f"One task at a time, {args.rounds} × {args.tasks:,} round trips a side; median µs of each part.\n")
    print("| part | relay | cronoq, `call` |")
    print("| --- | ---: | ---: |")
    for label, start, end in [*HOPS, ROUND_TRIP]:
        print(f"| {label} | {_cell(_median_us(trips['relay'], start, end))} | "
              f"{_cell(_median_us(trips['cronoq'], start, end))} |")
    print(f"| the driver's p50, ms (median of the runs) | {statistics.median(p50s['relay']):.3f} | "
          f"{statistics.median(p50s['cronoq']):.3f} |")
    print("\ncronoq's transits, split where the receiver's loop woke for the message:\n")
    print("| transit | sent → receiver woken | woken → received |")
    print("| --- | ---: | ---: |")
    for label, start, woken, end in TRANSITS:
        print(f"| {label} | {_cell(_median_us(trips['cronoq'], start, woken))} | "
              f"{_cell(_median_us(trips['cronoq'], woken, end))} |")
    print("\nInside cronoq's broker, each hold by the step of its loop pass that ends it:\n")
    print("| step | µs |")
    print("| --- | ---: |")
    for label, start, end in BROKER_STEPS:
        print(f"| {label} | {_cell(_median_us(trips['cronoq'], start, end))} |")
    cronoq_side = sides["cronoq"]
    if cronoq_side.timed:
        print("\nThe functions timed in cronoq's processes:\n")
        print("| function | process | calls per task | median µs a call |")
        print("| --- | --- | ---: | ---: |")
        for (name, process), durations in sorted(cronoq_side.timed.items()):
            if durations:
                per_task = len(durations) / max(1, cronoq_side.tasks_timed.get(process, 0))
                print(f"| `{name}` | {process} | {per_task:.2f} | {statistics.median(durations) / 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
