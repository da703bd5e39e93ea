"""`cronoq-broker [-c cronoq.toml]`: run one broker until SIGINT or SIGTERM; or, with --repair, repair its data_dir.

--clients, --workers and --data-dir replace the file's values (one file serves every host); with --standby
the broker first waits, holding its addresses silent, until it can take over a data_dir another broker holds
(cronoq.broker.standby).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Sequence

import zmq

from cronoq.broker.config import BrokerConfig, default_config, load_config, override
from cronoq.broker.held import HeldAddresses
from cronoq.broker.server import Broker
from cronoq.broker.standby import Complaint, servers_of, stand_by
from cronoq.errors import ConfigError, CronoqError, DamagedFile, StoreError
from cronoq.store.journal.repair import repair
from cronoq.wire import logs

log = logging.getLogger("cronoq.broker")


RETRY_SERVING = 1.0
"""Seconds a standby that took the lock but could not serve (its metrics or dashboard address was taken, by the
primary on its host while it ran, or by another process) waits before it tries again."""


class _StartFailed(Exception):
    """The broker could not start serving; the message says why."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronoq-broker", description="Run the cronoq broker.")
    parser.add_argument("-c", "--config", metavar="FILE", help="the TOML config (default: built-in defaults)")
    parser.add_argument("--member", metavar="NAME",
                        help="which member of the config's [cluster] this broker is (overrides [broker] member)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="key=value lines (text, the default) or one JSON object per line")
    parser.add_argument("--clients", metavar="ADDR",
                        help="the client endpoint, instead of the config's [broker] clients (one file, many hosts)")
    parser.add_argument("--workers", metavar="ADDR",
                        help="the worker endpoint, instead of the config's [broker] workers")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="the data directory, instead of the config's [broker] data_dir (relative to the "
                             "working directory)")
    parser.add_argument("--standby", action="store_true",
                        help="if data_dir is in use by another broker, wait and take over the moment it is free "
                             "(holding its addresses, silent, until then), instead of exiting")
    parser.add_argument("--repair", action="store_true",
                        help="repair a damaged data_dir instead of serving: copy its files to data_dir/damaged-TIME/, "
                             "rebuild it from every intact frame, report what was lost, and exit")
    return parser


def _check_free(address: str | None, what: str = "metrics") -> None:
    """Raise OSError if the address ("host:port") of the metrics or the dashboard cannot be bound now; each is
    served once the loop runs."""
    if address is None:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_server((host.strip("[]"), int(port))).close()
    except OSError as exc:
        raise OSError(f"cannot serve {what} at {address}: {exc.strerror or exc}") from None


def _reload(broker: Broker) -> None:
    """SIGHUP: reread the config; an invalid file is logged and the running config stays."""
    try:
        broker.reload()
    except CronoqError:
        pass  # already logged with the reason


