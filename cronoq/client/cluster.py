"""A client's view of a cluster: the map it learnt, one connection per member, and where each request goes.

`cronoq.connect(addr)` talks to one broker. When that broker's `hello` names a cluster member, the client asks
it for the cluster map (`cluster`) and from then on routes by itself: a submit (and pause, resume) to the
member that owns its pool, a task id's requests (result, status, cancel) to the member whose name starts the
id, `stats` to every member. A member that refuses a pool with FAILED_PRECONDITION naming another owner (a
reload moved the pool) makes the client read the map again and retry once, at the new owner.

Each member's connection is an ordinary single-broker `Client`, made by `member_connection` from the
member's addresses: the first is the primary, the others its standbys.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence, TypeVar

from cronoq.wire.clustermap import member_of_task, not_from
from cronoq.errors import CronoqError, FailedPrecondition, NotFound, Unavailable

if TYPE_CHECKING:
    from cronoq.client.connection import Client

T = TypeVar("T")

log = logging.getLogger("cronoq.client")

STATS_WAIT = 5.0
"""Seconds `stats` waits for each member at most (fewer when the client's request_timeout is shorter)."""


class ClusterRoutes:
    """The latest cluster map a client learnt, and a connection to each of its members.

    `connect` makes the connection to one member from its client addresses (a primary, then standbys).
    """

    def __init__(self, connect: Callable[[Sequence[str]], "Client"]) -> None:
        self._connect = connect
        self.version: str | None = None
        self.members: dict[str, "Client"] = {}
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

    def update_from(self, conn: "Client", value: Any) -> None:
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

    def for_pool(self, pool: str) -> "Client | None":
        """The connection to the owner of `pool`; None when the map does not know the pool."""
        owner = self._owners.get(pool)
        return None if owner is None else self.members.get(owner)

    def for_task(self, task_id: str) -> "Client | None":
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


async def routed(routes: ClusterRoutes, pool: str, fallback: "Client", call: Callable[["Client"], Awaitable[T]],
                 refresh: Callable[["Client"], Awaitable[None]]) -> T:
    """`call` on the connection to `pool`'s owner (`fallback` for a pool the map does not know: it answers
    NOT_FOUND as a lone broker would). A refusal naming another owner re-reads the map from the member that
    refused, and tries once more at the owner."""
    conn = routes.for_pool(pool) or fallback
    try:
        return await call(conn)
    except FailedPrecondition as exc:
        owner = moved_to(exc)
        if owner is None:
            raise
        await refresh(conn)
        again = routes.for_pool(pool)
        if again is None or again is conn:
            again = routes.members.get(owner)
        if again is None:
            raise
        return await call(again)


async def cluster_stats(routes: ClusterRoutes, wait: float) -> dict[str, Any]:
    """Every member's `stats`, waiting `wait` seconds for each at most, merged: `pools` holds every member's
    pools (each with its `member`), `workers` the sum, `members` each member's own answer, or for a member
    that did not answer `{"unreachable": why}`."""
    names = list(routes.members)

    async def ask(conn: "Client") -> dict[str, Any]:
        try:
            return await asyncio.wait_for(conn._stats_here(), wait)
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
