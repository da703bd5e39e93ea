"""The processes of a soak run (`bench/soak.py`) other than the broker and its workers.

    python -m bench.soak_roles load ADDRESS OUT --seconds S --window W [--connections C] [--rate N]
    python -m bench.soak_roles probe ADDRESS OUT --seconds S --gap G [--watch NAME=PID ...]
    python -m bench.soak_roles fill ADDRESS OUT --tasks N --window W
    python -m bench.soak_roles slow-reader ADDRESS OUT --seconds S
    python -m bench.soak_roles relay-load ADDRESS OUT --seconds S --window W [--rate N]
    python -m bench.soak_roles relay-probe ADDRESS OUT --seconds S --gap G [--watch NAME=PID ...]

Each runs in a process of its own, so that the probe's round trip is the
broker's and never the load client's loop. Each writes one line per event or
per half second to OUT, `<unix time> <numbers...>`, flushed as it goes, and
stops by itself after --seconds (0: when sent SIGTERM).

- load: `window` coroutines, each submitting a task to pool `default` and
  awaiting its result, again and again, spread over `connections` client
  connections; with `rate`, at most that many submits per second (the
  window still bounds what is in flight). Lines: time, tasks done, errors.
- probe: one task at a time to pool `probe` (its own worker), `gap` seconds
  apart. Lines: time, round trip in seconds (submit to result), then the
  seconds this process's threads waited for a CPU during that round trip
  and, per `--watch NAME=PID`, the same for that process's threads
  (/proc/PID/task/*/schedstat, read just before and just after the trip).
- relay-load, relay-probe: the same against the bare relay
  (`bench/relay.py`), with a raw DEALER: the load's requests untagged, the
  probe's tagged `probe` so that the relay hands them to the probe's own
  worker.
- fill: submits `tasks` tasks to pool `default` without awaiting results.
  Lines: time, tasks accepted.
- slow-reader: a raw DEALER that submits with `watch` as fast as the socket
  takes them and never reads a reply. Lines: time, submits sent.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, TextIO

sys.path.append(str(Path(__file__).resolve().parent.parent))

import cronoq  # noqa: E402
from bench.common import payload  # noqa: E402

REPORT_EVERY = 0.5
PACE_EVERY = 0.005  # how often a paced load is handed its allowance


class Pacer:
    """At most `rate` operations per second: every PACE_EVERY seconds the time since the last grant is turned into
    permits, of which at most two grants' worth may pile up (so a load that fell behind does not burst)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.allowance = 0.0
        self.last = time.monotonic()

    def grant(self) -> int:
        """Whole permits available now; the caller uses them or loses them past the cap."""
        now = time.monotonic()
        cap = max(1.0, 2 * self.rate * PACE_EVERY)
        self.allowance = min(cap, self.allowance + self.rate * (now - self.last))
        self.last = now
        whole = int(self.allowance)
        self.allowance -= whole
        return whole


class Waits:
    """Run-queue wait, in seconds, of every thread of this process and of the watched ones, since the last read.

    Each thread's schedstat stays open and is read with pread (about 1 µs, where opening it costs 15): the probe
    reads a dozen of them twice per round trip, and what it spends on that is CPU the machine does not have.
    The threads are listed again every RELIST reads; one that appears counts from its first reading."""

    RELIST = 200

    def __init__(self, watch: dict[str, int]) -> None:
        self.pids = [os.getpid(), *watch.values()]
        self.files: dict[int, dict[str, int]] = {pid: {} for pid in self.pids}  # pid -> tid -> open schedstat
        self.last: dict[tuple[int, str], int] = {}
        self.reads = 0
        self._relist()
        self.since()

    def _relist(self) -> None:
        for pid, files in self.files.items():
            try:
                tids = set(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                tids = set()
            for tid in set(files) - tids:
                os.close(files.pop(tid))
            for tid in tids - set(files):
                with contextlib.suppress(OSError):
                    files[tid] = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)

    def since(self) -> list[float]:
        self.reads += 1
        if self.reads % self.RELIST == 0:
            self._relist()
        out = []
        for pid, files in self.files.items():
            waited = 0
            for tid, fd in list(files.items()):
                try:
                    now = int(os.pread(fd, 128, 0).split()[1])
                except (OSError, ValueError, IndexError):  # the thread ended
                    os.close(files.pop(tid))
                    continue
                waited += now - self.last.get((pid, tid), now)
                self.last[pid, tid] = now
            out.append(waited / 1e9)
        return out


