"""Retention against the real broker: finished tasks leave its memory for the results store, answer from there
(also after a restart), and go when they pass result_ttl or result_retention_bytes; compaction runs in a forked
child that a kill -9 of the broker can interrupt anywhere. With `results_store = false` they stay in memory and in
the journal instead, through kill -9 and compactions, and turning the store off and on again loses none.

Counts, never times: each test waits on conditions with generous timeouts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import site
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cronoq
from tests.support import BEATS, ROOT, BrokerProcess, until

WAIT = 60.0
NO_STORE = "results_store = false\n"
"""The config line that keeps finished tasks in the broker's memory and journal instead of the results store."""


async def _echo(payload: Any) -> Any:
    return payload


class _worker:
    """An in-process worker for the length of an `async with`."""

    def __init__(self, broker: BrokerProcess, concurrency: int = 8) -> None:
        self.worker = cronoq.Worker(broker.workers, cronoq.Pool("default", _echo), concurrency=concurrency,
                                    **BEATS)

    async def __aenter__(self) -> cronoq.Worker:
        self.runner = asyncio.get_running_loop().create_task(self.worker.run())
        return self.worker

    async def __aexit__(self, *exc: Any) -> None:
        await self.worker.stop()
        await self.runner


async def _in_memory(client: cronoq.Client) -> int:
    return (await client.stats())["memory"]["records"]


async def _all_stored(client: cronoq.Client) -> bool:
    """Nothing finished waits in memory: the results store has it all."""
    memory = (await client.stats())["memory"]
    return memory["finished"] == 0


