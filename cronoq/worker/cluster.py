"""The cluster worker: a router over one `Runner` per member, following the cluster's map.

A worker whose broker turns out to be a cluster member (the first answer to its `cluster` question, see
`cronoq.worker.runner`) serves the cluster through a `ClusterWorker`: one runner per member that owns some of
its pools, each with a connection of its own to that member's worker addresses (its primary and standbys)
and a share of the slots. It follows the map as the members report it: a pool a reload moved is served on
its old member until drained and on its new one from then on. A member's map is only followed from that
member (`cronoq.wire.clustermap.not_from`): a peer at its address claiming to be another is ignored.

Which member gets which pools, and how the slots are split, are pure functions here (`wanted_pools`,
`split_slots`) over the cluster map (docs/protocol.md, "Clusters").

The credit is split, not shared. A broker only ever holds the credit a worker gave it, and the protocol has
no way to take credit back from an idle member, so a budget shared on the fly would mean granting one slot
at a time and a round trip per task. A static split costs nothing per task and can never exceed
`concurrency`. Each member that owns some of the worker's pools gets a share in proportion to how many of
them it owns (at least one slot each); the worker also runs at most `concurrency` handlers at once whatever
the brokers hand it, so a map change that shrinks a share while its slots are busy cannot push it over.
docs/scaling.md says what this costs and when to run one worker per member instead.

Leans on `cronoq.worker.runner` (the per-member loop), the wire and `cronoq.pool`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cronoq.errors import CronoqError, InvalidArgument, Unavailable
from cronoq.pool import Pool
from cronoq.wire import protocol
from cronoq.wire.clustermap import not_from
from cronoq.wire.dealer import broker_dealer
from cronoq.wire.link import parse_addresses
from cronoq.wire.transport import Channel
from cronoq.worker.runner import Runner

log = logging.getLogger("cronoq.worker")

PROBE_BEATS = 20
"""Every this many heartbeats, the members the worker has no runner for are asked whether they still drain a
pool of it (only a member knows: after its restart, say)."""


def wanted_pools(value: Mapping[str, Any], mine: Iterable[str],
                 draining: Mapping[str, Iterable[str]]) -> dict[str, tuple[list[str], list[str]]]:
    """Per member name: (the worker's pools it owns, the worker's pools it is still draining), for each member
    with either. `draining` holds what each member last said it drains (only a member knows its own)."""
    mine = list(mine)
    out: dict[str, tuple[list[str], list[str]]] = {}
    for member in value.get("members", ()):
        name = member["name"]
        owned = set(member.get("pools", ()))
        here = [pool for pool in mine if pool in owned]
        drains = set(draining.get(name, ()))
        leftover = [pool for pool in mine if pool in drains and pool not in owned]
        if here or leftover:
            out[name] = (here, leftover)
    return out


def split_slots(concurrency: int, owned: Mapping[str, int]) -> dict[str, int]:
    """`concurrency` slots over the members, in proportion to how many of the worker's pools each owns (largest
    remainders first, ties by name), at least one each. InvalidArgument when there are more members than slots."""
    if not owned:
        return {}
    if len(owned) > concurrency:
        raise InvalidArgument(
            f"concurrency {concurrency} is less than the {len(owned)} cluster members that own this worker's pools "
            f"({', '.join(sorted(owned))}); give it at least {len(owned)}, or run one worker per member")
    weights = {name: max(1, count) for name, count in owned.items()}
    total = sum(weights.values())
    exact = {name: concurrency * w / total for name, w in weights.items()}
    shares = {name: max(1, int(x)) for name, x in exact.items()}
    # Largest remainders: take from those furthest above their exact share, give to those furthest below.
    while sum(shares.values()) > concurrency:
        name = max((n for n in shares if shares[n] > 1), key=lambda n: (shares[n] - exact[n], n))
        shares[name] -= 1
    while sum(shares.values()) < concurrency:
        name = max(shares, key=lambda n: (exact[n] - shares[n], n))
        shares[name] += 1
    return shares


class ClusterWorker:
    """Serves `pools` on the members of a cluster, `concurrency` handlers at once over all of them, in the
    threads of `executor`; `token` and `server_key` as a `Runner` takes them."""

    def __init__(self, pools: dict[str, Pool], *, concurrency: int, token: bytes, server_key: bytes | None,
                 heartbeat_interval: float, liveness: int, executor: ThreadPoolExecutor) -> None:
        self.pools = pools
        self.concurrency = concurrency
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self._token = token
        self._server_key = server_key
        self._executor = executor
        self._gate = asyncio.Semaphore(concurrency)  # at most `concurrency` handlers at once, over every member
        self._members: dict[str, Runner] = {}
        self._member_runs: dict[str, asyncio.Task[None]] = {}
        self._draining: dict[str, list[str]] = {}  # what each member last said it drains
        self._map: Any = None  # the latest cluster map heard, and the version whose members were last probed
        self._probed: str | None = None
        self._probes: set[asyncio.Task[None]] = set()
        self._rids = itertools.count(1)
        self._beats = 0
        self._stopping = False
        self._stopped = asyncio.Event()
        self._fatal: CronoqError | None = None
        self._retired_finished = 0  # what the runners of members this worker left had done
        self._retired_abandoned = 0

    @property
    def registered(self) -> bool:
        """Whether every member serving this worker's pools has accepted it (and there is one)."""
        return bool(self._members) and all(m.registered for m in self._members.values())

    @property
    def running(self) -> int:
        return sum(m.running for m in self._members.values())

    @property
    def members(self) -> dict[str, list[str]]:
        """The pools this worker serves on each member."""
        return {name: list(m.pools) for name, m in self._members.items()}

    @property
    def finished(self) -> int:
        return self._retired_finished + sum(m.finished for m in self._members.values())

    @property
    def abandoned(self) -> int:
        return self._retired_abandoned + sum(m.abandoned for m in self._members.values())

    # ----------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Serve until `stop()`: the runners keep their own connections alive; this beats only to probe the
        members without one. Raises what stopped a member's runner by itself (a refusal), as it would alone."""
        try:
            while not self._stopped.is_set():
                try:
                    await asyncio.wait_for(self._stopped.wait(), self.heartbeat_interval)
                except asyncio.TimeoutError:
                    self._beats += 1
                    if self._beats % PROBE_BEATS == 0 and self._map is not None:
                        self._probe_others(self._map)
            if self._fatal is not None:
                raise self._fatal
        finally:
            for probe in list(self._probes):
                probe.cancel()
            for member in list(self._members.values()):
                await member.stop(now=True)

    async def stop(self, *, now: bool = False) -> None:
        """Stop every member's runner: gracefully (each finishes its running tasks), or at once."""
        if not now and self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        if now:
            for member in list(self._members.values()):
                await member.stop(now=True)
        else:
            await asyncio.gather(*(member.stop() for member in list(self._members.values())))
        self._stopped.set()

    def _fail(self, error: CronoqError) -> None:
        self._fatal = error
        self._stopped.set()

    # ----------------------------------------------------------------- the map

    def follow(self, value: Any) -> None:
        """Serve the map `value`: start, retarget or stop member runners so that each member that owns (or still
        drains) some of this worker's pools serves them with its share of the slots."""
        if self._stopping:
            return
        member_name = value.get("member")
        if isinstance(member_name, str):
            self._draining[member_name] = list(value.get("draining", ()))
        self._map = value
        if value.get("version") != self._probed:
            self._probed = value.get("version")
            self._probe_others(value)
        wanted = wanted_pools(value, self.pools, self._draining)
        try:
            shares = split_slots(self.concurrency, {name: len(owned) for name, (owned, _) in wanted.items()})
        except InvalidArgument as exc:
            if not self._members:
                log.error("cannot serve: %s", exc)
                self._fail(exc)
                return
            log.error("%s; serving with one slot per member (at most %d handlers run at once)", exc, self.concurrency)
            shares = {name: 1 for name in wanted}
        addresses = {m["name"]: m.get("workers") or [] for m in value.get("members", ())}
        for name, (owned, leftover) in wanted.items():
            member = self._members.get(name)
            # Only a member knows which pools it still drains: another's map may add pools to its runner, never
            # take them away.
            keep = set(owned) | set(leftover) | (set() if member is None or name == member_name else set(member.pools))
            pools = [self.pools[p] for p in self.pools if p in keep]
            if member is None:
                if not addresses.get(name):
                    continue
                self._start_member(name, addresses[name], pools, shares[name])
            else:
                member.retarget(pools, shares[name])
        for name in list(self._members):
            if name not in wanted and name == member_name:
                log.info("cluster member %s no longer owns any of this worker's pools: leaving it", name)
                asyncio.get_running_loop().create_task(self._leave(self._members.pop(name)))

    async def _leave(self, member: Runner) -> None:
        """Stop a member's runner gracefully, keeping what it did in the worker's counts."""
        await member.stop()
        self._retired_finished += member.finished
        self._retired_abandoned += member.abandoned

    def _heard_from(self, name: str, address: str, value: Any) -> None:
        """A map member `name`'s runner heard at `address`: followed if it is that member's own."""
        if _speaks_for(value, name, address):
            self.follow(value)

    def _start_member(self, name: str, addresses: list[str], pools: list[Pool], share: int) -> None:
        """Serve `pools` on member `name` with `share` slots, through a connection of its own to the member's
        worker addresses (its primary and standbys: only the one that serves takes the connection)."""
        brokers = parse_addresses(list(addresses), "broker address")
        runner = Runner(brokers, {pool.name: pool for pool in pools}, concurrency=share, token=self._token,
                        server_key=self._server_key, heartbeat_interval=self.heartbeat_interval,
                        liveness=self.liveness, gate=self._gate, member=name,
                        on_map=functools.partial(self._heard_from, name, " or ".join(brokers)))
        self._members[name] = runner
        run = asyncio.get_running_loop().create_task(runner.run(self._executor))
        self._member_runs[name] = run
        run.add_done_callback(functools.partial(self._member_ended, name))

    def _member_ended(self, name: str, run: asyncio.Task[None]) -> None:
        """A member's runner stopped: by itself only on a refusal, which stops the whole worker as it would alone."""
        if self._member_runs.get(name) is run:
            del self._member_runs[name]
        if run.cancelled() or self._stopping:
            return
        error = run.exception()
        if error is not None and self._fatal is None:
            self._fail(error if isinstance(error, CronoqError) else Unavailable(str(error)))

    # ----------------------------------------------------------------- probes

    def _probe_others(self, value: Any) -> None:
        """Ask each member this worker has no runner for (save the one that answered `value`) for its own map: it
        may still drain a pool of this worker, which only its own answer says."""
        for member in value.get("members", ()):
            name, workers = member.get("name"), member.get("workers") or []
            if name in self._members or name == value.get("member") or not workers:
                continue
            probe = asyncio.get_running_loop().create_task(self._probe(name, workers[0]))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

    async def _probe(self, name: str, address: str) -> None:
        """One `cluster` question to member `name`'s worker endpoint at `address`, on a socket of its own; its
        answer is followed like a member's runner's, if it is `name`'s. No answer within a liveness period: the
        next probe asks again."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        rid = next(self._rids)

        def on_message(frames: list[bytes]) -> None:
            try:
                commands = protocol.unbatch(protocol.decode_worker_command(frames[0]),
                                            frames[1] if len(frames) > 1 else None)
            except CronoqError:
                return
            for command, _ in commands:
                if isinstance(command, protocol.Ok) and command.rid == rid and not answer.done():
                    answer.set_result(command.value)

        try:
            # Not ZMQ_IMMEDIATE: the one question is queued before its connection completes.
            sock, _ = broker_dealer([address], server_key=self._server_key, immediate=False, monitored=False)
        except InvalidArgument:
            return
        channel = Channel(sock, on_message, pack=functools.partial(protocol.pack, protocol.WorkerBatch),
                          prefix=[self._token])
        try:
            channel.post(protocol.ClusterRequest(protocol.PROTOCOL_VERSION, rid))
            value = await asyncio.wait_for(answer, self.heartbeat_interval * self.liveness)
        except asyncio.TimeoutError:
            return
        finally:
            channel.close()
        if value is not None and not self._stopping and _speaks_for(value, name, address):
            self.follow(value)


def _speaks_for(value: Any, member: str, address: str) -> bool:
    """Whether a map heard at `address`, which the map followed so far gives as member `member`'s, may be
    followed (cronoq.wire.clustermap.not_from); an impostor's is not, and a WARNING says so."""
    why = not_from(value, member)
    if why is not None:
        log.warning("ignoring a cluster map from %s: %s", address, why)
    return why is None