def _stopper(seconds: float) -> asyncio.Event:
    """An event set after `seconds` (never, for 0) or on SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if seconds > 0:
        loop.call_later(seconds, stop.set)
    return stop


async def _report(out: TextIO, stop: asyncio.Event, line: Callable[[], str]) -> None:
    while not stop.is_set():
        out.write(f"{time.time():.4f} {line()}\n")
        out.flush()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), REPORT_EVERY)
    out.write(f"{time.time():.4f} {line()}\n")
    out.flush()


async def load(address: str, out: TextIO, seconds: float, window: int, token: str | None,
               connections: int = 1, payload_bytes: int = 0, rate: float = 0.0) -> None:
    done = errors = 0
    # With payload_bytes, every task carries that much padding: the broker's journal writes grow with it.
    pad = os.urandom(payload_bytes) if payload_bytes else None

    permits: collections.deque[asyncio.Future[None]] = collections.deque()  # lanes waiting for the pacer
    loop = asyncio.get_running_loop()

    async def pace() -> None:
        pacer = Pacer(rate)
        while not stop.is_set():
            for _ in range(min(pacer.grant(), len(permits))):
                permits.popleft().set_result(None)
            await asyncio.sleep(PACE_EVERY)
        while permits:
            permits.popleft().set_result(None)

    async def lane(sched: cronoq.Client, first: int) -> None:
        nonlocal done, errors
        n = first
        while not stop.is_set():
            if rate:
                permit = loop.create_future()
                permits.append(permit)
                await permit
                if stop.is_set():
                    break
            try:
                body = payload(n) if pad is None else {"n": n, "op": "noop", "pad": pad}
                handle = await sched.submit(body)
                value = await handle.result(timeout=600)
            except cronoq.CronoqError:
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if value != n:
                raise SystemExit(f"task {n} came back as {value!r}")
            done += 1
            n += window

    scheds = [await cronoq.connect(address, token=token) for _ in range(connections)]
    try:
        for sched in scheds:
            await sched.ping()
        # The load's `seconds` count from here: on a busy machine starting and connecting can take most of a short
        # run, which then reported a single progress line and no rate.
        stop = _stopper(seconds)
        lanes = [asyncio.ensure_future(lane(scheds[k % connections], k)) for k in range(window)]
        if rate:
            lanes.append(asyncio.ensure_future(pace()))
        await _report(out, stop, lambda: f"{done} {errors}")
        await asyncio.wait_for(asyncio.gather(*lanes), 120)
    finally:
        for sched in scheds:
            await sched.close()


async def probe(address: str, out: TextIO, seconds: float, gap: float, token: str | None,
                watch: dict[str, int] | None = None) -> None:
    stop = _stopper(seconds)
    async with cronoq.connect(address, token=token) as sched:
        await sched.ping()

        async def round_trip(n: int) -> None:
            handle = await sched.submit(payload(n), pool="probe")
            value = await handle.result(timeout=600)
            if value != n:
                raise SystemExit(f"probe {n} came back as {value!r}")

        await _one_at_a_time(out, stop, gap, Waits(watch or {}), round_trip)


async def _one_at_a_time(out: TextIO, stop: asyncio.Event, gap: float, waits: "Waits",
                         round_trip: Callable[[int], Awaitable[None]]) -> None:
    """Run `round_trip(n)` for n = 0, 1, ... `gap` seconds apart until `stop`, writing a line per trip: the
    time, the trip's seconds and each watched thread group's run-queue wait during it."""
    n = 0
    try:
        while not stop.is_set():
            waits.since()  # outside the timed span: what is read is the wait inside it
            started = time.perf_counter()
            await round_trip(n)
            took = time.perf_counter() - started
            waited = waits.since()
            out.write(f"{time.time():.4f} {took:.6f} {' '.join(f'{w:.6f}' for w in waited)}\n")
            n += 1
            if n % 50 == 0:
                out.flush()
            if gap > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), gap)
    finally:
        out.flush()


async def fill(address: str, out: TextIO, tasks: int, window: int, token: str | None) -> None:
    stop = _stopper(0)
    accepted = 0
    next_task = 0

    async def lane(sched: cronoq.Client) -> None:
        nonlocal accepted, next_task
        while next_task < tasks and not stop.is_set():
            n = next_task
            next_task += 1
            await sched.submit(payload(n))
            accepted += 1

    async with cronoq.connect(address, token=token) as sched:
        lanes = asyncio.ensure_future(asyncio.gather(*(lane(sched) for _ in range(min(window, tasks)))))
        lanes.add_done_callback(lambda _: stop.set())
        await _report(out, stop, lambda: str(accepted))
        await lanes


def _relay_socket(address: str) -> "zmq.Socket":
    import zmq

    from bench.relay import _socket

    sock = _socket(zmq.Context.instance(), zmq.DEALER)
    sock.connect(address)
    return sock


async def relay_load(address: str, out: TextIO, seconds: float, window: int, rate: float = 0.0) -> None:
    """`window` untagged requests in flight through the relay, a new one for each reply (paced with `rate`)."""
    import msgspec
    import zmq

    from bench.relay import _recv, _send

    stop = _stopper(seconds)
    sock = _relay_socket(address)
    loop = asyncio.get_running_loop()
    packb, unpackb = msgspec.msgpack.encode, msgspec.msgpack.decode
    body = packb(payload(0))  # every request the same: the relay and worker only echo `n`
    done = owed = 0
    pacer = Pacer(rate) if rate else None

    def send(count: int) -> None:
        for _ in range(count):
            _send(sock, [b"", b"", body])

    def drain() -> None:
        nonlocal done, owed
        while (frames := _recv(sock)) is not None:
            if unpackb(frames[1]) != 0:
                raise SystemExit(f"the relay returned {frames!r}")
            done += 1
            if stop.is_set():
                continue
            if pacer is None:
                send(1)
            else:
                owed += 1

    def pace() -> None:
        nonlocal owed
        if stop.is_set() or pacer is None:
            return
        granted = min(owed, pacer.grant())
        owed -= granted
        send(granted)
        drain()  # a send can swallow the FD's edge
        loop.call_later(PACE_EVERY, pace)

    fd = sock.getsockopt(zmq.FD)
    loop.add_reader(fd, drain)
    if pacer is None:
        send(window)
    else:
        owed = window
        pace()
    drain()
    try:
        await _report(out, stop, lambda: f"{done} 0")
    finally:
        loop.remove_reader(fd)
        sock.close(linger=0)


async def relay_probe(address: str, out: TextIO, seconds: float, gap: float, watch: dict[str, int] | None = None) -> None:
    """One request at a time tagged `probe`, `gap` seconds apart; lines as `probe`'s."""
    import msgspec
    import zmq

    from bench.relay import _recv, _send

    stop = _stopper(seconds)
    sock = _relay_socket(address)
    loop = asyncio.get_running_loop()
    packb, unpackb = msgspec.msgpack.encode, msgspec.msgpack.decode
    fd = sock.getsockopt(zmq.FD)
    replies: asyncio.Queue[list[bytes]] = asyncio.Queue()

    def drain() -> None:
        while (frames := _recv(sock)) is not None:
            replies.put_nowait(frames)

    loop.add_reader(fd, drain)

    async def round_trip(n: int) -> None:
        _send(sock, [b"probe", packb(n), packb(payload(n))])
        drain()  # a send can swallow the FD's edge
        header, result = await replies.get()
        if unpackb(header) != n or unpackb(result) != n:
            raise SystemExit(f"probe {n} came back as {header!r} {result!r}")

    try:
        await _one_at_a_time(out, stop, gap, Waits(watch or {}), round_trip)
    finally:
        loop.remove_reader(fd)
        sock.close(linger=0)


