"""The shared scheduling vectors (docs/scheduling-vectors/): scenarios as data, with the decisions expected.

A vector lists pools and steps (submit, dispatch, expire, finish, requeue, cancel, workers coming and going,
pause, resume) with the time of each, and what the core must answer: which worker gets which task, in order,
which tasks expire, which leases are still current. Both cores replay them: the Python `cronoq.core`
(tests/core/test_scheduling_vectors.py) and the Rust crate's embedded scheduler (rust/tests/scheduling_vectors.rs),
and must agree on every decision. docs/scheduling-vectors/README.md describes the format.

Expectations are recorded by running `cronoq.core.SchedulerCore` while the scenario is written (the hand-written
cases below also state their point with plain asserts, so a recording can not quietly change what they show).
`python -m tests.core.scheduling_vectors` (re)writes the hand-written cases. New random scenarios come from the
Hypothesis strategy `scenarios()`: run

    CRONOQ_EMIT_SCHEDULING_VECTORS=docs/scheduling-vectors python -m pytest -q tests/core/test_scheduling_vectors.py -k emit

and each scenario Hypothesis draws is written there as `hypothesis-<digest>.json`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

from cronoq.core import PRIORITIES, PoolSettings, SchedulerCore, Task

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "scheduling-vectors"

Pools = list[dict[str, Any]]


def settings_of(pools: Pools) -> list[PoolSettings]:
    return [
        PoolSettings(p["name"], p.get("tenant_weights", {}), p.get("fair_share", False), p.get("max_in_flight"),
                     tenant_limits=p.get("tenant_limits", {}), share_by=p.get("share_by", "dispatches"),
                     tenant_rates=p.get("tenant_rates", {}), tenant_minimums=p.get("tenant_minimums", {}),
                     default_weight=p.get("default_weight"), default_tenant_limit=p.get("default_tenant_limit"))
        for p in pools
    ]


def _given(step: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """`step` with the optional fields that were given (left out when None, so older vectors read the same)."""
    step.update({k: v for k, v in fields.items() if v is not None})
    return step


class Recorder:
    """Runs a scenario on the Python core, writing down each step and what the core answered."""

    def __init__(self, about: str, pools: Pools, needs: tuple[str, ...] = ()) -> None:
        self.about = about
        self.pools = pools
        self.needs = needs  # features beyond flat tenants, e.g. "tenant_trees" (README: who replays what)
        self.core = SchedulerCore(settings_of(pools))
        self.steps: list[dict[str, Any]] = []
        self.now = 0.0

    def at(self, now: float) -> "Recorder":
        self.now = float(now)
        return self

    def add_worker(self, worker: str, pools: list[str], slots: int) -> None:
        self.core.add_worker(worker, pools, slots)
        self.steps.append({"op": "add_worker", "worker": worker, "pools": pools, "slots": slots})

    def grant(self, worker: str, slots: int = 1) -> None:
        self.core.grant(worker, slots)
        self.steps.append({"op": "grant", "worker": worker, "slots": slots})

    def remove_worker(self, worker: str) -> list[str]:
        back = [t.id for t in self.core.remove_worker(worker, self.now)]
        self.steps.append({"op": "remove_worker", "now": self.now, "worker": worker, "expect": back})
        return back

    def submit(self, id: str, pool: str, tenant: str | None = None, priority: str = "normal",
               deadline: float | None = None, not_before: float | None = None, cost: float | None = None) -> None:
        task = Task(id, pool, tenant=tenant, priority=PRIORITIES.index(priority),
                    deadline=None if deadline is None else float(deadline),
                    not_before=None if not_before is None else float(not_before),
                    cost=None if cost is None else float(cost))
        self.core.submit(task, self.now)
        self.steps.append(_given({"op": "submit", "now": self.now, "id": id, "pool": pool, "tenant": tenant,
                                  "priority": priority, "deadline": task.deadline, "not_before": task.not_before},
                                 cost=task.cost))

    def dispatch(self, limit: int | None = None) -> list[list[str]]:
        got = [[str(w), t.id] for w, t in self.core.dispatch(self.now, limit)]
        self.steps.append({"op": "dispatch", "now": self.now, "limit": limit, "expect": got})
        return got

    def expire(self) -> list[str]:
        got = sorted(t.id for t in self.core.expire(self.now))
        self.steps.append({"op": "expire", "now": self.now, "expect": got})
        return got

    def tick(self) -> list[list[str]]:
        """What a shell does whenever something changed: expire, then dispatch, with the same `now`."""
        self.expire()
        return self.dispatch()

    def finish(self, id: str, worker: str, attempt: int = 1, ran_for: float | None = None) -> bool:
        ran_for = None if ran_for is None else float(ran_for)
        done = self.core.finish(id, self.now, worker_id=worker, attempt=attempt, state="succeeded",
                                ran_for=ran_for) is not None
        self.steps.append(_given({"op": "finish", "now": self.now, "id": id, "worker": worker, "attempt": attempt},
                                 ran_for=ran_for, expect=done))
        return done

    def requeue(self, id: str, worker: str, attempt: int = 1, not_before: float | None = None,
                ran_for: float | None = None) -> bool:
        ran_for = None if ran_for is None else float(ran_for)
        back = self.core.requeue(id, self.now, worker_id=worker, attempt=attempt,
                                 not_before=None if not_before is None else float(not_before),
                                 ran_for=ran_for) is not None
        self.steps.append(_given({"op": "requeue", "now": self.now, "id": id, "worker": worker, "attempt": attempt,
                                  "not_before": None if not_before is None else float(not_before)},
                                 ran_for=ran_for, expect=back))
        return back

    def configure(self, pools: Pools) -> None:
        """A reload: these pools' settings from now on (their `now` stamps what the change caps or re-times)."""
        self.core.configure(settings_of(pools), self.now)
        self.steps.append({"op": "configure", "now": self.now, "pools": pools})

    def charged_for(self, id: str) -> float | None:
        charged = self.core.charged_for(id)
        self.steps.append({"op": "charged_for", "id": id, "expect": charged})
        return charged

    def cancel(self, id: str) -> bool:
        done = self.core.cancel(id, self.now) is not None
        self.steps.append({"op": "cancel", "now": self.now, "id": id, "expect": done})
        return done

    def pause(self, pool: str) -> None:
        self.core.pause(pool)
        self.steps.append({"op": "pause", "pool": pool})

    def resume(self, pool: str) -> None:
        self.core.resume(pool)
        self.steps.append({"op": "resume", "pool": pool})

    def next_wakeup(self) -> float | None:
        wake = self.core.next_wakeup()
        self.steps.append({"op": "next_wakeup", "expect": wake})
        return wake

    def vector(self) -> dict[str, Any]:
        needs = {"needs": list(self.needs)} if self.needs else {}
        return {"about": self.about, **needs, "pools": self.pools, "steps": self.steps}


