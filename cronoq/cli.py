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

from cronoq import curve, views
from cronoq.client.connection import DEFAULT_CLIENT_ADDRESS, Client
from cronoq.errors import CronoqError

DEFAULT_TIMEOUT = 5.0


# Options every subcommand takes, before or after the subcommand's name, and their defaults.
COMMON_DEFAULTS = {"broker": DEFAULT_CLIENT_ADDRESS, "token_env": "CRONOQ_TOKEN", "timeout": DEFAULT_TIMEOUT,
                   "curve_public_key": None}


def _common_options() -> argparse.ArgumentParser:
    # Defaults are filled in after parsing: with real defaults here, the subcommand's parser would
    # overwrite a value given before the subcommand's name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--broker", default=argparse.SUPPRESS, metavar="ADDR",
                        help=f"the broker's client endpoint (default {DEFAULT_CLIENT_ADDRESS})")
    common.add_argument("--token-env", default=argparse.SUPPRESS, metavar="VAR",
                        help="environment variable holding the token (default CRONOQ_TOKEN)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, metavar="S",
                        help=f"seconds to wait for the broker's reply (default {DEFAULT_TIMEOUT:g})")
    common.add_argument("--curve-public-key", default=argparse.SUPPRESS, metavar="KEY_OR_FILE",
                        help="the broker's CURVE public key (40 Z85 characters or its NAME.key file): encrypt")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = argparse.ArgumentParser(prog="cronoq", description="Inspect and steer a cronoq broker.",
                                     parents=[common])
    commands = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    status = commands.add_parser("status", parents=[common], help="per pool: backlog, running, workers, shares")
    status.add_argument("--json", action="store_true", help="print the broker's statistics as JSON")

    top = commands.add_parser("top", parents=[common], help="a live view of pools, workers and tenant shares")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between frames (default 1)")

    submit = commands.add_parser("submit", parents=[common], help="submit a task; prints its id")
    submit.add_argument("payload", help="the payload as JSON (a bare word is taken as a string)")
    submit.add_argument("--pool", default="default")
    submit.add_argument("--tenant")
    submit.add_argument("--priority", default="normal", choices=["critical", "high", "normal", "low"])
    submit.add_argument("--deadline", type=float, metavar="S", help="seconds from now")
    submit.add_argument("--delay", type=float, metavar="S", help="seconds from now")
    submit.add_argument("--key", help="idempotency key")
    submit.add_argument("--max-retries", type=int, default=0)
    submit.add_argument("--wait", action="store_true", help="wait for the result and print it as JSON")

    inspect = commands.add_parser("inspect", parents=[common], help="state, attempts, timings and error of a task")
    inspect.add_argument("task_id", metavar="TASK_ID")
    inspect.add_argument("--json", action="store_true")

    cancel = commands.add_parser("cancel", parents=[common], help="cancel a task that has not started")
    cancel.add_argument("task_id", metavar="TASK_ID")

    for name, text in (("pause", "stop dispatching a pool (it still accepts tasks)"), ("resume", "dispatch a paused pool again")):
        sub = commands.add_parser(name, parents=[common], help=text)
        sub.add_argument("pool", metavar="POOL")

    commands.add_parser("reload", parents=[common], help="make the broker reread its config file (like SIGHUP)")

    keygen = commands.add_parser("keygen", help="write a CURVE key pair for the broker (no broker needed)")
    keygen.add_argument("--dir", default=".", help="where to write NAME.key and NAME.key_secret (default .)")
    keygen.add_argument("--name", default="broker", help="the files' name (default broker)")
    return parser


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
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
    try:
        while True:
            await asyncio.sleep(args.interval)
            current = await client.stats()
            # Clear the screen and home the cursor, like top(1).
            sys.stdout.write("\x1b[H\x1b[2J" + views.top_frame(current, previous, args.interval) + "\n")
            sys.stdout.flush()
            previous = current
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0


async def _submit(client: Client, args: argparse.Namespace) -> int:
    handle = await client.submit(
        _payload(args.payload), pool=args.pool, tenant=args.tenant, priority=args.priority,
        deadline=args.deadline, delay=args.delay, key=args.key, max_retries=args.max_retries,
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
        "finished_at": _when(info.finished_at), "deadline": _when(info.deadline), "last_error": info.error,
    }
    if args.json:
        print(json.dumps(fields, indent=2))
    else:
        width = max(map(len, fields))
        print("\n".join(f"{name:<{width}}  {'-' if value is None else value}" for name, value in fields.items()))
    return 0


async def _cancel(client: Client, args: argparse.Namespace) -> int:
    if await client.cancel(args.task_id):
        print(f"cancelled {args.task_id}")
        return 0
    print(f"not cancelled: task {args.task_id} is already running or finished")
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
    if changes["needs_restart"]:
        print(f"kept until a restart: {', '.join(changes['needs_restart'])}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    public_file, secret_file = curve.keygen(args.dir, args.name)
    print(f"public key:  {public_file}  (give it to clients and workers: --curve-public-key {public_file})")
    print(f"secret key:  {secret_file}  (the broker's: [broker] curve_secret_key_file; keep it private)")
    return 0


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], Awaitable[int]]] = {
    "status": _status, "top": _top, "submit": _submit, "inspect": _inspect,
    "cancel": _cancel, "pause": _pause, "resume": _resume, "reload": _reload,
}


async def _run(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env)
    async with Client(args.broker, token, request_timeout=args.timeout,
                      curve_public_key=args.curve_public_key) as client:
        return await COMMANDS[args.command](client, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name, default in COMMON_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        if args.command == "keygen":
            return _keygen(args)
        return asyncio.run(_run(args))
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
