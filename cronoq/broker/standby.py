"""`cronoq-broker --standby`: wait for another broker's data_dir, and take it over the moment it is free.

A standby runs the same config (usually on another host, with data_dir on
storage both hosts see) and serves nothing until data_dir's lock (a flock,
cronoq.store.journal.reading) is free: it opens no journal and serves no metrics.
It does hold its client and worker addresses from the start
(cronoq.broker.held): bound, so that no other process on its host can take
them and collect the tokens and tasks of clients and workers that list
them, and silent, so that those clients and workers send it nothing. Its
metrics and dashboard addresses are held as well, turning every connection
away unanswered, so that nobody can bind them to collect the tokens of the
browsers and scrapers sent there. When
the primary stops or dies, the kernel (or the shared file system) drops its
lock; the standby takes it, and the broker's ordinary start follows: its
ROUTERs adopt the held sockets, it replays the journal and serves. The lock
is the only thing that decides who serves, so two brokers never write the
same journal, however the hosts see each other.

A standby that cannot hold a client or worker address (another process has
bound it) does not take the lock while it cannot: a broker that cannot serve must not keep
another one from serving. It tries again every POLL_INTERVAL and says why,
at once and then every COMPLAINT_INTERVAL while it lasts. A metrics or
dashboard address it cannot hold is only warned of: on the primary's host,
with one config file for both, it is the primary's own until it stops.

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

from cronoq.broker.config import BrokerConfig
from cronoq.broker.held import HeldAddresses
from cronoq.errors import ConfigError
from cronoq.store.journal.reading import LOCK, holder, wait_for_lock

log = logging.getLogger("cronoq.broker")

POLL_INTERVAL = 0.1
"""Seconds between tries of a held lock: at most this is added to a takeover."""

COMPLAINT_INTERVAL = 60.0
"""Seconds between repeats of the same ERROR while an address cannot be held."""


class Complaint:
    """An ERROR logged when a trouble starts or changes, repeated every COMPLAINT_INTERVAL while it lasts, and an
    INFO line when it ends: a standby that retries every 0.1 s must not write ten lines a second."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, level: int = logging.ERROR) -> None:
        self._clock = clock
        self._level = level
        self._said: str | None = None
        self._said_at = 0.0

    def __call__(self, trouble: str | None, consequence: str, over: str = "that is over") -> None:
        now = self._clock()
        if trouble is None:
            if self._said is not None:
                log.info("%s (before: %s)", over, self._said)
            self._said = None
        elif trouble != self._said or now - self._said_at >= COMPLAINT_INTERVAL:
            log.log(self._level, "%s; %s", trouble, consequence)
            self._said, self._said_at = trouble, now


def standing_by_for(config: BrokerConfig) -> str:
    """What a standby waits for, in its log line and on stdout."""
    member = "" if config.member is None else f"cluster member {config.member}'s "
    return f"{member}data_dir {config.data_dir}"


def endpoints_of(config: BrokerConfig) -> list[str]:
    """The addresses a standby of `config` holds while it waits."""
    return [config.clients, config.workers]


def servers_of(config: BrokerConfig) -> list[str]:
    """The HTTP addresses ("HOST:PORT") a standby of `config` holds while it waits: its metrics and dashboard."""
    return [address for address in (config.metrics, config.dashboard) if address is not None]


def stand_by(config: BrokerConfig, reread: Callable[[], BrokerConfig] | None, held: HeldAddresses, *,
             announce: bool = True, delay: float = 0.0) -> tuple[int, BrokerConfig] | None:
    """Wait for `config`'s data_dir lock, holding its endpoints in `held` meanwhile; returns the lock's fd once
    taken, with the config to serve (the caller then hands `held`'s sockets over), or None when a signal stopped
    the wait (`held` is closed then). The lock is only tried while every endpoint is held.

    SIGHUP meanwhile calls `reread` (the config file again, as a running broker's reload does): a valid file
    is the config the standby takes over with; an invalid one is logged and the one it has stays. Prints
    `cronoq broker standing by ...` to stdout once, when the wait begins (unless not `announce`: a standby
    standing by again after it could not serve), and tries the lock only after `delay` seconds.
    """
    assert config.data_dir is not None, "a standby needs a data_dir"
    data_dir = Path(config.data_dir)
    subject = standing_by_for(config)
    stop: list[str] = []
    current = [config]
    complain = Complaint()
    complain_of_servers = Complaint(level=logging.WARNING)
    not_before = time.monotonic() + delay

    def ready() -> bool:
        return holding_all() and time.monotonic() >= not_before

    def holding_all() -> bool:
        # An HTTP address another process has bound does not keep the standby from taking over: on the primary's
        # host, with one config file for both, it is the primary's own, freed when it stops. It is held the moment
        # it is free, and the takeover makes sure of it (cronoq.broker.cli).
        server_problems = held.hold_servers(servers_of(current[0]))
        complain_of_servers("; ".join(server_problems) or None,
                            "if the primary does not run on this host with the same address, whoever has it may be "
                            "collecting the tokens of the browsers and scrapers sent there: find that process. "
                            "Holding it the moment it is free", over="holding the metrics and dashboard addresses now")
        problems = held.hold(endpoints_of(current[0]))
        complain("; ".join(problems) or None,
                 "clients and workers given this address may be sending their tokens and tasks to whoever has it. "
                 "Standing by without taking over until it is free (trying every "
                 f"{POLL_INTERVAL:g} s): find that process and stop it", over="holding every address now")
        return not problems

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGHUP:
            stop.append(signal.Signals(signum).name)
        elif reread is None:
            log.info("SIGHUP while standing by: running on built-in defaults, there is no config file to reread")
        else:
            current[0] = _reread(reread, current[0])

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        holding_all()  # before the line below: once it is out, the addresses are ours (or the log says why not)
        if announce:
            for why in held.unholdable.values():
                log.warning("%s", why)
            if (data_dir / LOCK).exists():
                log.info("standing by for %s: it is in use (pid %s); taking over the moment it is free; holding %s "
                         "meanwhile, silent", subject, holder(data_dir),
                         ", ".join(held.endpoints + held.servers) or "no address")
            else:
                log.info("standing by for %s: it holds no broker's lock file yet (is the shared storage mounted "
                         "here, and has a primary used it?); a standby never starts a data_dir afresh", subject)
            print(f"cronoq broker standing by for {subject}", flush=True)
        started = time.monotonic()
        fd = wait_for_lock(data_dir, lambda: bool(stop), POLL_INTERVAL, pause=held.pause, ready=ready)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if fd is None:
        held.close()
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