def _children(pid: int) -> list[tuple[int, str]]:
    """The broker's child processes and their command lines."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                found.append((int(child), Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except FileNotFoundError:
                pass
    return found


def _archivers(broker: BrokerProcess) -> int:
    """How many archiver processes the broker runs."""
    return sum("cronoq.store.results.archiver" in cmdline for _, cmdline in _children(broker.proc.pid))


def _starter(pid: int, child: int) -> int | None:
    """Which thread of process `pid` started `child` (Linux: a thread's children file), or None."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if str(child) in (task / "children").read_text().split():
                return int(task.name)
        except FileNotFoundError:
            pass
    return None


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# --------------------------------------------------------------------- memory follows the live set


async def test_twenty_thousand_tasks_leave_no_records_in_the_brokers_memory(broker_factory):
    # Finished tasks leave memory as soon as the results store has them; while it has not (the archiver is a
    # process of its own, slower on a busy machine), at most `held` wait before the broker dispatches only a trickle.
    held, window, concurrency, total = 2_000, 200, 64, 20_000
    broker = broker_factory('[[pools]]\nname = "default"\n', env={"CRONOQ_TEST_MAX_UNARCHIVED": str(held)})
    peak = 0
    async with cronoq.connect(broker.clients) as client, _worker(broker, concurrency=concurrency):
        submitted = 0

        async def lane() -> None:
            nonlocal submitted
            while submitted < total:
                submitted += 1
                handle = await client.submit(submitted)
                await handle.result(timeout=WAIT)

        async def watch() -> None:
            nonlocal peak
            while submitted < total:
                peak = max(peak, await _in_memory(client))
                await asyncio.sleep(0.2)

        await asyncio.gather(watch(), *(lane() for _ in range(window)))
        await until(lambda: _all_stored(client), "every finished task is in the results store")
        stats = await client.stats()
    # Without the results store every one of the 20,000 would still be in memory (result_ttl is a day).
    assert stats["memory"]["records"] == 0 and stats["store"]["results"]["rows"] == total
    # In memory at once: the live tasks (at most `window`), the finished ones waiting for the store (at most twice
    # `held`: past `held` only a trickle is dispatched, past twice nothing; plus those still running when it stopped).
    # Without the store, all 20,000 stay there.
    assert peak <= window + 2 * held + concurrency, f"{peak} records in memory at once"


# --------------------------------------------------------------------- answers from the results store


async def test_a_task_finished_long_ago_answers_from_the_store_and_after_a_restart(broker_factory, restarted):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    async with cronoq.connect(broker.clients) as client:
        async with _worker(broker):
            await client.ping()
            assert _archivers(broker) == 0, "an empty store starts no archiver before a task finishes"
            first = await client.submit({"n": 1}, key="invoice-1", tenant="acme")
            assert await first.result(timeout=WAIT) == {"n": 1}
            await until(lambda: asyncio.sleep(0, _archivers(broker) == 1), "the first finished task starts one")
            await client.pause("default")
            cancelled = await client.submit("x")
            assert await client.cancel(cancelled.id)
            await client.resume("default")
            later = [await client.submit(n) for n in range(50)]
            for handle in later:
                await handle.result(timeout=WAIT)
            await until(lambda: _all_stored(client), "every finished task is in the results store")
        assert await _in_memory(client) == 0
        info = await client.status(first.id)
        assert (info.state, info.tenant, info.attempts) == ("succeeded", "acme", 1)
        assert await client.result(first.id, timeout=WAIT) == {"n": 1}
        assert (await client.status(cancelled.id)).state == "cancelled"
        again = await client.submit({"n": 2}, key="invoice-1", tenant="acme")
        assert again.id == first.id and again.duplicate, "a key dedupes while its task is retained, on disk too"

        broker.kill()
        broker = restarted(broker)
        assert _archivers(broker) == 1, "a store that holds results has its archiver from the start"
        assert await _in_memory(client) == 0, "finished tasks the store holds are not read back into memory"
        assert await client.result(first.id, timeout=WAIT) == {"n": 1}
        with pytest.raises(cronoq.Cancelled):
            await client.result(cancelled.id, timeout=WAIT)
        assert [(await client.status(h.id)).state for h in later] == ["succeeded"] * 50
        again = await client.submit({"n": 3}, key="invoice-1", tenant="acme")
        assert again.id == first.id and again.duplicate
        other = await client.submit({"n": 3}, key="invoice-1", tenant="globex")
        assert other.id != first.id and not other.duplicate, "keys stay per tenant in the store"


# --------------------------------------------------------------------- retention by time and by bytes


async def test_results_go_after_result_ttl(broker_factory):
    ttl = 3.0
    broker = broker_factory('[[pools]]\nname = "default"\n', broker_extra=f"result_ttl = {ttl}\n")
    async with cronoq.connect(broker.clients) as client, _worker(broker):
        old = await client.submit("old", key="k")
        assert await old.result(timeout=WAIT) == "old"
        finished = time.monotonic()
        await until(lambda: _all_stored(client), "the task is in the results store")
        try:
            assert (await client.status(old.id)).state == "succeeded"
        except cronoq.NotFound:
            # Gone already: only right if the machine was so loaded that result_ttl passed meanwhile.
            assert time.monotonic() - finished >= ttl

        async def forgotten() -> bool:
            try:
                await client.status(old.id)
            except cronoq.NotFound:
                return True
            return False

        await until(forgotten, "the task passed result_ttl and is forgotten")
        with pytest.raises(cronoq.NotFound):
            await client.result(old.id, timeout=1)
        fresh = await client.submit("new", key="k")
        assert fresh.id != old.id and not fresh.duplicate, "the key is free again"
        assert await fresh.result(timeout=WAIT) == "new"


@pytest.mark.parametrize("stored", [True, False], ids=["in the results store", "in memory: results_store = false"])
async def test_results_over_result_retention_bytes_go_oldest_first(broker_factory, stored):
    broker = broker_factory('[[pools]]\nname = "default"\n',
                            broker_extra="result_retention_bytes = 40000\n" + ("" if stored else NO_STORE))
    async with cronoq.connect(broker.clients) as client, _worker(broker, concurrency=1):
        handles = []
        for n in range(400):  # one at a time: they finish in this order
            handle = await client.submit({"n": n, "pad": "x" * 100})
            await handle.result(timeout=WAIT)
            handles.append(handle)
        if stored:
            await until(lambda: _all_stored(client), "every finished task is in the results store")
        kept = []
        for handle in handles:
            try:
                kept.append((await client.status(handle.id)).state == "succeeded")
            except cronoq.NotFound:
                kept.append(False)
        stats = await client.stats()
    assert 0 < sum(kept) < 400
    if stored:
        assert stats["store"]["results"]["bytes"] <= 40000
    else:  # the budget bounds memory instead, where every kept one is
        assert stats["memory"]["finished"] == sum(kept) and stats["memory"]["finished_bytes"] <= 40000
    first_kept = kept.index(True)
    assert kept == [False] * first_kept + [True] * (400 - first_kept), "the oldest go first, and only they"


async def test_a_reload_applies_new_retention_limits(broker_factory):
    broker = broker_factory('[[pools]]\nname = "default"\n')
    async with cronoq.connect(broker.clients) as client, _worker(broker):
        handles = [await client.submit(n) for n in range(30)]
        for handle in handles:
            await handle.result(timeout=WAIT)
        await until(lambda: _all_stored(client), "every finished task is in the results store")
        text = broker.config_path.read_text().replace("[broker]\n", "[broker]\nresult_retention_bytes = 1\n", 1)
        broker.config_path.write_text(text)
        await client.reload()
        await client.submit("tick")  # any later batch, or the next tick, applies the new budget

        async def gone() -> bool:
            return (await client.stats())["store"]["results"]["rows"] <= 1

        await until(gone, "the store dropped what no longer fits")
        with pytest.raises(cronoq.NotFound):
            await client.status(handles[0].id)


# --------------------------------------------------------------------- without the results store


async def test_without_the_results_store_results_stay_in_memory_and_the_journal_through_kill_9(
        broker_factory, restarted):
    # Compact at every chance (a journal of any size, of a record or two): the snapshots must carry the finished
    # tasks too.
    broker = broker_factory('[[pools]]\nname = "default"\n', broker_extra=NO_STORE,
                            env={"CRONOQ_TEST_COMPACTION": "1,0.01"})
    data_dir: Path = broker.config_path.parent / "cronoq-data"
    async with cronoq.connect(broker.clients) as client:
        async with _worker(broker):
            first = await client.submit({"n": 1}, key="invoice-1", tenant="acme")
            assert await first.result(timeout=WAIT) == {"n": 1}
            later = [await client.submit(n) for n in range(50)]
            for handle in later:
                await handle.result(timeout=WAIT)
        stats = await client.stats()
        assert stats["memory"]["finished"] == 51 and "results" not in stats["store"]
        assert not (data_dir / "results.sqlite3").exists(), "no results store is made"
        assert not any("archiver" in line for _, line in _children(broker.proc.pid)), "and no archiver runs"

        # Two compactions that start after every change above: the journals that held them are gone, the snapshot
        # alone has them. Each needs a change to the journal after the last one: a submit (queued: no worker now).
        first_compactions = stats["store"]["compactions"]

        async def compacted() -> bool:
            await client.submit("nudge")
            return (await client.stats())["store"]["compactions"] >= first_compactions + 2

        await until(compacted, "two more compactions")
        assert (data_dir / "snapshot").exists()
        broker.kill()
        broker = restarted(broker)
        assert await client.result(first.id, timeout=WAIT) == {"n": 1}
        assert [(await client.status(h.id)).state for h in later] == ["succeeded"] * 50
        again = await client.submit({"n": 2}, key="invoice-1", tenant="acme")
        assert again.id == first.id and again.duplicate, "the key still dedupes, from the journal"
        assert (await client.stats())["memory"]["finished"] == 51


async def test_turning_the_results_store_off_and_on_again_loses_no_result(broker_factory, restarted):
    # Nudges for the compactions go to a pool no worker serves: they never finish, so the task finished while the
    # store is off is the first to finish then, and would take the store's first number without care.
    broker = broker_factory('[[pools]]\nname = "default"\n[[pools]]\nname = "idle"\n',
                            env={"CRONOQ_TEST_COMPACTION": "1,0.01"})
    config = broker.config_path
    async with cronoq.connect(broker.clients) as client:
        async with _worker(broker):
            stored = await client.submit("stored", key="k1")
            assert await stored.result(timeout=WAIT) == "stored"
            await until(lambda: _all_stored(client), "the task is in the results store")
        # Two compactions after that: the task is in the store alone, no longer in the journal.
        first_compactions = (await client.stats())["store"]["compactions"]

        async def compacted() -> bool:
            await client.submit("nudge", pool="idle")
            return (await client.stats())["store"]["compactions"] >= first_compactions + 2

        await until(compacted, "two more compactions")
        broker.stop()
        config.write_text(config.read_text().replace("[broker]\n", "[broker]\n" + NO_STORE, 1))
        broker = restarted(broker)
        assert "is left unread" in broker.log.read_text()
        with pytest.raises(cronoq.NotFound):  # as the docs say: what only the store holds is not read meanwhile
            await client.status(stored.id)
        async with _worker(broker):
            unstored = await client.submit("in memory", key="k2")
            assert await unstored.result(timeout=WAIT) == "in memory"
        broker.stop()
        config.write_text(config.read_text().replace(NO_STORE, "", 1))
        broker = restarted(broker)
        # Both again: the first from the store, the second from the journal, on its way to the store. (Numbered
        # within the store's range, the second would have been taken for a stored task and left out.)
        assert await client.result(stored.id, timeout=WAIT) == "stored"
        assert await client.result(unstored.id, timeout=WAIT) == "in memory"
        await until(lambda: _all_stored(client), "the second task reached the store too")
        again = await client.submit("x", key="k2")
        assert again.id == unstored.id and again.duplicate


# --------------------------------------------------------------------- crashes on the new paths


@pytest.mark.parametrize("fork_max_rss", ["", "0"], ids=["forked", "from the files"])
async def test_kill_9_of_the_broker_while_its_compaction_child_writes_loses_nothing(broker_factory, restarted,
                                                                                    tmp_path, fork_max_rss):
    hold = tmp_path / "compaction-held"
    # A broker bigger than FORK_MAX_RSS (here: any) has the snapshot written from the files, not by a fork.
    env = {"CRONOQ_TEST_COMPACTION": f"1,0.5,,{fork_max_rss}", "CRONOQ_TEST_HOLD_COMPACTION": str(hold)}
    broker = broker_factory('[[pools]]\nname = "default"\n', env=env, name="compact.toml")
    data_dir = broker.config_path.parent / "compact-data"
    async with cronoq.connect(broker.clients) as client:
        await client.pause("default")
        queued = [await client.submit(n, key=f"q{n}") for n in range(200)]
        cancelled = [await client.submit(n) for n in range(100)]
        for handle in cancelled:
            assert await client.cancel(handle.id)
        await until(lambda: asyncio.sleep(0, hold.exists()), "a compaction child is writing its snapshot")
        child = int(hold.read_text())
        assert (data_dir / "snapshot.tmp").exists()
        # A fork comes from the loop's thread; a process reading back is started by the housekeeping thread,
        # so that the loop does not wait for it to exec (and is bound to that thread, which lives as long).
        starter = _starter(broker.proc.pid, child)
        assert (starter == broker.proc.pid) if fork_max_rss == "" else (starter not in (None, broker.proc.pid))
        broker.kill()  # SIGKILL, mid-compaction
        await until(lambda: asyncio.sleep(0, not _alive(child)), "the child died with the broker")
        hold.unlink()
        broker = restarted(broker, env={})
        assert not (data_dir / "snapshot.tmp").exists(), "the unfinished snapshot was removed"
        assert [(await client.status(h.id)).state for h in queued] == ["queued"] * 200
        assert [(await client.status(h.id)).state for h in cancelled] == ["cancelled"] * 100
        assert (await client.submit("again", key="q7")).id == queued[7].id
        await client.resume("default")
        async with _worker(broker):
            assert [await h.result(timeout=WAIT) for h in queued] == list(range(200))


async def test_a_killed_compaction_child_or_archiver_changes_nothing_and_the_broker_carries_on(broker_factory,
                                                                                             restarted, tmp_path):
    hold = tmp_path / "compaction-held"
    env = {"CRONOQ_TEST_COMPACTION": "1,0.5,0.5", "CRONOQ_TEST_HOLD_COMPACTION": str(hold)}
    broker = broker_factory('[[pools]]\nname = "default"\n', env=env, name="children.toml")
    data_dir = broker.config_path.parent / "children-data"
    async with cronoq.connect(broker.clients) as client, _worker(broker):
        done = [await client.submit(n) for n in range(100)]
        assert [await h.result(timeout=WAIT) for h in done] == list(range(100))
        await until(lambda: asyncio.sleep(0, hold.exists()), "a compaction child is writing its snapshot")
        os.kill(int(hold.read_text()), signal.SIGKILL)
        hold.unlink()

        async def compacted() -> bool:
            if hold.exists():  # the next try holds too: let it go
                hold.unlink()
            return (await client.stats())["store"]["compactions"] >= 1

        await until(compacted, "a later compaction succeeded")
        assert not (data_dir / "snapshot.tmp").exists()
        [archiver] = [pid for pid, cmdline in _children(broker.proc.pid) if "cronoq.store.results.archiver" in cmdline]
        os.kill(archiver, signal.SIGKILL)
        more = [await client.submit(n) for n in range(100, 150)]
        assert [await h.result(timeout=WAIT) for h in more] == list(range(100, 150))

        async def respawned() -> bool:
            if hold.exists():
                hold.unlink()
            stats = await client.stats()
            return stats["store"]["results"]["respawns"] >= 1 and stats["memory"]["finished"] == 0

        await until(respawned, "a new archiver stored what the killed one had not")
        assert [await client.result(h.id, timeout=WAIT) for h in done + more] == list(range(150))
    broker.kill()
    hold.touch()  # no more holding: a start compacts at once with these thresholds
    hold.unlink()
    broker = restarted(broker, env={})
    async with cronoq.connect(broker.clients) as client:
        assert [await client.result(h.id, timeout=WAIT) for h in done + more] == list(range(150))


async def test_a_broker_stopped_while_its_compaction_reads_back_exits_at_once_and_loses_nothing(
        broker_factory, restarted, tmp_path):
    """SIGTERM while the housekeeping thread's read-back child writes: the broker stops that child (it does
    not wait for the snapshot), exits 0, and the next start replays the journals the child would have replaced."""
    hold = tmp_path / "compaction-held"
    env = {"CRONOQ_TEST_COMPACTION": "1,0.5,,0", "CRONOQ_TEST_HOLD_COMPACTION": str(hold)}
    broker = broker_factory('[[pools]]\nname = "default"\n', env=env, name="stopped.toml")
    data_dir = broker.config_path.parent / "stopped-data"
    async with cronoq.connect(broker.clients) as client:
        await client.pause("default")
        queued = [await client.submit(n) for n in range(200)]
        await until(lambda: asyncio.sleep(0, hold.exists() and hold.read_text() != ""),
                    "a compaction child is writing its snapshot")
        child = int(hold.read_text())
        assert broker.stop() == 0
        assert not _alive(child), "the child went with the broker"
        hold.unlink()
        broker = restarted(broker, env={})
        assert not (data_dir / "snapshot.tmp").exists()
        assert [(await client.status(h.id)).state for h in queued] == ["queued"] * 200
        await client.resume("default")
        async with _worker(broker):
            assert [await h.result(timeout=WAIT) for h in queued] == list(range(200))


async def test_a_compaction_writer_that_cannot_be_started_changes_nothing_and_is_tried_again(
        broker_factory, restarted, tmp_path):
    """The housekeeping thread cannot start the process reading back (here: the interpreter the broker runs as
    is gone): the broker logs it, keeps every journal, and a later try, once it can, compacts."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.symlink_to(os.path.realpath(sys.executable))
    # A link outside a virtualenv starts the base interpreter, which does not see the venv's packages: name them.
    env = {"CRONOQ_TEST_COMPACTION": "1,0.5,0.5,0",  # read back always, try again after half a second
           "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])}
    broker = broker_factory('[[pools]]\nname = "default"\n', env=env, name="nostart.toml", python=str(python))
    python.unlink()  # the broker runs; a process it starts from now on cannot
    async with cronoq.connect(broker.clients) as client, _worker(broker):
        done = [await client.submit(n) for n in range(100)]
        assert [await h.result(timeout=WAIT) for h in done] == list(range(100))

        async def failed() -> bool:
            await client.submit("more")  # grows the journal: the next try is due
            return "could not compact the journal" in broker.log.read_text()

        await until(failed, "a compaction whose writer could not be started")
        assert "No such file" in broker.log.read_text()
        assert (await client.stats())["store"]["compactions"] == 0
        python.symlink_to(os.path.realpath(sys.executable))

        async def compacted() -> bool:
            await client.submit("more")
            return (await client.stats())["store"]["compactions"] >= 1

        await until(compacted, "a later try compacted")
        assert [await client.result(h.id, timeout=WAIT) for h in done] == list(range(100))
    broker.kill()
    broker = restarted(broker, env={})
    async with cronoq.connect(broker.clients) as client:
        assert [await client.result(h.id, timeout=WAIT) for h in done] == list(range(100))


async def test_the_embedded_scheduler_keeps_results_in_memory_within_both_limits():
    from cronoq.book.retention import RECORD_MEMORY

    pool = cronoq.Pool("default", _echo)
    async with cronoq.Scheduler(pool, concurrency=1, result_retention_bytes=20 * (RECORD_MEMORY + 10)) as sched:
        handles = []
        for n in range(100):
            handle = await sched.submit(n)
            assert await handle.result(timeout=WAIT) == n
            handles.append(handle)
        kept = []
        for handle in handles:
            try:
                kept.append((await sched.status(handle.id)).state == "succeeded")
            except cronoq.NotFound:
                kept.append(False)
    assert 15 <= sum(kept) <= 20 and kept == [False] * (100 - sum(kept)) + [True] * sum(kept), "oldest first"
    with pytest.raises(cronoq.InvalidArgument, match="result_retention_bytes must be a positive integer"):
        cronoq.Scheduler(pool, result_retention_bytes=0)
