"""`cronoq SUBCOMMAND`: look at and steer a running broker from a terminal or a script.

Every subcommand talks to the broker's client endpoint with the token read
from `--token-env` (default CRONOQ_TOKEN). Mistakes and refusals print one
line naming the problem and exit non-zero; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from typing import Any, Awaitable, Callable, Sequence

import msgspec

from cronoq.answers import explain_text
from cronoq.client import text as views
from cronoq.client.client import DEFAULT_CLIENT_ADDRESS, Client
from cronoq.errors import CronoqError, Unauthenticated, UsageError
from cronoq.wire import curve
from cronoq.wire.transport import unset_token_hint

DEFAULT_TIMEOUT = 5.0


# Options every subcommand takes, before or after the subcommand's name, and their defaults.
COMMON_DEFAULTS = {"broker": DEFAULT_CLIENT_ADDRESS, "token_env": "CRONOQ_TOKEN", "timeout": DEFAULT_TIMEOUT,
                   "curve_public_key": None}


def _common_options() -> argparse.ArgumentParser:
    # Defaults are filled in after parsing: with real defaults here, the subcommand's parser would
    # overwrite a value given before the subcommand's name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--broker", default=argparse.SUPPRESS, metavar="ADDR", action="append",
                        help=f"the broker's client endpoint (default {DEFAULT_CLIENT_ADDRESS}); a primary's and "
                             "its standbys': repeat the option or separate them with commas")
    common.add_argument("--token-env", default=argparse.SUPPRESS, metavar="VAR",
                        help="environment variable holding the token (default CRONOQ_TOKEN)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S",
                        help=f"seconds to wait for the broker's reply (default {DEFAULT_TIMEOUT:g})")
    common.add_argument("--curve-public-key", default=argparse.SUPPRESS, metavar="KEY_OR_FILE",
                        help="the broker's CURVE public key (40 Z85 characters or its NAME.key file): encrypt")
    return common


MIN_TOP_INTERVAL = 0.1
"""Seconds: `top` asks the broker for its statistics once per frame; faster would only load the broker."""


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None


def _top_interval(text: str) -> float:
    seconds = _number(text)
    if not seconds >= MIN_TOP_INTERVAL:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be at least {MIN_TOP_INTERVAL:g} seconds, got {text}")
    return seconds


def _future_seconds(text: str) -> float:
    seconds = _number(text)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds from now, got {text}")
    return seconds


def _seconds(text: str) -> float:
    seconds = _number(text)
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return seconds


def _subcommand(commands: Any, name: str, text: str, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """A subcommand whose one-line summary (in `cronoq --help`) is also its description (in `--help`)."""
    return commands.add_parser(name, parents=parents, help=text, description=text[0].upper() + text[1:] + ".")


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = argparse.ArgumentParser(prog="cronoq", description="Inspect and steer a cronoq broker.",
                                     parents=[common])
    commands = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    status = _subcommand(commands, "status", "per pool: backlog, running, workers, shares", [common])
    status.add_argument("--json", action="store_true", help="print the broker's statistics as JSON")

    top = _subcommand(commands, "top", "a live view of pools, workers and tenant shares", [common])
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=_top_interval, default=1.0, metavar="S",
                     help=f"seconds between frames, at least {MIN_TOP_INTERVAL:g} (default 1)")

    submit = _subcommand(commands, "submit", "submit a task; prints its id", [common])
    submit.add_argument("payload", metavar="PAYLOAD",
                        help="the task's payload as JSON, e.g. '{\"n\": 1}' or '\"a string\"' (see --text)")
    submit.add_argument("--text", action="store_true", help="send PAYLOAD as a string, as it is, instead of as JSON")
    submit.add_argument("--pool", default="default", help="the pool to run it in (default: default)")
    submit.add_argument("--tenant", help="whose task it is, for fair sharing (a tenant-pinned token fills it in)")
    submit.add_argument("--priority", default="normal", choices=["critical", "high", "normal", "low"],
                        help="its priority class (default normal)")
    submit.add_argument("--deadline", type=_future_seconds, metavar="S",
                        help="seconds from now (more than 0): not dispatched by then, it expires and never runs")
    submit.add_argument("--delay", type=_seconds, metavar="S", help="seconds from now before it may be dispatched")
    submit.add_argument("--key", help="idempotency key: a second submit with the same key returns the first task")
    submit.add_argument("--max-retries", type=int, default=0, metavar="N",
                        help="how many more times to run it if its handler raises (default 0)")
    submit.add_argument("--cost", type=float, default=None, metavar="N",
                        help="what it charges its tenant's share in a pool that shares by cost (default 1)")
    submit.add_argument("--wait", action="store_true", help="wait for the result and print it as JSON")

    inspect = _subcommand(commands, "inspect", "state, attempts, timings and error of a task", [common])
    inspect.add_argument("task_id", metavar="TASK_ID", help="the id `cronoq submit` (or `submit()`) returned")
    inspect.add_argument("--json", action="store_true", help="print the fields as JSON (times in ISO 8601, null when unset)")

    explain = _subcommand(commands, "explain", "why a task has not started (or how its attempts ended)", [common])
    explain.add_argument("task_id", metavar="TASK_ID", help="the id `cronoq submit` (or `submit()`) returned")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON (times in Unix seconds)")

    cancel = _subcommand(commands, "cancel", "cancel a task that has not started", [common])
    cancel.add_argument("task_id", metavar="TASK_ID", help="the id of the task to cancel")

    for name, text in (("pause", "stop dispatching a pool (it still accepts tasks)"), ("resume", "dispatch a paused pool again")):
        sub = _subcommand(commands, name, text, [common])
        sub.add_argument("pool", metavar="POOL", help="the pool's name, as declared in the broker's config")

    _subcommand(commands, "reload", "make the broker reread its config file (like SIGHUP)", [common])

    keygen = _subcommand(commands, "keygen", "write a CURVE key pair for the broker (no broker needed)", [])
    keygen.add_argument("--dir", default=".", help="where to write NAME.key and NAME.key_secret (default .)")
    keygen.add_argument("--name", default="broker", help="the files' name (default broker)")
    keygen.add_argument("--force", action="store_true",
                        help="replace an existing pair (clients and workers holding the old public key are locked out)")
    return parser


def _payload(args: argparse.Namespace) -> Any:
    """The task's payload from PAYLOAD: JSON, or the text itself with --text."""
    if args.text:
        return args.payload
    try:
        return json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"PAYLOAD is not valid JSON ({exc}): quote a string as JSON ('\"hello\"'), "
            "or pass --text to send PAYLOAD as a string as it is"
        ) from None