async def _serve(broker: Broker, held_servers: dict[str, list[socket.socket]]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, broker.stop, sig.name)
    loop.add_signal_handler(signal.SIGHUP, _reload, broker)
    try:
        await broker.start_metrics(held_servers.pop(broker.config.metrics, None) if broker.config.metrics else None)
    except OSError as exc:
        raise _StartFailed(f"cannot serve metrics at {broker.config.metrics}: {exc}") from None
    try:
        await broker.start_dashboard(held_servers.pop(broker.config.dashboard, None)
                                     if broker.config.dashboard else None)
    except OSError as exc:
        raise _StartFailed(f"cannot serve the dashboard at {broker.config.dashboard}: {exc}") from None
    clients, workers = broker.endpoints
    member = f" member={broker.config.member}" if broker.config.member is not None else ""
    print(f"cronoq broker ready clients={clients} workers={workers}{member}", flush=True)
    await broker.serve()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)

    def overridden(config: BrokerConfig) -> BrokerConfig:
        return override(config, clients=args.clients, workers=args.workers, data_dir=args.data_dir)

    try:
        if args.member is not None and not args.config:
            raise ConfigError("--member names a member of a cluster: give the config that declares it with -c FILE")
        config: BrokerConfig = overridden(load_config(args.config, member=args.member) if args.config
                                          else default_config())
    except ConfigError as exc:
        print(f"cronoq-broker: invalid config: {exc}", file=sys.stderr)
        return 2
    if args.repair:
        return _repair(config, args.config)
    if args.standby and config.data_dir is None:
        print('cronoq-broker: --standby takes over a data_dir, but with durability = "none" there is none; '
              "a standby needs the primary's data_dir on storage both can reach", file=sys.stderr)
        return 2
    held_addresses = HeldAddresses() if args.standby else None
    cannot_serve = Complaint()
    retries = 0
    while True:
        held_lock, held_fds, held_servers = None, {}, {}
        if held_addresses is not None:
            taken = stand_by(config, (lambda: overridden(load_config(args.config, member=args.member)))
                             if args.config else None, held_addresses, announce=retries == 0,
                             delay=RETRY_SERVING if retries else 0.0)
            if taken is None:
                return 0  # stopped while standing by
            held_lock, config = taken
            # The HTTP addresses it could not hold while waiting (the primary's own, when on the same host) are
            # held now, or it cannot serve.
            if problems := held_addresses.hold_servers(servers_of(config)):
                # A standby that took the lock but cannot serve lets it go untouched and stands by again (another
                # standby may serve meanwhile), rather than leave the data_dir with nobody to serve it. It keeps
                # holding its client and worker addresses meanwhile.
                os.close(held_lock)
                cannot_serve(f"cannot serve after taking over {config.data_dir}: {'; '.join(problems)}",
                             f"let go of its lock untouched; standing by again, trying every {RETRY_SERVING:g} s")
                retries += 1
                continue
            held_fds = held_addresses.hand_over()
            held_servers = held_addresses.hand_over_servers()
        break
    broker = Broker(config, overrides=overridden)
    # Bind (and make sure the metrics address is free) before touching data_dir: a broker that
    # cannot serve must not create the directory, take its lock or replay its journal. (A standby holds
    # the lock by now, but has changed nothing: it lets go of it if it cannot serve.)
    opening = False
    try:
        broker.bind(held_fds)
        if config.metrics not in held_servers:
            _check_free(config.metrics)
        if config.dashboard not in held_servers:
            _check_free(config.dashboard, "the dashboard")
        opening = True  # from here the journal owns the held lock, and closes it if it fails
        recovered = broker.open(held_lock)
    except (OSError, StoreError) as exc:
        zmq.Context.instance().destroy(linger=0)  # close whatever was bound
        if held_lock is not None and not opening:
            os.close(held_lock)
        if isinstance(exc, DamagedFile):
            exc.repair_command = _repair_command(args.config)
        print(f"cronoq-broker: {exc}", file=sys.stderr)
        return 1
    if recovered is not None:
        log.info("carrying on from %s: %s", config.data_dir, ", ".join(f"{n} {what}" for what, n in recovered.items()))
    import uvloop

    try:
        uvloop.run(_serve(broker, held_servers))
    except _StartFailed as exc:
        broker.close()
        print(f"cronoq-broker: {exc}", file=sys.stderr)
        return 1
    if broker.failure is not None:
        print(f"cronoq-broker: {broker.failure}", file=sys.stderr)
        return 1
    log.info("stopped")
    return 0


def _repair_command(config_file: str | None) -> str:
    """The command line that repairs the data_dir of this config."""
    return f"cronoq-broker -c {shlex.quote(config_file)} --repair" if config_file else "cronoq-broker --repair"


def _repair(config: BrokerConfig, config_file: str | None) -> int:
    """`--repair`: repair the config's data_dir and exit (0: healthy or repaired)."""
    if config.data_dir is None:
        print('cronoq-broker: nothing to repair: with durability = "none" the broker keeps no data_dir',
              file=sys.stderr)
        return 1
    try:
        return repair(Path(config.data_dir))
    except (StoreError, OSError) as exc:
        print(f"cronoq-broker --repair: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
