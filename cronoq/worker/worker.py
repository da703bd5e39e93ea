"""The public worker, `cronoq.Worker`: one broker's runner, or a cluster's runners, behind one object.

A worker is given one broker's addresses (its primary and standbys), or any cluster member's. It cannot
know which until the broker answers its `cluster` question, so it starts one `Runner` that asks first
(`cronoq.worker.runner`). A lone broker's answer makes that runner the worker; a member's makes it hand
over to a `ClusterWorker` (`cronoq.worker.cluster`), which serves each member through a runner of its own.
This module checks the arguments, owns the handlers' threads, keeps the public signatures (docs/api.md,
"Workers") and says how the worker ended; what serving means is the runners'.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from cronoq.errors import InvalidArgument
from cronoq.pool import Pool
from cronoq.wire.curve import public_key
from cronoq.wire.link import parse_addresses
from cronoq.wire.transport import token_bytes
from cronoq.worker.cluster import ClusterWorker
from cronoq.worker.runner import Runner

__all__ = ["Worker"]

log = logging.getLogger("cronoq.worker")


class Worker:
    """Runs the tasks of `pools` that the broker at `broker` hands it, `concurrency` at a time."""

    def __init__(
        self,
        broker: str | Sequence[str],
        pools: Pool | Iterable[Pool],
        *,
        concurrency: int = 4,
        token: str | bytes | None = None,
        heartbeat_interval: float = 1.0,
        liveness: int = 3,
        curve_public_key: str | bytes | os.PathLike[str] | None = None,
    ) -> None:
        pool_list = [pools] if isinstance(pools, Pool) else list(pools)
        if not pool_list:
            raise InvalidArgument("a Worker needs at least one cronoq.Pool")
        self.pools: dict[str, Pool] = {}
        for pool in pool_list:
            if not isinstance(pool, Pool):
                raise InvalidArgument(f"Worker takes cronoq.Pool objects, got {pool!r}")
            if pool.run is None:
                raise InvalidArgument(f"pool {pool.name!r} has no handler: a worker needs one to run its tasks")
            self.pools[pool.name] = pool
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be a positive integer, got {concurrency!r}")
        self.brokers = parse_addresses(broker, "broker address")
        """The broker's worker endpoints: its primary's and its standbys' (one DEALER connects to them all)."""
        self.broker = " or ".join(self.brokers)
        self.concurrency = concurrency
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self._token = token_bytes(token)
        # The broker's CURVE public key (40 Z85 characters or a NAME.key file): encrypt everything.
        self._server_key = None if curve_public_key is None else public_key(curve_public_key)
        self._seed = Runner(self.brokers, self.pools, concurrency=concurrency, token=self._token,
                            server_key=self._server_key, heartbeat_interval=heartbeat_interval, liveness=liveness,
                            asks_first=True, on_map=self._found_cluster)
        self._cluster: ClusterWorker | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def registered(self) -> bool:
        """Whether the broker has accepted this worker on the current connection (in a cluster: whether every
        member serving its pools has)."""
        return self._cluster.registered if self._cluster is not None else self._seed.registered

    @property
    def running(self) -> int:
        """How many tasks run now."""
        return self._seed.running + (0 if self._cluster is None else self._cluster.running)

    @property
    def members(self) -> dict[str, list[str]]:
        """In a cluster, the pools this worker serves on each member; empty for a lone broker."""
        return {} if self._cluster is None else self._cluster.members

    @property
    def finished(self) -> int:
        """Tasks this worker ran to an outcome it reported (succeeded or failed)."""
        return self._seed.finished + (0 if self._cluster is None else self._cluster.finished)

    @property
    def abandoned(self) -> int:
        """Tasks left running when it stopped (at once, or on a fatal error): the broker runs them again."""
        return self._seed.abandoned + (0 if self._cluster is None else self._cluster.abandoned)

    async def run(self) -> None:
        """Serve until `stop()`; raises the broker's refusal (e.g. NotFound, FailedPrecondition) if it rejects us."""
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="cronoq-handler")
        try:
            await self._seed.run(self._executor)
            if self._cluster is not None:
                await self._cluster.run()
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
            log.info("worker stopped: %d task%s finished, %d abandoned", self.finished,
                     "" if self.finished == 1 else "s", self.abandoned)

    async def stop(self, *, now: bool = False) -> None:
        """Take no more tasks, let the running ones finish and report, then leave.

        With `now` (also while a graceful stop waits): close the connection at once and abandon the running
        tasks; the broker, losing the connection, runs them again on another worker. A plain `def` handler
        cannot be interrupted: its thread runs on, and what it returns is dropped.
        """
        if self._cluster is not None:
            await self._cluster.stop(now=now)
        else:
            await self._seed.stop(now=now)

    def _found_cluster(self, value: Any) -> None:
        """The seed runner's broker answered with a cluster map: serve the cluster through a runner per member."""
        if self._cluster is not None:  # a second answer on the seed's connection before it closed
            self._cluster.follow(value)
            return
        if self._seed.stopping or self._executor is None:
            return
        log.info("%s is cluster member %s: serving the members that own pools %s", self.broker,
                 value.get("member"), ", ".join(self.pools))
        self._cluster = ClusterWorker(self.pools, concurrency=self.concurrency, token=self._token,
                                      server_key=self._server_key, heartbeat_interval=self.heartbeat_interval,
                                      liveness=self.liveness, executor=self._executor)
        self._seed.hand_over()  # each member's runner has a connection of its own; this one has told what it could
        self._cluster.follow(value)
