"""Tenants share no names: idempotency keys and submission ids, in the book and after recovery.

These drive a real TaskBook (with a real journal where recovery matters) and
the embedded Scheduler; the attacks over the wire against a broker process
are in tests/integration/test_tenancy.py.
"""

from __future__ import annotations


import pytest

import cronoq
from cronoq.book import SubmitRequest, TaskBook
from cronoq.core import PoolSettings, SchedulerCore
from tests.test_store import World



def new_book() -> TaskBook:
    ids = iter(range(10**6))
    core = SchedulerCore([PoolSettings("a"), PoolSettings("b")])
    return TaskBook(core, new_id=lambda: f"t{next(ids)}", on_terminal=lambda record: None)


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
    assert book.submit(SubmitRequest(b"1", pool="a", tenant="acme", submission="abc-1"), 0.0) == (acme, True)
    assert book.submit(SubmitRequest(b"2", pool="b", tenant="globex", submission="abc-1"), 0.0) == (globex, True)


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
    assert book.submit(SubmitRequest(b"x", pool="a", tenant="globex", submission="s"), 21.0) == (globex, True)


def test_recovery_rebuilds_keys_and_submission_ids_per_tenant(tmp_path):
    world = World(tmp_path)
    acme, _ = world.book.submit(SubmitRequest(b"1", pool="a", tenant="acme", key="k", submission="s"), world.now)
    globex, _ = world.book.submit(SubmitRequest(b"2", pool="a", tenant="globex", key="k", submission="s"), world.now)
    world.journal.commit()
    world.crash()
    after = World(tmp_path, now=world.now + 1)
    book = after.book
    for tenant, first in (("acme", acme), ("globex", globex)):
        for dedup in ({"key": "k"}, {"submission": "s"}):
            again, dup = book.submit(SubmitRequest(b"x", pool="a", tenant=tenant, **dedup), after.now)
            assert dup and again.id == first.id
    fresh, dup = book.submit(SubmitRequest(b"3", pool="a", tenant="initech", key="k", submission="s"), after.now)
    assert not dup and fresh.id not in (acme.id, globex.id)


# ----------------------------------------------------------------- the embedded Scheduler


async def test_the_embedded_scheduler_scopes_keys_by_tenant():
    pool = cronoq.Pool("default", lambda payload: payload)
    async with cronoq.Scheduler([pool]) as sched:
        await sched.pause("default")
        acme = await sched.submit("a", tenant="acme", key="k")
        globex = await sched.submit("g", tenant="globex", key="k")
        assert acme.id != globex.id
        assert (await sched.submit("again", tenant="acme", key="k")).id == acme.id
        await sched.resume("default")
        assert await globex.result(timeout=10) == "g"
        assert await acme.result(timeout=10) == "a"