def slow_reader(address: str, out: TextIO, seconds: float, token: str | None) -> None:
    """Submit with watch, never read: what the broker keeps for this peer must stay within its budget."""
    import zmq

    from cronoq.wire import protocol

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)       # libzmq stops reading the TCP socket almost at once
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(address)
    token_frame = (token or "").encode()
    body = protocol.encode(payload(0))
    end = time.monotonic() + (seconds if seconds > 0 else float("inf"))
    stopped = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, on_signal)
    sent, rid, reported = 0, 0, 0.0
    while not stopped and time.monotonic() < end:
        rid += 1
        header = protocol.encode(protocol.Submit(protocol.PROTOCOL_VERSION, rid, watch=True))
        try:
            sock.send_multipart([token_frame, header, body], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:  # libzmq's queue to the broker is full: the broker stopped reading us
            time.sleep(0.001)
        now = time.monotonic()
        if now - reported >= REPORT_EVERY:
            out.write(f"{time.time():.4f} {sent}\n")
            out.flush()
            reported = now
    out.write(f"{time.time():.4f} {sent}\n")
    out.flush()
    sock.close(linger=0)
    ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_roles", description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=("load", "probe", "fill", "slow-reader", "relay-load", "relay-probe"))
    parser.add_argument("address")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--tasks", type=int, default=0)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--payload-bytes", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="load: at most this many tasks/s (0: no limit)")
    parser.add_argument("--watch", action="append", default=[], metavar="NAME=PID",
                        help="probe: also report the run-queue wait of this process's threads per round trip")
    parser.add_argument("--token-env", help="the environment variable that holds the client token")
    args = parser.parse_args(argv)
    try:
        watch = {name: int(pid) for name, pid in (item.split("=", 1) for item in args.watch)}
    except ValueError:
        parser.error(f"--watch takes NAME=PID, got {args.watch!r}")
    token = os.environ[args.token_env] if args.token_env else None
    with open(args.out, "w") as out:
        if args.role == "slow-reader":
            slow_reader(args.address, out, args.seconds, token)
            return 0
        import uvloop

        if args.role == "load":
            uvloop.run(load(args.address, out, args.seconds, args.window, token, args.connections,
                            args.payload_bytes, args.rate))
        elif args.role == "probe":
            uvloop.run(probe(args.address, out, args.seconds, args.gap, token, watch))
        elif args.role == "relay-load":
            uvloop.run(relay_load(args.address, out, args.seconds, args.window, args.rate))
        elif args.role == "relay-probe":
            uvloop.run(relay_probe(args.address, out, args.seconds, args.gap, watch))
        else:
            uvloop.run(fill(args.address, out, args.tasks, args.window, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
