"""`cronoq-broker [-c cronoq.toml]`: run one broker until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Sequence

from cronoq.broker.server import Broker
from cronoq.config import BrokerConfig, ConfigError, default_config, load_config
from cronoq.store.journal import StoreError

log = logging.getLogger("cronoq.broker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronoq-broker", description="Run the cronoq broker.")
    parser.add_argument("-c", "--config", metavar="FILE", help="the TOML config (default: built-in defaults)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser


async def _serve(broker: Broker) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, broker.stop)
    clients, workers = broker.endpoints
    print(f"cronoq broker ready clients={clients} workers={workers}", flush=True)
    await broker.serve()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.stderr)
    try:
        config: BrokerConfig = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        print(f"cronoq-broker: invalid config: {exc}", file=sys.stderr)
        return 2
    broker = Broker(config)
    try:
        recovered = broker.open()
    except StoreError as exc:
        print(f"cronoq-broker: {exc}", file=sys.stderr)
        return 1
    if recovered is not None:
        log.info("carrying on from %s: %s", config.data_dir, ", ".join(f"{n} {what}" for what, n in recovered.items()))
    try:
        broker.bind()
    except OSError as exc:
        broker.close()
        print(f"cronoq-broker: {exc}", file=sys.stderr)
        return 1
    import uvloop

    uvloop.run(_serve(broker))
    if broker.failure is not None:
        print(f"cronoq-broker: {broker.failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
