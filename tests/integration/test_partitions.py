"""Delivery across cuts between a peer and a real broker process, as docs/protocol.md and docs/api.md promise.

A cut is made here by freezing a process (SIGSTOP, then SIGCONT): its connections stay open and what was
sent to it waits in the kernel's buffers, as behind a network partition that heals; no network namespaces
are needed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Awaitable, Callable

import cronoq
from tests.support import start_worker_process, until

POOLS = '[[pools]]\nname = "default"\n'


async def frozen_until(pid: int, condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Cut process `pid` off (SIGSTOP) until `condition` holds, then let it go on (SIGCONT), whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await until(condition, what)
    finally:
        os.kill(pid, signal.SIGCONT)


async def started(client: cronoq.Client, handle: cronoq.TaskHandle) -> None:
    async def running() -> bool:
        return (await client.status(handle.id)).state == "running"
    await until(running, "the task runs")


async def test_the_librarys_own_resend_of_a_submit_is_no_duplicate(broker_factory):
    broker = broker_factory(POOLS)
    async with cronoq.connect(broker.clients, request_timeout=60) as client:
        await client.ping()
        # The ping's reply can be read before the socket monitor's report of the handshake: the freeze below
        # must start from a connection the client knows is up, or it ends at once and nothing is re-sent.
        await until(lambda: asyncio.sleep(0, client._connection._link.up), "the client's monitor saw the handshake")
        submitting: asyncio.Future | None = None

        async def link_down() -> bool:
            nonlocal submitting
            if submitting is None:
                # The submit waits in the broker's socket buffer; the client gives up on the frozen connection
                # (ZeroMQ's heartbeat), makes a new one and re-sends the submit once the broker answers again.
                submitting = asyncio.ensure_future(client.submit("once", pool="default"))
            return not client._connection._link.up  # what the client's socket monitor saw: the connection was dropped
        await frozen_until(broker.proc.pid, link_down, "the client gives up on the frozen broker's connection")
        assert submitting is not None
        handle = await asyncio.wait_for(submitting, 60)
        assert client.reconnects >= 1, "the submit must have been re-sent on a new connection"
        assert not handle.duplicate, "the client submitted once: no earlier task with its key was returned"
        stats = await client.stats()
        assert stats["pools"]["default"]["queued"] == 1, "the re-send made no second task"
        # A key the caller repeats is a duplicate, re-sent or not.
        first = await client.submit("a", key="k")
        again = await client.submit("b", key="k")
        assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)



async def test_a_worker_given_its_own_running_task_again_runs_it_once_and_the_late_result_is_counted_and_logged(
        broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "counted"\n')
    runs = tmp_path / "runs"
    worker = start_worker_process(broker.workers, "tests.apps.counted:pools", tmp_path / "worker.log", concurrency=2)
    try:
        async with cronoq.connect(broker.clients) as client:
            handle = await client.submit({"n": 1, "sleep": 8.0, "runs": str(runs)}, pool="counted")
            # (Long enough that the worker has been lost (3 s), registered again and been given attempt 2 before
            # attempt 1 ends, with seconds to spare on a busy machine.)
            await started(client, handle)

            # A cut the worker does not outlast (liveness: 15 x 0.2 s): the broker takes the task back, and gives
            # it, as attempt 2, to the only worker there is -- the one still running attempt 1.
            async def taken_back() -> bool:
                return (await client.stats())["workers"] == 0
            await frozen_until(worker.pid, taken_back, "the broker loses the frozen worker")
            assert await handle.result(timeout=60) == 1
            info = await client.status(handle.id)
            assert info.attempts == 2
            await asyncio.sleep(1.0)  # a second run, if there were one, would finish by now (its sleep is over)
            assert runs.read_text().split() == ["1"], "the task ran twice on one worker"

            async def counted() -> bool:
                return (await client.stats())["late_results"] >= 1
            await until(counted, "the late result of attempt 1 is counted")
        log = broker.log.read_text()
        assert log.count(f"task {handle.id}: the outcome of its attempt 1 came from worker") == 1, log
    finally:
        worker.terminate()
        worker.wait(10)


async def test_a_cut_off_worker_warns_once_per_outage_not_every_beat(broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "counted"\n')
    log = tmp_path / "worker.log"
    worker = start_worker_process(broker.workers, "tests.apps.counted:pools", log)
    try:
        async with cronoq.connect(broker.clients) as client:
            await client.ping()
            # The warning this is about: the broker fell silent. (A message dropped for want of a connection is
            # another event, with its own warning, and may or may not happen during the cut.)
            silent = "level=warning logger=cronoq.worker msg=\"broker silent"
            before = log.read_text().count(silent)
            os.kill(broker.proc.pid, signal.SIGSTOP)
            try:
                # 20 heartbeat intervals of the worker's, and several of its reconnects.
                await asyncio.sleep(4.0)
            finally:
                os.kill(broker.proc.pid, signal.SIGCONT)

            async def back() -> bool:
                return (await client.stats())["workers"] == 1
            await until(back, "the worker registers again")
        warnings = [line for line in log.read_text().splitlines() if silent in line][before:]
        assert len(warnings) <= 1, "\n".join(warnings)
    finally:
        worker.terminate()
        worker.wait(10)


async def test_a_result_that_comes_after_its_worker_was_lost_but_before_the_task_ran_again_ends_the_task(
        broker_factory, tmp_path):
    broker = broker_factory('[[pools]]\nname = "counted"\n')
    runs = tmp_path / "runs"
    # One slot: while its task runs, the worker has no room for the task's next attempt.
    worker = start_worker_process(broker.workers, "tests.apps.counted:pools", tmp_path / "worker.log", concurrency=1)
    try:
        async with cronoq.connect(broker.clients) as client:
            handle = await client.submit({"n": 7, "sleep": 3.0, "runs": str(runs)}, pool="counted")
            await started(client, handle)

            async def taken_back() -> bool:
                if (await client.status(handle.id)).state != "queued":
                    return False
                # Held queued: once thawed, the worker's free slot could otherwise take the task again before
                # its late result is read (seen on a loaded machine), which is the other test's case, not this one.
                await client.pause("counted")
                return True
            await frozen_until(worker.pid, taken_back, "the broker takes the task back from the frozen worker")
            assert await handle.result(timeout=60) == 7
            info = await client.status(handle.id)
            assert (info.state, info.attempts) == ("succeeded", 1), "the late result ended the task"
            await asyncio.sleep(1.0)
            assert runs.read_text().split() == ["7"]
            assert (await client.stats())["late_results"] == 0
    finally:
        worker.terminate()
        worker.wait(10)


async def test_a_paused_host_costs_a_worker_neither_its_connection_nor_the_result_it_finished(
        broker_factory, tmp_path):
    """Broker and worker frozen together (a paused VM, a laptop asleep), the worker thawed a moment first: its
    first heartbeat tick finds the broker silent for longer than its liveness window, but it was the one that
    stalled. It gives the broker a fresh window rather than hang up, so the result its handler finished during
    the pause reaches the broker on the same connection and the task runs once."""
    # The worker waits 10 beats (2 s) before it calls the broker silent; the broker waits 50 (10 s) for a worker.
    broker = broker_factory('[[pools]]\nname = "counted"\n', broker_extra="liveness = 50")
    runs = tmp_path / "runs"
    log = tmp_path / "worker.log"
    worker = start_worker_process(broker.workers, "tests.apps.counted:pools", log, extra=["--liveness", "10"])
    try:
        async with cronoq.connect(broker.clients) as client:
            handle = await client.submit({"n": 3, "sleep": 0.5, "runs": str(runs)}, pool="counted")
            await started(client, handle)
            os.kill(broker.proc.pid, signal.SIGSTOP)
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(4.0)  # the handler's sleep ends and the worker's window passes meanwhile
                os.kill(worker.pid, signal.SIGCONT)
                await asyncio.sleep(0.5)  # the worker's first ticks find a broker that is still frozen
            finally:
                os.kill(worker.pid, signal.SIGCONT)
                os.kill(broker.proc.pid, signal.SIGCONT)
            assert await handle.result(timeout=30) == 3
            info = await client.status(handle.id)
            assert (info.state, info.attempts) == ("succeeded", 1)
            assert runs.read_text().split() == ["3"], "the task ran once"
        assert "broker silent" not in log.read_text(), "the worker kept its connection"
    finally:
        worker.terminate()
        worker.wait(10)
