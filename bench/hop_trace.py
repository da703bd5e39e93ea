"""Timestamps at every hop of a round trip, taken inside each process of a bench stack (bench/hops.py).

With CRONOQ_BENCH_TRACE set to a folder, every process records when it receives and sends a message, and a
broker also when each part of its loop pass ends; each writes `<folder>/<pid>.json` when it exits. The
clock is perf_counter_ns (CLOCK_MONOTONIC, one clock for every process of the machine), so the events of
the client, the broker and a worker line up.

A process takes part without a line of cronoq changed: `bench/tracing/sitecustomize.py` (first on the
child's PYTHONPATH) calls `install()` before the program starts, which wraps cronoq's socket calls before
anything imports them. The relay, run as `python -m bench.relay`, is its own `__main__`: its `main()` hands
its globals to `trace_relay`.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

TRACE_ENV = "CRONOQ_BENCH_TRACE"
TIMED_ENV = "CRONOQ_BENCH_TIMED"
"""Functions to time as well, `module:Class.method` or `module:function`, comma-separated (hops.py --time)."""

_events: list[tuple[str, int]] = []
_timed: dict[str, list[int]] = {}
_clock = time.perf_counter_ns
_installed = False


def enabled() -> bool:
    return bool(os.environ.get(TRACE_ENV))


def take_events() -> list[tuple[str, int]]:
    """This process's events so far, which are then forgotten here (the timed calls too)."""
    taken = _events[:]
    _events.clear()
    for durations in _timed.values():
        durations.clear()
    return taken


def take_timed() -> dict[str, list[int]]:
    """The nanoseconds each call of each timed function took so far, which are then forgotten here."""
    taken = {name: durations[:] for name, durations in _timed.items()}
    for durations in _timed.values():
        durations.clear()
    return taken


def _note(kind: str) -> None:
    _events.append((kind, _clock()))


def _save() -> None:
    if _events:
        folder = os.environ[TRACE_ENV]
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
            json.dump({"argv": sys.argv, "events": _events, "timed": _timed}, out)


def _before(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        _events.append((kind, _clock()))
        return function(*args, **kwargs)
    return traced


def _after(kind: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        _events.append((kind, _clock()))
        return result
    return traced


def install(*, save: bool = True) -> None:
    """Wrap cronoq's receives, sends and the broker's pass steps (once; only with CRONOQ_BENCH_TRACE set).
    With `save`, the events are written out at exit; without, the caller takes them (`take_events`)."""
    global _installed
    if _installed or not enabled():
        return
    _installed = True
    if save:
        atexit.register(_save)
    from cronoq.wire import transport

    # The module functions first: the broker's modules bind them by name when they are imported, below.
    transport.recv_frames = _after("recv", transport.recv_frames)
    transport.recv_routed = _after("recv", transport.recv_routed)
    transport.send_frames = _before("send", transport.send_frames)
    # A client's or a worker's wake-up: the loop's callback for its socket.
    transport.Channel._drain = _before("wake", transport.Channel._drain)
    transport.Channel._on_readable = _before("wake", transport.Channel._on_readable)

    from cronoq.broker import clients, server

    broker = server.Broker
    broker._pump = _before("wake", broker._pump)
    broker._on_worker_message = _after("handled", broker._on_worker_message)
    clients.ClientRequests.on_message = _after("handled", clients.ClientRequests.on_message)
    broker._dispatch = _after("dispatched", broker._dispatch)
    broker._commit = _after("committed", broker._commit)
    for name in filter(None, os.environ.get(TIMED_ENV, "").split(",")):
        _time_calls(name.strip())


def _time_calls(name: str) -> None:
    """Time every call of `module:Class.method` or `module:function` (what this process never imports is
    imported here, harmlessly). A method is timed wherever it is called from; a module's function only where
    it is called through its module, not where a module imported it by name before."""
    module_name, _, path = name.partition(":")
    owner: Any = importlib.import_module(module_name)
    *outer, attribute = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    # A class's staticmethod or classmethod is wrapped inside and stays one.
    wrapper = vars(owner).get(attribute) if isinstance(owner, type) else None
    if isinstance(wrapper, (staticmethod, classmethod)):
        function = wrapper.__func__
    else:
        function, wrapper = getattr(owner, attribute), None
    durations = _timed.setdefault(name, [])

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = _clock()
        try:
            return function(*args, **kwargs)
        finally:
            durations.append(_clock() - started)

    setattr(owner, attribute, timed if wrapper is None else type(wrapper)(timed))


def trace_relay(namespace: dict[str, Any], *, save: bool = True) -> None:
    """Wrap the relay's `_recv` and `_send` in the module namespace that runs (only with CRONOQ_BENCH_TRACE)."""
    if not enabled() or namespace.get("_traced"):
        return
    namespace["_traced"] = True
    if save:
        atexit.register(_save)
    receive, send = namespace["_recv"], namespace["_send"]

    def traced_recv(sock: Any) -> Any:
        frames = receive(sock)
        if frames is not None:
            _note("recv")
        return frames

    namespace["_recv"] = traced_recv
    namespace["_send"] = _before("send", send)