def render(vector: dict[str, Any]) -> str:
    """A vector as its file holds it: one step per line, so a diff shows which decision changed."""
    needs = {"needs": vector["needs"]} if vector.get("needs") else {}
    head = json.dumps({"about": vector["about"], **needs, "pools": vector["pools"]}, indent=2)[:-2]
    steps = ",\n".join("    " + json.dumps(step) for step in vector["steps"])
    return f'{head},\n  "steps": [\n{steps}\n  ]\n}}\n'


# ----------------------------------------------------------------------------- replay


def replay(vector: dict[str, Any]) -> list[str]:
    """Run a vector on a fresh Python core; the steps whose answer differs from the expected one."""
    core = SchedulerCore(settings_of(vector["pools"]))
    wrong: list[str] = []
    for n, step in enumerate(vector["steps"]):
        op, now = step["op"], step.get("now", 0.0)
        got: Any = None
        if op == "add_worker":
            core.add_worker(step["worker"], step["pools"], step["slots"])
        elif op == "grant":
            core.grant(step["worker"], step["slots"])
        elif op == "remove_worker":
            got = [t.id for t in core.remove_worker(step["worker"], now)]
        elif op == "submit":
            core.submit(Task(step["id"], step["pool"], tenant=step["tenant"],
                             priority=PRIORITIES.index(step["priority"]), deadline=step["deadline"],
                             not_before=step["not_before"], cost=step.get("cost")), now)
        elif op == "dispatch":
            got = [[str(w), t.id] for w, t in core.dispatch(now, step["limit"])]
        elif op == "expire":
            got = sorted(t.id for t in core.expire(now))
        elif op == "finish":
            got = core.finish(step["id"], now, worker_id=step["worker"], attempt=step["attempt"],
                              state="succeeded", ran_for=step.get("ran_for")) is not None
        elif op == "requeue":
            got = core.requeue(step["id"], now, worker_id=step["worker"], attempt=step["attempt"],
                               not_before=step["not_before"], ran_for=step.get("ran_for")) is not None
        elif op == "configure":
            core.configure(settings_of(step["pools"]), now)
        elif op == "charged_for":
            got = core.charged_for(step["id"])
        elif op == "cancel":
            got = core.cancel(step["id"], now) is not None
        elif op == "pause":
            core.pause(step["pool"])
        elif op == "resume":
            core.resume(step["pool"])
        elif op == "next_wakeup":
            got = core.next_wakeup()
        else:
            wrong.append(f"step {n}: unknown op {op!r}")
            continue
        if "expect" in step and got != step["expect"]:
            wrong.append(f"step {n} ({op}): got {got!r}, expected {step['expect']!r}")
    return wrong


# ----------------------------------------------------------------------------- hand-written cases

CASES: dict[str, Callable[[], Recorder]] = {}


def case(fn: Callable[[], Recorder]) -> Callable[[], Recorder]:
    CASES[fn.__name__.replace("_", "-")] = fn
    return fn


def letters(dispatched: list[list[str]]) -> str:
    return "".join(task[0] for _, task in dispatched)


@case
def weights_three_to_one() -> Recorder:
    r = Recorder("Weights 3:1, both backlogged: acme gets three dispatches for each of globex's, though globex "
                 "queued first; ties between tags go to the earlier arrival.",
                 [{"name": "llm", "tenant_weights": {"acme": 3, "globex": 1}}])
    for n in range(4):
        r.submit(f"g{n}", "llm", "globex")
    for n in range(12):
        r.submit(f"a{n}", "llm", "acme")
    r.add_worker("w", ["llm"], 16)
    assert letters(r.dispatch()) == "gaaagaaagaaagaaa"
    return r


@case
def one_slot_three_to_one() -> Recorder:
    r = Recorder("The 3:1 order with one slot, a dispatch per finished task, as a real worker sees it.",
                 [{"name": "llm", "tenant_weights": {"acme": 3, "globex": 1}}])
    r.add_worker("w", ["llm"], 1)
    for n in range(6):
        r.submit(f"a{n}", "llm", "acme")
        r.submit(f"g{n}", "llm", "globex")
    order = ""
    for step in range(12):
        r.at(step)
        (worker, task), = r.dispatch()
        order += task[0]
        r.finish(task, worker)
        r.grant(worker)
    assert order == "agaagaaagggg", order  # acme runs out after six
    return r


