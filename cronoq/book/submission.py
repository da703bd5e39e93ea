"""The rules a submission must pass before the task book accepts it, each naming what is wrong.

The broker and the embedded scheduler check every submit here; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from cronoq.core import PRIORITIES, PRIORITY_CLASS
from cronoq.core.checks import tenant_problem
from cronoq.errors import InvalidArgument, NotFound
from cronoq.wire.protocol import MAX_NAME_CHARS, check_cost

MAX_NAME_LENGTH = MAX_NAME_CHARS
"""The longest pool, tenant, key or submission id: the wire's bound, so a name the wire carries is never
refused here for its length, and the embedded Scheduler refuses what a broker would."""

RESERVED_KEY_PREFIX = "cronoq:"
"""Idempotency keys starting with this belong to the broker itself (schedule ticks): clients may not use them."""


@dataclass(frozen=True, slots=True)
class FormerKey:
    """The key a previous version gave the same submission (a schedule tick's `schedule:<name>:<tick>`).

    A task kept under it, in the same pool and tenant, counts as the first
    submission only if it was submitted in [since, until): a previous
    version's task for the tick, not one a client made up under that name.
    """

    key: str
    since: float
    until: float


@dataclass(slots=True)
class SubmitRequest:
    """A submission after the shell decoded it; times are seconds from now.

    Not frozen: one is built per submit, and a frozen dataclass takes twice as long to build (2.2 µs).
    """

    payload: bytes
    pool: str = "default"
    tenant: str | None = None
    priority: str = "normal"
    deadline: float | None = None
    delay: float | None = None
    key: str | None = None
    max_retries: int = 0
    submission: str | None = None
    """The client's unique id for this submission: a re-sent submit (lost reply) returns the first task."""
    internal: bool = False
    """Made by the broker itself (a schedule's tick): only such a submission may use a reserved key."""
    former_key: FormerKey | None = None
    cost: float | None = None
    """What the task charges its tenant in a pool that shares by cost (None: 1); see MAX_COST."""


def _check_name(what: str, value: str | None, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise InvalidArgument(f"{what} must be a non-empty string of at most {MAX_NAME_LENGTH} characters, got {value!r}")


def _check_tenant_path(tenant: str | None) -> None:
    """A tenant may be a path (acme/search/alice): at most 8 non-empty segments, no '/' at either end."""
    if tenant is not None and "/" in tenant:
        problem = tenant_problem(tenant)
        if problem is not None:
            raise InvalidArgument(problem)


def _check_seconds(what: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{what} must be a finite number of seconds, got {value!r}")


def validate_submit(request: SubmitRequest, known_pools: Iterable[str], max_payload_bytes: int) -> int:
    """Check a submission's fields; return its priority class. Raises InvalidArgument or NotFound."""
    # Every submit comes through here, so the common shape is passed by one condition at half the cost.
    priority = common_submission_class(request, known_pools, max_payload_bytes)
    return priority if priority is not None else checked_submission_class(request, known_pools, max_payload_bytes)


def common_submission_class(request: SubmitRequest, known_pools: Iterable[str], max_payload_bytes: int) -> int | None:
    """The priority class of a submission of the common shape, which `checked_submission_class` would accept;
    None for any other (which may still be valid): names of allowed lengths, a tenant without '/', no key,
    deadline or delay, retries in range, a payload within bounds, a known pool and priority."""
    pool, tenant, submission, retries = request.pool, request.tenant, request.submission, request.max_retries
    if (
        pool.__class__ is str and 0 < len(pool) <= MAX_NAME_LENGTH
        and (tenant is None or (tenant.__class__ is str and 0 < len(tenant) <= MAX_NAME_LENGTH and "/" not in tenant))
        and (submission is None or (submission.__class__ is str and 0 < len(submission) <= MAX_NAME_LENGTH))
        and request.key is None and request.deadline is None and request.delay is None and request.cost is None
        and retries.__class__ is int and 0 <= retries <= 1000
        and len(request.payload) <= max_payload_bytes
        and pool in known_pools
        and request.priority.__class__ is str
    ):
        return PRIORITY_CLASS.get(request.priority)
    return None


def checked_submission_class(request: SubmitRequest, known_pools: Iterable[str], max_payload_bytes: int) -> int:
    """Every check of a submission, each saying what is wrong; its priority class if it passes them all."""
    _check_name("pool", request.pool, optional=False)
    _check_name("tenant", request.tenant, optional=True)
    _check_tenant_path(request.tenant)
    _check_name("key", request.key, optional=True)
    if request.key is not None and request.key.startswith(RESERVED_KEY_PREFIX) and not request.internal:
        raise InvalidArgument(
            f"key {request.key!r} starts with {RESERVED_KEY_PREFIX!r}: keys with that prefix are reserved "
            "for the broker's own tasks (schedule ticks); choose another key"
        )
    _check_name("submission", request.submission, optional=True)
    priority = PRIORITY_CLASS.get(request.priority) if isinstance(request.priority, str) else None
    if priority is None:
        raise InvalidArgument(f"priority must be one of {', '.join(PRIORITIES)}, got {request.priority!r}")
    _check_seconds("deadline", request.deadline)
    if request.deadline is not None and request.deadline <= 0:
        # A deadline already reached would expire the task at once: surely a mistake, so say so.
        raise InvalidArgument(f"deadline must be more than 0 seconds from now, got {request.deadline:g} seconds")
    _check_seconds("delay", request.delay)
    if request.delay is not None and request.delay < 0:
        raise InvalidArgument(f"delay must not be negative, got {request.delay!r}")
    if isinstance(request.max_retries, bool) or not isinstance(request.max_retries, int) or not 0 <= request.max_retries <= 1000:
        raise InvalidArgument(f"max_retries must be an integer from 0 to 1000, got {request.max_retries!r}")
    check_cost(request.cost)
    if len(request.payload) > max_payload_bytes:
        raise InvalidArgument(
            f"payload is {len(request.payload)} bytes, over max_payload_bytes = {max_payload_bytes}"
        )
    if request.pool not in known_pools:
        raise NotFound(f"no pool named {request.pool!r}; declared pools: {', '.join(sorted(known_pools))}")
    return priority
