"""A cluster of real broker processes on loopback: pools partitioned over members, clients and workers that
know one address only, a member killed -9 and restarted, a pool moved by a reload.

Every member is `cronoq-broker -c cluster.toml --member NAME` on one shared file, as in production.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

import cronoq
from tests.support import BEATS, HEARTBEAT, LIVENESS, BrokerProcess, free_port, run_command, until, wait_for_line

SIX_POOLS = ["p1", "p2", "p3", "p4", "p5", "p6"]
WEIGHTS = "[pools.tenant_weights]\nacme = 3\nglobex = 1\n"


class Cluster:
    """Members started from one config file; `config` is rewritten by `write`, members restarted by `restart`."""

    def __init__(self, tmp_path: Path, names: list[str]) -> None:
        self.tmp_path = tmp_path
        self.config = tmp_path / "cluster.toml"
        self.ports = {name: (free_port(), free_port()) for name in names}
        self.members: dict[str, BrokerProcess] = {}

    def write(self, pools: str, broker: str = "") -> None:
        members = "".join(
            f'[[cluster.members]]\nname = "{name}"\nclients = "tcp://127.0.0.1:{c}"\n'
            f'workers = "tcp://127.0.0.1:{w}"\n' for name, (c, w) in self.ports.items())
        self.config.write_text(f"[broker]\nheartbeat_interval = {HEARTBEAT}\nliveness = {LIVENESS}\n{broker}\n"
                               f"[cluster]\n{members}\n{pools}")

    def start(self, name: str) -> BrokerProcess:
        """Start member `name` (again, on the same data_dir, after a kill)."""
        self.members[name] = BrokerProcess(self.config, args=["--member", name, "--log-level", "INFO"],
                                           log=self.tmp_path / f"{name}.log").start()
        return self.members[name]

    def clients(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name][0]}"

    def workers(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name][1]}"

    def stop(self) -> None:
        for member in self.members.values():
            member.stop()


@pytest.fixture
def cluster(tmp_path) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(names: list[str]) -> Cluster:
        c = Cluster(tmp_path, names)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def six_pools(max_in_flight: bool = True) -> str:
    """p1..p6: two pinned to each member, the last two placed by hashing; 3:1 weights, one task at a time each."""
    pins = {"p1": "b1", "p2": "b2", "p3": "b3", "p4": "b1"}
    out = ""
    for pool in SIX_POOLS:
        out += f'[[pools]]\nname = "{pool}"\n'
        if pool in pins:
            out += f'member = "{pins[pool]}"\n'
        if max_in_flight:
            out += "max_in_flight = 1\n"
        out += WEIGHTS
    return out


def recording_pools(names: list[str]) -> tuple[list[cronoq.Pool], dict[str, itertools.count]]:
    """Pools whose handler returns [the pool's dispatch position, payload]."""
    counters = {name: itertools.count() for name in names}

    def handler(name: str) -> Any:
        async def run(payload: Any) -> Any:
            await asyncio.sleep(0)
            return [next(counters[name]), payload]
        return run

    return [cronoq.Pool(name, handler(name)) for name in names], counters


async def test_six_pools_over_three_members_keep_exact_fair_order_each(cluster):
    c = cluster(["b1", "b2", "b3"])
    c.write(six_pools())
    for name in ("b1", "b2", "b3"):
        c.start(name)
    pools, _ = recording_pools(SIX_POOLS)
    # The worker and the client each know one address only, of different members.
    worker = cronoq.Worker(c.workers("b2"), pools, concurrency=6, **BEATS)
    serving = asyncio.create_task(worker.run())
    try:
        async with cronoq.connect(c.clients("b3")) as client:
            cluster_map = await client.cluster()
            owners = {pool: m["name"] for m in cluster_map["members"] for pool in m["pools"]}
            assert set(owners) == set(SIX_POOLS) and set(owners.values()) == {"b1", "b2", "b3"}
            assert owners["p1"] == "b1" and owners["p2"] == "b2" and owners["p3"] == "b3"
            await until(lambda: _true(worker.registered and len(worker.members) == 3), "the worker serves all three")
            handles: dict[str, list] = {}
            for pool in SIX_POOLS:
                await client.pause(pool)
                handles[pool] = ([await client.submit("globex", pool=pool, tenant="globex") for _ in range(20)]
                                 + [await client.submit("acme", pool=pool, tenant="acme") for _ in range(60)])
            for pool in SIX_POOLS:
                assert {h.id.split(":")[0] for h in handles[pool]} == {owners[pool]}  # ids name their member
                await client.resume(pool)
            for pool in SIX_POOLS:
                results = [await h.result(timeout=60) for h in handles[pool]]
                order = [payload for _, payload in sorted(results)]
                assert Counter(order) == {"acme": 60, "globex": 20}
                assert order[:40] == ["globex", "acme", "acme", "acme"] * 10, (pool, order[:40])
            # status, cancel and stats reach the right member from this one connection.
            some = handles["p1"][0]
            assert (await client.status(some.id)).pool == "p1"
            stats = await client.stats()
            assert {name: p["member"] for name, p in stats["pools"].items()} == owners
            assert all("unreachable" not in answer for answer in stats["members"].values())
    finally:
        await worker.stop()
        await serving


async def test_a_member_refuses_another_members_pool_naming_the_owner(cluster):
    c = cluster(["b1", "b2"])
    c.write('[[pools]]\nname = "mine"\nmember = "b1"\n[[pools]]\nname = "theirs"\nmember = "b2"\n')
    c.start("b1")
    # Without routing, as a client in another language that never read the map would be.
    async with cronoq.Client(c.clients("b1"), routing=False) as direct:
        with pytest.raises(cronoq.FailedPrecondition) as refused:
            await direct.submit(1, pool="theirs")
        assert refused.value.details == {"member": "b2", "pool": "theirs"}
        assert "belongs to cluster member 'b2'" in str(refused.value)
        with pytest.raises(cronoq.NotFound):
            await direct.submit(1, pool="nobody-declares-it")
        assert (await direct.submit(1, pool="mine")).id.startswith("b1:")


async def test_a_member_killed_stalls_only_its_pools_and_loses_nothing_acknowledged(cluster, tmp_path):
    c = cluster(["b1", "b2", "b3"])
    c.write(six_pools(max_in_flight=False))
    for name in ("b1", "b2", "b3"):
        c.start(name)
    pools, _ = recording_pools(SIX_POOLS)
    worker = cronoq.Worker(c.workers("b1"), pools, concurrency=6, **BEATS)
    serving = asyncio.create_task(worker.run())
    try:
        async with cronoq.connect(c.clients("b1"), request_timeout=3) as client:
            cluster_map = await client.cluster()
            owners = {pool: m["name"] for m in cluster_map["members"] for pool in m["pools"]}
            victim_pools = [pool for pool in SIX_POOLS if owners[pool] == "b3"]
            other_pools = [pool for pool in SIX_POOLS if owners[pool] != "b3"]
            await until(lambda: _true(worker.registered and len(worker.members) == 3), "the worker serves all three")
            # Acknowledged but not run: b3's pools are paused when it dies.
            for pool in victim_pools:
                await client.pause(pool)
            held = {pool: [await client.submit(i, pool=pool) for i in range(50)] for pool in victim_pools}
            c.members["b3"].kill()  # SIGKILL: no flush, no goodbye
            # The other members keep serving.
            others = [await client.submit(i, pool=pool) for pool in other_pools for i in range(20)]
            assert [len(await h.result(timeout=30)) for h in others] == [2] * len(others)
            with pytest.raises(cronoq.Unavailable):
                await client.submit("lost?", pool=victim_pools[0])
            status = run_command(["-m", "cronoq.client.cli", "status", "--broker", c.clients("b2"), "--timeout", "2"])
            assert status.returncode == 0, status.stderr
            assert "member b3: UNREACHABLE" in status.stdout and "member b1: pools" in status.stdout
            # Restarted on the same data_dir, b3 still holds every acknowledged task (paused, as it was).
            c.start("b3")
            for pool in victim_pools:
                await until(lambda: _answers(client, held[pool][0].id), "b3 answers again", timeout=30)
                await client.resume(pool)
            for pool in victim_pools:
                assert sorted(p for _, p in [await h.result(timeout=30) for h in held[pool]]) == list(range(50))
    finally:
        await worker.stop()
        await serving


async def test_a_reload_moves_a_pool_which_drains_on_its_old_member(cluster):
    c = cluster(["b1", "b2"])
    pools_before = ('[[pools]]\nname = "moving"\nmember = "b1"\nmax_in_flight = 1\n'
                    '[[pools]]\nname = "staying"\nmember = "b2"\n')
    c.write(pools_before)
    c.start("b1")
    c.start("b2")
    release = asyncio.Event()
    runs: Counter = Counter()
    ran_on: dict[Any, str] = {}

    async def held(payload: Any) -> Any:
        await release.wait()
        runs[payload] += 1
        return payload

    worker = cronoq.Worker(c.workers("b2"), [cronoq.Pool("moving", held), cronoq.Pool("staying", held)],
                           concurrency=4, **BEATS)
    serving = asyncio.create_task(worker.run())
    try:
        async with cronoq.connect(c.clients("b2")) as client:
            await until(lambda: _true(worker.members.get("b1") == ["moving"]), "the worker serves moving on b1")
            old = [await client.submit(f"old-{i}", pool="moving") for i in range(10)]
            assert all(h.id.startswith("b1:") for h in old)
            # Move the pool; both members reread the same file.
            c.write(pools_before.replace('member = "b1"', 'member = "b2"'))
            for member in c.members.values():
                member.proc.send_signal(signal.SIGHUP)
            await until(lambda: _owner_is(c.clients("b1"), "moving", "b2"), "b1 reloaded")
            await until(lambda: _owner_is(c.clients("b2"), "moving", "b2"), "b2 reloaded")
            # The client still has the old map: b1 refuses, naming b2; the client rereads the map and retries.
            new = [await client.submit(f"new-{i}", pool="moving") for i in range(10)]
            assert all(h.id.startswith("b2:") for h in new)
            await until(lambda: _true(worker.members.get("b2") == ["moving", "staying"]
                                      and "moving" in worker.members.get("b1", [])),
                        "the worker serves moving on both members")
            release.set()
            for h in old + new:
                ran_on[await h.result(timeout=30)] = h.id.split(":")[0]
            assert all(ran_on[f"old-{i}"] == "b1" and ran_on[f"new-{i}"] == "b2" for i in range(10))
            assert set(runs.values()) == {1}, runs  # nothing ran twice
            # Once drained, b1 lets the pool go, and the worker stops serving b1.
            await until(lambda: _true("b1" not in worker.members), "b1 drained and the worker left it", timeout=30)
            stats = await client.stats()
            assert stats["pools"]["moving"]["member"] == "b2"
    finally:
        release.set()
        await worker.stop()
        await serving


async def _true(value: bool) -> bool:
    return value


async def _answers(client: cronoq.Client, task_id: str) -> bool:
    try:
        await client.status(task_id)
        return True
    except cronoq.Unavailable:
        return False


async def _owner_is(address: str, pool: str, member: str) -> bool:
    async with cronoq.Client(address, routing=False, request_timeout=2) as direct:
        value = await direct.cluster()
    return any(pool in m["pools"] and m["name"] == member for m in value["members"])


async def test_a_member_restarted_while_it_drains_a_moved_pool_still_runs_its_tasks(cluster):
    c = cluster(["b1", "b2"])
    pools_before = '[[pools]]\nname = "moving"\nmember = "b1"\n'
    c.write(pools_before)
    c.start("b1")
    c.start("b2")
    async with cronoq.connect(c.clients("b1")) as client:
        old = [await client.submit(f"old-{i}", pool="moving") for i in range(5)]  # no worker yet: queued on b1
        c.write(pools_before.replace('"b1"', '"b2"'))
        for member in c.members.values():
            member.proc.send_signal(signal.SIGHUP)
        await until(lambda: _owner_is(c.clients("b1"), "moving", "b2"), "b1 reloaded")
        c.members["b1"].stop()
        c.start("b1")  # recovers the pool's tasks though it owns the pool no more: it drains them
        async with cronoq.Client(c.clients("b1"), routing=False) as direct:
            assert (await direct.cluster())["draining"] == ["moving"]

        async def echo(payload: Any) -> Any:
            return payload

        worker = cronoq.Worker(c.workers("b2"), [cronoq.Pool("moving", echo)], concurrency=2, **BEATS)
        serving = asyncio.create_task(worker.run())
        try:
            assert [await h.result(timeout=30) for h in old] == [f"old-{i}" for i in range(5)]
            assert (await client.submit("new", pool="moving")).id.startswith("b2:")
        finally:
            await worker.stop()
            await serving


async def test_a_member_s_standby_takes_over_for_the_clients_and_workers_of_the_cluster(cluster, tmp_path):
    """b1 lists a primary and a standby: after kill -9 of its primary, a client and a worker that were given
    b2's address only carry on with b1's pool through the standby, and b2's pool never stops."""
    c = cluster(["b1", "b2"])
    (c1, w1), (s1, sw1), (c2, w2) = c.ports["b1"], (free_port(), free_port()), c.ports["b2"]
    c.config.write_text(
        f"[broker]\nheartbeat_interval = {HEARTBEAT}\nliveness = {LIVENESS}\n\n[cluster]\n"
        f'[[cluster.members]]\nname = "b1"\nclients = ["tcp://127.0.0.1:{c1}", "tcp://127.0.0.1:{s1}"]\n'
        f'workers = ["tcp://127.0.0.1:{w1}", "tcp://127.0.0.1:{sw1}"]\n'
        f'[[cluster.members]]\nname = "b2"\nclients = "tcp://127.0.0.1:{c2}"\nworkers = "tcp://127.0.0.1:{w2}"\n\n'
        '[[pools]]\nname = "one"\nmember = "b1"\n[[pools]]\nname = "two"\nmember = "b2"\n')
    primary = c.start("b1")
    c.start("b2")
    standby = BrokerProcess(c.config, args=["--member", "b1", "--standby", "--log-level", "INFO", "--clients",
                                            f"tcp://127.0.0.1:{s1}", "--workers", f"tcp://127.0.0.1:{sw1}"],
                            log=tmp_path / "b1-standby.log").start(wait=False)
    c.members["b1-standby"] = standby
    line = wait_for_line(standby.proc, standby.log, "cronoq broker standing by")
    assert "cluster member b1's data_dir" in line

    async def echo(payload: Any) -> Any:
        return payload

    worker = cronoq.Worker(c.workers("b2"), [cronoq.Pool("one", echo), cronoq.Pool("two", echo)], concurrency=4,
                           **BEATS)
    serving = asyncio.create_task(worker.run())
    try:
        async with cronoq.connect(c.clients("b2"), request_timeout=60) as client:
            before = [await client.submit(n, pool="one") for n in range(10)]
            assert [await h.result(timeout=30) for h in before] == list(range(10))
            assert all(h.id.startswith("b1:") for h in before)
            primary.kill()
            during = [asyncio.ensure_future(client.submit(n, pool="one")) for n in range(10, 20)]
            assert await (await client.submit("still", pool="two")).result(timeout=30) == "still"
            await asyncio.to_thread(standby.wait_ready)
            after = await asyncio.gather(*during)
            assert [await h.result(timeout=60) for h in after] == list(range(10, 20))
            assert (await client.status(before[0].id)).state == "succeeded"  # b1's state came over with it
    finally:
        await worker.stop(now=True)
        await serving