@case
def no_banked_credit() -> Recorder:
    r = Recorder("A tenant that had nothing queued banks no credit: returning, it starts at the current "
                 "virtual time, not behind the others.",
                 [{"name": "p", "fair_share": True}])
    r.add_worker("w", ["p"], 1)
    for n in range(6):
        r.submit(f"a{n}", "p", "a")
    for step in range(4):
        r.at(step)
        (worker, task), = r.dispatch()
        r.finish(task, worker)
        r.grant(worker)
    for n in range(4):
        r.submit(f"b{n}", "p", "b")
    got = ""
    for step in range(4, 8):
        r.at(step)
        (worker, task), = r.dispatch()
        got += task[0]
        r.finish(task, worker)
        r.grant(worker)
    assert got == "baba", got
    return r


@case
def priority_classes_are_strict() -> Recorder:
    r = Recorder("Every ready critical task goes before any high, then normal, then low, whatever the tenant, "
                 "weight or deadline.",
                 [{"name": "p", "tenant_weights": {"big": 100}}])
    r.submit("low", "p", "big", "low")
    r.submit("normal", "p", "big", "normal", deadline=5)
    r.submit("high", "p", None, "high")
    r.submit("critical", "p", "small", "critical")
    r.submit("high-2", "p", "big", "high", deadline=50)
    r.add_worker("w", ["p"], 10)
    assert [t for _, t in r.dispatch()] == ["critical", "high-2", "high", "normal", "low"]
    return r


@case
def deadlines_before_fair_share() -> Recorder:
    r = Recorder("Inside a class, tasks with a deadline go first, earliest deadline first (ties by arrival), "
                 "and change no start tag.",
                 [{"name": "p", "tenant_weights": {"a": 1, "b": 1}}])
    r.submit("a0", "p", "a")
    r.submit("b0", "p", "b")
    r.submit("late", "p", "a", deadline=30)
    r.submit("soon", "p", "b", deadline=10)
    r.submit("soon-too", "p", "a", deadline=10)
    r.add_worker("w", ["p"], 5)
    assert [t for _, t in r.dispatch()] == ["soon", "soon-too", "late", "a0", "b0"]
    return r


@case
def deadlines_expire() -> Recorder:
    r = Recorder("A task not dispatched by its deadline expires and is never dispatched; a delayed task whose "
                 "deadline comes first expires without ever queueing.",
                 [{"name": "p"}])
    r.submit("on-time", "p", deadline=10)
    r.submit("too-late", "p", deadline=2)
    r.submit("delayed-past-deadline", "p", deadline=3, not_before=6)
    r.submit("delayed", "p", not_before=4)
    assert r.next_wakeup() == 2.0
    r.at(2)
    assert r.expire() == ["too-late"]
    r.at(3)
    assert r.expire() == ["delayed-past-deadline"]
    r.add_worker("w", ["p"], 5)
    assert [t for _, t in r.dispatch()] == ["on-time"]
    r.at(4)
    r.expire()
    assert [t for _, t in r.dispatch()] == ["delayed"]
    return r


@case
def overdue_is_skipped_until_expired() -> Recorder:
    r = Recorder("dispatch(now) never hands out a task whose deadline is <= now, even before expire(now) "
                 "reports it.",
                 [{"name": "p"}])
    r.submit("due", "p", deadline=1)
    r.submit("plain", "p")
    r.at(1)
    r.add_worker("w", ["p"], 2)
    assert [t for _, t in r.dispatch()] == ["plain"]
    assert r.expire() == ["due"]
    return r


@case
def max_in_flight() -> Recorder:
    r = Recorder("A pool never runs more than max_in_flight tasks at once over all workers.",
                 [{"name": "p", "max_in_flight": 2}, {"name": "q"}])
    for n in range(4):
        r.submit(f"p{n}", "p")
    r.submit("q0", "q")
    r.add_worker("w1", ["p", "q"], 2)
    r.add_worker("w2", ["p"], 2)
    got = r.dispatch()
    assert sorted(t for _, t in got) == ["p0", "p1", "q0"]
    r.at(1)
    r.finish("p0", next(w for w, t in got if t == "p0"))  # the pool drops under its cap: p2 may go
    assert [t for _, t in r.dispatch()] == ["p2"]
    return r


@case
def workers_least_recently_ready() -> Recorder:
    r = Recorder("Workers are served least recently ready first, so idle workers take turns.",
                 [{"name": "p"}])
    r.add_worker("w1", ["p"], 2)
    r.add_worker("w2", ["p"], 2)
    r.add_worker("w3", ["p"], 1)
    for n in range(6):
        r.submit(f"t{n}", "p")
    assert [w for w, _ in r.dispatch()] == ["w1", "w2", "w3", "w1", "w2"]
    r.at(1)
    r.finish("t2", "w3")
    r.grant("w3")
    r.finish("t0", "w1")
    r.grant("w1")
    assert r.dispatch() == [["w3", "t5"]]
    return r


@case
def pools_take_turns() -> Recorder:
    r = Recorder("A worker serving several pools takes the best class, then the earliest deadline, then the "
                 "pools take turns.",
                 [{"name": "a"}, {"name": "b"}, {"name": "c", "fair_share": True}])
    for n in range(3):
        r.submit(f"a{n}", "a")
        r.submit(f"b{n}", "b")
        r.submit(f"c{n}", "c", "t")
    r.submit("b-high", "b", priority="high")
    r.submit("c-deadline", "c", "t", deadline=9)
    r.submit("a-deadline", "a", deadline=7)
    r.add_worker("w", ["a", "b", "c"], 20)
    got = [t for _, t in r.dispatch(limit=5)]
    assert got[:3] == ["b-high", "a-deadline", "c-deadline"], got
    r.dispatch()
    return r


