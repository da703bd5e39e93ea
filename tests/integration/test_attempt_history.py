"""How each attempt of a task ended survives a broker restart: real broker processes killed with SIGKILL and
started again on the same data_dir, a real worker process (tests/apps/flaky.py) killed mid-run, compaction forced
by the test thresholds, finished tasks answered from the results store.

Counts and states, never times: each test waits on conditions with generous timeouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cronoq
from tests.support import start_worker_process, until

WAIT = 60.0
FLAKY = '[[pools]]\nname = "flaky"\n[[pools]]\nname = "idle"\n'


def _ends(why: cronoq.Explanation) -> list[tuple[int, str, Any, Any]]:
    return [(end.attempt, end.ended, end.at, end.error) for end in why.history]


def _at(client: cronoq.Client, task_id: str, state: str, attempts: int):
    async def check() -> bool:
        info = await client.status(task_id)
        return (info.state, info.attempts) == (state, attempts)

    return check


def _ran(runs: Path, times: int):
    """The handler started `times` runs (a dispatched task may not have reached its handler yet)."""
    async def check() -> bool:
        return runs.exists() and len(runs.read_text().splitlines()) >= times

    return check


def _kill(proc) -> None:
    proc.kill()
    proc.wait()


async def test_retried_attempts_and_their_errors_survive_kill_9_of_the_broker(broker_factory, restarted, tmp_path):
    broker = broker_factory(FLAKY)
    worker = start_worker_process(broker.workers, "tests.apps.flaky:pools", tmp_path / "worker.log")
    async with cronoq.connect(broker.clients) as client:
        # Two runs raise, the third holds its worker until it is killed: the broker dies while it runs.
        task = await client.submit({"runs": str(tmp_path / "runs"), "fail": 2, "hold_on": 3}, pool="flaky",
                                   max_retries=5)
        await until(_at(client, task.id, "running", 3), "the third attempt runs", timeout=WAIT)
        await until(_ran(tmp_path / "runs", 3), "its handler runs", timeout=WAIT)
        before = _ends(await client.explain(task.id))
        assert [end[:2] for end in before] == [(1, "retried"), (2, "retried"), (3, "running")]
        assert [end[3] for end in before[:2]] == ["ValueError: run 1 failed", "ValueError: run 2 failed"]
        assert before[0][2] < before[1][2]

        broker.kill()  # SIGKILL, while attempt 3 runs
        _kill(worker)
        broker = restarted(broker)
        after = _ends(await client.explain(task.id))
        assert after[:2] == before[:2], "both retries, their errors and times, as the broker knew them"
        attempt, ended, at, error = after[2]
        assert (attempt, ended, error) == (3, "worker_lost", None) and at >= before[1][2]

        worker = start_worker_process(broker.workers, "tests.apps.flaky:pools", tmp_path / "worker2.log")
        try:
            assert await task.result(timeout=WAIT) == "done"
            done = _ends(await client.explain(task.id))
            assert done[:3] == after and [end[:2] for end in done[3:]] == [(4, "succeeded")]
        finally:
            _kill(worker)


async def test_an_attempt_lost_with_its_worker_survives_kill_9_of_the_broker(broker_factory, restarted, tmp_path):
    broker = broker_factory(FLAKY)
    worker = start_worker_process(broker.workers, "tests.apps.flaky:pools", tmp_path / "worker.log")
    async with cronoq.connect(broker.clients) as client:
        task = await client.submit({"runs": str(tmp_path / "runs"), "hold_on": 1}, pool="flaky")
        await until(_at(client, task.id, "running", 1), "the first attempt runs", timeout=WAIT)
        await until(_ran(tmp_path / "runs", 1), "its handler runs", timeout=WAIT)
        _kill(worker)  # SIGKILL mid-run: the broker loses the worker, the task goes back to its queue
        await until(_at(client, task.id, "queued", 1), "the task is queued again", timeout=WAIT)
        before = _ends(await client.explain(task.id))
        assert [(attempt, ended, error) for attempt, ended, _, error in before] == [(1, "worker_lost", None)]
        assert before[0][2] is not None

        broker.kill()
        broker = restarted(broker)
        assert _ends(await client.explain(task.id)) == before

        worker = start_worker_process(broker.workers, "tests.apps.flaky:pools", tmp_path / "worker2.log")
        try:
            assert await task.result(timeout=WAIT) == "done"
            assert [end[:2] for end in _ends(await client.explain(task.id))] == [(1, "worker_lost"), (2, "succeeded")]
        finally:
            _kill(worker)


@pytest.mark.parametrize("fork_max_rss", ["", "0"], ids=["forked", "from the files"])
async def test_compaction_and_the_results_store_keep_how_attempts_ended(broker_factory, restarted, tmp_path,
                                                                        fork_max_rss):
    # Compact at every chance (a journal of any size), by a forked child or by one that reads the files back.
    env = {"CRONOQ_TEST_COMPACTION": f"1,0.5,,{fork_max_rss}"}
    broker = broker_factory(FLAKY, env=env, name="compact.toml")
    data_dir: Path = broker.config_path.parent / "compact-data"
    worker = start_worker_process(broker.workers, "tests.apps.flaky:pools", tmp_path / "worker.log")
    async with cronoq.connect(broker.clients) as client:
        await client.pause("idle")
        done = await client.submit({"runs": str(tmp_path / "done"), "fail": 2}, pool="flaky", max_retries=3)
        assert await done.result(timeout=WAIT) == "done"
        live = await client.submit({"runs": str(tmp_path / "live"), "fail": 1, "hold_on": 2}, pool="flaky",
                                   max_retries=3)
        await until(_at(client, live.id, "running", 2), "the live task's second attempt runs", timeout=WAIT)
        await until(_ran(tmp_path / "live", 2), "its handler runs", timeout=WAIT)
        done_before, live_before = _ends(await client.explain(done.id)), _ends(await client.explain(live.id))
        assert [end[:2] for end in done_before] == [(1, "retried"), (2, "retried"), (3, "succeeded")]
        assert [end[:2] for end in live_before] == [(1, "retried"), (2, "running")]

        async def stored() -> bool:
            return (await client.stats())["memory"]["finished"] == 0

        await until(stored, "the finished task is in the results store", timeout=WAIT)
        assert _ends(await client.explain(done.id)) == done_before, "the results store keeps them too"

        # Two compactions that start after every change above: the journals holding those changes are gone, the
        # snapshot alone has them. Each compaction needs a change to the journal after the last one: a submit.
        first = (await client.stats())["store"]["compactions"]

        async def compacted_twice() -> bool:
            await client.submit("nudge", pool="idle")
            return (await client.stats())["store"]["compactions"] >= first + 2

        await until(compacted_twice, "two more compactions", timeout=WAIT)
        broker.kill()
        _kill(worker)
        broker = restarted(broker, env={})
        assert (data_dir / "snapshot").exists()
        assert _ends(await client.explain(done.id)) == done_before
        after = _ends(await client.explain(live.id))
        assert after[0] == live_before[0] and after[1][:2] == (2, "worker_lost")
