"""Pool settings: what the scheduling core needs to know about a pool.

One frozen value per pool. The broker builds these from its config file, the
embedded Scheduler from `cronoq.Pool` objects; the core never reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

PRIORITIES: tuple[str, ...] = ("critical", "high", "normal", "low")
"""Priority class names; the index is the class number, 0 the most urgent."""

PRIORITY_CLASS: Mapping[str, int] = MappingProxyType({name: i for i, name in enumerate(PRIORITIES)})


@dataclass(frozen=True)
class PoolSettings:
    """How one pool schedules: tenant weights, fair sharing, and its in-flight cap.

    A pool is fair when it lists `tenant_weights` or sets `fair_share`; then
    tenants share each priority class by weighted start-time fair queuing.
    Tenants not listed (and tasks without a tenant, which form one more
    tenant) weigh 1. `max_in_flight=None` means no cap.
    """

    name: str
    tenant_weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    fair_share: bool = False
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        # Freeze the mapping so a settings value can be shared safely.
        object.__setattr__(self, "tenant_weights", MappingProxyType(dict(self.tenant_weights)))

    @property
    def fair(self) -> bool:
        return self.fair_share or bool(self.tenant_weights)

    def weight(self, tenant: str | None) -> float:
        """The weight of `tenant` in this pool (1 when unlisted or untenanted)."""
        if tenant is None:
            return 1.0
        return float(self.tenant_weights.get(tenant, 1.0))
