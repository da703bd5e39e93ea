"""`cronoq-worker --broker ADDR [--token-env VAR] [--concurrency N] MODULE:ATTR`.

The first SIGINT (Ctrl-C) or SIGTERM stops the worker gracefully: it takes
no new task and finishes the running ones. A second stops it at once: the
running tasks are abandoned to the broker, which runs them again elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from typing import Any, Sequence

from cronoq.errors import CronoqError, Unauthenticated, UsageError
from cronoq.pool import Pool
from cronoq.wire import logs
from cronoq.wire.transport import unset_token_hint
from cronoq.worker.worker import Worker

DEFAULT_WORKER_ADDRESS = "tcp://127.0.0.1:5556"

log = logging.getLogger("cronoq.worker")


def load_pools(target: str) -> list[Pool]:
    """Import MODULE:ATTR and return the pool or pools it names."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:ATTR (e.g. myapp.tasks:llm), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`, find modules beside the caller
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from None
    except SyntaxError as exc:
        # The handler module is the user's code: name the file and line, as the interpreter would, in one line.
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else f"line {exc.lineno}"
        raise UsageError(f"cannot import module {module_name!r}: {exc.msg} ({where})") from None
    except Exception as exc:
        raise UsageError(f"cannot import module {module_name!r}: importing it raised "
                         f"{type(exc).__name__}: {exc} ({_innermost_frame(exc)})") from None
    value = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    pools = [value] if isinstance(value, Pool) else value
    if not isinstance(pools, (list, tuple)) or not pools or not all(isinstance(p, Pool) for p in pools):
        raise UsageError(f"{target} must be a cronoq.Pool or a list of them, got {type(value).__name__}")
    return list(pools)


def _innermost_frame(exc: BaseException) -> str:
    """Where an exception was raised, as "FILE, line N": the one line of its traceback a user needs."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "unknown place" if tb is None else f"{tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronoq-worker", description="Run a cronoq worker for the pools at MODULE:ATTR.")
    parser.add_argument("target", metavar="MODULE:ATTR", help="a cronoq.Pool, or a list of them")
    parser.add_argument("--broker", action="append", metavar="ADDR",
                        help=f"the broker's worker endpoint (default {DEFAULT_WORKER_ADDRESS}); a primary's and its "
                             "standbys': repeat the option or separate them with commas")
    parser.add_argument("--token-env", default="CRONOQ_TOKEN", metavar="VAR", help="environment variable holding the worker token (default CRONOQ_TOKEN)")
    parser.add_argument("--concurrency", type=int, default=4, metavar="N", help="tasks run at once (default 4)")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, metavar="S", help="seconds between heartbeats (default 1.0)")
    parser.add_argument("--liveness", type=int, default=3, metavar="N", help="missed heartbeats before the broker counts as lost (default 3)")
    parser.add_argument("--curve-public-key", metavar="KEY_OR_FILE",
                        help="the broker's CURVE public key (40 Z85 characters or its NAME.key file): encrypt")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="key=value lines (text, the default) or one JSON object per line")
    return parser


def _tasks(count: int) -> str:
    return f"{count} running task{'' if count == 1 else 's'}"


async def _serve(worker: Worker) -> signal.Signals | None:
    """Run the worker until it stops; returns the signal that stopped it at once, if one did."""
    loop = asyncio.get_running_loop()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        name = "Ctrl-C" if sig == signal.SIGINT else sig.name
        received.append(sig)
        if len(received) == 1:
            if worker.running:
                log.info("%s: finishing %s (%s again to stop now)", name, _tasks(worker.running), name)
            else:
                log.info("%s: stopping (no task is running)", name)
            loop.create_task(worker.stop())
        else:
            log.warning("%s again: stopping now; the broker runs the %s again elsewhere", name, _tasks(worker.running))
            loop.create_task(worker.stop(now=True))

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await worker.run()
    return received[-1] if len(received) > 1 else None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        if args.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
        pools = load_pools(args.target)
        token = os.environ.get(args.token_env) or None
        worker = Worker(
            args.broker or DEFAULT_WORKER_ADDRESS, pools, concurrency=args.concurrency, token=token,
            heartbeat_interval=args.heartbeat_interval, liveness=args.liveness,
            curve_public_key=args.curve_public_key,
        )
        try:
            stopped_by = _run_loop(_serve(worker))
        except Unauthenticated:
            if token is None:
                raise Unauthenticated(unset_token_hint(args.token_env)) from None
            raise
    except CronoqError as exc:
        kind = "usage" if isinstance(exc, UsageError) else exc.code  # a mistake on the command line reads as one
        print(f"cronoq-worker: {kind}: {exc}", file=sys.stderr)
        return 2
    if stopped_by is not None:
        # Stopped at once: a plain `def` handler may still be running in its thread, and the interpreter would
        # wait for it on the way out. Its task is the broker's again; leave without it, as the shell's
        # convention for a process ended by a signal says (128 + its number).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + stopped_by)
    return 0


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency, but a worker can run without it
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    raise SystemExit(main())
