"""Tenants share no names: idempotency keys, submission ids and schedule ticks, in the book and across upgrades.

These drive a real TaskBook (with a real journal where recovery matters), the
broker's real CronRunner on a real data_dir, and the embedded Scheduler; the
attacks over the wire against a broker process are in
tests/integration/test_tenancy.py.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

import cronoq
from cronoq.book.submission import SubmitRequest
from cronoq.book.taskbook import BULK_TENANTS, TaskBook
from cronoq.broker.cron import STATE_FILE, CronRunner
from cronoq.broker.schedules import Schedule
from cronoq.core import PoolSettings, SchedulerCore
from tests.store.journal.test_journal import World

HOUR = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC, on the hour


def new_book() -> TaskBook:
    ids = iter(range(10**6))
    core = SchedulerCore([PoolSettings("a"), PoolSettings("b")])
    return TaskBook(core, new_id=lambda: f"t{next(ids)}", on_terminal=lambda record: None,
                    rng=random.Random(0), pacing_clock=time.perf_counter)


def test_the_same_key_in_two_tenants_is_two_tasks_and_a_duplicate_only_within_one():
    book = new_book()
    acme, dup = book.submit(SubmitRequest(b"1", pool="a", tenant="acme", key="invoice-7"), 0.0)
    globex, dup_globex = book.submit(SubmitRequest(b"2", pool="a", tenant="globex", key="invoice-7"), 0.0)
    untenanted, dup_none = book.submit(SubmitRequest(b"3", pool="a", key="invoice-7"), 0.0)
    assert not (dup or dup_globex or dup_none)
    assert len({acme.id, globex.id, untenanted.id}) == 3
    assert (globex.tenant, globex.payload) == ("globex", b"2")
    # Within a tenant (and within the no-tenant scope) the contract holds: the first task's handle.
    assert book.submit(SubmitRequest(b"x", pool="a", tenant="acme", key="invoice-7"), 1.0) == (acme, True)
    assert book.submit(SubmitRequest(b"x", pool="a", tenant="globex", key="invoice-7"), 1.0) == (globex, True)
    assert book.submit(SubmitRequest(b"x", pool="a", key="invoice-7"), 1.0) == (untenanted, True)
    # Keys stay per pool as well.
    other_pool, dup = book.submit(SubmitRequest(b"4", pool="b", tenant="acme", key="invoice-7"), 0.0)
    assert not dup and other_pool.id != acme.id


def test_submission_ids_are_scoped_by_tenant():
    book = new_book()
    acme, _ = book.submit(SubmitRequest(b"1", pool="a", tenant="acme", submission="abc-1"), 0.0)
    globex, dup = book.submit(SubmitRequest(b"2", pool="b", tenant="globex", submission="abc-1"), 0.0)
    assert not dup and globex.id != acme.id and globex.pool == "b"
    # A repeated submission id is the caller's own re-send: its first task, not reported as a duplicate.
    assert book.submit(SubmitRequest(b"1", pool="a", tenant="acme", submission="abc-1"), 0.0) == (acme, False)
    assert book.submit(SubmitRequest(b"2", pool="b", tenant="globex", submission="abc-1"), 0.0) == (globex, False)


def test_forgetting_a_record_frees_its_key_in_its_own_tenant_only():
    book = new_book()
    book.result_ttl = 10.0
    acme, _ = book.submit(SubmitRequest(b"1", pool="a", tenant="acme", key="k", submission="s"), 0.0)
    globex, _ = book.submit(SubmitRequest(b"2", pool="a", tenant="globex", key="k", submission="s"), 0.0)
    book.cancel(acme.id, 1.0)
    assert book.forget_expired_records(20.0) == 1
    again, dup = book.submit(SubmitRequest(b"3", pool="a", tenant="acme", key="k"), 21.0)
    assert not dup and again.id != acme.id
    assert book.submit(SubmitRequest(b"x", pool="a", tenant="globex", key="k"), 21.0) == (globex, True)
    assert book.submit(SubmitRequest(b"x", pool="a", tenant="globex", submission="s"), 21.0) == (globex, False)


def test_recovery_rebuilds_keys_and_submission_ids_per_tenant(tmp_path):
    world = World(tmp_path)
    acme, _ = world.book.submit(SubmitRequest(b"1", pool="a", tenant="acme", key="k", submission="s"), world.now)
    globex, _ = world.book.submit(SubmitRequest(b"2", pool="a", tenant="globex", key="k", submission="s"), world.now)
    world.journal.commit()
    world.crash()
    after = World(tmp_path, now=world.now + 1)
    book = after.book
    for tenant, first in (("acme", acme), ("globex", globex)):
        for dedup, duplicate in (({"key": "k"}, True), ({"submission": "s"}, False)):
            again, dup = book.submit(SubmitRequest(b"x", pool="a", tenant=tenant, **dedup), after.now)
            assert dup is duplicate and again.id == first.id
    fresh, dup = book.submit(SubmitRequest(b"3", pool="a", tenant="initech", key="k", submission="s"), after.now)
    assert not dup and fresh.id not in (acme.id, globex.id)


@pytest.mark.parametrize("tenants", [1, 3, BULK_TENANTS + 4])
def test_recovery_indexes_every_tenants_submission_ids_however_many_tenants(tmp_path, tenants):
    """Up to BULK_TENANTS tenants a restart indexes submission ids a tenant at a time, past it a task at a time:
    either way each id finds its own tenant's task, and only that tenant's."""
    world = World(tmp_path)
    names = [None] + [f"tenant-{n}" for n in range(tenants - 1)]
    first = {}
    for n in range(60):
        tenant = names[n % tenants]
        submission = None if n % 7 == 3 else f"s{n // tenants}"  # the same ids in every tenant; some none
        record, _ = world.book.submit(SubmitRequest(b"1", pool="a", tenant=tenant, submission=submission), world.now)
        if submission is not None:
            first[tenant, submission] = record.id
    world.journal.commit()
    world.crash()
    book = World(tmp_path, now=world.now + 1).book
    for (tenant, submission), task_id in first.items():
        again, dup = book.submit(SubmitRequest(b"x", pool="a", tenant=tenant, submission=submission), world.now)
        assert not dup and again.id == task_id  # the re-send finds its task; `duplicate` is for keys
    fresh, dup = book.submit(SubmitRequest(b"x", pool="a", tenant="initech", submission="s0"), world.now)
    assert not dup and fresh.id not in first.values()


def test_keys_in_the_reserved_namespace_are_refused_unless_the_broker_makes_them():
    book = new_book()
    with pytest.raises(cronoq.InvalidArgument, match="reserved for the broker's own tasks"):
        book.submit(SubmitRequest(b"x", pool="a", tenant="acme", key="cronoq:schedule:nightly:1"), 0.0)
    assert not book.records
    tick, dup = book.submit(SubmitRequest(b"x", pool="a", key="cronoq:schedule:nightly:1", internal=True), 0.0)
    assert not dup and tick.key == "cronoq:schedule:nightly:1"
    # A key that only contains the prefix further in is the client's own.
    assert not book.submit(SubmitRequest(b"x", pool="a", key="my-cronoq:job"), 0.0)[1]


# ----------------------------------------------------------------- schedule ticks across the upgrade

HOURLY = Schedule("hourly", "0 * * * *", pool="a", tenant="acme")
START = T0 + HOUR + 30  # the broker starts 30 s after the tick at T0 + 1 h: that tick is due at once


def runner(data_dir: Path, state: dict | None) -> CronRunner:
    if state is not None:
        (data_dir / STATE_FILE).write_text(json.dumps(state))
    return CronRunner((HOURLY,), data_dir, START)


def fire(book: TaskBook, cron: CronRunner, now: float) -> list[tuple[str, bool]]:
    """What the broker's loop does with due ticks: submit each; returns (task id, duplicate) per tick."""
    return [(record.id, dup) for record, dup in (book.submit(request, now) for request in cron.due(now))]