@case
def cancelled_head_is_not_charged() -> Recorder:
    r = Recorder("Cancelling a tenant's head task hands its start tag to the next one: a cancelled task is "
                 "never charged.",
                 [{"name": "p", "tenant_weights": {"a": 1, "b": 1}}])
    r.submit("a0", "p", "a")
    r.submit("a1", "p", "a")
    r.submit("b0", "p", "b")
    r.submit("b1", "p", "b")
    r.cancel("a0")
    r.cancel("b1")
    r.submit("b2", "p", "b")
    r.add_worker("w", ["p"], 4)
    assert [t for _, t in r.dispatch()] == ["a1", "b0", "b2"]
    return r


@case
def retries_get_a_new_arrival() -> Recorder:
    r = Recorder("A task sent back (retry, lost worker) queues behind the tasks that arrived meanwhile, with a "
                 "new start tag, and keeps its deadline and attempts.",
                 [{"name": "p", "fair_share": True}])
    r.add_worker("w", ["p"], 1)
    r.submit("x", "p", "a")
    (worker, task), = r.dispatch()
    r.submit("y", "p", "a")
    r.submit("z", "p", "b")
    r.at(1)
    r.requeue("x", worker, 1, not_before=2)
    assert not r.finish("x", worker, 1)
    r.grant(worker)
    assert r.dispatch() == [["w", "z"]]
    r.at(2)
    r.finish("z", "w")
    r.grant("w")
    r.expire()
    r.dispatch()
    r.at(3)
    r.remove_worker("w")
    r.add_worker("w2", ["p"], 3)
    r.tick()
    return r


@case
def untenanted_and_unlisted_weigh_one() -> Recorder:
    r = Recorder("Tasks without a tenant are one more tenant of weight 1; unlisted tenants weigh 1; weights "
                 "are read as the decimals they are written as (0.5 is 1/2, 2.5 is 5/2).",
                 [{"name": "p", "tenant_weights": {"half": 0.5, "more": 2.5}}])
    for n in range(6):
        r.submit(f"h{n}", "p", "half")
        r.submit(f"m{n}", "p", "more")
        r.submit(f"u{n}", "p", "other")
        r.submit(f"n{n}", "p", None)
    r.add_worker("w", ["p"], 24)
    r.dispatch()
    return r


@case
def paused_pool() -> Recorder:
    r = Recorder("A paused pool takes tasks but dispatches none; its deadlines still pass.",
                 [{"name": "p"}])
    r.add_worker("w", ["p"], 2)
    r.pause("p")
    r.submit("t0", "p")
    r.submit("t1", "p", deadline=1)
    assert r.dispatch() == []
    r.at(1)
    assert r.expire() == ["t1"]
    r.resume("p")
    assert r.dispatch() == [["w", "t0"]]
    return r


@case
def cost_four_to_one() -> Recorder:
    r = Recorder("share_by = cost: a dispatch charges the task's cost, so with equal weights a tenant whose tasks cost "
                 "4 gets one dispatch for each four of a tenant whose tasks cost 1 (equal summed cost); deadline "
                 "tasks are not charged.",
                 [{"name": "p", "share_by": "cost", "fair_share": True}])
    for n in range(3):
        r.submit(f"h{n}", "p", "heavy", cost=4)
    for n in range(9):
        r.submit(f"l{n}", "p", "light", cost=1)
    r.submit("d0", "p", "heavy", deadline=10, cost=100)
    r.add_worker("w", ["p"], 12)
    assert letters(r.dispatch()) == "dhllllhllllh", letters(r.dispatch())
    return r


@case
def cost_ties_are_exact() -> Recorder:
    r = Recorder("Costs are exact to a thousandth: three tasks of 0.1 charge exactly what one of 0.3 does (in floats "
                 "they would charge 0.30000000000000004), so the tie that follows is a true tie, broken by arrival.",
                 [{"name": "p", "share_by": "cost", "tenant_weights": {"x": 1, "y": 1}}])
    for n in range(4):
        r.submit(f"x{n}", "p", "x", cost=0.1)
    for n in range(2):
        r.submit(f"y{n}", "p", "y", cost=0.3)
    r.add_worker("w", ["p"], 6)
    assert [t for _, t in r.dispatch()] == ["x0", "y0", "x1", "x2", "x3", "y1"]
    return r


@case
def rate_burst_and_wakeup() -> Recorder:
    r = Recorder("tenant_rates: a rate of 3 a second is a bucket of 3 tokens: three start at once, then the tenant is "
                 "held back (blocking nobody) until its next token, whose time next_wakeup() gives; it rejoins the fair "
                 "order there, banking nothing for the wait.",
                 [{"name": "p", "fair_share": True, "tenant_rates": {"a": 3}}])
    for n in range(6):
        r.submit(f"a{n}", "p", "a")
        r.submit(f"b{n}", "p", "b")
    r.add_worker("w", ["p"], 20)
    assert letters(r.dispatch()) == "ababab" + "bbb"
    wake = r.next_wakeup()
    assert wake is not None and abs(wake - 1 / 3) < 1e-9, wake
    r.at(0.3)
    assert r.tick() == []
    r.at(wake)
    assert [t for _, t in r.tick()] == ["a3"]
    r.next_wakeup()
    r.at(2.0)
    assert [t for _, t in r.tick()] == ["a4", "a5"]
    assert r.next_wakeup() is None  # nothing queued: a bucket still refilling wakes nobody
    return r


