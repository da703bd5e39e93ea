"""cronoq.Pool: a named queue of work and the handler that runs it."""

from __future__ import annotations

import asyncio
import inspect
import math
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

from cronoq.core import PoolSettings
from cronoq.core.checks import tenant_problem
from cronoq.core.settings import tenant_path
from cronoq.errors import FailedPrecondition, InvalidArgument

__all__ = ["Handler", "Pool", "tenant_path"]

Handler = Callable[[Any], Any]
# tenant_path (the nodes a tenant path names, top down) is the core's rule, passed on here as part of the pool's
# vocabulary: the client's text draws a pool's tenant tree as the broker builds it, without leaning on the core.


class Pool:
    """A pool of work: its name, the handler that runs its tasks, and how it shares workers between tenants.

    Tenants may be paths (`acme/search`): weights and ceilings apply to any
    node of that tree, by its full name. `tenant_weights` (node -> positive
    weight), `default_weight` (of every node not listed), `fair_share=True`,
    `tenant_limits` (node -> how many tasks of its subtree may run at once)
    or `default_tenant_limit` (the same, for each top-level tenant not
    listed) make the pool fair; `max_in_flight` caps how many of its tasks
    run at once over all workers. In brokered mode the broker's config owns
    these settings: a setting left at its default carries no opinion, and
    one set explicitly must agree with the broker's.
    """

    def __init__(
        self,
        name: str,
        run: Handler | None = None,
        *,
        tenant_weights: Mapping[str, float] | None = None,
        fair_share: bool = False,
        max_in_flight: int | None = None,
        tenant_limits: Mapping[str, int] | None = None,
        default_weight: float | None = None,
        default_tenant_limit: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a pool name must be a non-empty string, got {name!r}")
        if run is not None and not callable(run):
            raise InvalidArgument(f"pool {name!r}: run must be callable, got {run!r}")
        weights = _per_tenant(name, "tenant_weights", tenant_weights)
        for tenant, weight in weights.items():
            if not _positive_number(weight):
                raise InvalidArgument(f"pool {name!r}: weight of tenant {tenant!r} must be a positive number, got {weight!r}")
        limits = _per_tenant(name, "tenant_limits", tenant_limits)
        for tenant, limit in limits.items():
            if not _positive_int(limit):
                raise InvalidArgument(f"pool {name!r}: the limit of tenant {tenant!r} must be a positive integer, got {limit!r}")
        if max_in_flight is not None and not _positive_int(max_in_flight):
            raise InvalidArgument(f"pool {name!r}: max_in_flight must be a positive integer, got {max_in_flight!r}")
        if default_weight is not None and not _positive_number(default_weight):
            raise InvalidArgument(f"pool {name!r}: default_weight must be a positive number, got {default_weight!r}")
        if default_tenant_limit is not None and not _positive_int(default_tenant_limit):
            raise InvalidArgument(
                f"pool {name!r}: default_tenant_limit must be a positive integer, got {default_tenant_limit!r}"
            )
        self.name = name
        self.run = run
        self._judged: Handler | None = None  # the handler `is_async` last looked at, and what it found
        self._judged_async = False
        self.tenant_weights = weights
        self.fair_share = bool(fair_share)
        self.max_in_flight = max_in_flight
        self.tenant_limits = limits
        self.default_weight = default_weight
        self.default_tenant_limit = default_tenant_limit

    @property
    def is_async(self) -> bool:
        """Whether the handler is a coroutine function (runs on the loop) rather than a plain one (runs in a thread)."""
        run = self.run
        if run is not self._judged:  # asked once per handler: `inspect` costs a few µs a task on a worker
            self._judged = run
            self._judged_async = run is not None and (
                inspect.iscoroutinefunction(run) or inspect.iscoroutinefunction(getattr(run, "__call__", None))
            )
        return self._judged_async

    def settings(self) -> PoolSettings:
        """The scheduling settings this pool asks for (used as-is in embedded mode)."""
        return PoolSettings(
            self.name,
            self.tenant_weights,
            self.fair_share,
            self.max_in_flight,
            tenant_limits=self.tenant_limits,
            default_weight=self.default_weight,
            default_tenant_limit=self.default_tenant_limit,
        )

    def explicit_settings(self) -> dict[str, Any]:
        """Only the settings set away from their defaults: the opinions a worker sends to the broker."""
        opinions: dict[str, Any] = {}
        if self.tenant_weights:
            opinions["tenant_weights"] = dict(self.tenant_weights)
        if self.fair_share:
            opinions["fair_share"] = True
        if self.max_in_flight is not None:
            opinions["max_in_flight"] = self.max_in_flight
        if self.tenant_limits:
            opinions["tenant_limits"] = dict(self.tenant_limits)
        if self.default_weight is not None:
            opinions["default_weight"] = self.default_weight
        if self.default_tenant_limit is not None:
            opinions["default_tenant_limit"] = self.default_tenant_limit
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
        elif setting == "tenant_limits":
            mine_limits = dict(configured.tenant_limits)
            try:
                theirs_limits = {str(t): int(n) for t, n in dict(wanted).items()}
            except (TypeError, ValueError):
                return f"pool {pool!r}: tenant_limits must map tenants to integers"
            if mine_limits != theirs_limits:
                return f"pool {pool!r}: the worker sets tenant_limits {theirs_limits} but the broker's config has {mine_limits}"
        elif setting in ("default_weight", "default_tenant_limit"):
            have = getattr(configured, setting)
            if wanted != have:
                shown = "unset" if have is None else have
                return f"pool {pool!r}: the worker sets {setting} = {wanted} but the broker's config has {shown}"
        else:
            return f"pool {pool!r}: unknown pool setting {setting!r}"
    return None


def _per_tenant(pool: str, setting: str, table: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of a per-tenant table whose keys are valid tenant names (a name or a path such as "acme/search")."""
    out = dict(table or {})
    for tenant in out:
        problem = tenant_problem(tenant)
        if problem is not None:
            raise InvalidArgument(f"pool {pool!r}: {setting}: {problem}")
    return out


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1