def test_a_tick_the_former_version_submitted_before_it_stopped_is_not_submitted_again(tmp_path):
    book = new_book()
    # The former version fired the tick at T0 + 1 h (key `schedule:...`) and stopped before it wrote
    # schedules.json, which still says T0 and has no format entry.
    theirs, _ = book.submit(SubmitRequest(b"p", pool="a", tenant="acme", key=f"schedule:hourly:{int(T0 + HOUR)}"),
                            T0 + HOUR + 0.2)
    cron = runner(tmp_path, {"hourly": T0})
    assert fire(book, cron, START) == [(theirs.id, True)]
    cron.save()
    # From then on the file says ticks are keyed in the reserved namespace; the next tick is a new task.
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state == {"hourly": T0 + HOUR, "cronoq:format": 2}
    [(next_id, dup)] = fire(book, cron, T0 + 2 * HOUR)
    assert not dup and book.get(next_id).key == f"cronoq:schedule:hourly:{int(T0 + 2 * HOUR)}"


def test_a_client_claim_of_a_former_tick_key_does_not_stop_the_tick(tmp_path):
    book = new_book()
    # acme's own client claimed the old-style name before the tick came (the former version's hole).
    claim, _ = book.submit(SubmitRequest(b"c", pool="a", tenant="acme", key=f"schedule:hourly:{int(T0 + HOUR)}"),
                           T0 + HOUR - 60)
    cron = runner(tmp_path, {"hourly": T0})
    [(tick_id, dup)] = fire(book, cron, START)
    assert not dup and tick_id != claim.id
    assert book.get(tick_id).key == f"cronoq:schedule:hourly:{int(T0 + HOUR)}"


