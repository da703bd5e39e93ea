"""The limit: a bare pyzmq relay with cronoq's socket pattern and no scheduling at all.

client DEALER -> relay broker (ROUTER for clients, ROUTER for workers, both
watched with `loop.add_reader` and drained until a full pass finds nothing)
-> N worker processes (DEALER, `credit` tasks each at most) -> back.

The broker only forwards frames and counts credit, with the leanest socket
calls pyzmq offers (see `_recv`/`_send`); the worker decodes the
msgpack payload and encodes its result (with msgspec, like cronoq), as any
real handler must. Whatever
cronoq costs beyond this is the price of scheduling, bookkeeping and safety.

Run as `python -m bench.relay broker CLIENTS_PORT WORKERS_PORT` or
`python -m bench.relay worker WORKERS_PORT CREDIT [--tag TAG]`; the bench
drives the client side in-process with `drive_relay`.

Tags, for the soak's probe (`bench/soak.py --relay`): a worker started with
`--tag probe` serves only requests whose first frame (where cronoq puts a
token) is `probe`; every other request goes to the untagged workers. That
is the whole of the routing: one queue of requests and one of free slots
per tag.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time

import msgspec
import zmq

from bench.common import Run, payload

READY = b"ready"


def _socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    return sock


# pyzmq's constants are enum members and every `|`/`&` on them builds a new enum
# value (~0.8 µs); its Python-level Socket.send adds another ~0.25 µs per frame.
# The limit should be the leanest loop this pattern allows, so: plain ints, the
# Cython send, Frame.more instead of getsockopt(RCVMORE), and recv until EAGAIN
# instead of a getsockopt(EVENTS) before every message.
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_raw_send = zmq.Socket.__mro__[1].send


def _recv(sock: zmq.Socket) -> list[bytes] | None:
    """One whole message, or None when none is waiting."""
    try:
        frame = sock.recv(NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame.bytes]
    while frame.more:
        frame = sock.recv(NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


def _send(sock: zmq.Socket, frames: list[bytes]) -> None:
    for frame in frames[:-1]:
        _raw_send(sock, frame, NOBLOCK_MORE)
    _raw_send(sock, frames[-1], NOBLOCK)


async def serve_broker(clients_port: int, workers_port: int) -> None:
    """Forward client requests to workers with credit, and replies back, until SIGTERM."""
    ctx = zmq.Context.instance()
    clients, workers = _socket(ctx, zmq.ROUTER), _socket(ctx, zmq.ROUTER)
    clients.bind(f"tcp://127.0.0.1:{clients_port}")
    workers.bind(f"tcp://127.0.0.1:{workers_port}")
    # Per tag (b"": untagged), the free worker slots (one entry each, oldest first) and the requests no slot
    # could take yet. A tag's lane is made when a worker or a request first names it.
    lanes: dict[bytes, tuple[collections.deque[bytes], collections.deque[list[bytes]]]] = {}
    lane_of: dict[bytes, collections.deque[bytes]] = {}  # worker identity -> its tag's free slots

    def lane(tag: bytes) -> tuple[collections.deque[bytes], collections.deque[list[bytes]]]:
        found = lanes.get(tag)
        if found is None:
            found = lanes[tag] = (collections.deque(), collections.deque())
        return found

    def pump() -> None:
        while True:
            handled = 0
            while (frames := _recv(workers)) is not None:
                handled += 1
                if frames[1] == READY:  # [worker, READY, credit] or [worker, READY, credit, tag]
                    slots = lane_of[frames[0]] = lane(frames[3] if len(frames) == 4 else b"")[0]
                    slots.extend([frames[0]] * int(frames[2]))
                else:  # [worker, client, header, result]: one slot back, reply to the client
                    lane_of[frames[0]].append(frames[0])
                    _send(clients, frames[1:])
            while (frames := _recv(clients)) is not None:
                lane(frames[1])[1].append(frames)  # [client, tag (cronoq's token frame), header, body]
                handled += 1
            for slots, waiting in lanes.values():
                while slots and waiting:
                    client, _tag, header, body = waiting.popleft()
                    _send(workers, [slots.popleft(), client, header, body])
            if not handled:
                return

    loop = asyncio.get_running_loop()
    for sock in (clients, workers):
        loop.add_reader(sock.getsockopt(zmq.FD), pump)
    print("relay broker ready", flush=True)
    stop = asyncio.Event()
    import signal

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    pump()
    await stop.wait()


async def serve_worker(workers_port: int, credit: int, tag: bytes = b"") -> None:
    """Take tasks, decode the payload, answer with its `n`, until SIGTERM; with `tag`, only requests tagged so."""
    ctx = zmq.Context.instance()
    sock = _socket(ctx, zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{workers_port}")
    packb, unpackb = msgspec.msgpack.encode, msgspec.msgpack.decode

    def drain() -> None:
        while (frames := _recv(sock)) is not None:
            client, header, body = frames
            _send(sock, [client, header, packb(unpackb(body)["n"])])

    loop = asyncio.get_running_loop()
    loop.add_reader(sock.getsockopt(zmq.FD), drain)
    _send(sock, [READY, str(credit).encode(), tag] if tag else [READY, str(credit).encode()])
    print("relay worker ready", flush=True)
    drain()
    stop = asyncio.Event()
    import signal

    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()


async def drive_relay(address: str, tasks: int, window: int, *, timeout: float = 300.0) -> Run:
    """Keep `window` requests in flight through the relay until `tasks` came back; every result is checked."""
    ctx = zmq.Context.instance()
    sock = _socket(ctx, zmq.DEALER)
    sock.connect(address)
    loop = asyncio.get_running_loop()
    packb, unpackb = msgspec.msgpack.encode, msgspec.msgpack.decode
    bodies = [packb(payload(n)) for n in range(tasks)]  # encoded up front: the client's cost is not the relay's
    sent_at = [0.0] * tasks
    latencies: list[float] = []
    seen = bytearray(tasks)
    done = loop.create_future()
    next_task = 0

    def send_one() -> None:
        nonlocal next_task
        n = next_task
        next_task += 1
        sent_at[n] = time.perf_counter()
        _send(sock, [b"", packb(n), bodies[n]])

    def drain() -> None:
        while (frames := _recv(sock)) is not None:
            header, result = frames
            n = unpackb(header)
            latencies.append(time.perf_counter() - sent_at[n])
            if unpackb(result) != n or seen[n]:
                if not done.done():
                    done.set_exception(RuntimeError(f"relay returned a wrong or repeated result for task {n}"))
                return
            seen[n] = 1
            if next_task < tasks:
                send_one()
            elif len(latencies) == tasks and not done.done():
                done.set_result(None)

    fd = sock.getsockopt(zmq.FD)
    loop.add_reader(fd, drain)
    try:
        started = time.perf_counter()
        for _ in range(min(window, tasks)):
            send_one()
        drain()  # a send can swallow the FD's edge: look once by hand
        await asyncio.wait_for(done, timeout)
        elapsed = time.perf_counter() - started
    finally:
        loop.remove_reader(fd)
        sock.close(linger=0)
    return Run(tasks=len(latencies), elapsed=elapsed, latencies=latencies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay")
    sub = parser.add_subparsers(dest="role", required=True)
    broker = sub.add_parser("broker")
    broker.add_argument("clients_port", type=int)
    broker.add_argument("workers_port", type=int)
    worker = sub.add_parser("worker")
    worker.add_argument("workers_port", type=int)
    worker.add_argument("credit", type=int)
    worker.add_argument("--tag", default="", help="serve only requests with this tag (default: the untagged)")
    args = parser.parse_args(argv)
    import uvloop

    from bench.hop_trace import trace_relay

    trace_relay(globals())  # bench/hops.py: timestamps at each receive and send; nothing otherwise
    if args.role == "broker":
        uvloop.run(serve_broker(args.clients_port, args.workers_port))
    else:
        uvloop.run(serve_worker(args.workers_port, args.credit, args.tag.encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