@case
def rate_below_one() -> Recorder:
    r = Recorder("A rate below 1 a second is a bucket of one token: one start, then one every 1/rate seconds; deadline "
                 "tasks take tokens too and wait for them.",
                 [{"name": "p", "fair_share": True, "tenant_rates": {"slow": 0.5}}])
    r.submit("s0", "p", "slow")
    r.submit("s1", "p", "slow", deadline=10)
    r.submit("s2", "p", "slow")
    r.submit("o0", "p", "other")
    r.add_worker("w", ["p"], 10)
    assert [t for _, t in r.dispatch()] == ["s1", "o0"]
    assert r.next_wakeup() == 2.0
    r.at(1.9)
    assert r.tick() == []
    r.at(2.0)
    assert [t for _, t in r.tick()] == ["s0"]
    assert r.next_wakeup() == 4.0
    r.at(4.0)
    assert [t for _, t in r.tick()] == ["s2"]
    return r


@case
def rate_reload() -> Recorder:
    r = Recorder("A reload keeps the tokens a bucket has spent and repays them at the new rate: raised from 1 to 10 a "
                 "second, a tenant that had just spent its one token may start more at once; lowered back to 1, one "
                 "that spent its tokens waits for them at the slow pace.",
                 [{"name": "p", "fair_share": True, "tenant_rates": {"a": 1}}])
    for n in range(12):
        r.submit(f"a{n}", "p", "a")
    r.add_worker("w", ["p"], 20)
    assert [t for _, t in r.dispatch()] == ["a0"]
    assert r.next_wakeup() == 1.0
    r.at(0.5)
    r.configure([{"name": "p", "fair_share": True, "tenant_rates": {"a": 10}}])
    fast = r.tick()
    assert len(fast) > 5, fast
    r.configure([{"name": "p", "fair_share": True, "tenant_rates": {"a": 1}}])
    r.next_wakeup()
    r.at(1.5)
    assert r.tick() == []
    r.at(20.0)
    r.tick()
    return r


@case
def rate_with_ceiling_and_minimum() -> Recorder:
    r = Recorder("A rate, a ceiling and a minimum on one tenant: a task starts only when the tenant has a token and is "
                 "under its ceiling; under its minimum it goes first, but only while it has a token; at its minimum "
                 "the fair order decides.",
                 [{"name": "p", "tenant_weights": {"a": 1, "b": 4}, "tenant_rates": {"a": 2},
                   "tenant_limits": {"a": 3}, "tenant_minimums": {"a": 2}}])
    for n in range(6):
        r.submit(f"a{n}", "p", "a")
    for n in range(10):
        r.submit(f"b{n}", "p", "b")
    r.add_worker("w", ["p"], 4)
    assert letters(r.dispatch()) == "aabb"
    r.at(0.25)
    r.finish("a0", "w")
    r.grant("w")
    assert letters(r.tick()) == "b"  # under its minimum, but out of tokens
    r.at(0.5)
    assert letters(r.tick()) == ""  # a's token came, but the slots are full
    r.finish("b0", "w")
    r.grant("w")
    assert letters(r.tick()) == "a"  # under its minimum again: first
    r.at(1.5)
    r.finish("b1", "w")
    r.finish("b2", "w")
    r.grant("w", 2)
    assert letters(r.tick()) == "bb"  # a has a token again, but also its minimum: the fair order (b weighs 4)
    r.at(2.0)
    r.finish("a1", "w")
    r.grant("w")
    assert letters(r.tick()) == "a"  # under its minimum, with a token: ahead of b again
    r.next_wakeup()
    return r


@case
def rate_on_parent_and_child() -> Recorder:
    r = Recorder("Rates on a node and on its child compose: a dispatch takes a token from every rated node on its path, "
                 "and starts only when each has one. acme may start 4 a second, acme/search 1 of those; globex, "
                 "unrated, is never held back by either.",
                 [{"name": "p", "fair_share": True, "tenant_rates": {"acme": 4, "acme/search": 1}}],
                 needs=("tenant_trees",))
    for n in range(4):
        r.submit(f"s{n}", "p", "acme/search")
        r.submit(f"a{n}", "p", "acme/ads")
        r.submit(f"g{n}", "p", "globex")
    r.add_worker("w", ["p"], 20)
    assert [t for _, t in r.dispatch()] == ["s0", "g0", "a0", "g1", "a1", "g2", "a2", "g3"]
    assert r.next_wakeup() == 0.25  # acme's next token; search waits for its own, at 1.0
    r.at(0.25)
    assert [t for _, t in r.tick()] == ["a3"]
    assert r.next_wakeup() == 0.5
    r.at(0.5)
    assert r.tick() == []  # acme has a token, but search (all that is left) has none
    assert r.next_wakeup() == 1.0
    r.at(1.0)
    assert [t for _, t in r.tick()] == ["s1"]
    assert r.next_wakeup() == 2.0
    return r


@case
def capped_leaf_rejoins_served() -> Recorder:
    r = Recorder("A capped tenant that rejoins having banked nothing forgets its lead, but not that its own tasks "
                 "were served: when it then gets its first sub-tenant, its own next task stands one step behind "
                 "the last, so the sub-tenant goes first inside it.",
                 [{"name": "p", "fair_share": True, "tenant_limits": {"a": 1}}], needs=("tenant_trees",))
    for n in range(3):
        r.submit(f"a{n}", "p", "a")
    for n in range(6):
        r.submit(f"b{n}", "p", "b")
    r.add_worker("w", ["p"], 2)
    assert letters(r.dispatch()) == "ab"  # a capped at once

    def done(id: str) -> None:
        r.finish(id, "w")
        r.grant("w")

    done("b0")
    assert letters(r.dispatch()) == "b"
    done("b1")
    assert letters(r.dispatch()) == "b"
    done("a0")  # a rejoins at V: its F was behind
    done("b2")
    r.submit("g0", "p", "a/g")
    r.submit("g1", "p", "a/g")
    order = ""
    for _ in range(7):
        (_, id), = r.dispatch(1)
        done(id)
        order += id[0]
    # a is back at V, one step ahead of b; inside a, its own tasks were served, so a/g goes first.
    assert order == "gabbgab", order
    return r


