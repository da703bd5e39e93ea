"""What the broker does for the messages on its client socket.

Each message is decoded (one request or a batch), its token identified
once, and every request authorized by role and tenant, carried out on the
task book, and answered through the clients' outbox, which the broker sends
after the pass's group commit. A client waiting for a task is remembered on
the task's record, with the connection it asked on, and gets its outcome
from `deliver_outcome` when the book says the task ended, if that connection
is still there.

A waiter is one int on the record, `rid << WAITER_SERIAL_BITS | serial`: the
request id the outcome goes under and the serial number of the connection
(cronoq.broker.connections), which `ClientRequests` maps back to the
connection while it lasts. Every watched queued task holds one, and an int
costs 32 bytes where a (connection, rid) tuple and its rid cost 88.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable

from cronoq.book.records import TaskRecord
from cronoq.book.submission import SubmitRequest
from cronoq.book.taskbook import TaskBook, unknown_task
from cronoq.broker.auth import Principal
from cronoq.broker.connections import Connection
from cronoq.broker.messages import (
    body_frame, check_frame_count, error_reply, refuse_if_misdirected, wrong_endpoint_hint,
)
from cronoq.broker.outbox import Outbox
from cronoq.broker.statistics import visible_stats
from cronoq.errors import CronoqError, NotFound, PermissionDenied, ResourceExhausted, Unavailable
from cronoq.wire import protocol

log = logging.getLogger("cronoq.broker")

# Waits on one task: each costs a little memory until the task ends, so a flood of them is refused.
MAX_WAITERS_PER_TASK = 1024
# A waiter's low bits are its connection's serial number: 2**32 connections before two could share them.
WAITER_SERIAL_BITS = 32
_SERIAL_MASK = (1 << WAITER_SERIAL_BITS) - 1
# The first fields of SubmitRequest, in the order `_submit` passes them: by position, a submit's request takes
# half the time it takes by keyword.
_SUBMIT_FIELDS = ("payload", "pool", "tenant", "priority", "deadline", "delay", "key", "max_retries", "submission")
assert tuple(field.name for field in dataclasses.fields(SubmitRequest))[:len(_SUBMIT_FIELDS)] == _SUBMIT_FIELDS


class RestOfBatch:
    """The requests of a batch that a pass had no time left for: handled first in a later pass, before anything
    else its connection sent (they wait in its `parked` queue, ahead of whatever came after)."""

    __slots__ = ("principal", "requests", "start")

    def __init__(self, principal: Principal, requests: list[tuple[Any, bytes | None]], start: int) -> None:
        self.principal = principal
        self.requests = requests
        self.start = start


class ClientRequests:
    """Serves client requests against `book`, replying into `outbox`.

    `identify` maps a token frame to its principal (the broker's current tokens, which a reload
    swaps); `stats` and `reload` are the broker's admin operations (`stats` calls back with its answer,
    perhaps a few passes of the loop later); `explain(task_id, now, scope)` is the broker's answer to `explain`
    (`scope`: the tenant the caller is pinned to, if any).
    """

    def __init__(self, book: TaskBook, outbox: Outbox, *, identify: Callable[[bytes, Connection], Principal],
                 authenticate: Callable[[Connection, Principal], None],
                 refusal_allowed: Callable[[Connection, float], bool],
                 stats: Callable[[Callable[[dict[str, Any]], None]], None],
                 reload: Callable[[], dict[str, Any]], explain: Callable[[str, float, str | None], dict[str, Any]],
                 worker_endpoint: str = "the one in its config",
                 owner_check: Callable[[str], None] = lambda pool: None,
                 cluster: Callable[[], dict[str, Any] | None] = lambda: None, member: str | None = None,
                 set_aside: Callable[[Connection, RestOfBatch], None] | None = None) -> None:
        self._book = book
        # serial -> connection, for the connections some task's record names as a waiter, until they end.
        self._waiting: dict[int, Connection] = {}
        self._set_aside = set_aside
        self._owner_check = owner_check
        self._cluster = cluster
        self.member = member
        """This broker's cluster member name (told to clients in `hello`), or None."""
        self._worker_endpoint = worker_endpoint
        self._outbox = outbox
        self._identify = identify
        self._authenticate = authenticate
        self._refusal_allowed = refusal_allowed
        self._stats = stats
        self._reload = reload
        self._explain = explain

    def on_message(self, conn: Connection, frames: list[bytes] | RestOfBatch, now: float,
                   until: float = math.inf) -> int:
        """Handle one message from a client (a request or a batch of them), or the rest of a batch; returns how
        many requests were handled.

        A batch can hold hundreds of requests, a few milliseconds of work: once `until` (perf_counter) has
        passed, what is left of it is set aside for the next pass, so that one client's big batch does not
        make the pass, and with it every other client's reply, wait (with a `set_aside` to give it to).
        """
        put = self._outbox.put
        if type(frames) is RestOfBatch:
            principal, requests, start = frames.principal, frames.requests, frames.start
        else:
            try:
                check_frame_count(frames, "a request has 2 or 3 frames (token, header, optional body)")
                principal = self._identify(frames[1], conn)
                requests = protocol.read_client_requests(frames[2], body_frame(frames))
                refuse_if_misdirected(frames, requests, "client", self._worker_endpoint)
                self._authenticate(conn, principal)
            except CronoqError as exc:
                # One error for the whole message, however many requests it holds: under its rid if it has one
                # that can be read (never a batch's). An UNAUTHENTICATED or PERMISSION_DENIED one concerns every
                # request sent with that token, and a peer without a valid token earns few of them
                # (refusal_allowed).
                if self._refusal_allowed(conn, now):
                    hint = wrong_endpoint_hint(frames, "client", self._worker_endpoint)
                    rid = 0 if hint is not None else protocol.peek_rid(frames[2]) if len(frames) > 2 else 0
                    put(conn, error_reply(rid, hint or exc))
                return 1
            start = 0
        clock = time.perf_counter
        last = len(requests) - 1
        for index in range(start, last + 1):
            request, body = requests[index]
            try:
                self._handle(conn, principal, request, body, now)
            except CronoqError as exc:
                put(conn, error_reply(request.rid, exc))
            except Exception:  # a bug: it must cost this one request, never the broker
                log.exception("failed to handle a client request; it was dropped")
                put(conn, error_reply(request.rid, Unavailable(
                    "the broker failed to handle this request (see its log); try again")))
            if index < last and self._set_aside is not None and clock() >= until:
                self._set_aside(conn, RestOfBatch(principal, requests, index + 1))
                return index + 1 - start
        return last + 1 - start

    def deliver_outcome(self, record: TaskRecord) -> None:
        """The task ended: send its outcome to everyone still connected who waits for it."""
        waiters, record.waiters = record.waiters, None
        if waiters is None:
            return
        waiting = self._waiting
        for waiter in ((waiters,) if type(waiters) is int else waiters):
            conn = waiting.get(waiter & _SERIAL_MASK)
            if conn is not None:  # else its connection ended: it waits no more
                self._send_outcome(conn, waiter >> WAITER_SERIAL_BITS, record)

    def connection_closed(self, conn: Connection) -> None:
        """A client connection ended: the tasks it waited for will find no one to answer."""
        self._waiting.pop(conn.serial, None)

    def _send_outcome(self, conn: Connection, rid: int, record: TaskRecord) -> None:
        if not conn.alive:  # the waiter's connection ended: whoever holds its identity now is someone else
            return
        # The error fields positionally: a dict of keywords per finished task cost three times the struct.
        outcome = protocol.Outcome(
            protocol.PROTOCOL_VERSION, rid, record.id, record.state, record.error_type, record.error_message,
            record.traceback,
        )
        self._outbox.put(conn, outcome, record.result)

    def _handle(self, conn: Connection, principal: Principal, request: Any, body: bytes | None, now: float) -> None:
        reply = self._outbox.put
        match request:
            case protocol.Submit():
                principal.require("submit")
                self._owner_check(request.pool)
                self._submit(conn, principal, request, body, now)
            case protocol.Wait():
                principal.require("wait")
                self._wait_for(self._visible_record(principal, request.id), conn, request.rid)
            case protocol.Unwait():
                principal.require("unwait")
                record = self._book.records.get(request.id)
                if record is not None:
                    _remove_waiter(record, request.rid << WAITER_SERIAL_BITS | conn.serial)
            case protocol.Status():
                principal.require("status")
                self._visible_record(principal, request.id)
                info = self._book.info(request.id)
                reply(conn, protocol.Info(
                    protocol.PROTOCOL_VERSION, request.rid, info.id, info.pool, info.tenant, info.priority,
                    info.state, info.attempts, info.submitted_at, info.started_at, info.finished_at,
                    info.deadline, info.error, info.cost,
                ))
            case protocol.Explain():
                principal.require("explain")
                self._visible_record(principal, request.id)
                # A pinned caller is told nothing of other tenants' tasks: the explanation is scoped to its subtree.
                explanation = self._explain(request.id, now, principal.tenant)
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, explanation))
            case protocol.Cancel():
                principal.require("cancel")
                self._visible_record(principal, request.id)
                cancelled = self._book.cancel(request.id, now)
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, cancelled))
            case protocol.Pause():
                principal.require("pause")
                self._owner_check(request.pool)
                self._pool_action(self._book.pause, request.pool)
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, True))
            case protocol.Resume():
                principal.require("resume")
                self._owner_check(request.pool)
                self._pool_action(self._book.resume, request.pool)
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, True))
            case protocol.Stats():
                principal.require("stats")
                rid = request.rid
                self._stats(lambda value: reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, rid,
                                                                  visible_stats(value, principal))))
            case protocol.Reload():
                principal.require("reload")
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, self._reload()))
            case protocol.Ping():
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, protocol.PROTOCOL_VERSION))
            case protocol.Hello():
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid,
                                        protocol.hello_value(self._book.max_payload_bytes, self.member)))
            case protocol.ClusterRequest():
                reply(conn, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, self._cluster()))
            case protocol.Refused():  # an item of a batch that could not be read
                raise request.error

    def _submit(self, conn: Connection, principal: Principal, request: protocol.Submit,
                body: bytes | None, now: float) -> None:
        tenant = request.tenant
        if principal.tenant is not None:
            if tenant is None:
                tenant = principal.tenant
            elif not principal.may_see_tenant(tenant):
                raise PermissionDenied(
                    f"this token is pinned to tenant {principal.tenant!r} and may not submit for tenant {tenant!r}; "
                    f"it may submit as {principal.tenant!r} or as one of its sub-tenants ({principal.tenant}/...)"
                )
        if body is None:
            body = protocol.NIL_BODY  # the body frame is optional: no payload is a nil one
        elif len(body) <= self._book.max_payload_bytes:  # a larger one is refused for its size by the book
            protocol.check_body(body, "the payload (the submit's body)")
        record, duplicate = self._book.submit(SubmitRequest(  # positionally (_SUBMIT_FIELDS): half the cost
            body, request.pool, tenant, request.priority, request.deadline, request.delay, request.key,
            request.max_retries, request.submission, cost=request.cost,
        ), now)
        if duplicate and not principal.may_see_tenant(record.tenant):
            # Cannot happen: the book finds duplicates only among the tasks of the tenant submitting, and a
            # pinned token always submits within its own subtree. Were it to happen anyway, the other tenant's
            # id must not leak, and no honest answer is left (accepting a second task would break the
            # key's promise; any refusal of our own would say the key exists), so it fails the way a bug
            # does: logged, and answered UNAVAILABLE.
            raise RuntimeError(f"a duplicate lookup crossed tenants: {principal.tenant!r} found {record.id}")
        if not (request.watch and request.outcome_only):  # `call`: the outcome is the only answer
            self._outbox.put(conn, protocol.Accepted(protocol.PROTOCOL_VERSION, request.rid, record.id, duplicate))
        if request.watch:
            self._wait_for(record, conn, request.rid)

    def _wait_for(self, record: TaskRecord, conn: Connection, rid: int) -> None:
        """Answer with the task's outcome under `rid`: now if it has one, else when it ends."""
        if record.finished_at is not None:
            self._send_outcome(conn, rid, record)
        else:
            self._waiting[conn.serial] = conn
            _add_waiter(record, rid << WAITER_SERIAL_BITS | conn.serial)

    def _visible_record(self, principal: Principal, task_id: str) -> TaskRecord:
        """The task's record if this principal may see it; else NotFound, word for word the answer for an id
        that never existed, so a pinned token learns nothing of other tenants' tasks."""
        record = self._book.get(task_id)
        if not principal.may_see_tenant(record.tenant):
            raise unknown_task(task_id)
        return record

    def _pool_action(self, action: Callable[[str], None], pool: str) -> None:
        pools = self._book.core.pool_names()
        if pool not in pools:
            raise NotFound(f"no pool named {pool!r}; declared pools: {', '.join(sorted(pools))}")
        action(pool)


def _add_waiter(record: TaskRecord, waiter: int) -> None:
    """Remember who waits for a live task's outcome: one waiter as a bare int (the common case, kept
    small because every watched queued task holds one), several in a list."""
    waiters = record.waiters
    if waiters is None:
        record.waiters = waiter
    elif type(waiters) is int:
        if waiters != waiter:  # an equal one is a client re-sending its wait: one outcome is enough
            record.waiters = [waiters, waiter]
    elif waiter not in waiters:
        if len(waiters) >= MAX_WAITERS_PER_TASK:
            raise ResourceExhausted(f"task {record.id} already has {MAX_WAITERS_PER_TASK} waiters; retry later")
        waiters.append(waiter)


def _remove_waiter(record: TaskRecord, waiter: int) -> None:
    waiters = record.waiters
    if waiters == waiter:
        record.waiters = None
    elif type(waiters) is list and waiter in waiters:
        waiters.remove(waiter)
