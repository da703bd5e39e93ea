"""Where a cluster client sends the requests about a task id: to the member the id names, from any client of
the cluster, whoever submitted the task; and what they meet while that member is down. Real member processes
on loopback, as in test_cluster.py."""

from __future__ import annotations

from typing import Iterator

import pytest

import cronoq
from tests.integration.test_cluster import Cluster
from tests.support import run_command


@pytest.fixture
def two_members(tmp_path) -> Iterator[Cluster]:
    """b1 owns pool `mine`, b2 pool `theirs`."""
    c = Cluster(tmp_path, ["b1", "b2"])
    c.write('[[pools]]\nname = "mine"\nmember = "b1"\n[[pools]]\nname = "theirs"\nmember = "b2"\n')
    try:
        c.start("b1")
        c.start("b2")
        yield c
    finally:
        c.stop()


async def test_a_task_id_s_requests_reach_its_member_from_a_client_given_another_member(two_members):
    c = two_members
    async with cronoq.connect(c.clients("b2")) as submitter:
        await submitter.pause("mine")  # no worker either: the tasks stay queued on b1
        kept = await submitter.submit("kept", pool="mine")
        dropped = await submitter.submit("dropped", pool="mine")
    assert kept.id.startswith("b1:") and dropped.id.startswith("b1:")

    # A client that submitted nothing and was given b2's address only: every request about b1's tasks leaves b2.
    async with cronoq.connect(c.clients("b2")) as asker:
        assert (await asker.status(kept.id)).state == "queued"
        explained = await asker.explain(kept.id)
        assert (explained.id, explained.pool, explained.state) == (kept.id, "mine", "queued")
        assert await asker.cancel(dropped.id) is True
        assert (await asker.status(dropped.id)).state == "cancelled"
        with pytest.raises(cronoq.Cancelled):
            await asker.result(dropped.id, timeout=30)
        assert await asker.cancel(dropped.id) is False, "b1 says the task is no longer cancellable"
        # An id naming no member of the map is asked of the broker the client was given, which knows no such task.
        with pytest.raises(cronoq.NotFound):
            await asker.status("b9:0123456789abcdef")


async def test_requests_about_a_down_member_s_task_fail_while_the_others_are_answered(two_members):
    c = two_members
    async with cronoq.connect(c.clients("b2"), request_timeout=5) as client:
        await client.pause("mine")
        stranded = await client.submit("stranded", pool="mine")
        assert (await client.status(stranded.id)).state == "queued"  # the connection to b1 is up
        c.members["b1"].kill()  # SIGKILL: no goodbye
        with pytest.raises(cronoq.Unavailable) as status_failed:
            await client.status(stranded.id)
        assert c.clients("b1") in str(status_failed.value), "the error names the member's address"
        with pytest.raises(cronoq.Unavailable):
            await client.cancel(stranded.id)
        # b2's pool, and b2's own tasks, carry on.
        elsewhere = await client.submit("elsewhere", pool="theirs")
        assert elsewhere.id.startswith("b2:")
        assert (await client.status(elsewhere.id)).state == "queued"


async def test_a_cluster_s_status_shows_each_pool_s_share_unit_rates_and_minimums_from_its_owner(tmp_path):
    # The merged statistics are the owner's own for each pool: asked of b1, b2's pool shows what it shares by,
    # its rates and its minimums, and b1's plain pool keeps its own (dispatches, none of either).
    c = Cluster(tmp_path, ["b1", "b2"])
    c.write('[[pools]]\nname = "plain"\nmember = "b1"\nfair_share = true\n'
            '[[pools]]\nname = "gpu"\nmember = "b2"\nshare_by = "runtime"\n'
            '[pools.tenant_weights]\nacme = 10\nglobex = 1\n'
            '[pools.tenant_rates]\nacme = 0.5\n[pools.tenant_minimums]\nglobex = 2\n')
    try:
        c.start("b1")
        c.start("b2")
        async with cronoq.connect(c.clients("b1")) as client:
            await client.pause("gpu")  # no worker either: what is submitted stays queued on b2
            for tenant in ("acme", "globex"):
                await client.submit("x", pool="gpu", tenant=tenant, cost=3)
            await client.submit("y", pool="plain", tenant="acme")
            stats = await client.stats()
        gpu, plain = stats["pools"]["gpu"], stats["pools"]["plain"]
        assert (gpu["member"], gpu["share_by"], gpu["share_unit"]) == ("b2", "runtime", "seconds")
        assert gpu["rates"]["acme"]["rate"] == 0.5 and not gpu["rates"]["acme"]["limited"]
        assert gpu["minimums"]["globex"] == {"minimum": 2, "running": 0, "under": True}
        assert (plain["member"], plain["share_by"], plain["share_unit"]) == ("b1", "dispatches", "dispatches")
        assert not plain.get("rates") and not plain.get("minimums")
        assert stats["members"]["b2"]["pools"]["gpu"]["rates"] == gpu["rates"]  # each member's answer is kept too

        # The command line shows the same, asked of b1, which does not own gpu.
        shown = run_command(["-m", "cronoq.client.cli", "status", "--broker", c.clients("b1")])
        assert shown.returncode == 0, shown.stderr
        gpu_text = shown.stdout.split("pool gpu", 1)[1].split("\npool ", 1)[0]
        assert "shares by runtime" in gpu_text and "rates (starts per second):" in gpu_text, shown.stdout
        assert "minimums (running of minimum):" in gpu_text and "globex" in gpu_text, shown.stdout
    finally:
        c.stop()
