"""The submit/result/status/cancel API as users call it, against both backends."""

from __future__ import annotations

import asyncio
import datetime

import pytest

import cronoq


def flaky_pool(failures: int) -> cronoq.Pool:
    """A pool whose handler raises on its first `failures` calls, then returns the payload."""
    calls = 0

    def run(payload):  # a plain function: runs in a thread
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ValueError(f"failure {calls}")
        return {"echo": payload, "calls": calls}

    return cronoq.Pool("work", run)


async def test_a_result_comes_back_with_the_payload_round_tripped(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        handle = await sched.submit({"n": [1, 2.5, "x", None, True]}, pool="work", tenant="acme")
        assert isinstance(handle.id, str)
        assert await handle.result(timeout=10) == {"echo": {"n": [1, 2.5, "x", None, True]}, "calls": 1}
        info = await sched.status(handle.id)
        assert (info.id, info.pool, info.tenant, info.priority, info.state, info.attempts) == (
            handle.id, "work", "acme", "normal", "succeeded", 1)


async def test_a_raising_handler_becomes_task_failed_with_type_message_and_traceback(backend):
    async with backend.open([flaky_pool(99)]) as sched:
        handle = await sched.submit("x", pool="work")
        with pytest.raises(cronoq.TaskFailed) as caught:
            await handle.result(timeout=10)
    assert caught.value.code == "TASK_FAILED"
    assert caught.value.type == "ValueError"
    assert caught.value.message == "failure 1"
    assert "Traceback" in caught.value.traceback and "ValueError: failure 1" in caught.value.traceback


async def test_retries_run_the_task_again_until_it_succeeds(backend):
    async with backend.open([flaky_pool(2)]) as sched:
        handle = await sched.submit("x", pool="work", max_retries=2)
        assert (await handle.result(timeout=30))["calls"] == 3
        assert (await sched.status(handle.id)).attempts == 3


async def test_retries_give_up_after_max_retries(backend):
    async with backend.open([flaky_pool(5)]) as sched:
        handle = await sched.submit("x", pool="work", max_retries=1)
        with pytest.raises(cronoq.TaskFailed, match="failure 2"):
            await handle.result(timeout=30)
        info = await sched.status(handle.id)
        assert (info.state, info.attempts) == ("failed", 2)


async def test_an_idempotency_key_returns_the_first_task(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        first = await sched.submit("a", pool="work", key="order-17")
        second = await sched.submit("b", pool="work", key="order-17")
        assert second.id == first.id and second.duplicate and not first.duplicate
        assert (await second.result(timeout=10))["echo"] == "a"


async def test_cancel_a_queued_task(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        await sched.pause("work")
        handle = await sched.submit("x", pool="work")
        assert (await sched.status(handle.id)).state == "queued"
        assert await sched.cancel(handle.id) is True
        assert await sched.cancel(handle.id) is False
        with pytest.raises(cronoq.Cancelled):
            await handle.result(timeout=10)
        assert (await sched.status(handle.id)).state == "cancelled"


async def test_a_handle_asks_for_its_own_status_and_cancels_itself(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        await sched.pause("work")
        handle = await sched.submit("x", pool="work", tenant="acme")
        info = await handle.status()
        assert (info.id, info.state, info.tenant) == (handle.id, "queued", "acme")
        assert await handle.cancel() is True
        assert await handle.cancel() is False
        assert (await handle.status()).state == "cancelled"
        with pytest.raises(cronoq.Cancelled):
            await handle.result(timeout=10)
        await sched.resume("work")
        done = await sched.submit("y", pool="work")
        await done.result(timeout=10)
        assert (await done.status()).state == "succeeded"
        assert await done.cancel() is False


async def test_a_delayed_task_waits_then_runs(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        handle = await sched.submit("x", pool="work", delay=datetime.timedelta(seconds=0.3))
        assert (await sched.status(handle.id)).state == "delayed"
        assert (await handle.result(timeout=10))["echo"] == "x"
        info = await sched.status(handle.id)
        assert info.started_at - info.submitted_at >= 0.29


async def test_an_aware_datetime_deadline(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        await sched.pause("work")
        soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=0.2)
        handle = await sched.submit("x", pool="work", deadline=soon)
        with pytest.raises(cronoq.DeadlineExceeded):
            await handle.result(timeout=10)


async def test_waiting_for_a_result_can_time_out(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        await sched.pause("work")
        handle = await sched.submit("x", pool="work")
        with pytest.raises(TimeoutError):
            await handle.result(timeout=0.1)
        await sched.resume("work")
        assert (await handle.result(timeout=10))["echo"] == "x"


async def test_a_cancelled_waiter_leaves_the_others_waiting_on_the_same_task(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        await sched.pause("work")
        handle = await sched.submit("x", pool="work")
        waiters = [asyncio.ensure_future(handle.result(timeout=10)) for _ in range(3)]
        by_id = asyncio.ensure_future(sched.result(handle.id, timeout=10))
        await asyncio.sleep(0.05)
        waiters[1].cancel()
        await sched.resume("work")
        assert [(await w)["echo"] for w in (waiters[0], waiters[2], by_id)] == ["x", "x", "x"]
        assert waiters[1].cancelled()
        assert (await handle.result(timeout=10))["echo"] == "x", "the outcome stays with the handle"


@pytest.mark.parametrize("kwargs, problem", [
    ({"priority": "urgent"}, "priority"),
    ({"deadline": "soon"}, "deadline"),
    ({"deadline": datetime.datetime(2030, 1, 1)}, "aware datetime"),
    ({"deadline": -5}, "deadline must be more than 0 seconds from now"),
    ({"deadline": 0}, "deadline must be more than 0 seconds from now"),
    ({"deadline": datetime.timedelta(seconds=-1)}, "deadline must be more than 0 seconds from now"),
    ({"deadline": datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)}, "deadline must be more than 0"),
    ({"delay": -1}, "delay"),
    ({"max_retries": -1}, "max_retries"),
    ({"tenant": ""}, "tenant"),
])
async def test_bad_arguments_are_invalid_argument_naming_the_field(backend, kwargs, problem):
    async with backend.open([flaky_pool(0)]) as sched:
        with pytest.raises(cronoq.InvalidArgument, match=problem):
            await sched.submit("x", pool="work", **kwargs)
        # nothing was lost: the pool still serves
        assert (await (await sched.submit("y", pool="work")).result(timeout=10))["echo"] == "y"


async def test_an_unserializable_payload_is_invalid_argument(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        with pytest.raises(cronoq.InvalidArgument, match="msgpack"):
            await sched.submit(object(), pool="work")


async def test_unknown_pools_and_tasks_are_not_found(backend):
    async with backend.open([flaky_pool(0)]) as sched:
        with pytest.raises(cronoq.NotFound, match="nope"):
            await sched.submit("x", pool="nope")
        with pytest.raises(cronoq.NotFound):
            await sched.status("no-such-task")
        with pytest.raises(cronoq.NotFound):
            await sched.result("no-such-task", timeout=1)
