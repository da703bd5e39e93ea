"""Checks of what callers hand the core, with messages that say what to send instead.

The core refuses malformed input at its boundary (InvalidArgument, NotFound)
so that its structures only ever hold tasks and settings it can order by.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from cronoq.core.settings import MAX_TENANT_DEPTH, PRIORITIES, SHARE_BY, PoolSettings, tenant_path
from cronoq.core.task import Task
from cronoq.errors import InvalidArgument

if TYPE_CHECKING:
    from cronoq.core.pool import PoolState


def no_pool_message(name: object, pool: PoolState | None, accepting: list[str]) -> str:
    """Why `name` takes no tasks (unknown, or draining after a reload), and what does."""
    if pool is not None:
        return f"pool {name!r} was removed from the config and is draining; use one of {accepting}"
    return f"no pool named {name!r}; declared pools: {accepting}"


def is_time(value: object) -> bool:
    """Whether `value` can be a time on the caller's clock: an int or a float, not NaN."""
    return type(value) in (int, float) and not math.isnan(value)  # type: ignore[arg-type]


def check_task(task: Task) -> None:
    """Refuse fields the core cannot order by, with a message that says what to send instead."""
    if type(task.id) is not str or not task.id:
        raise InvalidArgument(f"a task id must be a non-empty string, got {task.id!r}")
    priority = task.priority
    if type(priority) is not int or not 0 <= priority < len(PRIORITIES):
        raise InvalidArgument(f"priority must be a class number 0..{len(PRIORITIES) - 1}, got {priority!r}")
    tenant = task.tenant
    if tenant is not None and (type(tenant) is not str or not tenant):
        raise InvalidArgument(f"tenant must be a non-empty string or None, got {tenant!r}")
    if task.deadline is not None and not is_time(task.deadline):
        raise InvalidArgument(f"deadline must be a number or None, got {task.deadline!r}")
    if task.not_before is not None and not is_time(task.not_before):
        raise InvalidArgument(f"not_before must be a number or None, got {task.not_before!r}")
    if type(task.attempts) is not int or task.attempts < 0:
        raise InvalidArgument(f"attempts must be an int >= 0, got {task.attempts!r}")
    cost = task.cost
    if cost is not None and not is_positive(cost):
        raise InvalidArgument(f"cost must be a positive number or None (1), got {cost!r}")


def is_positive(value: object) -> bool:
    """Whether `value` is a positive finite int or float (not a bool)."""
    return type(value) in (int, float) and 0 < value < math.inf  # type: ignore[operator]


def tenant_problem(tenant: object) -> str | None:
    """What is wrong with `tenant` as a tenant name (a path of 1..8 non-empty `/`-separated segments), or None."""
    if type(tenant) is not str or not tenant:
        return f"a tenant must be a non-empty string, got {tenant!r}"
    if "/" in tenant:
        segments = tenant.split("/")
        if "" in segments:
            return (
                f"tenant {tenant!r} has an empty segment: a tenant path is names separated by single '/', "
                "with no '/' at either end (e.g. 'acme/search')"
            )
        if len(segments) > MAX_TENANT_DEPTH:
            return f"tenant {tenant!r} has {len(segments)} levels; at most {MAX_TENANT_DEPTH} are allowed"
    return None


def check_settings(s: PoolSettings) -> None:
    """Refuse pool settings the core cannot schedule by (weights must be positive and finite)."""
    if not isinstance(s, PoolSettings):
        raise InvalidArgument(f"expected PoolSettings, got {type(s).__name__}")
    if not isinstance(s.name, str) or not s.name:
        raise InvalidArgument(f"a pool name must be a non-empty string, got {s.name!r}")
    for tenant, weight in s.tenant_weights.items():
        _check_node(s, "tenant_weights", tenant)
        if type(weight) not in (int, float) or not 0 < weight < math.inf:
            raise InvalidArgument(
                f"pool {s.name!r}: the weight of tenant {tenant!r} must be a positive number, got {weight!r}"
            )
    weight = s.default_weight
    if weight is not None and (type(weight) not in (int, float) or not 0 < weight < math.inf):
        raise InvalidArgument(f"pool {s.name!r}: default_weight must be a positive number or None, got {weight!r}")
    for tenant, limit in s.tenant_limits.items():
        _check_node(s, "tenant_limits", tenant)
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(
                f"pool {s.name!r}: the ceiling of tenant {tenant!r} must be an int >= 1, got {limit!r}"
            )
    limit = s.default_tenant_limit
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InvalidArgument(f"pool {s.name!r}: default_tenant_limit must be an int >= 1 or None, got {limit!r}")
    cap = s.max_in_flight
    if cap is not None and (type(cap) is not int or cap < 1):
        raise InvalidArgument(f"pool {s.name!r}: max_in_flight must be an int >= 1 or None, got {cap!r}")
    if s.share_by not in SHARE_BY:
        raise InvalidArgument(
            f"pool {s.name!r}: share_by must be one of {', '.join(map(repr, SHARE_BY))}, got {s.share_by!r}"
        )
    for tenant, rate in s.tenant_rates.items():
        _check_node(s, "tenant_rates", tenant)
        if not is_positive(rate):
            raise InvalidArgument(
                f"pool {s.name!r}: the rate of tenant {tenant!r} must be a positive number of dispatches per "
                f"second, got {rate!r}"
            )
    for tenant, minimum in s.tenant_minimums.items():
        _check_node(s, "tenant_minimums", tenant)
        if type(minimum) is not int or minimum < 1:
            raise InvalidArgument(
                f"pool {s.name!r}: the minimum of tenant {tenant!r} must be an int >= 1, got {minimum!r}"
            )
        for node in tenant_path(tenant):
            ceiling = s.limit(node)
            if ceiling is not None and ceiling < minimum:
                where = "its own ceiling" if node == tenant else f"the ceiling of {node!r} above it"
                raise InvalidArgument(
                    f"pool {s.name!r}: tenant {tenant!r} is guaranteed {minimum} running tasks but {where} is "
                    f"{ceiling}; lower the minimum or raise the ceiling"
                )
    _check_minimums_fit(s)


def _check_minimums_fit(s: PoolSettings) -> None:
    """Minimums nested under another minimum are part of it; the outermost ones must fit in max_in_flight."""
    if s.max_in_flight is None or not s.tenant_minimums:
        return
    listed = s.tenant_minimums
    outermost = {t: m for t, m in listed.items() if not any(a in listed for a in tenant_path(t)[:-1])}
    total = sum(outermost.values())
    if total > s.max_in_flight:
        raise InvalidArgument(
            f"pool {s.name!r}: tenant_minimums guarantee {total} running tasks "
            f"({', '.join(f'{t}={m}' for t, m in outermost.items())}) but max_in_flight is {s.max_in_flight}; "
            "lower the minimums or raise max_in_flight"
        )


def _check_node(s: PoolSettings, setting: str, tenant: object) -> None:
    problem = tenant_problem(tenant)
    if problem is not None:
        raise InvalidArgument(f"pool {s.name!r}: {setting}: {problem}")
