"""`cronoq-broker --standby`: wait for another broker's data_dir, and take it over the moment it is free.

A standby runs the same config (usually on another host, with data_dir on
storage both hosts see) and owns nothing until data_dir's lock (a flock,
cronoq.store.reading) is free: it binds no socket, opens no journal and
serves no metrics. When the primary stops or dies, the kernel (or the
shared file system) drops its lock; the standby takes it, and the broker's
ordinary start follows: bind, replay the journal, serve. The lock is the
only thing that decides who serves, so two brokers never write the same
journal, however the hosts see each other.

The wait polls the lock every POLL_INTERVAL seconds rather than blocking in
flock(2): polling works the same on local disks and network file systems,
and SIGTERM, SIGINT and SIGHUP reach the waiting process at once.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Callable

from cronoq.config import BrokerConfig, ConfigError
from cronoq.store.reading import LOCK, holder, wait_for_lock

log = logging.getLogger("cronoq.broker")

POLL_INTERVAL = 0.1
"""Seconds between tries of a held lock: at most this is added to a takeover."""


def standing_by_for(config: BrokerConfig) -> str:
    """What a standby waits for, in its log line and on stdout."""
    member = "" if config.member is None else f"cluster member {config.member}'s "
    return f"{member}data_dir {config.data_dir}"


def stand_by(config: BrokerConfig, reread: Callable[[], BrokerConfig] | None = None
             ) -> tuple[int, BrokerConfig] | None:
    """Wait for `config`'s data_dir lock; returns its fd once taken, with the config to serve, or None when a
    signal stopped the wait.

    SIGHUP meanwhile calls `reread` (the config file again, as a running broker's reload does): a valid file
    is the config the standby takes over with; an invalid one is logged and the one it has stays. Prints
    `cronoq broker standing by ...` to stdout once, when the wait begins.
    """
    assert config.data_dir is not None, "a standby needs a data_dir"
    data_dir = Path(config.data_dir)
    subject = standing_by_for(config)
    stop: list[str] = []
    current = [config]

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGHUP:
            stop.append(signal.Signals(signum).name)
        elif reread is None:
            log.info("SIGHUP while standing by: running on built-in defaults, there is no config file to reread")
        else:
            current[0] = _reread(reread, current[0])

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        if (data_dir / LOCK).exists():
            log.info("standing by for %s: it is in use (pid %s); taking over the moment it is free",
                     subject, holder(data_dir))
        else:
            log.info("standing by for %s: it holds no broker's lock file yet (is the shared storage mounted "
                     "here, and has a primary used it?); a standby never starts a data_dir afresh", subject)
        print(f"cronoq broker standing by for {subject}", flush=True)
        started = time.monotonic()
        fd = wait_for_lock(data_dir, lambda: bool(stop), POLL_INTERVAL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if fd is None:
        log.info("%s while standing by: stopped, having taken nothing over", stop[0])
        return None
    log.info("taking over %s after %.1f s standing by", subject, time.monotonic() - started)
    return fd, current[0]


def _reread(reread: Callable[[], BrokerConfig], config: BrokerConfig) -> BrokerConfig:
    """The config file again, unless it is invalid or moves data_dir (a standby waits for one data_dir)."""
    try:
        new = reread()
    except ConfigError as exc:
        log.error("reload refused, standing by with the config read before: %s", exc)
        return config
    if new.data_dir != config.data_dir:
        log.error("reload refused: data_dir changed (%s -> %s); restart the standby to wait for another",
                  config.data_dir, new.data_dir)
        return config
    log.info("reloaded %s while standing by: it applies at takeover", new.source)
    return new
