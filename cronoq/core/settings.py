"""Pool settings: what the scheduling core needs to know about a pool.

One frozen value per pool. The broker builds these from its config file, the
embedded Scheduler from `cronoq.Pool` objects; the core never reads a file.

Tenant names are paths: `acme`, `acme/search`, `acme/search/alice` name
nodes of a tree (at most MAX_TENANT_DEPTH segments, none empty). A name
without `/` is a top-level tenant. Weights and ceilings may be set for any
node, by its full name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

PRIORITIES: tuple[str, ...] = ("critical", "high", "normal", "low")
"""Priority class names; the index is the class number, 0 the most urgent."""

PRIORITY_CLASS: Mapping[str, int] = MappingProxyType({name: i for i, name in enumerate(PRIORITIES)})

MAX_TENANT_DEPTH = 8
"""How many `/`-separated segments a tenant name may have."""

SHARE_BY: tuple[str, ...] = ("dispatches", "cost", "runtime")
"""What a dispatch charges its tenant's share: one dispatch, the task's declared cost, or its measured run time."""

SHARE_UNIT: Mapping[str, str] = MappingProxyType({"dispatches": "dispatches", "cost": "cost", "runtime": "seconds"})
"""The unit lag, virtual time and shares are read in, by `share_by`."""


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class PoolSettings:
    """How one pool schedules: tenant weights, ceilings, rates and minimums, fair sharing, what a share counts,
    and its in-flight cap.

    A pool is fair when it sets any of `tenant_weights`, `fair_share`,
    `default_weight`, `tenant_limits`, `default_tenant_limit`,
    `tenant_rates`, `tenant_minimums`, or a `share_by` other than
    "dispatches"; then tenants
    share each priority class by hierarchical weighted start-time fair
    queuing. Nodes not listed weigh `default_weight` (1 when unset); tasks
    without a tenant form one more top-level tenant of weight 1.
    `tenant_limits` caps how many tasks of a node's subtree run at once;
    `default_tenant_limit` caps each top-level tenant not listed (the
    untenanted tasks included). `max_in_flight=None` means no pool cap.
    `share_by` is what a dispatch charges its tenant: "dispatches" (1),
    "cost" (the task's cost) or "runtime" (its run time, estimated then
    corrected). `tenant_rates` holds the most dispatches per second a node's
    subtree may start (a bucket of one second's worth, at least one);
    `tenant_minimums` the running tasks a node's subtree is guaranteed while
    it has work queued (docs/scheduling.md).
    """

    name: str
    tenant_weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    fair_share: bool = False
    max_in_flight: int | None = None
    tenant_limits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    default_weight: float | None = None
    default_tenant_limit: int | None = None
    share_by: str = "dispatches"
    tenant_rates: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    tenant_minimums: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # Freeze the mappings so a settings value can be shared safely.
        object.__setattr__(self, "tenant_weights", _frozen(self.tenant_weights))
        object.__setattr__(self, "tenant_limits", _frozen(self.tenant_limits))
        object.__setattr__(self, "tenant_rates", _frozen(self.tenant_rates))
        object.__setattr__(self, "tenant_minimums", _frozen(self.tenant_minimums))

    @property
    def fair(self) -> bool:
        return (
            self.fair_share
            or bool(self.tenant_weights)
            or self.default_weight is not None
            or self.has_node_limits
            or self.share_by != "dispatches"
        )

    @property
    def has_node_limits(self) -> bool:
        """Whether any node of this pool has a ceiling, a rate or a minimum: the pool then counts the running
        tasks of those nodes' subtrees and passes over the ones it must hold back."""
        return self.has_ceilings or bool(self.tenant_rates) or bool(self.tenant_minimums)

    @property
    def share_unit(self) -> str:
        """What lag, virtual time and shares are counted in: "dispatches", "cost" or "seconds"."""
        return SHARE_UNIT.get(self.share_by, self.share_by)

    @property
    def has_ceilings(self) -> bool:
        """Whether any tenant of this pool can be capped."""
        return bool(self.tenant_limits) or self.default_tenant_limit is not None

    def weight(self, tenant: str | None) -> float:
        """The weight of node `tenant` in this pool (listed, else default_weight, else 1; 1 when untenanted)."""
        if tenant is None:
            return 1.0
        weight = self.tenant_weights.get(tenant)
        if weight is None:
            weight = 1.0 if self.default_weight is None else self.default_weight
        return float(weight)

    def limit(self, tenant: str | None) -> int | None:
        """The ceiling of node `tenant` (listed, else default_tenant_limit for a top-level one), or None."""
        if tenant is not None:
            listed = self.tenant_limits.get(tenant)
            if listed is not None:
                return listed
            if len(tenant_path(tenant)) > 1:
                return None
        return self.default_tenant_limit

    def rate(self, tenant: str | None) -> float | None:
        """The most dispatches per second node `tenant`'s subtree may start, or None."""
        return None if tenant is None else self.tenant_rates.get(tenant)

    def minimum(self, tenant: str | None) -> int | None:
        """The running tasks node `tenant`'s subtree is guaranteed while it has work queued, or None."""
        return None if tenant is None else self.tenant_minimums.get(tenant)


@functools.lru_cache(maxsize=4096)
def tenant_path(tenant: str | None) -> tuple[str | None, ...]:
    """The nodes from the top down to `tenant`: ("acme", "acme/search") for "acme/search"; (None,) untenanted.

    A name that is not a valid path (an empty segment, more than
    MAX_TENANT_DEPTH levels) is one opaque top-level name: submit refuses
    such names, but tasks recovered from a version that took any name keep
    their place.

    Asked on every submit, dispatch and stats row, for a few names: the last
    4,096 answers are kept (tuples of the caller's strings; a pure function).
    """
    if tenant is None or "/" not in tenant:
        return (tenant,)
    parts = tenant.split("/")
    if "" in parts or len(parts) > MAX_TENANT_DEPTH:
        return (tenant,)
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))