@case
def minimums_go_first_within_their_class() -> Recorder:
    r = Recorder("tenant_minimums: a tenant under its minimum goes ahead of the fair order of its class (weights 10:1 "
                 "would give it one slot in eleven), but priority classes and deadline tasks still go first; the "
                 "dispatches it takes are charged, so it pays them back in fair turns later.",
                 [{"name": "p", "tenant_weights": {"big": 10}, "tenant_minimums": {"small": 2}, "max_in_flight": 6}])
    for n in range(12):
        r.submit(f"b{n}", "p", "big")
    for n in range(4):
        r.submit(f"s{n}", "p", "small")
    r.submit("crit", "p", "big", priority="critical")
    r.submit("due", "p", "big", deadline=30)
    r.submit("high", "p", "small", priority="high")
    r.add_worker("w", ["p"], 6)
    assert [t for _, t in r.dispatch()] == ["crit", "high", "due", "s0", "b0", "b1"]
    r.at(1)
    r.finish("s0", "w")
    r.finish("high", "w")
    r.grant("w", 2)
    assert [t for _, t in r.tick()] == ["s1", "s2"]  # both of small's ended: under its minimum again
    r.at(2)
    for task in ("crit", "due", "b0", "b1"):
        r.finish(task, "w")
    r.grant("w", 4)
    r.tick()
    return r


@case
def ceilings_pass_over() -> Recorder:
    r = Recorder("tenant_limits: a tenant at its ceiling is passed over (its deadline tasks too) without losing its "
                 "place, and rejoins at max(V, F) when one of its tasks ends.",
                 [{"name": "p", "fair_share": True, "tenant_limits": {"a": 2}}])
    for n in range(5):
        r.submit(f"a{n}", "p", "a")
        r.submit(f"b{n}", "p", "b")
    r.submit("a-due", "p", "a", deadline=9)
    r.add_worker("w", ["p"], 6)
    assert [t for _, t in r.dispatch()] == ["a-due", "a0", "b0", "b1", "b2", "b3"]
    r.at(1)
    r.finish("a0", "w")
    r.grant("w")
    assert [t for _, t in r.tick()] == ["a1"]
    return r


@case
def defaults_for_unlisted_tenants() -> Recorder:
    r = Recorder("default_weight weighs every tenant not listed (the untenanted tasks still weigh 1; the default's "
                 "fraction counts into the exact scale, 2.5 being 5/2), and default_tenant_limit caps each tenant not "
                 "listed, the untenanted tasks as one more, a listed tenant_limit overriding it (deadline tasks "
                 "too); a reload changes both at once.",
                 [{"name": "w", "tenant_weights": {"one": 1}, "default_weight": 2.5},
                  {"name": "c", "fair_share": True, "tenant_limits": {"big": 3}, "default_tenant_limit": 2}])
    for n in range(4):
        r.submit(f"o{n}", "w", "one")
        r.submit(f"n{n}", "w", None)
    for n in range(10):
        r.submit(f"u{n}", "w", "unlisted")
    r.add_worker("ww", ["w"], 18)
    # 5/2 dispatches of an unlisted tenant for each of a weight-1 one's, ties to the earlier arrival.
    assert letters(r.dispatch()) == "onuuuonuuonuuuonuu"
    for n in range(4):
        r.submit(f"a{n}", "c", "a")
        r.submit(f"b{n}", "c", "big")
        r.submit(f"x{n}", "c", None)
    r.submit("a-due", "c", "a", deadline=9)
    r.add_worker("wc", ["c"], 12)
    assert sorted(t for _, t in r.dispatch()) == ["a-due", "a0", "b0", "b1", "b2", "x0", "x1"]
    r.submit("a-due2", "c", "a", deadline=9)  # a is at its ceiling: its deadline task waits too
    assert r.dispatch() == []
    r.at(1)
    r.finish("a-due", "wc")
    r.finish("x0", "wc")
    assert [t for _, t in r.tick()] == ["a-due2", "x2"]
    r.configure([{"name": "w", "tenant_weights": {"one": 1}, "default_weight": 0.5},
                 {"name": "c", "fair_share": True, "tenant_limits": {"big": 3}, "default_tenant_limit": 3}])
    assert sorted(t for _, t in r.tick()) == ["a1", "x3"]
    for n in range(4, 8):
        r.submit(f"o{n}", "w", "one")
        r.submit(f"u{n + 6}", "w", "unlisted")
    r.grant("ww", 8)
    r.tick()
    return r


