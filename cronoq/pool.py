"""cronoq.Pool: a named queue of work and the handler that runs it."""

from __future__ import annotations

import asyncio
import inspect
import math
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

from cronoq.core import PoolSettings
from cronoq.errors import FailedPrecondition, InvalidArgument

Handler = Callable[[Any], Any]


class Pool:
    """A pool of work: its name, the handler that runs its tasks, and how it shares workers between tenants.

    `tenant_weights` (tenant -> positive weight) or `fair_share=True` make the
    pool fair; `max_in_flight` caps how many of its tasks run at once over all
    workers. In brokered mode the broker's config owns these settings: a
    setting left at its default carries no opinion, and one set explicitly
    must agree with the broker's.
    """

    def __init__(
        self,
        name: str,
        run: Handler | None = None,
        *,
        tenant_weights: Mapping[str, float] | None = None,
        fair_share: bool = False,
        max_in_flight: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a pool name must be a non-empty string, got {name!r}")
        if run is not None and not callable(run):
            raise InvalidArgument(f"pool {name!r}: run must be callable, got {run!r}")
        weights = dict(tenant_weights or {})
        for tenant, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight > 0):
                raise InvalidArgument(f"pool {name!r}: weight of tenant {tenant!r} must be a positive number, got {weight!r}")
        if max_in_flight is not None and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1):
            raise InvalidArgument(f"pool {name!r}: max_in_flight must be a positive integer, got {max_in_flight!r}")
        self.name = name
        self.run = run
        self.tenant_weights = weights
        self.fair_share = bool(fair_share)
        self.max_in_flight = max_in_flight

    @property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (runs on the loop) rather than a plain one (runs in a thread)."""
        return self.run is not None and (
            inspect.iscoroutinefunction(self.run) or inspect.iscoroutinefunction(getattr(self.run, "__call__", None))
        )

    def settings(self) -> PoolSettings:
        """The scheduling settings this pool asks for (used as-is in embedded mode)."""
        return PoolSettings(self.name, self.tenant_weights, self.fair_share, self.max_in_flight)

    def explicit_settings(self) -> dict[str, Any]:
        """Only the settings set away from their defaults: the opinions a worker sends to the broker."""
        opinions: dict[str, Any] = {}
        if self.tenant_weights:
            opinions["tenant_weights"] = dict(self.tenant_weights)
        if self.fair_share:
            opinions["fair_share"] = True
        if self.max_in_flight is not None:
            opinions["max_in_flight"] = self.max_in_flight
        return opinions

    async def call(self, payload: Any, executor: Executor | None = None) -> Any:
        """Run the handler on one payload: coroutines on the loop, plain functions in `executor`'s threads."""
        if self.run is None:
            raise FailedPrecondition(f"pool {self.name!r} has no handler to run its tasks")
        if self.is_async:
            return await self.run(payload)
        return await asyncio.get_running_loop().run_in_executor(executor, self.run, payload)

    def __repr__(self) -> str:
        return f"Pool({self.name!r})"


def settings_disagreement(pool: str, opinions: Mapping[str, Any], configured: PoolSettings) -> str | None:
    """Why a worker's explicit pool settings disagree with the broker's config, or None if they agree."""
    if not isinstance(opinions, Mapping):
        return f"pool {pool!r}: settings must be a map"
    for setting, wanted in opinions.items():
        if setting == "tenant_weights":
            mine = {t: float(w) for t, w in configured.tenant_weights.items()}
            try:
                theirs = {str(t): float(w) for t, w in dict(wanted).items()}
            except (TypeError, ValueError):
                return f"pool {pool!r}: tenant_weights must map tenants to numbers"
            if mine != theirs:
                return f"pool {pool!r}: the worker sets tenant_weights {theirs} but the broker's config has {mine}"
        elif setting == "fair_share":
            if bool(wanted) != configured.fair:
                return f"pool {pool!r}: the worker sets fair_share = {bool(wanted)} but the broker's pool is {'fair' if configured.fair else 'not fair'}"
        elif setting == "max_in_flight":
            if wanted != configured.max_in_flight:
                return f"pool {pool!r}: the worker sets max_in_flight = {wanted} but the broker's config has {configured.max_in_flight}"
        else:
            return f"pool {pool!r}: unknown pool setting {setting!r}"
    return None
