"""The cluster client: a router over one `Connection` per member, and the map it routes by.

`cronoq.connect(addr)` starts with one connection, to the broker at the addresses given (the seed). When that
broker's `hello` names a cluster member, the `Router` asks it for the cluster map (`cluster`) and from then on
sends each request where it belongs: a submit (and pause, resume) to the member that owns its pool
(`Router.at_owner`), a task id's requests (result, status, explain, cancel) to the member whose name starts
the id (`Router.for_task`), `stats` to every member (`cluster_stats`). A member that refuses a pool with
FAILED_PRECONDITION naming another owner (a reload moved the pool) makes the router read the map again and
retry once, at the new owner. A lone broker's requests all go to the seed, as if there were no router.

Each member's connection is an ordinary one-broker `Connection` (`cronoq.client.connection`), made from the
member's addresses: the first is the primary, the others its standbys. This module leans on it and on
`cronoq.wire.clustermap` (how a task id names its member, whose map may be followed); nothing here talks to
a socket itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from cronoq.client.connection import Connection
from cronoq.errors import CronoqError, FailedPrecondition, NotFound, Unavailable
from cronoq.wire.clustermap import member_of_task, not_from

T = TypeVar("T")

log = logging.getLogger("cronoq.client")

STATS_WAIT = 5.0
"""Seconds `stats` waits for each member at most (fewer when the client's request_timeout is shorter)."""


class ClusterRoutes:
    """The latest cluster map a client learnt, and a connection to each of its members.

    `connect` makes the connection to one member from its client addresses (a primary, then standbys).
    """

    def __init__(self, connect: Callable[[Sequence[str]], Connection]) -> None:
        self._connect = connect
        self.version: str | None = None
        self.members: dict[str, Connection] = {}
        self._addresses: dict[str, tuple[str, ...]] = {}
        self._owners: dict[str, str] = {}

    def update(self, value: Any) -> None:
        """Take a `cluster` answer: open connections to new members (or to new addresses), forget the old."""
        if not isinstance(value, dict) or not isinstance(value.get("members"), list):
            raise Unavailable(f"the broker answered `cluster` with something that is no cluster map: {value!r}")
        owners: dict[str, str] = {}
        addresses: dict[str, tuple[str, ...]] = {}
        for member in value["members"]:
            name, clients = member.get("name"), member.get("clients")
            if not isinstance(name, str) or not isinstance(clients, list) or not clients:
                raise Unavailable(f"the cluster map lists a member without a name or client addresses: {member!r}")
            addresses[name] = tuple(clients)
            for pool in member.get("pools", ()):
                owners[pool] = name
        for name, conn in list(self.members.items()):
            if addresses.get(name) != self._addresses.get(name):
                # Gone from the map, or moved: its requests in flight finish; new ones go to the new address.
                del self.members[name]
                asyncio.get_running_loop().create_task(conn.close())
        for name, clients in addresses.items():
            if name not in self.members:
                self.members[name] = self._connect(clients)
        self._addresses, self._owners = addresses, owners
        self.version = value.get("version")

    def update_from(self, conn: Connection, value: Any) -> None:
        """Take a `cluster` answer heard on member connection `conn`: only if it is that member's own (a peer at
        its address claiming to be another member is ignored, with a WARNING: cronoq.wire.clustermap.not_from)."""
        name = next((n for n, c in self.members.items() if c is conn), None)
        why = None if name is None else not_from(value, name)
        if why is not None:
            log.warning("ignoring a cluster map from %s: %s", " or ".join(self._addresses.get(name, ())), why)
            return
        self.update(value)

    def owner(self, pool: str) -> str | None:
        """The member that owns `pool` by the map, or None for a pool the map does not list."""
        return self._owners.get(pool)

    def for_pool(self, pool: str) -> Connection | None:
        """The connection to the owner of `pool`; None when the map does not know the pool."""
        owner = self._owners.get(pool)
        return None if owner is None else self.members.get(owner)

    def for_task(self, task_id: str) -> Connection | None:
        """The connection to the member whose name starts `task_id`; None for an id that names no member."""
        member = member_of_task(task_id) if isinstance(task_id, str) else None
        return None if member is None else self.members.get(member)

    async def close(self) -> None:
        """Close every member's connection."""
        members, self.members = self.members, {}
        for conn in members.values():
            await conn.close()


def moved_to(exc: CronoqError) -> str | None:
    """The member a FAILED_PRECONDITION says owns the pool instead, or None for any other refusal."""
    if isinstance(exc, FailedPrecondition) and isinstance(exc.details, dict):
        member = exc.details.get("member")
        return member if isinstance(member, str) else None
    return None


class Router:
    """Where each request of a client goes: to the seed `Connection` of a lone broker, or to the member of a
    cluster it concerns, over a connection of that member's own made by `connect` (from the member's client
    addresses: a primary, then its standbys)."""

    def __init__(self, seed: Connection, connect: Callable[[Sequence[str]], Connection]) -> None:
        self.seed = seed
        self._connect = connect
        self.routes: ClusterRoutes | None = None
        seed.on_member = self._learn_early

    def _learn_early(self) -> None:
        """The seed's broker said it is a cluster member: ask for the map now, so the first request need not."""
        if self.routes is None:
            self.seed.ask_cluster()

    @property
    def lone(self) -> bool:
        """The seed's broker is known to be a lone broker: every request is the seed's, without waiting."""
        return self.seed.heard_hello and self.seed.member is None

    async def routing(self) -> ClusterRoutes | None:
        """The cluster's routes, learning them first if need be (the seed's `hello`, then its map); None for a
        lone broker. Raises what the seed's `hello` met if it could not tell (see `Connection.rules`)."""
        seed = self.seed
        if self.lone:
            return None
        if await seed.rules() is None:
            return None
        if self.routes is None:
            value = await seed.cluster()
            if value is None:  # the broker left its cluster since its hello (a restart with another config)
                return None
            if self.routes is None:  # (unless another request learnt them meanwhile)
                routes = ClusterRoutes(self._connect)
                routes.update(value)
                self.routes = routes
        return self.routes

    async def for_task(self, task_id: Any) -> Connection:
        """The connection that knows `task_id`: the member's its id names (learning the map if need be), else
        the seed's. An id that names no member is the seed's at once, without waiting for its `hello`."""
        if not isinstance(task_id, str) or member_of_task(task_id) is None:
            return self.seed
        routes = await self.routing()
        return (None if routes is None else routes.for_task(task_id)) or self.seed

    async def at_owner(self, pool: str, call: Callable[[Connection], Awaitable[T]]) -> T:
        """`call` on the connection to `pool`'s owner: the seed for a lone broker, or for a pool the map does not
        know (it answers NOT_FOUND as a lone broker would). A refusal naming another owner re-reads the map from
        the member that refused, and tries once more at the owner."""
        routes = await self.routing()
        if routes is None:
            return await call(self.seed)
        conn = routes.for_pool(pool) or self.seed
        try:
            return await call(conn)
        except FailedPrecondition as exc:
            owner = moved_to(exc)
            if owner is None:
                raise
            await self._reread(conn)
            again = routes.for_pool(pool)
            if again is None or again is conn:
                again = routes.members.get(owner)
            if again is None:
                raise
            return await call(again)

    async def _reread(self, conn: Connection) -> None:
        """Read the cluster map again, from `conn`'s member (it refused a pool: it has the newer config)."""
        assert self.routes is not None
        value = await conn.cluster()
        if value is not None:
            self.routes.update_from(conn, value)

    def learnt(self, value: Any) -> None:
        """A map the seed's broker gave (`Client.cluster()`): follow it, once routing has begun."""
        if value is not None and self.routes is not None:
            self.routes.update(value)

    async def close(self) -> None:
        """Close every member's connection (not the seed's: its owner closes that)."""
        if self.routes is not None:
            routes, self.routes = self.routes, None
            await routes.close()


async def cluster_stats(routes: ClusterRoutes, wait: float) -> dict[str, Any]:
    """Every member's `stats`, waiting `wait` seconds for each at most, merged: `pools` holds every member's
    pools (each with its `member`), `workers` the sum, `members` each member's own answer, or for a member
    that did not answer `{"unreachable": why}`."""
    names = list(routes.members)

    async def ask(conn: Connection) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(conn.stats(), wait)
        except (asyncio.TimeoutError, TimeoutError):
            return {"unreachable": f"no answer within {wait:g} s"}
        except CronoqError as exc:
            if isinstance(exc, NotFound) or exc.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                raise
            return {"unreachable": f"{exc.code}: {exc}"}

    answers = await asyncio.gather(*(ask(routes.members[name]) for name in names))
    pools: dict[str, Any] = {}
    workers = 0
    for name, answer in zip(names, answers):
        workers += answer.get("workers", 0)
        for pool, pool_stats in answer.get("pools", {}).items():
            if pool in pools and not pool_stats.get("draining"):
                pools[pool] = {**pool_stats, "member": name}  # the owner's entry wins over a draining one
            elif pool not in pools:
                pools[pool] = {**pool_stats, "member": name}
    return {"cluster": routes.version, "members": dict(zip(names, answers)), "pools": pools, "workers": workers}
