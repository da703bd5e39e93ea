"""This broker's place in a cluster: which member owns each pool, and what it tells clients and workers.

A lone broker (no `[cluster]`) owns every pool and has no map. In a cluster a
broker schedules only its member's pools: a submit, pause or resume for
another member's pool, or a worker's `ready` naming one, is refused with
FAILED_PRECONDITION, the owner named in the error's details so that clients
and workers can go there; a pool a reload moved away still drains here
(docs/scaling.md).
"""

from __future__ import annotations

from typing import Any, Iterable

from cronoq.broker.config import BrokerConfig
from cronoq.core import SchedulerCore
from cronoq.errors import FailedPrecondition
from cronoq.wire.clustermap import cluster_map


class Membership:
    """Pool ownership for one broker, from its config (`configure` again on each reload)."""

    def __init__(self, config: BrokerConfig, core: SchedulerCore) -> None:
        self._core = core
        self.configure(config)

    def configure(self, config: BrokerConfig) -> None:
        """Take a (new) config: remember which member owns each declared pool, hashed once here rather than on
        every submit."""
        self._config = config
        cluster = config.cluster
        self._owners = {} if cluster is None else {pool.name: cluster.owner(pool.name) for pool in config.pools}

    @property
    def clustered(self) -> bool:
        return self._config.cluster is not None

    @staticmethod
    def own_schedules(config: BrokerConfig) -> tuple[Any, ...]:
        """The schedules this broker fires: all, or in a cluster those of its member's pools (one member each)."""
        if config.cluster is None:
            return config.schedules
        owned = {pool.name for pool in config.owned_pools}
        return tuple(schedule for schedule in config.schedules if schedule.pool in owned)

    def require_owned(self, pool: str) -> None:
        """FailedPrecondition naming the owner (in its details too) when `pool` is another member's."""
        cluster = self._config.cluster
        if cluster is None:
            return
        owner = self._owners.get(pool) if isinstance(pool, str) else None
        member = self._config.member
        if owner is not None and owner != member:
            addresses = ", ".join(cluster.member(owner).clients)
            raise FailedPrecondition(
                f"pool {pool!r} belongs to cluster member {owner!r} ({addresses}), not to {member!r}; "
                "send it there (cronoq's client does so by itself)",
                details={"member": owner, "pool": pool},
            )

    def require_servable(self, pools: Iterable[str]) -> None:
        """A worker may serve here the pools this member owns and those it still drains; FailedPrecondition
        naming the owner of the first other one."""
        if not self.clustered:
            return
        draining = set(self._core.draining_pools())
        for pool in pools:
            if pool not in draining:
                self.require_owned(pool)

    def map(self) -> dict[str, Any] | None:
        """The answer to a `cluster` request: the members, their addresses and pools (None: a lone broker)."""
        config = self._config
        if config.cluster is None:
            return None
        return cluster_map(config.cluster, [pool.name for pool in config.pools], member=config.member or "",
                           draining=self._core.draining_pools())
