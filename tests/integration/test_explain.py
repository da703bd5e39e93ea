"""`explain` end to end: why a task waits, and how a task's attempts ended.

Against both backends (the embedded Scheduler, and a real broker process with a worker over tcp): a paused
pool, a capped tenant, a retried task. Against the real broker: the `cronoq explain` command as a
subprocess, for a task behind a critical backlog, and a token pinned to a tenant, which explains only its
subtree's tasks.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import cronoq
from tests.integration.test_tenant_tree import CONFIG as PINNED, TOKENS
from tests.support import run_command, start_worker_process, until


def _state(sched, task_id: str, state: str):
    async def check() -> bool:
        return (await sched.status(task_id)).state == state

    return check


async def test_explain_a_task_in_a_paused_pool(backend):
    async def echo(payload):
        return payload

    async with backend.open([cronoq.Pool("llm", echo, fair_share=True)]) as sched:
        await sched.pause("llm")
        handles = [await sched.submit(i, pool="llm", tenant="acme") for i in range(3)]
        why = await sched.explain(handles[-1].id)
        assert (why.state, why.tenant, why.attempts, why.history) == ("queued", "acme", 0, ())
        waiting = why.waiting
        assert waiting.paused and waiting.estimate is None and "paused" in waiting.estimate_note
        assert (waiting.queue_ahead, waiting.queue_length, waiting.higher_classes_ahead) == (2, 3, 0)
        assert [node.name for node in waiting.nodes] == ["acme"] and waiting.nodes[0].share == 1.0
        await sched.resume("llm")
        assert await handles[-1].result(timeout=30) == 2
        ran = await handles[-1].explain()
        assert ran.waiting is None and ran.state == "succeeded"
        assert [(end.attempt, end.ended) for end in ran.history] == [(1, "succeeded")]


async def test_explain_a_task_of_a_capped_tenant(backend):
    release = asyncio.Event()

    async def held(payload):
        await release.wait()
        return payload

    pool = cronoq.Pool("llm", held, tenant_limits={"acme": 1})
    async with backend.open([pool], concurrency=4) as sched:
        first = await sched.submit("first", pool="llm", tenant="acme/search")
        second = await sched.submit("second", pool="llm", tenant="acme/ads")
        await until(_state(sched, first.id, "running"), "acme's first task runs")
        why = await sched.explain(second.id)
        acme = why.waiting.nodes[0]
        assert acme.name == "acme" and acme.share == 0.0
        assert (acme.ceiling.limit, acme.ceiling.running, acme.ceiling.capped) == (1, 1, True)
        assert acme.ceiling.capped_since is not None and acme.ceiling.capped_for >= 0
        assert why.waiting.estimate is None and "acme at its ceiling" in why.waiting.estimate_note
        assert why.waiting.ready_workers == 1  # slots are free: only the ceiling holds it
        release.set()
        assert await second.result(timeout=30) == "second"


async def test_explain_a_task_behind_a_critical_backlog(backend):
    release = asyncio.Event()

    async def held(payload):
        await release.wait()
        return payload

    async with backend.open([cronoq.Pool("llm", held, fair_share=True)], concurrency=1) as sched:
        critical = [await sched.submit(i, pool="llm", tenant="ops", priority="critical") for i in range(4)]
        await until(_state(sched, critical[0].id, "running"), "the first critical task runs")
        mine = await sched.submit("mine", pool="llm", tenant="acme", deadline=600)
        later = await sched.submit("later", pool="llm", tenant="acme")
        why = (await sched.explain(later.id)).waiting
        assert (why.higher_classes_ahead, why.deadline_ahead, why.queue_ahead) == (3, 1, 0)
        assert (why.ready_workers, why.running) == (0, 1)
        assert (await sched.explain(mine.id)).waiting.higher_classes_ahead == 3
        release.set()
        assert await later.result(timeout=30) == "later"


async def test_explain_a_retried_task_lists_how_each_attempt_ended(backend):
    calls = []

    async def flaky(payload):
        calls.append(payload)
        if len(calls) == 1:
            raise ValueError("not yet")
        return "done"

    async with backend.open([cronoq.Pool("llm", flaky)]) as sched:
        handle = await sched.submit("x", pool="llm", max_retries=2)
        assert await handle.result(timeout=30) == "done"
        why = await sched.explain(handle.id)
    assert (why.state, why.attempts, why.max_retries) == ("succeeded", 2, 2)
    assert [(end.attempt, end.ended, end.error) for end in why.history] == [
        (1, "retried", "ValueError: not yet"), (2, "succeeded", None)]
    assert all(end.at is not None for end in why.history)


# -- the command, against a real broker --------------------------------------------------------------

SLOW = """
[[pools]]
name = "default"

