"""cronoq.connect: one DEALER socket to the broker, many requests in flight on it.

Every request gets a request id; replies are matched to waiting futures by
that id, so submits pipeline instead of taking one round trip each.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, Generator

import zmq

from cronoq import protocol
from cronoq.book import TaskInfo, seconds_from_now
from cronoq.errors import CronoqError, InvalidArgument, Unavailable, error_from_code
from cronoq.handles import TaskHandle, outcome_value
from cronoq.transport import Channel, context, token_bytes, tune

DEFAULT_CLIENT_ADDRESS = "tcp://127.0.0.1:5555"
DEFAULT_REQUEST_TIMEOUT = 30.0


class Client:
    """A connection to a broker's client endpoint. Await it, or use it as an async context manager."""

    def __init__(self, address: str = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
                 *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.address = address
        self.request_timeout = request_timeout
        self._token = token_bytes(token)
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[Any, bytes | None]]] = {}
        self._channel: Channel | None = None

    # ----------------------------------------------------------------- lifecycle

    def __await__(self) -> Generator[Any, None, "Client"]:
        return self._open().__await__()

    async def __aenter__(self) -> "Client":
        return await self._open()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def _open(self) -> "Client":
        if self._channel is None:
            sock = context().socket(zmq.DEALER)
            tune(sock)
            try:
                sock.connect(self.address)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise InvalidArgument(f"cannot connect to broker address {self.address!r}: {exc}") from None
            self._channel = Channel(sock, self._on_reply)
        return self

    async def close(self) -> None:
        """Close the connection; requests still waiting fail with Unavailable."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(Unavailable("the client connection was closed"))
        self._pending.clear()

    # ----------------------------------------------------------------- requests

    def _send(self, message: Any, body: bytes | None = None) -> asyncio.Future[tuple[Any, bytes | None]]:
        if self._channel is None:
            raise Unavailable("this client is not connected: use `await cronoq.connect(...)` or `async with`")
        future = asyncio.get_running_loop().create_future()
        self._pending[message.rid] = future
        frames = [self._token, protocol.encode(message)] if body is None else [self._token, protocol.encode(message), body]
        try:
            self._channel.send(frames)
        except zmq.Again:
            del self._pending[message.rid]
            raise Unavailable(f"the send queue to {self.address} is full; is the broker running?") from None
        return future

    async def _request(self, message: Any, body: bytes | None = None) -> tuple[Any, bytes | None]:
        future = self._send(message, body)
        try:
            return await asyncio.wait_for(future, self.request_timeout)
        except asyncio.TimeoutError:
            self._pending.pop(message.rid, None)
            raise Unavailable(
                f"no reply from the broker at {self.address} within {self.request_timeout:g} s; is it running?"
            ) from None

    def _on_reply(self, frames: list[bytes]) -> None:
        try:
            reply = protocol.decode_client_reply(frames[0])
        except CronoqError:
            return  # not ours to answer; a broken reply cannot be matched to a request
        future = self._pending.pop(reply.rid, None)
        if future is None or future.done():
            return
        if isinstance(reply, protocol.Error):
            future.set_exception(error_from_code(reply.code, reply.message))
        else:
            future.set_result((reply, frames[1] if len(frames) > 1 else None))

    # ----------------------------------------------------------------- API

    async def submit(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
    ) -> TaskHandle:
        """Queue a task; returns its handle once the broker has accepted it (durably, with a data_dir)."""
        now = time.time()
        message = protocol.Submit(
            protocol.PROTOCOL_VERSION, next(self._rids), pool=pool, tenant=tenant, priority=priority,
            deadline=seconds_from_now(deadline, "deadline", now), delay=seconds_from_now(delay, "delay", now),
            key=key, max_retries=max_retries,
        )
        reply, _ = await self._request(message, protocol.encode_body(payload))
        return TaskHandle(reply.id, self, duplicate=reply.duplicate)

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task's value by id; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        rid = next(self._rids)
        future = self._send(protocol.Wait(protocol.PROTOCOL_VERSION, rid, task_id))
        try:
            reply, body = await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            if self._channel is not None:
                self._channel.send([self._token, protocol.encode(protocol.Unwait(protocol.PROTOCOL_VERSION, rid, task_id))])
            raise TimeoutError(f"task {task_id} did not finish within {timeout} s") from None
        return outcome_value(reply.id, reply.state, body, reply.error_type, reply.error_message, reply.traceback)

    async def status(self, task_id: str) -> TaskInfo:
        """A snapshot of a task: state, attempts, timings."""
        reply, _ = await self._request(protocol.Status(protocol.PROTOCOL_VERSION, next(self._rids), task_id))
        return TaskInfo(
            id=reply.id, pool=reply.pool, tenant=reply.tenant, priority=reply.priority, state=reply.state,
            attempts=reply.attempts, submitted_at=reply.submitted_at, started_at=reply.started_at,
            finished_at=reply.finished_at, deadline=reply.deadline, error=reply.error,
        )

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task not yet dispatched; False if it already runs or has finished."""
        reply, _ = await self._request(protocol.Cancel(protocol.PROTOCOL_VERSION, next(self._rids), task_id))
        return bool(reply.value)

    async def pause(self, pool: str) -> None:
        """Stop dispatching `pool` (admin)."""
        await self._request(protocol.Pause(protocol.PROTOCOL_VERSION, next(self._rids), pool))

    async def resume(self, pool: str) -> None:
        """Dispatch `pool` again (admin)."""
        await self._request(protocol.Resume(protocol.PROTOCOL_VERSION, next(self._rids), pool))

    async def stats(self) -> dict[str, Any]:
        """The broker's per-pool statistics (admin)."""
        reply, _ = await self._request(protocol.Stats(protocol.PROTOCOL_VERSION, next(self._rids)))
        return reply.value

    async def ping(self) -> None:
        """Round trip to the broker; raises Unavailable when it does not answer in time."""
        await self._request(protocol.Ping(protocol.PROTOCOL_VERSION, next(self._rids)))


def connect(address: str = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
            *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> Client:
    """A client for the broker at `address`: `await connect(...)` or `async with connect(...) as sched`."""
    return Client(address, token, request_timeout=request_timeout)
