"""What cronoq answers about a task: the public types `status` and `explain` return, and how they read as text.

A leaf: the client, the embedded scheduler, the broker (its dashboard) and the
`cronoq` command share these definitions and import nothing of each other's
through them. The fields of `TaskInfo` are the task's fields every answer has;
`Explanation` adds why the task is where it is.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

from cronoq.errors import InvalidArgument

# The states of a task (TaskInfo.state, and what a result says happened). The core's rules move a task between
# them (core/task.py); they live here, in the vocabulary every process shares, so that a client reading an
# outcome need not load the scheduling core.
QUEUED = "queued"
DELAYED = "delayed"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
EXPIRED = "expired"

KEPT_ATTEMPT_ENDS = 16
"""How many of a task's attempts that ended without ending it (retried, worker lost) its record keeps, the last
ones: memory and the journal's snapshots follow the live tasks, not how often one of them failed."""


@dataclass(frozen=True)
class CeilingState:
    """A node's ceiling: its limit, the running tasks of its subtree, and whether (and since when) it is capped.

    `capped_since` is on the caller's clock (Unix seconds in the broker); `capped_for` is the seconds since.
    """

    limit: int
    running: int
    capped: bool
    capped_since: float | None = None
    capped_for: float | None = None


@dataclass(frozen=True)
class NodeState:
    """One node on a task's tenant path, as the fair share of the task's class sees it now.

    `own_tasks` marks the tenant's own tasks where they share with its sub-tenants (as one more child of
    weight 1). `share` is the fraction of its parent's dispatches the node gets now (0 while it has nothing
    queued in the class or is capped); `lag` the dispatches it trails (+) or leads (-) its share, in this class.
    `hidden`: the caller is pinned to this node or one below it, and its share and lag (which depend on other
    tenants' work) are not told: they read 0. In a pool that shares by cost or run time, `lag` is in that unit
    (`Waiting.share_unit`). `rate` is the node's most starts per second and `rate_limited_for` the seconds until
    its bucket lets it start again (None while it may); `minimum` the running tasks its subtree is guaranteed
    and `under_minimum` whether it runs fewer (its tasks then go ahead of its class's fair order).
    """

    name: str
    own_tasks: bool
    weight: float
    backlogged: bool
    share: float
    lag: float
    ceiling: CeilingState | None = None
    hidden: bool = False
    rate: float | None = None
    rate_limited_for: float | None = None
    minimum: int | None = None
    under_minimum: bool = False


@dataclass(frozen=True)
class Waiting:
    """Why a queued or delayed task has not started (every count is of queued tasks of its pool).

    - `higher_classes_ahead`: tasks of higher priority classes, which all go first.
    - `deadline_ahead`: tasks of its own class with a deadline that go before it (all of them for a task without
      a deadline; those with an earlier deadline for one with a deadline); `deadline_ahead_exact` False means
      "at least".
    - `queue_ahead`: tasks ahead of it in its own queue (its tenant's, in a fair pool; its class's otherwise), of
      `queue_length`; None while it is delayed; `queue_ahead_exact` False means "at least".
    - `nodes`: its tenant's path from the top, `tenant_share` the product of their shares: the fraction of the
      class's fair dispatches its queue gets now.
    - `delayed_for`: seconds before it may be dispatched at all (`retry`: that is a retry back-off).
    - `estimate`: seconds from now until it starts, from `dispatch_rate` (the pool's, per second), the rate at
      which work that goes before it keeps arriving (`arrival_rate_ahead`) and its share; None when it cannot
      be told, and `estimate_note` says why (or what the figure assumes).
    - `scope`: for a caller pinned to a tenant, that tenant: every count covers only its subtree's tasks, the
      rates are not told (None), `tenant_share` is None, and `estimate` is rounded up to a coarse step.
    - `at_max_in_flight`: the pool runs as many tasks as its `max_in_flight` allows.
    """

    fair: bool
    higher_classes_ahead: int
    deadline_ahead: int
    deadline_ahead_exact: bool
    queue_ahead: int | None
    queue_ahead_exact: bool
    queue_length: int
    nodes: tuple[NodeState, ...]
    tenant_share: float | None
    paused: bool
    workers: int
    ready_workers: int
    running: int
    max_in_flight: int | None
    delayed_for: float | None
    retry: bool
    dispatch_rate: float | None
    estimate: float | None
    estimate_note: str
    arrival_rate_ahead: float | None = None
    scope: str | None = None
    at_max_in_flight: bool = False
    higher_classes_ahead_exact: bool = True
    share_unit: str = "dispatches"


@dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one task, as `status()` returns it. Times are Unix seconds; `cost` is what the task was
    submitted with (None when it was given none, and counts 1)."""

    id: str
    pool: str
    tenant: str | None
    priority: str
    state: str
    attempts: int
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    deadline: float | None = None
    error: str | None = None
    cost: float | None = None
    """The cost the task was submitted with (None: it counts 1)."""


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt (dispatch) of a task ended, as far as the book knows.

    `ended` is `succeeded` or `failed` (the last attempt, by its outcome), `retried` (the handler raised and
    the task was queued again), `worker_lost` (its worker was lost, or the broker stopped, while it ran),
    `running` (the attempt under way), or `unknown` (not kept: a record keeps the ends of its last
    KEPT_ATTEMPT_ENDS attempts that did not end it, and data files written before records kept them have
    none). `at` is when it ended (Unix seconds), `error` what the
    handler raised (`"Type: message"`), when known.
    """

    attempt: int
    ended: str
    at: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Explanation:
    """Why a task is where it is (`cronoq.Explanation`): `cronoq explain`, `Scheduler.explain()` and
    `Client.explain()` return it.

    The task's fields as `TaskInfo` has them (times are Unix seconds; a test holds the two to the same names,
    types and defaults — they are written out here, not inherited, to keep the order in which they have always
    been given), `max_retries`, `not_before` (when a delayed task may run), `history` (how each attempt ended,
    first first), while it is queued or delayed, `waiting` (`Waiting`: what stands before it, and when it may
    start), its `cost`, and while it runs in a pool that shares by run time, what it is `charged` so far.
    docs/scheduling.md ("Why is my task waiting?") describes every field.
    """

    id: str
    pool: str
    tenant: str | None
    priority: str
    state: str
    attempts: int
    max_retries: int
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    deadline: float | None = None
    not_before: float | None = None
    error: str | None = None
    history: tuple[AttemptEnd, ...] = ()
    waiting: Waiting | None = None
    cost: float | None = None
    """The cost the task was submitted with (None: it counts 1)."""
    charged: float | None = None
    """While it runs in a pool that shares by run time: the seconds its tenant is charged for this run so far
    (its estimate, or more once it has run past it; the end corrects it to the run's time)."""


