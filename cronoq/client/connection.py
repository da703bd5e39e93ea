"""One broker's client connection: one DEALER socket, many requests in flight on it.

`Connection` talks to ONE broker, given as its primary and standbys; what
routes requests over the members of a cluster is `cronoq.client.cluster`,
and the public `Client` (`cronoq.client.client`) is one or the other.

Every request gets a request id; replies are matched to waiting futures by
that id, so submits pipeline instead of taking one round trip each.

The connection outlives a broker restart (the Lazy Pirate pattern): ZeroMQ
reconnects by itself, and on each new connection the client re-sends every
request still waiting for its reply — a `wait` the restarted broker never
heard of, a `submit` whose reply was lost. Each submit carries a submission
id of its own, so the broker answers a re-sent one with the first task.

On each connection the client also asks the broker for its rules (`hello`):
`submit` refuses a payload over the broker's max_payload_bytes itself,
before anything is sent. Sent, libzmq would drop the connection for it, and
the re-sent submit would drop the next one too. The answer also says
whether the broker is a cluster member (`member`), which is all a router
needs to know from it.

The address may list a broker's primary and its standbys: the one socket
(`cronoq.wire.dealer`) connects to all of them with ZMQ_IMMEDIATE, so
requests are only queued on a completed connection — the broker that
serves (standbys bind nothing until they take over). A request made while
no connection is up is held here and leaves with the next one, as re-sent
requests do.

Waiting is only for a broker that may yet answer. The socket monitor tells
why a connection fails (`cronoq.wire.link`): when waiting cannot help — nothing
ever took the connection, or the CURVE handshake cannot succeed — the
requests fail at once with `Unavailable` naming the cause, and the socket is
made anew so that none of them leaves later. An error the broker sends
under request id 0 answers a whole message it could not read (this is its
worker endpoint, or it speaks another protocol version): every request of
the connection fails with it until the connection is made again.

Leans on the wire (`protocol`, `transport`, `dealer`, `link`, `curve`), the
answer types (`cronoq.answers`), `cronoq.handles` and `cronoq.errors`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from cronoq.answers import Explanation, TaskInfo, seconds_from_now
from cronoq.errors import (
    CronoqError, InvalidArgument, PermissionDenied, Unauthenticated, Unavailable, error_from_code,
)
from cronoq.handles import TaskHandle, outcome_value
from cronoq.wire import protocol, transport
from cronoq.wire.curve import public_key
from cronoq.wire.dealer import broker_dealer
from cronoq.wire.link import Links, parse_addresses
from cronoq.wire.transport import Channel, token_bytes

DEFAULT_CLIENT_ADDRESS = "tcp://127.0.0.1:5555"
DEFAULT_REQUEST_TIMEOUT = 30.0
# Seconds before requests libzmq would not queue while a connection was up are offered again.
HELD_RETRY = 0.02


@dataclass(slots=True)
class _Outstanding:
    """A request waiting for its reply: what to re-send on a new connection, and who waits.

    Only the request's own caller awaits `future` (directly, so the reply wakes it in one step of the
    loop); a caller that is cancelled cancels only it, and a late reply to it is dropped.
    """

    future: asyncio.Future[tuple[Any, bytes | None]]
    message: Any
    body: bytes | None
    resend: bool


class _Watch:
    """A task submitted with `watch`: its outcome will come under the submit's rid.

    The task's handle holds its watch, so the outcome is there for `handle.result()` however late it
    is asked for, and goes away with the handle. Each `result()` call waits on a future of its own,
    so cancelling one caller never touches another, and the outcome wakes each in one step.
    `outcome` is the outcome reply and body, or None when the watch was refused or closed and an
    explicit wait is needed.
    """

    __slots__ = ("client", "task_id", "settled", "outcome", "_waiters")

    def __init__(self, client: "Connection") -> None:
        self.client = client
        self.task_id: str | None = None
        self.settled = False
        self.outcome: tuple[Any, bytes | None] | None = None
        self._waiters: list[asyncio.Future[None]] | None = None

    def settle(self, outcome: tuple[Any, bytes | None] | None) -> None:
        if self.settled:
            return
        self.settled = True
        self.outcome = outcome
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        if not self.settled:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            timer = None if timeout is None else loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)
            if not self.settled:
                raise TimeoutError(f"task {task_id} did not finish within {timeout} s")
        if self.outcome is None:
            return await self.client.result(task_id, timeout)
        reply, body = self.outcome
        return outcome_value(reply.id, reply.state, body, reply.error_type, reply.error_message, reply.traceback)


class _TimedOut(Exception):
    """A `call`'s own timeout (told apart from a TimeoutError its task's outcome might carry)."""


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_TimedOut())


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Connection:
    """A connection to one broker's client endpoint (its primary and standbys): `start()` it, `close()` it.

    It never routes: each request goes to this broker. `on_member` is called when a `hello` answer names a
    cluster member (a router then learns the map early).
    """

    def __init__(self, address: str | Sequence[str] = DEFAULT_CLIENT_ADDRESS, token: str | bytes | None = None,
                 *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 curve_public_key: str | bytes | os.PathLike[str] | None = None) -> None:
        self.addresses = parse_addresses(address, "broker address")
        """One broker's addresses: its primary and standbys (one DEALER connects to them all, and only the one that
        serves takes requests)."""
        self.address = " or ".join(self.addresses)
        self._member: str | None = None  # the member name the broker's hello gave, in a cluster
        self.on_member: Callable[[], None] | None = None
        self._map: asyncio.Future[tuple[Any, bytes | None]] | None = None  # the `cluster` request in flight
        self.request_timeout = request_timeout
        self._token = token_bytes(token)
        # The broker's CURVE public key (40 Z85 characters or a NAME.key file): encrypt everything.
        self._server_key = None if curve_public_key is None else public_key(curve_public_key)
        self._rids = itertools.count(1)
        self._submissions = itertools.count(1)
        self._submission_prefix = uuid.uuid4().hex[:16]
        self._pending: dict[int, _Outstanding] = {}
        # (deadline, rid) of requests that fail after request_timeout, oldest first (one timeout for all,
        # so deadlines only grow): one sweep now and then instead of a timer per request.
        self._expiries: deque[tuple[float, int]] = deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._watches: dict[int, _Watch] = {}  # by the submit's rid
        self._watched: dict[str, _Watch] = {}  # the same, by task id once accepted
        self._channel: Channel | None = None
        self._monitor: Channel | None = None
        self._link = Links(self.addresses, encrypted=self._server_key is not None)
        # Requests libzmq would not queue: no connection is up (ZMQ_IMMEDIATE), or, rarely, its queue is full.
        # They leave on the next connection, or on a retry while one is up; request_timeout still bounds them.
        self._held: list[tuple[Any, bytes | None]] = []
        self._held_retry: asyncio.TimerHandle | None = None
        # Why requests fail at once instead of waiting: the broker cannot be reached (a sentence), or it
        # refused everything this connection sent (the error's code and message).
        self._unreachable: str | None = None
        self._refusal: tuple[str, str] | None = None
        self._connections = 0
        self.reconnects = 0
        """How many times the connection to the broker was made again (and outstanding requests re-sent)."""
        # The latest `hello` (in flight, or answered or failed), and what its answers said so far.
        self._hello: asyncio.Future[tuple[Any, bytes | None]] | None = None
        self._heard_hello = False
        self._max_payload_bytes: int | None = None

    @property
    def max_payload_bytes(self) -> int | None:
        """The broker's max_payload_bytes as it last said (on connecting); None until it has, or if it never
        says (an older broker): `submit` then leaves the check to the broker."""
        return self._max_payload_bytes

    @property
    def heard_hello(self) -> bool:
        """Whether the broker has answered a `hello` (or refused it as an older broker does)."""
        return self._heard_hello

    @property
    def member(self) -> str | None:
        """The cluster member the broker's latest `hello` named; None for a lone broker (or none heard yet)."""
        return self._member

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start connecting (at once: requests made meanwhile wait for the connection); InvalidArgument for an
        address libzmq refuses."""
        if self._channel is None:
            self._connect()
            self._ask_rules()  # goes out with the first connection

    def _connect(self) -> None:
        """Make the socket (and its monitor) and start connecting; InvalidArgument for an address libzmq refuses."""
        sock, monitor = broker_dealer(self.addresses, server_key=self._server_key, zmtp_heartbeat=True)
        assert monitor is not None
        self._channel = Channel(sock, self._on_reply, pack=functools.partial(protocol.pack, protocol.RequestBatch),
                                prefix=[self._token], on_unsent=self._on_unsent)
        self._monitor = Channel(monitor, self._on_connection_event)

    def _disconnect(self) -> None:
        """Close the socket and its monitor; what is queued in it is dropped, never sent."""
        if self._monitor is not None:
            if self._channel is not None:
                self._channel.sock.disable_monitor()
            self._monitor.close()
            self._monitor = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    async def close(self) -> None:
        """Close the connection; requests still waiting fail with Unavailable."""
        self._disconnect()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._held_retry is not None:
            self._held_retry.cancel()
            self._held_retry = None
        self._held.clear()
        self._expiries.clear()
        for outstanding in self._pending.values():
            if not outstanding.future.done():
                outstanding.future.set_exception(Unavailable("the client connection was closed"))
        self._pending.clear()
        for watch in self._watches.values():
            watch.settle(None)
        self._watches.clear()
        self._watched.clear()

    def _on_connection_event(self, frames: list[bytes]) -> None:
        """What the socket monitor saw. A completed handshake after the first re-sends what is outstanding;
        a failure that waiting cannot mend fails the requests now."""
        event = parse_monitor_message(frames)
        self._link.observe(event["event"], event["value"], event["endpoint"], asyncio.get_running_loop().time())
        if event["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._give_up_if_hopeless()
            return
        self._connections += 1
        self._unreachable = None
        if self._connections > 1:
            self._refusal = None  # perhaps another broker (or endpoint) now: ask it afresh
        if self._channel is None:
            return
        sent = self._send_held()  # requests made while no connection was up
        if self._connections > 1:
            self.reconnects += 1
            for rid, outstanding in self._pending.items():
                if outstanding.resend and not outstanding.future.done() and rid not in sent:
                    self._channel.post(outstanding.message, outstanding.body)
            # A restarted broker forgot who watches which task: ask again, under the same rids.
            for rid, watch in self._watches.items():
                if watch.task_id is not None:
                    self._channel.post(protocol.Wait(protocol.PROTOCOL_VERSION, rid, watch.task_id))
        # The broker on the other end may have restarted with another config. (The first connection's `hello` was
        # sent at the start, and its answer may be in already: a lone request leaves at once.)
        self._ask_rules(again=self._connections > 1)

    def _give_up_if_hopeless(self) -> None:
        """Fail every request now, naming the cause, once the link says waiting cannot help; remake the socket
        so that nothing queued in it (these requests, or earlier ones that timed out) reaches a broker that
        comes up later: their callers were told they failed."""
        if self._unreachable is not None or self._channel is None:
            return
        reason = self._link.hopeless(asyncio.get_running_loop().time())
        if reason is None:
            return
        self._unreachable = reason
        self._fail_all(Unavailable(reason))
        self._disconnect()
        self._connect()

    def _ask_rules(self, *, again: bool = False) -> None:
        """Send a `hello`, unless one is still waiting for its answer (a new connection re-sends that one), or
        (without `again`: not a new broker, perhaps) the last one's answer came. That answer may have been read
        in this very turn of the loop, before the callback that keeps it ran: it is kept here then."""
        if self._unreachable is not None or self._refusal is not None:
            return  # no request leaves now; the next connection asks
        hello = self._hello
        if hello is not None and not hello.done():
            return
        if hello is not None and not again:
            self._take_rules(hello)
            if self._heard_hello:
                return
        self._hello = self._send(protocol.Hello(protocol.PROTOCOL_VERSION, next(self._rids)))
        self._hello.add_done_callback(self._take_rules)

    def _take_rules(self, hello: asyncio.Future[tuple[Any, bytes | None]]) -> None:
        """Keep what the broker's answer to a `hello` says. No answer in time leaves what is known as it is."""
        if hello.cancelled():
            return
        error = hello.exception()  # retrieved here, so no caller need be waiting for it
        if error is None:
            reply, _ = hello.result()
            self._heard_hello = True
            self._max_payload_bytes = protocol.advertised_limit(reply.value)
            self._member = protocol.hello_member(reply.value)
            if self._member is not None and self.on_member is not None:
                self.on_member()
        elif not isinstance(error, Unavailable):
            # A broker that does not know `hello` (or refuses our token): it checks sizes on its own.
            self._heard_hello = True
            self._max_payload_bytes = None

    # ----------------------------------------------------------------- the broker's rules

    async def rules(self) -> str | None:
        """Wait for the broker's answer to a `hello` if none came yet; the cluster member it named (None: a lone
        broker, or an older one that does not know `hello`). Raises what the `hello` met when that was no
        answer (Unavailable) or a refused token (Unauthenticated, PermissionDenied: the broker answers such a
        connection once a second and drops the rest, so no request may follow it)."""
        if not self._heard_hello:
            await self._hello_answer((Unavailable, Unauthenticated, PermissionDenied))
        return self._member

    async def _hello_answer(self, fatal: tuple[type[CronoqError], ...]) -> None:
        """Wait for the answer to a `hello` (asking again if none waits: the last went unanswered), raising the
        errors in `fatal`; any other refusal is an older broker's, which has no rules to tell."""
        self._check_sendable()  # not the stale failure of an earlier `hello`
        self._ask_rules()
        hello = self._hello
        assert hello is not None
        try:
            await asyncio.shield(hello)  # shared by every request waiting: one's cancellation is not all's
        except fatal:
            raise
        except CronoqError:
            pass
        self._take_rules(hello)  # whichever of the two callbacks runs first, the answer is kept

    async def _payload_limit(self) -> int | None:
        """The broker's max_payload_bytes, waiting for its answer to a `hello` if none came yet (at most
        request_timeout: Unavailable then, as a submit would get). None: the broker does not say."""
        if not self._heard_hello:
            await self._hello_answer((Unavailable,))
        return self._max_payload_bytes

    # ----------------------------------------------------------------- requests

    def _send(self, message: Any, body: bytes | None = None, *, resend: bool = True, expires: bool = True
              ) -> asyncio.Future[tuple[Any, bytes | None]]:
        """Send a request and return the future of its reply; `resend`: safe to send again on a new connection;
        `expires`: fail with Unavailable when no reply comes within request_timeout."""
        self._check_sendable()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        pending = self._pending
        pending[message.rid] = _Outstanding(future, message, body, resend)
        if self._held:
            # libzmq refused earlier requests and they wait to go again: this one goes behind them, never ahead.
            # A caller's requests reach the broker in the order made (a submit after the one before it, any
            # request after the connection's `hello`), even when a connection comes up between the two.
            self._on_unsent([(message, body)])
        else:
            self._channel.post(message, body)  # leaves at the end of this loop turn, batched with the others...
            if len(pending) == 1:
                # ...unless no other request is outstanding (Nagle's rule the other way round): then none is
                # likely to join it this turn, and a lone caller (an API handler awaiting one task) gets its
                # request out a loop turn sooner. Under load requests are outstanding, and each turn's still go
                # as one batch.
                self._channel.flush_now()
        if expires:
            self._expiries.append((loop.time() + self.request_timeout, message.rid))
            if self._sweeper is None:
                self._sweeper = loop.call_later(self._sweep_interval(), self._sweep)
        return future

    def _check_sendable(self) -> None:
        """Raise what a request would meet now, if it cannot be sent: no connection, an unreachable broker, a
        broker that refuses everything this connection sends."""
        if self._channel is None:
            raise Unavailable("this client is not connected: use `await cronoq.connect(...)` or `async with`")
        if self._unreachable is not None:
            raise Unavailable(self._unreachable)
        if self._refusal is not None:
            raise error_from_code(*self._refusal)

    def _sweep_interval(self) -> float:
        """How often expired requests are looked for: a timeout fires up to this much late."""
        return min(1.0, max(0.01, self.request_timeout / 8))

    def _sweep(self) -> None:
        """Fail the requests whose request_timeout has passed; forget the ones answered meanwhile."""
        loop = asyncio.get_running_loop()
        now, pending, expiries = loop.time(), self._pending, self._expiries
        while expiries:
            deadline, rid = expiries[0]
            outstanding = pending.get(rid)
            if outstanding is not None:
                if outstanding.future.done():
                    del pending[rid]  # its caller was cancelled: a late reply is dropped either way
                elif deadline > now:
                    break
                else:
                    del pending[rid]
                    outstanding.future.set_exception(Unavailable(self._link.silence(
                        f"no reply from the broker at {self.address} within {self.request_timeout:g} s")))
            expiries.popleft()
        self._sweeper = loop.call_later(self._sweep_interval(), self._sweep) if expiries else None

    def _on_unsent(self, items: list[tuple[Any, bytes | None]]) -> None:
        """libzmq took none of `items`: no connection is up (ZMQ_IMMEDIATE), or the one that is has a full queue.
        Hold them: they leave with the next connection, or on a retry while one is up (libzmq may attach a
        new connection a moment after its monitor says so); request_timeout bounds their wait. Past as many
        as a socket would queue (transport.HIGH_WATER_MARK), the broker has been away long: fail the rest now."""
        room = max(0, transport.HIGH_WATER_MARK - len(self._held))
        self._held.extend(items[:room])
        for message, _ in items[room:]:
            outstanding = self._pending.pop(message.rid, None)
            if outstanding is not None and not outstanding.future.done():
                outstanding.future.set_exception(Unavailable(self._link.silence(
                    f"the send queue to the broker at {self.address} is full")))
        if self._link.up and self._held_retry is None:
            self._held_retry = asyncio.get_running_loop().call_later(HELD_RETRY, self._retry_held)

    def _retry_held(self) -> None:
        self._held_retry = None
        if self._channel is not None:
            self._send_held()

    def _send_held(self) -> set[int]:
        """Post the held requests that are still waiting (the rest were given up on); returns their rids."""
        held, self._held = self._held, []
        sent: set[int] = set()
        for message, body in held:
            outstanding = self._pending.get(message.rid)
            if outstanding is not None and not outstanding.future.done() and outstanding.message is message:
                self._channel.post(message, body)  # type: ignore[union-attr]
                sent.add(message.rid)
        return sent

    async def _request(self, message: Any, body: bytes | None = None, *, resend: bool = True
                       ) -> tuple[Any, bytes | None]:
        return await self._send(message, body, resend=resend)

    def _on_reply(self, frames: list[bytes]) -> None:
        try:
            replies = protocol.unbatch(protocol.decode_client_reply(frames[0]), frames[1] if len(frames) > 1 else None)
        except CronoqError:
            return  # not ours to answer; a broken reply cannot be matched to a request
        for reply, body in replies:
            self._take_reply(reply, body)

    def _take_reply(self, reply: Any, body: bytes | None) -> None:
        watch = self._watches.get(reply.rid)
        if watch is not None and (isinstance(reply, protocol.Outcome) or watch.task_id is not None):
            self._end_watch(reply.rid, watch, reply if isinstance(reply, protocol.Outcome) else None, body)
            return
        if isinstance(reply, protocol.Error) and reply.code == "UNAUTHENTICATED":
            # The broker answers a message with a bad token once, whatever it held, and then stays quiet for a
            # while: every request sent with this token shares the fate.
            self._fail_all(error_from_code(reply.code, reply.message))
            return
        if isinstance(reply, protocol.Error) and reply.rid == 0:
            # No request has id 0: the broker could not read the message at all. Refused as it is, so would
            # every later one be (INVALID_ARGUMENT: the wrong endpoint, another protocol version).
            if reply.code == "INVALID_ARGUMENT":
                self._refusal = (reply.code, reply.message)
            self._fail_all(error_from_code(reply.code, reply.message, reply.details))
            return
        outstanding = self._pending.pop(reply.rid, None)
        if outstanding is None or outstanding.future.done():
            return  # a second reply to a request that was re-sent, or one given up on
        future = outstanding.future
        if isinstance(reply, protocol.Error):
            self._watches.pop(reply.rid, None)  # a refused submit has nothing to watch
            future.set_exception(error_from_code(reply.code, reply.message, reply.details))
        else:
            if isinstance(reply, protocol.Accepted) and watch is not None:
                watch.task_id = reply.id
                self._watched[reply.id] = watch
            future.set_result((reply, body))

    def _fail_all(self, error: CronoqError) -> None:
        pending, self._pending = self._pending, {}
        for rid, outstanding in pending.items():
            self._watches.pop(rid, None)
            if not outstanding.future.done():
                outstanding.future.set_exception(error)

    def _end_watch(self, rid: int, watch: _Watch, outcome: protocol.Outcome | None, body: bytes | None) -> None:
        """The watched task's outcome came (or the broker refused the watch: fall back to `wait`). A `call` still
        waits for its request (no `accepted` came): the outcome answers it."""
        del self._watches[rid]
        if outcome is not None:
            outstanding = self._pending.pop(rid, None)
            if outstanding is not None and not outstanding.future.done():
                outstanding.future.set_result((outcome, body))
        if watch.task_id is not None and self._watched.get(watch.task_id) is watch:
            del self._watched[watch.task_id]
        watch.settle(None if outcome is None else (outcome, body))

    # ----------------------------------------------------------------- API

    async def submit(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None,
    ) -> TaskHandle:
        """Queue a task on this broker; returns its handle once the broker has accepted it (durably, with a
        data_dir). A payload over the broker's max_payload_bytes, or a pool, tenant or key longer than the
        broker takes, is refused here with InvalidArgument, and nothing is sent."""
        body = self._body(payload, pool, tenant, key)
        if not self._heard_hello:
            await self._payload_limit()
        message = self._submission(body, pool, tenant, priority, deadline, delay, key, max_retries, cost,
                                   outcome_only=False)
        # Watch from the start: the outcome may arrive before this coroutine resumes after `accepted`.
        watch = self._watches[message.rid] = _Watch(self)
        try:
            reply, _ = await self._request(message, body)
        except BaseException:
            self._watches.pop(message.rid, None)
            raise
        return TaskHandle(reply.id, watch, duplicate=reply.duplicate)

    async def call(
        self, payload: Any, *, pool: str = "default", tenant: str | None = None, priority: str = "normal",
        deadline: Any = None, delay: Any = None, key: str | None = None, max_retries: int = 0,
        cost: float | None = None, timeout: float | None = None,
    ) -> Any:
        """Submit a task and wait for its value in one request: the broker answers with the outcome only, one
        message per task fewer than `submit` then `result`. Raises what both raise; TimeoutError after
        `timeout` seconds (the task goes on). Re-sent on a new connection like a submit (the broker finds the
        first task by its submission id), so request_timeout does not bound it: `timeout` does."""
        body = self._body(payload, pool, tenant, key)
        if not self._heard_hello:
            await self._payload_limit()
        message = self._submission(body, pool, tenant, priority, deadline, delay, key, max_retries, cost,
                                   outcome_only=True)
        rid = message.rid
        watch = self._watches[rid] = _Watch(self)
        # Resolved by the outcome (`_end_watch`), failed by a refusal, or by an older broker's `accepted`.
        future = self._send(message, body, expires=False)
        loop = asyncio.get_running_loop()
        # A timer that fails the future, rather than asyncio.wait_for's extra future and callbacks per call.
        ends_at = timer = None
        if timeout is not None:
            ends_at = loop.time() + timeout
            timer = loop.call_at(ends_at, _time_out, future)
        try:
            reply, body = await future  # the future is ours alone: a cancelled caller cancels only it
        except BaseException as exc:
            self._pending.pop(rid, None)
            if self._watches.get(rid) is watch:
                del self._watches[rid]
            if watch.task_id is not None and self._watched.get(watch.task_id) is watch:
                del self._watched[watch.task_id]
            if type(exc) is _TimedOut:
                raise TimeoutError(f"the task submitted to pool {pool!r} did not finish within {timeout} s; "
                                   "it goes on (submit() and result() give its id to wait on)") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if isinstance(reply, protocol.Accepted):  # an older broker: the outcome follows under the same rid
            left = None if ends_at is None else max(0.0, ends_at - loop.time())
            return await watch.result(reply.id, left)
        return outcome_value(reply.id, reply.state, body, reply.error_type, reply.error_message, reply.traceback)

    @staticmethod
    def _body(payload: Any, pool: str, tenant: str | None, key: str | None) -> bytes:
        """A submit's payload encoded, its names checked: what needs no word from the broker. Nothing is sent
        for a mistake."""
        body = protocol.encode_body(payload)
        longest = protocol.MAX_NAME_CHARS  # one test of the three names, as submit is the hot path
        if ((type(pool) is str and len(pool) > longest) or (type(tenant) is str and len(tenant) > longest)
                or (type(key) is str and len(key) > longest)):
            raise InvalidArgument(_long_name(pool=pool, tenant=tenant, key=key))
        return body

    def _submission(self, body: bytes, pool: str, tenant: str | None, priority: str, deadline: Any, delay: Any,
                    key: str | None, max_retries: int, cost: float | None, *, outcome_only: bool) -> protocol.Submit:
        """The watched submit of a `_body`, checked against the broker's max_payload_bytes (the caller has its
        hello answer: `_payload_limit`) and for its cost and times. A plain function, not a coroutine, and no
        call for what was not given: submit and call are the client's hot path."""
        limit = self._max_payload_bytes
        if limit is not None and len(body) > limit:
            raise InvalidArgument(protocol.payload_too_large(len(body), limit))
        if cost is not None:
            protocol.check_cost(cost)
        if deadline is None and delay is None:
            in_seconds = wait_seconds = None
        else:
            now = time.time()
            in_seconds = seconds_from_now(deadline, "deadline", now)
            wait_seconds = seconds_from_now(delay, "delay", now)
        return protocol.Submit(
            protocol.PROTOCOL_VERSION, next(self._rids), pool=pool, tenant=tenant, priority=priority,
            deadline=in_seconds, delay=wait_seconds, key=key, max_retries=max_retries,
            submission=f"{self._submission_prefix}-{next(self._submissions):x}", watch=True,
            cost=None if cost is None else float(cost), outcome_only=outcome_only,
        )

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task's value by id; raises TaskFailed, DeadlineExceeded, Cancelled or TimeoutError."""
        watch = self._watched.get(task_id)
        if watch is not None:  # a task this connection submitted, still in flight
            return await watch.result(task_id, timeout)
        rid = next(self._rids)
        future = self._send(protocol.Wait(protocol.PROTOCOL_VERSION, rid, task_id), expires=False)
        try:
            reply, body = await asyncio.wait_for(future, timeout)  # the future is ours alone: it may be cancelled
        except BaseException as exc:
            # Timed out or cancelled while the broker still holds the wait: tell it to let go.
            if self._pending.pop(rid, None) is not None and self._channel is not None:
                self._channel.post(protocol.Unwait(protocol.PROTOCOL_VERSION, rid, task_id))
            if isinstance(exc, TimeoutError):
                raise TimeoutError(f"task {task_id} did not finish within {timeout} s") from None
            raise
        return outcome_value(reply.id, reply.state, body, reply.error_type, reply.error_message, reply.traceback)

    async def status(self, task_id: str) -> TaskInfo:
        """A snapshot of a task: state, attempts, timings."""
        reply, _ = await self._request(protocol.Status(protocol.PROTOCOL_VERSION, next(self._rids), task_id))
        return TaskInfo(
            id=reply.id, pool=reply.pool, tenant=reply.tenant, priority=reply.priority, state=reply.state,
            attempts=reply.attempts, submitted_at=reply.submitted_at, started_at=reply.started_at,
            finished_at=reply.finished_at, deadline=reply.deadline, error=reply.error, cost=reply.cost,
        )

    async def explain(self, task_id: str) -> Explanation:
        """Why the task is where it is: what stands before a waiting task and when it may start, or how each
        attempt of one that ran ended (docs/scheduling.md, "Why is my task waiting?"). NotFound if unknown,
        or another tenant's to a pinned token."""
        reply, _ = await self._request(protocol.Explain(protocol.PROTOCOL_VERSION, next(self._rids), task_id))
        try:
            return msgspec.convert(reply.value, Explanation)
        except msgspec.ValidationError as exc:
            raise Unavailable(f"the broker's explanation of task {task_id} cannot be read: {exc}") from None

    async def cancel(self, task_id: str) -> bool:
        """Cancel a task not yet dispatched; False if it already runs or has finished."""
        # Not re-sent on a new connection: a second cancel of a cancelled task would answer False.
        reply, _ = await self._request(protocol.Cancel(protocol.PROTOCOL_VERSION, next(self._rids), task_id),
                                       resend=False)
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

    def ask_cluster(self) -> asyncio.Future[tuple[Any, bytes | None]]:
        """Ask the broker for the cluster map, unless a request for it is on its way already (one answer serves
        every caller waiting)."""
        if self._map is None or self._map.done():
            self._map = self._send(protocol.ClusterRequest(protocol.PROTOCOL_VERSION, next(self._rids)))
        return self._map

    async def cluster(self) -> dict[str, Any] | None:
        """The cluster map as the broker gave it: members, their addresses and pools, and the map's version;
        None from a broker that is no member of a cluster."""
        reply, _ = await asyncio.shield(self.ask_cluster())
        if reply.value is None:
            self._member = None  # it left its cluster since its hello (a restart with another config)
        return reply.value

    async def reload(self) -> dict[str, Any]:
        """Make the broker reread its config file (admin); returns what changed."""
        reply, _ = await self._request(protocol.Reload(protocol.PROTOCOL_VERSION, next(self._rids)), resend=False)
        return reply.value

    async def ping(self) -> None:
        """Round trip to the broker; raises Unavailable when it does not answer in time."""
        await self._request(protocol.Ping(protocol.PROTOCOL_VERSION, next(self._rids)))


def _long_name(**names: Any) -> str:
    """Which of a submit's names is longer than the broker takes (it would refuse it; a huge one, unsent,
    would even cost the connection)."""
    what, name = next((what, name) for what, name in names.items()
                      if type(name) is str and len(name) > protocol.MAX_NAME_CHARS)
    return (f"{what} must be a non-empty string of at most {protocol.MAX_NAME_CHARS} characters, "
            f"got one of {len(name)}")