def test_after_the_upgrade_old_style_keys_are_plain_client_keys(tmp_path):
    book = new_book()
    # A client key that looks like an old tick, submitted after the tick: with a state file written by this
    # version, it is nobody's tick.
    book.submit(SubmitRequest(b"c", pool="a", tenant="acme", key=f"schedule:hourly:{int(T0 + HOUR)}"), T0 + HOUR + 1)
    cron = runner(tmp_path, {"hourly": T0, "cronoq:format": 2})
    [(tick_id, dup)] = fire(book, cron, START)
    assert not dup
    # A crash after the tick was journaled but before the file was saved: the reserved key stops a double.
    assert fire(book, runner(tmp_path, {"hourly": T0, "cronoq:format": 2}), START) == [(tick_id, True)]
    assert fire(book, runner(tmp_path, {"hourly": T0}), START) == [(tick_id, True)]


def test_the_former_key_counts_only_in_the_schedules_own_tenant(tmp_path):
    book = new_book()
    book.submit(SubmitRequest(b"g", pool="a", tenant="globex", key=f"schedule:hourly:{int(T0 + HOUR)}"),
                T0 + HOUR + 0.2)
    [(tick_id, dup)] = fire(book, runner(tmp_path, {"hourly": T0}), START)
    assert not dup and book.get(tick_id).tenant == "acme"


# ----------------------------------------------------------------- the embedded Scheduler


async def test_the_embedded_scheduler_scopes_keys_by_tenant_and_reserves_the_namespace():
    pool = cronoq.Pool("default", lambda payload: payload)
    async with cronoq.Scheduler([pool]) as sched:
        await sched.pause("default")
        acme = await sched.submit("a", tenant="acme", key="k")
        globex = await sched.submit("g", tenant="globex", key="k")
        assert acme.id != globex.id
        assert (await sched.submit("again", tenant="acme", key="k")).id == acme.id
        with pytest.raises(cronoq.InvalidArgument, match="reserved for the broker's own tasks"):
            await sched.submit("x", key="cronoq:schedule:nightly:1")
        await sched.resume("default")
        assert await globex.result(timeout=10) == "g"
        assert await acme.result(timeout=10) == "a"