def seconds_from_now(value: Any, what: str, now: float) -> float | None:
    """A deadline or delay given as seconds, a timedelta or an aware datetime, as seconds from `now` (Unix time)."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(f"{what} must be an aware datetime (with a time zone), got naive {value.isoformat()}")
        return value.timestamp() - now
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{what} must be seconds (a number), a timedelta or an aware datetime, got {value!r}")
    return float(value)


def duration_text(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 2 h 07 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def clock_time(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


_ENDED = {"retried": "the handler raised; retried", "worker_lost": "its worker was lost (or the broker stopped)",
          "succeeded": "succeeded", "failed": "failed", "running": "running now",
          "unknown": f"not known (a task keeps how its last {KEPT_ATTEMPT_ENDS} ended attempts ended)"}


def _count(n: int, exact: bool, what: str) -> str:
    """"3 tasks", "1 task", "at least 1000 tasks"."""
    return f"{'' if exact else 'at least '}{n} {what}{'' if n == 1 and exact else 's'}"


_LAG_UNIT = {"dispatches": "", "cost": " cost", "seconds": " s"}


def explain_text(e: Any) -> str:
    """`cronoq explain`: a `cronoq.answers.Explanation` as text, the reasons a waiting task waits first."""
    tenant = e.tenant if e.tenant is not None else "(none)"
    lines = [f"task {e.id}: {e.state} — pool {e.pool}, tenant {tenant}, class {e.priority}"]
    cost, charged = getattr(e, "cost", None), getattr(e, "charged", None)  # an older broker does not say
    if cost is not None or charged is not None:
        parts = ([] if cost is None else [f"cost {cost:g}"]) + \
            ([] if charged is None else [f"charged {charged:.1f} s of worker time so far"])
        lines.append(", ".join(parts))
    w = e.waiting
    if w is not None:
        lines.append("why it has not started:")
        lines += [f"  - {reason}" for reason in _waiting_reasons(e, w)]
        if w.nodes:
            lines.append("its tenant's place in the fair share of its class, from the top:")
            parent = f"pool {e.pool}"
            width = max(len(n.name or "(none)") + (7 if n.own_tasks else 0) for n in w.nodes)
            for node in w.nodes:
                name = (node.name or "(none)") + (" (own)" if node.own_tasks else "")
                share = f"{node.share:.0%} of {parent}" if node.backlogged else "nothing queued"
                if node.hidden:  # pinned: it competes with tenants the caller may not see
                    text = f"  {name:<{width}}  weight {node.weight:g}, share not shown"
                else:
                    unit = _LAG_UNIT.get(getattr(w, "share_unit", "dispatches"), "")
                    text = f"  {name:<{width}}  weight {node.weight:g}, share {share}, lag {node.lag:+.1f}{unit}"
                if node.ceiling is not None:
                    c = node.ceiling
                    text += f", ceiling {c.limit}: {c.running} running"
                    if c.capped:
                        text += f", capped for {c.capped_for:.1f} s" if c.capped_for is not None else ", capped"
                if getattr(node, "rate", None) is not None:
                    text += f", rate {node.rate:g}/s"
                    if node.rate_limited_for is not None:
                        text += f", rate-limited: next start in {node.rate_limited_for:.1f} s"
                if getattr(node, "minimum", None) is not None:
                    text += f", minimum {node.minimum}"
                    if node.under_minimum:
                        text += ", under its minimum: goes first"
                lines.append(text)
                parent = node.name or "(none)"
            if w.tenant_share is not None:
                lines.append(f"  its queue gets {w.tenant_share:.0%} of the class's fair dispatches now")
        note = w.estimate_note
        if w.estimate is not None:
            coarse = w.scope is not None  # rounded up: "within", not "in about"
            estimate = f"within about {w.estimate:g} s" if coarse else f"in about {w.estimate:.1f} s"
        elif note.startswith("cannot tell: "):
            estimate, note = "cannot tell", note[len("cannot tell: "):]
        else:
            estimate = "unknown"
        lines.append(f"expected to start: {estimate} ({note})")
    if e.attempts:
        retries = f" (max_retries {e.max_retries})" if e.max_retries else ""
        lines.append(f"attempts: {e.attempts}{retries}")
        for end in e.history:
            when = f" at {clock_time(end.at)}" if end.at is not None else ""
            error = f": {end.error}" if end.error else ""
            lines.append(f"  {end.attempt}: {_ENDED.get(end.ended, end.ended)}{when}{error}")
    elif w is None:
        lines.append(f"never dispatched{': ' + e.error if e.error else ''}")
    return "\n".join(lines)


def _waiting_reasons(e: Any, w: Any) -> list[str]:
    """What holds a waiting task back, the pool-wide reasons first."""
    reasons = []
    if w.paused:
        reasons.append(f"pool {e.pool} is paused (`cronoq resume {e.pool}` dispatches it again)")
    if not w.workers:
        reasons.append(f"no worker serves pool {e.pool}")
    elif not w.ready_workers:
        reasons.append(f"every worker serving pool {e.pool} is busy ({w.workers} connected)")
    scope = w.scope
    if scope is not None:
        if w.at_max_in_flight:
            reasons.append(f"pool {e.pool} is at max_in_flight ({w.max_in_flight} running, {w.running} of them "
                           f"{scope}'s)")
    elif w.max_in_flight is not None and w.running >= w.max_in_flight:
        reasons.append(f"pool {e.pool} is at max_in_flight ({w.running} of {w.max_in_flight} running)")
    if w.delayed_for is not None:
        why = "retry back-off" if w.retry else "delay"
        reasons.append(f"its {why} has {w.delayed_for:.1f} s to go")
    for node in w.nodes:
        if node.ceiling is not None and node.ceiling.capped:
            reasons.append(f"{node.name or '(none)'} is at its ceiling ({node.ceiling.running} of "
                           f"{node.ceiling.limit} running)")
        if getattr(node, "rate_limited_for", None) is not None:
            reasons.append(f"{node.name or '(none)'} is rate-limited ({node.rate:g}/s): next start in "
                           f"{node.rate_limited_for:.1f} s")
    if scope is not None:
        reasons.append(f"other tenants' tasks are not shown to a token pinned to {scope}; the counts below are "
                       f"{scope}'s, the estimate counts everything")
    if w.higher_classes_ahead:
        exact = w.higher_classes_ahead_exact
        one = w.higher_classes_ahead == 1 and exact
        reasons.append(f"{_count(w.higher_classes_ahead, exact, 'queued task')} of higher classes "
                       f"{'goes' if one else 'go'} first")
    if w.deadline_ahead:
        what = "deadline task" if e.deadline is None else "task with an earlier deadline"
        one = w.deadline_ahead == 1 and w.deadline_ahead_exact
        reasons.append(f"{_count(w.deadline_ahead, w.deadline_ahead_exact, what)} of its class "
                       f"{'goes' if one else 'go'} first")
    if w.queue_ahead:
        whose = f"tenant {e.tenant}'s" if w.fair and e.tenant is not None else "its"
        reasons.append(f"{_count(w.queue_ahead, w.queue_ahead_exact, 'task')} ahead of it in {whose} queue "
                       f"(of {w.queue_length})")
    if not reasons:
        reasons.append("nothing: it should start at the next dispatch")
    return reasons
