"""cronoq.Pool: a named queue of work and the handler that runs it."""

from __future__ import annotations

import asyncio
import inspect
import math
from concurrent.futures import Executor
from typing import Any, Callable, Mapping

from cronoq.core import PoolSettings
from cronoq.core.checks import check_settings, tenant_problem
from cronoq.core.settings import SHARE_BY, tenant_path
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
    run at once over all workers. `share_by` says what a tenant's share
    counts: "dispatches" (the default), "cost" (the `cost=` of its tasks)
    or "runtime" (the seconds its tasks hold a worker); `tenant_rates`
    (node -> most tasks started per second, in bursts of one second's
    worth) and `tenant_minimums` (node -> running tasks guaranteed while it
    has work queued) make the pool fair too. In brokered mode the broker's config owns
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
        share_by: str | None = None,
        tenant_rates: Mapping[str, float] | None = None,
        tenant_minimums: Mapping[str, int] | None = None,
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
        if share_by is not None and share_by not in SHARE_BY:
            raise InvalidArgument(
                f"pool {name!r}: share_by must be one of {', '.join(map(repr, SHARE_BY))}, got {share_by!r}"
            )
        rates = _per_tenant(name, "tenant_rates", tenant_rates)
        for tenant, rate in rates.items():
            if not _positive_number(rate):
                raise InvalidArgument(
                    f"pool {name!r}: the rate of tenant {tenant!r} must be a positive number of tasks per second, "
                    f"got {rate!r}"
                )
        minimums = _per_tenant(name, "tenant_minimums", tenant_minimums)
        for tenant, minimum in minimums.items():
            if not _positive_int(minimum):
                raise InvalidArgument(
                    f"pool {name!r}: the minimum of tenant {tenant!r} must be a positive integer, got {minimum!r}"
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
        self.share_by = share_by  # None: left at its default ("dispatches"), no opinion in brokered mode
        self.tenant_rates = {t: float(r) for t, r in rates.items()}
        self.tenant_minimums = minimums
        if minimums:  # what only the settings together tell: a minimum above a ceiling, or over max_in_flight
            check_settings(self.settings())

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
            share_by=self.share_by or "dispatches",
            tenant_rates=self.tenant_rates,
            tenant_minimums=self.tenant_minimums,
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
        if self.share_by is not None:
            opinions["share_by"] = self.share_by
        if self.tenant_rates:
            opinions["tenant_rates"] = dict(self.tenant_rates)
        if self.tenant_minimums:
            opinions["tenant_minimums"] = dict(self.tenant_minimums)
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
        elif setting == "share_by":
            if wanted != configured.share_by:
                return f"pool {pool!r}: the worker sets share_by = {wanted!r} but the broker's config has {configured.share_by!r}"
        elif setting == "tenant_rates":
            mine_rates = {t: float(r) for t, r in configured.tenant_rates.items()}
            try:
                theirs_rates = {str(t): float(r) for t, r in dict(wanted).items()}
            except (TypeError, ValueError):
                return f"pool {pool!r}: tenant_rates must map tenants to numbers"
            if mine_rates != theirs_rates:
                return f"pool {pool!r}: the worker sets tenant_rates {theirs_rates} but the broker's config has {mine_rates}"
        elif setting == "tenant_minimums":
            mine_minimums = dict(configured.tenant_minimums)
            try:
                theirs_minimums = {str(t): int(n) for t, n in dict(wanted).items()}
            except (TypeError, ValueError):
                return f"pool {pool!r}: tenant_minimums must map tenants to integers"
            if mine_minimums != theirs_minimums:
                return f"pool {pool!r}: the worker sets tenant_minimums {theirs_minimums} but the broker's config has {mine_minimums}"
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