def _when(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat(timespec="milliseconds")


async def _status(client: Client, args: argparse.Namespace) -> int:
    stats = await client.stats()
    print(json.dumps(stats, indent=2, sort_keys=True) if args.json else views.status_text(stats))
    return 0


async def _top(client: Client, args: argparse.Namespace) -> int:
    previous = await client.stats()
    if args.once:
        print(views.top_frame(previous, None, 0.0))
        return 0
    # Clear the screen and home the cursor before each frame, like top(1); into a pipe, frames follow each other.
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    try:
        while True:
            await asyncio.sleep(args.interval)
            current = await client.stats()
            sys.stdout.write(clear + views.top_frame(current, previous, args.interval) + "\n")
            sys.stdout.flush()
            previous = current
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0


async def _submit(client: Client, args: argparse.Namespace) -> int:
    handle = await client.submit(
        args.payload, pool=args.pool, tenant=args.tenant, priority=args.priority,
        deadline=args.deadline, delay=args.delay, key=args.key, max_retries=args.max_retries,
        cost=args.cost,
    )
    print(handle.id)
    if args.wait:
        print(json.dumps(await handle.result()))
    return 0


async def _inspect(client: Client, args: argparse.Namespace) -> int:
    info = await client.status(args.task_id)
    fields = {
        "id": info.id, "pool": info.pool, "tenant": info.tenant, "priority": info.priority, "state": info.state,
        "attempts": info.attempts, "submitted_at": _when(info.submitted_at), "started_at": _when(info.started_at),
        "finished_at": _when(info.finished_at), "deadline": _when(info.deadline), "last_error": info.error or None,
        "cost": info.cost,
    }
    if args.json:
        print(json.dumps(fields, indent=2))
    else:
        width = max(map(len, fields))
        print("\n".join(f"{name:<{width}}  {'-' if value in (None, '') else value}" for name, value in fields.items()))
    return 0


async def _explain(client: Client, args: argparse.Namespace) -> int:
    explanation = await client.explain(args.task_id)
    if args.json:
        print(json.dumps(msgspec.to_builtins(explanation), indent=2))
    else:
        print(explain_text(explanation))
    return 0


async def _cancel(client: Client, args: argparse.Namespace) -> int:
    if await client.cancel(args.task_id):
        print(f"cancelled {args.task_id}")
        return 0
    # The broker only says "not cancelled"; the task's state says why, so the message is not a guess.
    state = (await client.status(args.task_id)).state
    if state == "cancelled":
        reason = "it was already cancelled"
    elif state == "running":
        reason = "it is already running (a running task is not interrupted)"
    elif state in ("queued", "delayed"):
        reason = f"it is {state} again (a retry after a failure, or it was re-queued)"
    else:
        reason = f"it already finished ({state})"
    print(f"not cancelled: task {args.task_id}: {reason}")
    return 1


async def _pause(client: Client, args: argparse.Namespace) -> int:
    await client.pause(args.pool)
    print(f"paused pool {args.pool}: it accepts tasks but dispatches none until `cronoq resume {args.pool}`")
    return 0


async def _resume(client: Client, args: argparse.Namespace) -> int:
    await client.resume(args.pool)
    print(f"resumed pool {args.pool}")
    return 0


async def _reload(client: Client, args: argparse.Namespace) -> int:
    changes = await client.reload()
    print(f"reloaded; pools added: {', '.join(changes['pools_added']) or 'none'}; "
          f"draining: {', '.join(changes['pools_draining']) or 'none'}")
    weights = changes.get("weights_changed") or []  # an older broker does not say
    if weights:
        print("weights changed: "
              + ", ".join(f"{w['pool']} {w['tenant']} {w['old']:g} -> {w['new']:g}" for w in weights))
    shares = changes.get("shares_changed") or []  # an older broker does not say
    if shares:
        print("shares changed: " + ", ".join(f"{c['pool']} {c['setting']} {c['old']} -> {c['new']}" for c in shares))
    if changes["needs_restart"]:
        print(f"kept until a restart: {', '.join(changes['needs_restart'])}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    public_file, secret_file = curve.keygen(args.dir, args.name, overwrite=args.force)
    print(f"public key:  {public_file}  (give it to clients and workers: --curve-public-key {public_file})")
    print(f"secret key:  {secret_file}  (the broker's: [broker] curve_secret_key_file; keep it private)")
    return 0


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], Awaitable[int]]] = {
    "status": _status, "top": _top, "submit": _submit, "inspect": _inspect, "explain": _explain,
    "cancel": _cancel, "pause": _pause, "resume": _resume, "reload": _reload,
}


async def _run(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env) or None
    try:
        async with Client(args.broker, token, request_timeout=args.timeout,
                          curve_public_key=args.curve_public_key) as client:
            return await COMMANDS[args.command](client, args)
    except Unauthenticated:
        if token is None:
            raise Unauthenticated(unset_token_hint(args.token_env)) from None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name, default in COMMON_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        if args.command == "keygen":
            return _keygen(args)
        if args.command == "submit":
            args.payload = _payload(args)  # a bad payload is refused before connecting
        return asyncio.run(_run(args))
    except UsageError as exc:
        print(f"cronoq {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Whoever read our output has gone (`cronoq top | head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0 if args.command == "top" else 1
    except CronoqError as exc:
        print(f"cronoq {args.command}: {exc.code}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cronoq {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