@case
def runtime_correction() -> Recorder:
    r = Recorder("share_by = runtime: a dispatch is charged an estimate (the task's cost in seconds, else its tenant's "
                 "recent average run time, else the pool's, else 1 s) and corrected to the run's time when it ends "
                 "(measured from the dispatch's now, or ran_for); a run past its charge is re-charged at expire.",
                 [{"name": "p", "share_by": "runtime", "fair_share": True}])
    for n in range(6):
        r.submit(f"q{n}", "p", "quick")
        r.submit(f"s{n}", "p", "slow")
    r.add_worker("w", ["p"], 2)
    assert [t for _, t in r.dispatch()] == ["q0", "s0"]
    assert r.charged_for("q0") == 1.0  # nothing known yet: 1 s
    r.at(0.1)
    r.finish("q0", "w")  # ran 0.1 s: charged 0.1, not 1
    r.grant("w")
    assert [t for _, t in r.tick()] == ["q1"]
    assert r.charged_for("q1") == 0.1  # its tenant's average
    r.at(0.2)
    r.finish("q1", "w", ran_for=0.05)
    r.grant("w")
    assert [t for _, t in r.tick()] == ["q2"]
    r.at(3.5)  # s0 has run past its 1 s charge: re-charged at its time so far plus 1 s
    r.expire()
    assert r.charged_for("s0") == 4.5
    r.finish("q2", "w")
    r.grant("w")
    r.tick()
    r.submit("c0", "p", "slow", cost=0.01)  # a given cost is its estimate
    r.at(4.0)
    r.finish("s0", "w")
    r.grant("w")
    r.tick()
    r.at(4.5)
    r.requeue(r.core.worker_tasks("w")[0].id, "w", 1, ran_for=0.2)
    r.grant("w")
    r.tick()
    r.at(5.0)
    r.remove_worker("w")
    r.add_worker("w2", ["p"], 3)
    r.tick()
    for task in [t.id for t in r.core.worker_tasks("w2")]:
        r.charged_for(task)
    return r


@case
def shares_reload() -> Recorder:
    r = Recorder("A reload that changes share_by starts the pool's fair state afresh (tags in two units do not "
                 "compare): the backlog is kept in arrival order from V = 0.",
                 [{"name": "p", "fair_share": True}])
    for n in range(4):
        r.submit(f"a{n}", "p", "a", cost=3)
        r.submit(f"b{n}", "p", "b", cost=1)
    r.add_worker("w", ["p"], 2)
    assert letters(r.dispatch()) == "ab"
    r.at(1)
    r.configure([{"name": "p", "share_by": "cost", "fair_share": True}])
    r.finish("a0", "w")
    r.finish("b0", "w")
    r.grant("w", 2)
    r.tick()
    r.at(2)
    r.configure([{"name": "p", "share_by": "cost", "tenant_weights": {"a": 3}}])
    for task in [t.id for t in r.core.worker_tasks("w")]:
        r.finish(task, "w")
    r.grant("w", 2)
    r.tick()
    return r


def rendered() -> dict[str, str]:
    """The hand-written cases as their files hold them, by file name."""
    return {f"{name}.json": render(build().vector()) for name, build in CASES.items()}


# ----------------------------------------------------------------------------- random scenarios

POOLS: Pools = [
    {"name": "fair", "tenant_weights": {"a": 3, "b": 1, "c": 0.5}},
    {"name": "plain", "max_in_flight": 2},
    {"name": "share", "fair_share": True, "max_in_flight": 3},
    {"name": "cost", "share_by": "cost", "tenant_weights": {"a": 2, "c": 0.5}, "tenant_rates": {"b": 2},
     "tenant_minimums": {"c": 1}},
    {"name": "time", "share_by": "runtime", "fair_share": True, "tenant_limits": {"a": 2}, "tenant_rates": {"c": 0.5},
     "tenant_minimums": {"b": 1}, "max_in_flight": 4},
]
# What a reload may switch the pools to (and back): new weights, rates, minimums, ceilings and units, default
# weights and ceilings.
RELOADED: Pools = [
    {"name": "fair", "tenant_weights": {"a": 1, "b": 2.5}, "tenant_rates": {"a": 1.5}, "default_weight": 1.5},
    {"name": "plain", "max_in_flight": 2},
    {"name": "share", "fair_share": True, "max_in_flight": 3, "tenant_minimums": {"a": 1}, "default_tenant_limit": 1},
    {"name": "cost", "share_by": "cost", "tenant_weights": {"a": 2, "c": 0.5}, "tenant_rates": {"b": 0.5, "a": 4},
     "tenant_limits": {"c": 1}},
    {"name": "time", "share_by": "cost", "fair_share": True, "tenant_rates": {"c": 3}, "tenant_minimums": {"b": 2}},
]
COSTS = [0.001, 0.1, 0.3, 1, 2.5, 4]
TENANTS = [None, "a", "b", "c"]
OFFSETS = [-1.0, 0.0, 0.5, 1.0, 2.0, 5.0]

# The same pools over tenant trees: weights, ceilings, rates and minimums on inner nodes and leaves, a default
# ceiling on the top-level nodes, and tenants that are at once a leaf's parent and a tenant of their own ("a").
TREE_POOLS: Pools = [
    {"name": "fair", "tenant_weights": {"a": 3, "b": 1, "a/x": 2, "a/x/p": 0.5}, "tenant_limits": {"a/x": 2},
     "tenant_minimums": {"b/y": 1}},
    {"name": "plain", "max_in_flight": 2},
    {"name": "share", "fair_share": True, "max_in_flight": 3, "default_tenant_limit": 2, "tenant_limits": {"a/y": 1}},
    {"name": "cost", "share_by": "cost", "tenant_weights": {"a": 2, "a/y": 0.5}, "tenant_rates": {"a": 2, "a/x": 1},
     "tenant_minimums": {"c": 1}},
    {"name": "time", "share_by": "runtime", "tenant_weights": {"a/x": 3}, "tenant_limits": {"a": 2},
     "tenant_rates": {"b/y": 0.5}, "tenant_minimums": {"a/y": 1}, "max_in_flight": 4},
]
TREE_RELOADED: Pools = [
    {"name": "fair", "tenant_weights": {"a": 1, "a/x": 0.5, "a/y": 2.5, "b/y": 3}, "tenant_rates": {"a/x/p": 1.5},
     "default_weight": 1.5},
    {"name": "plain", "max_in_flight": 2},
    {"name": "share", "fair_share": True, "max_in_flight": 3, "tenant_minimums": {"a": 1, "a/x": 1},
     "default_tenant_limit": 1},
    {"name": "cost", "share_by": "cost", "tenant_weights": {"a/x": 2, "c": 0.5}, "tenant_rates": {"b": 0.5, "a/y": 4},
     "tenant_limits": {"a": 1, "b/y": 1}},
    {"name": "time", "share_by": "cost", "fair_share": True, "tenant_rates": {"a/x": 3},
     "tenant_minimums": {"b": 2, "b/y": 1}},
]
TREE_TENANTS = [None, "a", "a/x", "a/x/p", "a/y", "b", "b/y", "c"]


