"""What the broker does for the messages on its client socket.

Each message is decoded (one request or a batch), its token identified
once, and every request authorized by role and tenant, carried out on the
task book, and answered through the clients' outbox, which the broker sends
after the pass's group commit. A client waiting for a task is remembered on
the task's record and gets its outcome from `deliver_outcome` when the book
says the task ended.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from cronoq import protocol
from cronoq.book import SubmitRequest, TaskBook, TaskRecord, outcome_error_fields
from cronoq.broker.auth import Principal
from cronoq.broker.messages import body_frame, check_frame_count, error_reply
from cronoq.broker.outbox import Outbox
from cronoq.errors import CronoqError, InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, Unavailable

log = logging.getLogger("cronoq.broker")

# Waits on one task: each costs a little memory until the task ends, so a flood of them is refused.
MAX_WAITERS_PER_TASK = 1024


class ClientRequests:
    """Serves client requests against `book`, replying into `outbox`.

    `identify` maps a token frame to its principal (the broker's current tokens, which a reload
    swaps); `stats` and `reload` are the broker's admin operations.
    """

    def __init__(self, book: TaskBook, outbox: Outbox, *, identify: Callable[[bytes], Principal],
                 stats: Callable[[], dict[str, Any]], reload: Callable[[], dict[str, Any]]) -> None:
        self._book = book
        self._outbox = outbox
        self._identify = identify
        self._stats = stats
        self._reload = reload

    def on_message(self, frames: list[bytes], now: float) -> int:
        """Handle one message from a client (a request or a batch of them); returns how many requests."""
        identity = frames[0]
        put = self._outbox.put
        try:
            check_frame_count(frames, "a request has 2 or 3 frames (token, header, optional body)")
            requests = protocol.unbatch(protocol.decode_client_request(frames[2]), body_frame(frames))
        except CronoqError as exc:
            put(identity, error_reply(protocol.peek_rid(frames[2]) if len(frames) > 2 else 0, exc))
            return 1
        try:
            principal = self._identify(frames[1])
        except CronoqError as exc:  # every request of a batch is refused, so no caller waits in vain
            for request, _ in requests:
                put(identity, error_reply(request.rid, exc))
            return len(requests)
        for request, body in requests:
            try:
                self._handle(identity, principal, request, body, now)
            except CronoqError as exc:
                put(identity, error_reply(request.rid, exc))
            except Exception:  # a bug: it must cost this one request, never the broker
                log.exception("failed to handle a client request; it was dropped")
                put(identity, error_reply(request.rid, Unavailable(
                    "the broker failed to handle this request (see its log); try again")))
        return len(requests)

    def deliver_outcome(self, record: TaskRecord) -> None:
        """The task ended: send its outcome to everyone waiting for it."""
        waiters, record.waiters = record.waiters, None
        if type(waiters) is tuple:
            self._send_outcome(*waiters, record)
        elif waiters:
            for identity, rid in waiters:
                self._send_outcome(identity, rid, record)

    def _send_outcome(self, identity: bytes, rid: int, record: TaskRecord) -> None:
        outcome = protocol.Outcome(
            protocol.PROTOCOL_VERSION, rid, record.id, record.state, **outcome_error_fields(record)
        )
        self._outbox.put(identity, outcome, record.result)

    def _handle(self, identity: bytes, principal: Principal, request: Any, body: bytes | None, now: float) -> None:
        reply = self._outbox.put
        match request:
            case protocol.Submit():
                principal.require("submit")
                self._submit(identity, principal, request, body, now)
            case protocol.Wait():
                principal.require("wait")
                self._wait_for(self._visible_record(principal, request.id), identity, request.rid)
            case protocol.Unwait():
                principal.require("unwait")
                record = self._book.records.get(request.id)
                if record is not None:
                    _remove_waiter(record, (identity, request.rid))
            case protocol.Status():
                principal.require("status")
                self._visible_record(principal, request.id)
                info = self._book.info(request.id)
                reply(identity, protocol.Info(
                    protocol.PROTOCOL_VERSION, request.rid, info.id, info.pool, info.tenant, info.priority,
                    info.state, info.attempts, info.submitted_at, info.started_at, info.finished_at,
                    info.deadline, info.error,
                ))
            case protocol.Cancel():
                principal.require("cancel")
                self._visible_record(principal, request.id)
                cancelled = self._book.cancel(request.id, now)
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, cancelled))
            case protocol.Pause():
                principal.require("pause")
                self._pool_action(self._book.pause, request.pool)
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, True))
            case protocol.Resume():
                principal.require("resume")
                self._pool_action(self._book.resume, request.pool)
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, True))
            case protocol.Stats():
                principal.require("stats")
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, self._stats()))
            case protocol.Reload():
                principal.require("reload")
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, self._reload()))
            case protocol.Ping():
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid, protocol.PROTOCOL_VERSION))
            case protocol.Hello():
                reply(identity, protocol.Ok(protocol.PROTOCOL_VERSION, request.rid,
                                            protocol.hello_value(self._book.max_payload_bytes)))

    def _submit(self, identity: bytes, principal: Principal, request: protocol.Submit,
                body: bytes | None, now: float) -> None:
        tenant = request.tenant
        if principal.tenant is not None:
            if tenant is None:
                tenant = principal.tenant
            elif tenant != principal.tenant:
                raise PermissionDenied(
                    f"this token is pinned to tenant {principal.tenant!r} and may not submit for tenant {tenant!r}"
                )
        if body is None:
            raise InvalidArgument("a submit needs a body frame holding the msgpack payload")
        record, duplicate = self._book.submit(SubmitRequest(
            body, pool=request.pool, tenant=tenant, priority=request.priority, deadline=request.deadline,
            delay=request.delay, key=request.key, max_retries=request.max_retries, submission=request.submission,
        ), now)
        if duplicate and not principal.may_see_tenant(record.tenant):
            raise PermissionDenied("that idempotency key (or submission id) belongs to another tenant's task")
        self._outbox.put(identity, protocol.Accepted(protocol.PROTOCOL_VERSION, request.rid, record.id, duplicate))
        if request.watch:
            self._wait_for(record, identity, request.rid)

    def _wait_for(self, record: TaskRecord, identity: bytes, rid: int) -> None:
        """Answer with the task's outcome under `rid`: now if it has one, else when it ends."""
        if record.finished_at is not None:
            self._send_outcome(identity, rid, record)
        else:
            _add_waiter(record, (identity, rid))

    def _visible_record(self, principal: Principal, task_id: str) -> TaskRecord:
        record = self._book.get(task_id)
        if not principal.may_see_tenant(record.tenant):
            raise PermissionDenied(f"task {task_id} belongs to another tenant; this token is pinned to {principal.tenant!r}")
        return record

    def _pool_action(self, action: Callable[[str], None], pool: str) -> None:
        pools = self._book.core.pool_names()
        if pool not in pools:
            raise NotFound(f"no pool named {pool!r}; declared pools: {', '.join(sorted(pools))}")
        action(pool)


def _add_waiter(record: TaskRecord, waiter: tuple[bytes, int]) -> None:
    """Remember who waits for a live task's outcome: one waiter as a bare tuple (the common case, kept
    small because every watched queued task holds one), several in a list."""
    waiters = record.waiters
    if waiters is None:
        record.waiters = waiter
    elif type(waiters) is tuple:
        if waiters != waiter:  # an equal one is a client re-sending its wait: one outcome is enough
            record.waiters = [waiters, waiter]
    elif waiter not in waiters:
        if len(waiters) >= MAX_WAITERS_PER_TASK:
            raise ResourceExhausted(f"task {record.id} already has {MAX_WAITERS_PER_TASK} waiters; retry later")
        waiters.append(waiter)


def _remove_waiter(record: TaskRecord, waiter: tuple[bytes, int]) -> None:
    waiters = record.waiters
    if waiters == waiter:
        record.waiters = None
    elif type(waiters) is list and waiter in waiters:
        waiters.remove(waiter)