[[pools]]
name = "slow"
fair_share = true
"""


def test_cronoq_explain_a_task_behind_a_critical_backlog(broker_factory, tmp_path):
    broker = broker_factory(SLOW)
    worker = start_worker_process(broker.workers, "tests.apps.echo:pools", tmp_path / "worker.log")

    def cli(*args):
        result = run_command(["-m", "cronoq.client.cli", *args, "--broker", broker.clients])
        assert result.returncode == 0, result.stderr
        return result.stdout

    try:
        # The worker has one slot: the first critical task takes it for a minute, four more wait behind it.
        critical = [cli("submit", "60", "--pool", "slow", "--tenant", "ops", "--priority", "critical").strip()
                    for _ in range(5)]
        mine = cli("submit", "0", "--pool", "slow", "--tenant", "acme/search").strip()
        shown = json.loads(cli("explain", mine, "--json"))
        assert (shown["state"], shown["tenant"], shown["priority"]) == ("queued", "acme/search", "normal")
        waiting = shown["waiting"]
        assert (waiting["higher_classes_ahead"], waiting["deadline_ahead"], waiting["queue_ahead"]) == (4, 0, 0)
        assert (waiting["workers"], waiting["ready_workers"], waiting["paused"]) == (1, 0, False)
        assert [node["name"] for node in waiting["nodes"]] == ["acme", "acme/search"]
        text = cli("explain", mine)
        assert f"task {mine}: queued — pool slow, tenant acme/search, class normal" in text
        assert "every worker serving pool slow is busy (1 connected)" in text
        assert "4 queued tasks of higher classes go first" in text
        assert "expected to start:" in text
        running = json.loads(cli("explain", critical[0], "--json"))
        assert running["state"] == "running" and running["waiting"] is None
        assert running["history"] == [{"attempt": 1, "ended": "running", "at": None, "error": None}]
        unknown = run_command(["-m", "cronoq.client.cli", "explain", "no-such-task", "--broker", broker.clients])
        assert unknown.returncode == 1
        assert unknown.stderr.strip() == "cronoq explain: NOT_FOUND: no task with id 'no-such-task' (unknown, or its " \
                                         "record has expired)"
    finally:
        worker.kill()
        worker.wait()


# -- tokens pinned to a tenant -------------------------------------------------------------------------

async def test_a_pinned_token_explains_only_its_subtree_s_tasks(broker_factory):
    broker = broker_factory(PINNED, env=TOKENS)  # the tenant tree's tokens: acme, and acme/search
    async with cronoq.connect(broker.clients, token=TOKENS["T_ACME"]) as acme, cronoq.connect(
        broker.clients, token=TOKENS["T_SEARCH"]
    ) as search:
        own = await acme.submit("a")
        theirs = await search.submit("s")
        assert (await acme.explain(theirs.id)).tenant == "acme/search"  # acme sees its whole subtree
        assert (await search.explain(theirs.id)).waiting.nodes[-1].name == "acme/search"
        with pytest.raises(cronoq.NotFound) as refused:
            await search.explain(own.id)  # above it: as if the task did not exist
        with pytest.raises(cronoq.NotFound) as never:
            await search.explain("0123456789abcdef0123456789abcdef")
        assert str(refused.value).replace(own.id, "ID") == str(never.value).replace(
            "0123456789abcdef0123456789abcdef", "ID")