@st.composite
def tree_scenarios(draw: st.DrawFn, max_steps: int = 60) -> dict[str, Any]:
    """As `scenarios`, over tenant trees up to three levels deep (for cores that order tenant trees)."""
    return draw(scenarios(max_steps, configs=(TREE_POOLS, TREE_RELOADED), tenants=TREE_TENANTS))


@st.composite
def scenarios(draw: st.DrawFn, max_steps: int = 60, configs: tuple[Pools, Pools] = (POOLS, RELOADED),
              tenants: list[str | None] = TENANTS) -> dict[str, Any]:
    """A random interleaving of every operation the vectors know, recorded on the Python core as it is drawn:
    the pools start as `configs[0]` and a reload switches them to either config."""
    trees = any(tenant is not None and "/" in tenant for tenant in tenants)
    r = Recorder("A random interleaving drawn by Hypothesis (tests/core/scheduling_vectors.py, "
                 f"{'tree_scenarios' if trees else 'scenarios'}()).", configs[0],
                 needs=("tenant_trees",) if trees else ())
    r.add_worker("w0", ["fair", "plain", "share"], 3)
    r.add_worker("w1", ["fair"], 1)
    r.add_worker("w2", ["cost", "time"], 2)
    names = [p["name"] for p in configs[0]]
    count = 0
    for _ in range(draw(st.integers(5, max_steps))):
        op = draw(st.sampled_from(["submit"] * 6 + ["dispatch"] * 3 + ["advance"] * 3 + [
            "finish", "finish", "requeue", "cancel", "expire", "worker", "grant", "pause", "resume", "wakeup",
            "reload", "charged"]))
        running = [(t.id, t.worker, t.attempts) for t in r.core.tasks() if t.state == "running"]
        live = sorted(t.id for t in r.core.tasks())
        if op == "submit":
            count += 1
            deadline = draw(st.none() | st.sampled_from(OFFSETS[1:]))
            delay = draw(st.none() | st.sampled_from(OFFSETS))
            r.submit(f"t{count}", draw(st.sampled_from(names)), draw(st.sampled_from(tenants)),
                     draw(st.sampled_from(["critical", "high", "normal", "normal", "normal", "low"])),
                     None if deadline is None else r.now + deadline, None if delay is None else r.now + delay,
                     draw(st.none() | st.sampled_from(COSTS)))
        elif op == "dispatch":
            r.dispatch(draw(st.sampled_from([None, None, 1, 2])))
        elif op == "advance":
            r.at(r.now + draw(st.sampled_from([0.5, 1.0, 2.0])))
        elif op in ("finish", "requeue") and running:
            task_id, worker, attempt = draw(st.sampled_from(sorted(running)))
            if draw(st.integers(0, 5)) == 0:
                attempt -= 1  # a stale lease: refused
            ran_for = draw(st.none() | st.none() | st.sampled_from([0.0, 0.05, 0.5, 3.0]))
            if op == "finish":
                r.finish(task_id, worker, attempt, ran_for)
            else:
                delay = draw(st.none() | st.sampled_from(OFFSETS))
                r.requeue(task_id, worker, attempt, None if delay is None else r.now + delay, ran_for)
            if draw(st.booleans()):
                r.grant(worker)
        elif op == "cancel" and live:
            r.cancel(draw(st.sampled_from(live)))
        elif op == "expire":
            r.expire()
        elif op == "worker":
            worker = draw(st.sampled_from(["w0", "w1", "w2"]))
            if draw(st.booleans()):
                pools = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
                r.add_worker(worker, pools, draw(st.integers(0, 3)))
            else:
                r.remove_worker(worker)
        elif op == "grant":
            r.grant(draw(st.sampled_from(["w0", "w1", "w2"])), draw(st.integers(1, 2)))
        elif op == "pause":
            r.pause(draw(st.sampled_from(names)))
        elif op == "resume":
            r.resume(draw(st.sampled_from(names)))
        elif op == "wakeup":
            r.next_wakeup()
        elif op == "reload":
            r.configure(draw(st.sampled_from(list(configs))))
        elif op == "charged" and running:
            r.charged_for(draw(st.sampled_from(sorted(running)))[0])
    r.tick()
    return r.vector()


def emit(vector: dict[str, Any], directory: Path) -> Path:
    """Write a drawn scenario as `hypothesis-<digest>.json` (the same scenario always gets the same name)."""
    text = render(vector)
    path = directory / f"hypothesis-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: list[str]) -> int:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (VECTORS / name).write_text(text)
    print(f"wrote {len(CASES)} hand-written scheduling vectors to {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
