"""The public client, `cronoq.Client` (`cronoq.connect`): one broker's connection, or a router over a cluster's.

A client is given addresses: one broker's primary and standbys, or any member of a cluster. It cannot know
which until the broker's `hello` says, so it always starts with one `Connection` to the addresses given
(`cronoq.client.connection`) and, unless made with `routing=False`, a `Router` over it
(`cronoq.client.cluster`) that sends every request to the seed for a lone broker and to the member it
concerns in a cluster. This module only wires the two together and keeps the public signatures
(docs/api.md, "Clients"); what a request does is theirs.
"""

from __future__ import annotations

import os
import time
from typing import Any, Awaitable, Callable, Generator, Sequence, TypeVar

from cronoq.answers import Explanation, TaskInfo, seconds_from_now
from cronoq.client.cluster import STATS_WAIT, Router, cluster_stats
from cronoq.client.connection import DEFAULT_CLIENT_ADDRESS, DEFAULT_REQUEST_TIMEOUT, Connection
from cronoq.handles import TaskHandle

T = TypeVar("T")

__all__ = ["Client", "DEFAULT_CLIENT_ADDRESS", "DEFAULT_REQUEST_TIMEOUT", "connect"]


class Client:
    """A connection to a broker's client endpoint (or to a cluster's members). Await it, or use it as an async
    context manager."""

    def __init__(self, address: str | Sequence[str] = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
                 *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 curve_public_key: str | bytes | os.PathLike[str] | None = None, routing: bool = True) -> None:
        self._token = token
        self._curve_public_key = curve_public_key
        self._connection = Connection(address, token, request_timeout=request_timeout,
                                      curve_public_key=curve_public_key)
        self._router = Router(self._connection, self._member_connection) if routing else None
        self.addresses = self._connection.addresses
        """Every address given: one broker's primary and standbys (one DEALER connects to them all, and only the
        one that serves takes requests), or seeds of a cluster (any member's address will do; each member then
        gets a connection of its own, to its primary and standbys)."""
        self.address = self._connection.address

    @property
    def request_timeout(self) -> float:
        """Seconds a request waits for its reply before it fails with Unavailable (each member's connection too)."""
        return self._connection.request_timeout

    @property
    def max_payload_bytes(self) -> int | None:
        """The broker's max_payload_bytes as it last said (on connecting); None until it has, or if it never
        says (an older broker): `submit` then leaves the check to the broker."""
        return self._connection.max_payload_bytes

    @property
    def reconnects(self) -> int:
        """How many times the connection to the broker was made again (and outstanding requests re-sent)."""
        return self._connection.reconnects

    # ----------------------------------------------------------------- lifecycle

    def __await__(self) -> Generator[Any, None, "Client"]:
        return self._open().__await__()

    async def __aenter__(self) -> "Client":
        return await self._open()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def _open(self) -> "Client":
        self._connection.start()
        return self

    async def close(self) -> None:
        """Close the connection (every member's, in a cluster); requests still waiting fail with Unavailable."""
        if self._router is not None:
            await self._router.close()
        await self._connection.close()

    def _member_connection(self, addresses: Sequence[str]) -> Connection:
        """The connection to one member of a cluster, from its client addresses (a primary, then its standbys)."""
        conn = Connection(list(addresses), self._token, request_timeout=self.request_timeout,
                          curve_public_key=self._curve_public_key)
        conn.start()
        return conn

    async def _for_task(self, task_id: str) -> Connection:
        return self._connection if self._router is None else await self._router.for_task(task_id)

    # ----------------------------------------------------------------- API

    async def submit(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None,
    ) -> TaskHandle:
        """Queue a task; returns its handle once the broker has accepted it (durably, with a data_dir).

        A payload over the broker's max_payload_bytes, or a pool, tenant or key longer than the broker
        takes, is refused here with InvalidArgument, and nothing is sent. In a cluster it goes to the
        member that owns `pool`.
        """
        return await self._at_owner(pool, deadline, delay, lambda conn, deadline, delay: conn.submit(
            payload, pool=pool, tenant=tenant, priority=priority, deadline=deadline, delay=delay, key=key,
            max_retries=max_retries, cost=cost))

    async def call(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None, timeout: float | None = None,
    ) -> Any:
        """Submit a task and wait for its value: `await (await submit(...)).result(timeout)` in one request,
        for a caller that wants the value and not the task's id. The broker answers with the outcome alone,
        one message per task fewer. Raises what `submit` and `result` raise; TimeoutError after `timeout`
        seconds (the task goes on). In a cluster it goes to the member that owns `pool`.
        """
        return await self._at_owner(pool, deadline, delay, lambda conn, deadline, delay: conn.call(
            payload, pool=pool, tenant=tenant, priority=priority, deadline=deadline, delay=delay, key=key,
            max_retries=max_retries, cost=cost, timeout=timeout))

    def _at_owner(self, pool: str, deadline: Any, delay: Any,
                  send: Callable[[Connection, Any, Any], Awaitable[T]]) -> Awaitable[T]:
        """`send(connection, deadline, delay)` to the broker that owns `pool`: this connection's for a lone
        broker, else the owner the cluster map names (`Router.at_owner`). A deadline or delay given as a
        datetime is then turned into seconds here, once, so that a retry at a moved pool's owner keeps it."""
        router = self._router
        # Submit and call are the hot path: for a lone broker, `send`'s own coroutine, with no coroutine of
        # this method's or the router's around it to start and to resume at each reply.
        if router is None or router.lone:
            return send(self._connection, deadline, delay)
        return self._routed(router, pool, deadline, delay, send)

    async def _routed(self, router: Router, pool: str, deadline: Any, delay: Any,
                      send: Callable[[Connection, Any, Any], Awaitable[T]]) -> T:
        """`_at_owner` while the seed's broker may be a cluster member: its routes first, learnt if need be."""
        if await router.routing() is None:
            return await send(self._connection, deadline, delay)
        now = time.time()
        deadline, delay = seconds_from_now(deadline, "deadline", now), seconds_from_now(delay, "delay", now)
        return await router.at_owner(pool, lambda conn: send(conn, deadline, delay))

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task's value by id; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        return await (await self._for_task(task_id)).result(task_id, timeout)

    async def status(self, task_id: str) -> TaskInfo:
        """A snapshot of a task: state, attempts, timings."""
        return await (await self._for_task(task_id)).status(task_id)

    async def explain(self, task_id: str) -> Explanation:
        """Why the task is where it is: what stands before a waiting task and when it may start, or how each
        attempt of one that ran ended (docs/scheduling.md, "Why is my task waiting?"). NotFound if unknown,
        or another tenant's to a pinned token."""
        return await (await self._for_task(task_id)).explain(task_id)

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task not yet dispatched; False if it already runs or has finished."""
        return await (await self._for_task(task_id)).cancel(task_id)

    async def pause(self, pool: str) -> None:
        """Stop dispatching `pool` (admin); in a cluster, on the member that owns it."""
        if self._router is None:
            await self._connection.pause(pool)
        else:
            await self._router.at_owner(pool, lambda conn: conn.pause(pool))

    async def resume(self, pool: str) -> None:
        """Dispatch `pool` again (admin); in a cluster, on the member that owns it."""
        if self._router is None:
            await self._connection.resume(pool)
        else:
            await self._router.at_owner(pool, lambda conn: conn.resume(pool))

    async def stats(self) -> dict[str, Any]:
        """The broker's per-pool statistics (admin).

        In a cluster, every member's, merged: `pools` holds all of them (each names its `member`), `members`
        each member's own statistics, or `{"unreachable": why}` for a member that did not answer in time.
        """
        routes = None if self._router is None else await self._router.routing()
        if routes is not None:
            return await cluster_stats(routes, min(STATS_WAIT, self.request_timeout))
        return await self._connection.stats()

    async def cluster(self) -> dict[str, Any] | None:
        """The cluster map as the broker gave it: members, their addresses and pools, and the map's version;
        None from a broker that is no member of a cluster."""
        value = await self._connection.cluster()
        if self._router is not None:
            self._router.learnt(value)
        return value

    async def reload(self) -> dict[str, Any]:
        """Make the broker reread its config file (admin); returns what changed."""
        return await self._connection.reload()

    async def ping(self) -> None:
        """Round trip to the broker; raises Unavailable when it does not answer in time."""
        await self._connection.ping()


def connect(address: str | Sequence[str] = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
            *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
            curve_public_key: str | bytes | os.PathLike[str] | None = None) -> Client:
    """A client for the broker at `address`: `await connect(...)` or `async with connect(...) as sched`.

    `address` may list the client endpoints of a broker's primary and its standbys (a list, or one string
    with commas): requests go to whichever serves, and after a takeover the client carries on with the new
    one by itself, re-sending what was outstanding. The address of any member of a cluster (or a list of
    them) gives a client of the whole cluster: it routes each request to the member it concerns, over a
    connection to that member's primary and standbys.

    With `curve_public_key` (the broker's, from `cronoq keygen`) the connection is encrypted.
    """
    return Client(address, token, request_timeout=request_timeout, curve_public_key=curve_public_key)
