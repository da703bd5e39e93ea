"""The broker: two ROUTER sockets around one task book, on one asyncio loop.

One pass of the loop (`_pump`): drain both sockets without blocking, handle
every message (client requests in `clients.py`, worker messages here:
decode, authorize, call the book), expire and dispatch what the core says
is due, commit the pass's changes to the journal in one write (group
commit), and only then send every reply and assignment at once, one batch
per peer (`outbox.py`): an `accepted` reply is never sent for a task that
is not in the journal. Passes repeat while messages wait (libzmq is asked,
after the pass's last send on a socket, whether one came meanwhile: a send
can consume the FD's signal of it); then the loop sleeps until a socket or
a monitor becomes readable, the core's next wake-up, or the heartbeat tick.

No message, however malformed, may stop the loop: a refusal is answered
where a reply can be routed, anything else costs that one message only.
Every message is first matched to its connection (`connections.py`): the
broker trusts no routing identity a peer may have chosen, binds each
connection to the principal of the first valid token it shows, and gives
what it holds for each connection a byte budget.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import dataclasses
import itertools
import logging
import math
import os
import random
import resource
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import msgspec
import zmq

from cronoq.book.rates import DispatchRates
from cronoq.book.records import TaskRecord
from cronoq.book.taskbook import TaskBook
from cronoq.broker.auth import Authenticator, Principal
from cronoq.broker.clients import ClientRequests, RestOfBatch
from cronoq.broker.collector import CollectorPolicy
from cronoq.broker.config import DEFAULTS_SOURCE, BrokerConfig, load_config
from cronoq.broker.connections import Connection, Connections
from cronoq.broker.cron import CronRunner
from cronoq.broker.durable import SYNC_INTERVAL, DataDir
from cronoq.broker.failures import RecentFailures
from cronoq.broker.membership import Membership
from cronoq.broker.messages import (
    body_frame, check_frame_count, error_reply, refuse_if_misdirected, wrong_endpoint_hint,
)
from cronoq.broker.metrics import BrokerMetrics
from cronoq.broker.outbox import Outbox
from cronoq.broker.statistics import STATS_TENANTS, StatsReplies
from cronoq.broker.workers import WorkerEntry, WorkerRegistry
from cronoq.core import FAILED, PRIORITIES, PoolSettings, SchedulerCore
from cronoq.errors import ConfigError, CronoqError, FailedPrecondition, InvalidArgument, PermissionDenied, Unavailable
from cronoq.wire import protocol
from cronoq.wire.clustermap import TASK_ID_SEPARATOR
from cronoq.wire.curve import load_secret_key, serve_encrypted
from cronoq.wire.transport import readable as _readable, recv_routed, tune

if TYPE_CHECKING:
    from cronoq.broker.dashboard import Dashboard

log = logging.getLogger("cronoq.broker")

# Requests (a batch counts each of its own) taken from one socket before the other gets a turn and the
# core dispatches.
DRAIN_BATCH = 512
# Seconds of handling one pass of the loop may take before it commits, sends and lets other callbacks run.
# A request from an idle pool waits for the pass under way and is answered by the next (and a task's
# outcome one pass after its worker's `done`), so this bounds what a saturated pool adds to its round trip;
# shorter passes spread the per-pass costs (commit, one message per peer) over fewer tasks. Since a batch is
# cut at the deadline too, 1 ms kept a saturated pass's own CPU under 2 ms nearly always (the commit and the
# sends of what it handled come after), at no broker CPU per task measurable against 2 ms. Once a task's
# handling got cheaper, 1 ms held more tasks and the passes over 2 ms grew by 30 %; 0.8 ms brought them back,
# with the same CPU per task (bench/history/2026-12-01-broker-cpu-per-task.md).
PASS_BUDGET = 0.0008
# Seconds between checks that data_dir's lock is still this broker's (cronoq.store.journal.fence): a broker that lost it
# stops within about this long, and at its next journal write if another broker took data_dir over sooner.
FENCE_CHECK_INTERVAL = 0.5
# Frames above this are cut off by libzmq itself; payloads are checked against max_payload_bytes.
FRAME_SLACK = 64 * 1024
# A routed message has the peer's identity, then at most MAX_FRAMES frames; of a longer one we keep
# one frame more than that (to refuse it) and drop the rest as they arrive.
KEPT_FRAMES = 1 + protocol.MAX_FRAMES + 1
# Messages libzmq queues per connection before it stops reading that peer's socket (TCP then pushes
# back on the peer): bounds what a flood from one connection can pile up in the broker's memory.
RECEIVE_HWM = 1000
# Messages libzmq queues per connection for a peer that does not read: beyond them the broker keeps the rest
# in the connection's backlog, where its byte budget (connection_buffer_bytes) can see and bound them.
SEND_HWM = 16
# Seconds before the broker tries again to hand libzmq the backlog of a peer that was not reading.
BACKLOG_RETRY = 0.005
# Seconds between errors sent to a connection that has not authenticated: a flood of bad messages earns few.
REFUSAL_INTERVAL = 1.0
# Descriptors kept free of connections for the journal, the metrics server and libzmq's own.
SPARE_DESCRIPTORS = 64
# Connections per endpoint when the config does not say (fewer when the open-file limit is lower).
DEFAULT_MAX_CONNECTIONS = 10_000
# Config keys a reload cannot change in a running broker.
# max_payload_bytes is among them: libzmq fixes the largest frame it accepts when the sockets bind.
RESTART_KEYS = ("clients", "workers", "data_dir", "durability", "results_store", "metrics", "dashboard",
                "curve_secret_key_file", "max_payload_bytes", "auth_timeout", "max_connections",
                "connection_buffer_bytes", "member")


class Broker:
    """Serves one BrokerConfig until `stop()`."""

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], float] = time.time,
                 overrides: Callable[[BrokerConfig], BrokerConfig] | None = None) -> None:
        self.config = config
        # What the command line changes in the file's config (cronoq-broker --clients ...): again on each reload.
        self._overrides = overrides
        self._clock = clock
        self._auth = Authenticator(config.tokens)
        # Every declared pool at first, so that recovery keeps the tasks of a pool that a reload moved to
        # another member before a restart; `serve` then narrows the core to this member's pools, and such a
        # pool drains (docs/scaling.md).
        self._core = SchedulerCore(config.pools)
        prefix = "" if config.member is None else config.member + TASK_ID_SEPARATOR
        self._book = TaskBook(
            self._core, new_id=_task_ids(prefix), on_terminal=self._on_terminal,
            max_payload_bytes=config.max_payload_bytes, max_deliveries=config.max_deliveries,
            result_ttl=config.result_ttl, result_retention_bytes=config.result_retention_bytes,
            limits=self._pool_limits, rng=random.Random(), pacing_clock=time.perf_counter,
        )
        self._workers = WorkerRegistry(self._core, self._book)
        self._to_clients = Outbox(protocol.ReplyBatch)
        self._to_workers = Outbox(protocol.CommandBatch)
        self._stats_replies = StatsReplies(self._core, self._pool_stats, self._stats_map)
        self._membership = Membership(config, self._core)
        self._requests = ClientRequests(self._book, self._to_clients, identify=self._identify,
                                        authenticate=authenticate, refusal_allowed=refusal_allowed,
                                        stats=self._stats_replies.request, reload=self.reload,
                                        explain=self.explain, worker_endpoint=config.workers,
                                        owner_check=self._membership.require_owned, cluster=self._membership.map,
                                        member=config.member, set_aside=self._set_aside)
        self._clients: zmq.Socket | None = None
        self._workers_sock: zmq.Socket | None = None
        self._client_conns: Connections | None = None
        self._worker_conns: Connections | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._next_pass: asyncio.Handle | None = None
        # This pass left work it holds or that waits on a socket (a drain stopped short, the rest of a batch set
        # aside): the next pass is queued at once, not left to the next wake-up or timer.
        self._more = False
        self._beat_due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self._syncer: asyncio.TimerHandle | None = None
        self._fence_check: asyncio.TimerHandle | None = None
        # A group commit under way in the journal's writer thread, with the replies sealed until it is done.
        self._writing: tuple[concurrent.futures.Future[float], Outbox, Outbox] | None = None
        self._stopped: asyncio.Event | None = None
        self._cron: CronRunner | None = None
        # Sampled at each heartbeat, for the rates of `stats` and the estimates of `explain`.
        self._rates = DispatchRates(self._core)
        self.metrics = BrokerMetrics()
        self._collector = CollectorPolicy(self.metrics.gc_paused)
        self._busy = False
        """Whether clients asked anything or tasks were dispatched since the last heartbeat."""
        self._data = DataDir(config, self._book, self.metrics)
        self._metrics_servers: list[asyncio.base_events.Server] = []
        self._dashboard: Dashboard | None = None
        self.failures = RecentFailures()
        """The last tasks that failed, for the dashboard (a bounded ring)."""
        self.failure: str | None = None
        """Why the broker stopped by itself (it could not write its journal), or None."""
        self.endpoints: tuple[str, str] = ("", "")

    def _pool_limits(self, pool: str) -> tuple[int | None, int | None]:
        limits = self.config.limits.get(pool)
        return (None, None) if limits is None else (limits.max_backlog, limits.max_tenant_backlog)

    # ----------------------------------------------------------------- lifecycle

    def open(self, held_lock: int | None = None) -> dict[str, int] | None:
        """Lock data_dir and carry on from the state it holds; returns what recovery did (None: no data_dir).

        `held_lock`: the fd of data_dir's lock, already taken by a standby. Raises StoreError when the
        directory cannot be used. `cronoq-broker` calls it after `bind()`, so that a broker that cannot have its
        ports leaves data_dir untouched.
        """
        return self._data.open(self._clock(), held_lock)

    def close(self) -> None:
        """Release data_dir: commit and fsync what is left (nothing, after a failure). Idempotent."""
        self._data.close(failed=self.failure is not None)

    def bind(self, held: Mapping[str, int] | None = None) -> tuple[str, str]:
        """Bind both ROUTER sockets; returns the endpoints actually bound. Raises OSError on failure.

        `held`: listening sockets' descriptors by endpoint, bound already (a standby's, cronoq.broker.held): the
        ROUTER of that endpoint adopts it (ZMQ_USE_FD) instead of binding anew, so the address is never free.
        Every descriptor given is the broker's from here, closed on failure."""
        held = dict(held or {})
        try:
            return self._bind(held)
        finally:
            for fd in held.values():
                os.close(fd)

    def _bind(self, held: dict[str, int]) -> tuple[str, str]:
        ctx = zmq.Context.instance()
        max_frame = self.config.max_payload_bytes + FRAME_SLACK
        secret_key = None
        if self.config.curve_secret_key_file is not None:
            try:
                secret_key = load_secret_key(self.config.curve_secret_key_file)
            except InvalidArgument as exc:
                raise OSError(str(exc)) from None
        max_connections = _connection_limit(self.config.max_connections)
        _seed_routing_ids()
        sockets: list[tuple[zmq.Socket, Connections]] = []
        for endpoint, name, on_closed in ((self.config.clients, "client", self._on_client_closed),
                                          (self.config.workers, "worker", self._on_worker_closed)):
            sock = ctx.socket(zmq.ROUTER)
            tune(sock, max_message_bytes=max_frame)
            sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full queue or a gone peer is an error we can see
            sock.setsockopt(zmq.HANDSHAKE_IVL, int(self.config.auth_timeout * 1000))
            if secret_key is not None:
                serve_encrypted(sock, secret_key)
            conns = Connections(sock, name, max_connections=max_connections, auth_timeout=self.config.auth_timeout,
                                buffer_bytes=self.config.connection_buffer_bytes, on_closed=on_closed)
            try:
                if endpoint in held:
                    sock.setsockopt(zmq.USE_FD, held.pop(endpoint))  # from here the socket's, closed with it
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                conns.close()
                sock.close(linger=0)
                for other, other_conns in sockets:
                    other_conns.close()
                    other.close(linger=0)
                raise OSError(f"cannot bind {endpoint}: {exc}") from None
            sockets.append((sock, conns))
        (self._clients, self._client_conns), (self._workers_sock, self._worker_conns) = sockets
        sockets_only = [sock for sock, _ in sockets]
        self.endpoints = tuple(s.getsockopt_string(zmq.LAST_ENDPOINT) for s in sockets_only)  # type: ignore[assignment]
        return self.endpoints

    async def start_metrics(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve /metrics when the config asks for it (on `sockets`, when a standby held its address). Raises OSError
        when the address cannot be bound."""
        if self.config.metrics is not None:
            from cronoq.broker.exposition import collector_for, serve_metrics  # prometheus-client: only when asked

            collector = collector_for(self.stats, self.metrics, self.config.member)
            self._metrics_servers = await serve_metrics(self.config.metrics, collector, self.stats_in_steps, sockets,
                                                        hosts=lambda: self.config.metrics_hosts)

    async def start_dashboard(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve the web dashboard when the config asks for it (on `sockets`, when a standby held its address).
        Raises OSError when the address cannot be bound."""
        if self.config.dashboard is not None:
            from cronoq.broker.dashboard import BrokerParts, Dashboard  # only a broker that serves it loads it

            self._dashboard = Dashboard(BrokerParts(
                stats=self.stats, stats_in_steps=self.stats_in_steps, identify=self._identify,
                pools=lambda: self.config.pools, core=self._core, book=self._book, workers=self._workers.describe,
                failures=self.failures, act=self.act, clock=self._clock, explain=self.explain,
                hosts=lambda: self.config.dashboard_hosts,
                pinned_tenants=self._dashboard_pins,
                connections=self.metrics.dashboard,
            ))
            await self._dashboard.start(self.config.dashboard, sockets)

    def _dashboard_pins(self) -> set[str]:
        """The tenants of the tokens pinned to one that may read the dashboard (the charts it follows for them)."""
        return {token.tenant for token in self.config.tokens
                if token.tenant is not None and Principal(token.role, token.tenant).allows("dashboard")}

    def act(self, action: Callable[[float], Any]) -> Any:
        """Do an admin action that did not come through a socket (the dashboard's), given the time, then one pass
        of the loop: it reaches the journal before this returns, and its effects (dispatches after a resume, the
        outcome of a cancel to whoever waits) go out. Unavailable if the broker could not commit it."""
        result = action(self._clock())
        self._pump()
        if self.failure is not None:
            raise Unavailable(f"the broker stopped: {self.failure}")
        return result

    async def serve(self) -> None:
        """Run until `stop()`; `bind()` must have been called."""
        assert self._clients is not None and self._workers_sock is not None, "bind() first"
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        if self.config.cluster is not None:
            self._book.configure(self.config.owned_pools, self._clock())  # the others drain, or go when empty
        if Membership.own_schedules(self.config):
            self._cron = CronRunner(Membership.own_schedules(self.config), self.config.data_dir, self._clock())
        self._rates.sample(self._clock())  # rates count from the start, not from the first heartbeat
        self._collector.start()
        for sock in (self._clients, self._workers_sock):
            loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        for conns in (self._client_conns, self._worker_conns):
            loop.add_reader(conns.monitor.getsockopt(zmq.FD), self._on_monitor, conns)  # type: ignore[union-attr]
        self._beat_due = loop.time() + self.config.heartbeat_interval
        self._heartbeat = loop.call_later(self.config.heartbeat_interval, self._on_heartbeat_tick)
        if self._data.syncs_in_background:
            self._syncer = loop.call_later(SYNC_INTERVAL, self._on_sync_tick)
        if self._data.journal is not None:
            self._fence_check = loop.call_later(FENCE_CHECK_INTERVAL, self._on_fence_tick)
        self._data.watch(loop, self._pump)
        self._pump()
        await self._stopped.wait()
        for sock in self._watched_sockets():
            loop.remove_reader(sock.getsockopt(zmq.FD))
        for handle in (self._timer, self._heartbeat, self._syncer, self._retry, self._next_pass, self._fence_check):
            if handle is not None:
                handle.cancel()
        self._client_conns.close()  # type: ignore[union-attr]
        self._worker_conns.close()  # type: ignore[union-attr]
        self._clients.close(linger=0)
        self._workers_sock.close(linger=0)
        for server in self._metrics_servers:
            server.close()
        if self._dashboard is not None:
            self._dashboard.close()
        self._collector.stop()
        self.close()

    def _on_monitor(self, conns: Connections) -> None:
        """A monitor's FD signalled: a connection may have come or gone. The pass reads it."""
        conns.signal()
        self._pump()

    def _watched_sockets(self) -> list[zmq.Socket]:
        """The sockets whose readiness wakes the loop: both ROUTERs and their monitors."""
        return [self._clients, self._workers_sock, self._client_conns.monitor,  # type: ignore[list-item,union-attr]
                self._worker_conns.monitor]  # type: ignore[union-attr]

    def stop(self, reason: str = "asked to stop") -> None:
        """Stop accepting and return from `serve()` (graceful: changes are committed, replies sent).

        `reason` (e.g. the signal's name) goes into the log line that says what is left at the stop.
        """
        if self._stopped is not None and not self._stopped.is_set():
            if self._commit_all():
                log.info("stopping: %s; %s", reason, self._left_at_stop())
            self._stopped.set()

    def _commit_all(self) -> bool:
        """Commit everything here and now, after the writer thread's frame if one is under way, and send every
        reply that waited; False when the journal cannot be written (the broker stops)."""
        if not self._send_what_was_written():
            return False
        try:
            self._data.commit()
        except OSError as exc:
            self._journal_failed(exc)
            return False
        self._flush(self._to_clients, self._to_workers)
        return True

    def _journal_failed(self, exc: OSError) -> None:
        self._fail(f"cannot write the journal in {self.config.data_dir}: {exc}")

    def _left_at_stop(self) -> str:
        """What the broker holds as it stops, and whether it is kept, for the log."""
        counts = {"queued": 0, "delayed": 0, "running": 0}
        for pool_stats in self._core.stats().values():
            for what in counts:
                counts[what] += pool_stats[what]
        held = f"{_count(counts['queued'], 'task')} queued, {counts['running']} running"
        if counts["delayed"]:
            held += f", {counts['delayed']} delayed"
        if self._data.journal is None:
            return f"{held}; nothing is kept (no data_dir)"
        return f"{held}; journal flushed to {self.config.data_dir}"

    def _fail(self, reason: str) -> None:
        """Stop at once without answering: what this pass did is not durable, so nothing of it is confirmed."""
        log.critical("%s; stopping without sending the replies of this pass", reason)
        self.failure = reason
        self._to_clients.clear()
        self._to_workers.clear()
        self._writing = None  # and what waited for a write in the writer thread
        if self._stopped is not None:
            self._stopped.set()

    # ----------------------------------------------------------------- the loop

    def _pump(self) -> None:
        """One pass of the loop; while it finds work, the next pass is queued behind the loop's other callbacks.

        A pass handles at most PASS_BUDGET seconds of messages, so one saturated pool delays another pool's
        request by a pass or two, and timers, heartbeats and the metrics server get their turn in between.
        """
        if self._next_pass is not None:
            self._next_pass.cancel()
            self._next_pass = None
        if self._stopped is None or self._stopped.is_set():
            return
        clients, workers = self._clients, self._workers_sock
        client_conns, worker_conns = self._client_conns, self._worker_conns
        started, cpu_started = time.perf_counter(), time.thread_time()
        now = self._clock()
        # Connects and disconnects first: a worker that left is lost before anything more is sent to it. A
        # monitor is read when its FD has signalled; what an earlier read took is reported in any case.
        worker_conns.poll_events(now, look=worker_conns.signalled)  # type: ignore[union-attr]
        client_conns.poll_events(now, look=client_conns.signalled)  # type: ignore[union-attr]
        self._more = False
        # Workers first, with half the pass at most: their `done`s free the slots this pass fills again.
        handled = self._drain(workers, worker_conns, self._on_worker_message, now, started + PASS_BUDGET / 2)
        # What was set aside first (the rest of a batch the last pass had no time for), then what came since.
        asked = self._unpark(client_conns, self._requests.on_message, now, started + PASS_BUDGET)
        asked += self._drain(clients, client_conns, self._requests.on_message, now, started + PASS_BUDGET)
        handled += asked
        fired = self._fire_schedules(now) if self._cron is not None else False
        # Every pass forgets what expired since the last: a few records each time, never a day's worth at once.
        self._book.forget_expired_records(now)
        dispatched = self._dispatch(now)
        self._stats_replies.step()  # a step of the search for the busiest tenants, when a `stats` waits for one
        if asked or dispatched:
            self._busy = True
        sent_workers = sent_clients = False
        if self._writing is None:  # else this pass's changes and replies wait for the write under way
            if not self._commit():
                return
            if self._writing is None:
                sent_workers, sent_clients = self._flush(self._to_clients, self._to_workers)
                self._data.ship_finished()  # after the replies: they go first, the archiver wakes after
        if fired:
            self._cron.save()  # type: ignore[union-attr]
        self._collector.worked(handled + dispatched)  # after the flush: nobody's reply waits for it
        until = started + PASS_BUDGET
        unparked = self._unpark(worker_conns, self._on_worker_message, now, until)
        unparked += self._unpark(client_conns, self._requests.on_message, now, until)
        self.metrics.pass_took(time.perf_counter() - started, time.thread_time() - cpu_started)
        # The loop may sleep once both sockets are empty. The drains read each until it was empty (a look that
        # re-arms its FD's edge), unless they stopped short (`_more`). A send can consume the edge of a message
        # that arrived meanwhile, so a socket sent on is asked (ZMQ_EVENTS) after the send: a message found
        # there gets another pass, and an empty answer re-arms the edge for the next one.
        if (unparked or self._more or (sent_workers and _readable(workers)) or (sent_clients and _readable(clients))
                or worker_conns.ending or client_conns.ending  # type: ignore[union-attr]
                or self._stats_replies.searching or (self._data.releasing and self._writing is None)):
            self._next_pass = asyncio.get_running_loop().call_soon(self._pump)
        self._arm_timer()
        self._arm_retry()

    def _drain(self, sock: zmq.Socket, conns: Connections,
               handle: Callable[[Connection, list[bytes], float, float], int], now: float, until: float) -> int:
        """Handle messages until the socket is empty, DRAIN_BATCH requests, or `until` (perf_counter); returns
        how many. A message from a peer over its budget is set aside, unhandled.

        Whether another message waits is asked of ZMQ_EVENTS before each receive, rather than receiving until
        zmq.Again: a drain finds one or two messages nearly always, even at full rate (a client's batch is one
        message), and a look costs less than the exception pyzmq builds. Both leave the FD's edge re-armed."""
        count = 0
        clock = time.perf_counter
        while _readable(sock):
            try:
                frames, fd = recv_routed(sock, KEPT_FRAMES)
            except zmq.Again:  # (libzmq said a message waits; it always does)
                break
            conn = conns.admit(frames[0], fd, now)
            if conn is None:  # sent on a connection that has ended: nobody is left to answer
                count += 1
            elif conn.parked or conns.over_budget(conn):
                conns.park(conn, frames)
                count += 1
            else:
                count += handle(conn, frames, now, until)
            if count >= DRAIN_BATCH or clock() >= until:
                self._more = True  # the rest waits for the next pass
                return count
        conns.emptied()
        return count

    def _unpark(self, conns: Connections, handle: Callable[[Connection, Any, float, float], int],
                now: float, until: float) -> int:
        """Handle the messages set aside for peers whose backlog has drained back under budget, until `until`."""
        if not conns.backlogged:  # nothing is set aside (nearly always)
            return 0
        count = 0
        clock = time.perf_counter
        for conn in conns.parking():
            while clock() < until:
                frames = conns.unpark(conn)
                if frames is None:
                    break
                count += handle(conn, frames, now, until)
        return count

    def _set_aside(self, conn: Connection, rest: RestOfBatch) -> None:
        """The rest of a batch this pass had no time for: it is handled first, in the very next pass. Nothing on the
        sockets may wake the loop for it, and the backlog retry would leave the loop idle for milliseconds while
        requests it holds wait (a burst of 5,000 submits was accepted at a third of the rate)."""
        self._client_conns.set_aside(conn, rest)  # type: ignore[union-attr]
        self._more = True

    def _arm_retry(self) -> None:
        """While a peer's backlog waits, try again soon: libzmq says when a socket is readable, not when one
        peer's queue has room."""
        waiting = self._client_conns.backlogged or self._worker_conns.backlogged  # type: ignore[union-attr]
        if waiting and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(BACKLOG_RETRY, self._on_retry)

    def _on_retry(self) -> None:
        self._retry = None
        self._pump()

    def _commit(self) -> bool:
        """Group commit: the changes of this pass (and of the passes that waited for a write) reach the journal
        before any of their replies leave. A big frame goes to the journal's writer thread: then the replies
        waiting so far are sealed with it (`_writing`), the loop goes on serving, and `_on_written` sends them
        once the write is done. False when the journal cannot be written (the broker stops)."""
        try:
            writing = self._data.commit_pass()
        except OSError as exc:
            self._journal_failed(exc)
            return False
        if writing is not None:
            self._writing = (writing, self._to_clients.seal(), self._to_workers.seal())
            loop = asyncio.get_running_loop()
            writing.add_done_callback(lambda _: loop.call_soon_threadsafe(self._on_written))
        return True

    def _on_written(self) -> None:
        """The writer thread's commit is on disk: send what waited for it, then serve what came meanwhile."""
        if self._stopped is not None and self._stopped.is_set():
            return
        if self._writing is not None and self._send_what_was_written():
            self._pump()

    def _send_what_was_written(self) -> bool:
        """Once the writer thread's commit is done (waiting for it, if need be), send the replies sealed with it;
        False when it failed (the broker stops)."""
        if self._writing is None:
            return True
        writing, to_clients, to_workers = self._writing
        self._writing = None
        try:
            self._data.written(writing)
        except OSError as exc:
            self._journal_failed(exc)
            return False
        self._flush(to_clients, to_workers)
        self._data.ship_finished()
        return True

    def _dispatch(self, now: float) -> int:
        """Hand out what the core says is due; returns how many tasks."""
        put = self._to_workers.put
        assignments = self._book.dispatch(now)
        for worker, record, attempt in assignments:
            put(worker, protocol.Assign(
                protocol.PROTOCOL_VERSION, record.id, attempt, record.pool, record.tenant, PRIORITIES[record.priority],
            ), record.payload)
        return len(assignments)

    def _flush(self, to_clients: Outbox, to_workers: Outbox) -> tuple[bool, bool]:
        """Send what waits for workers and for clients (and retry their backlogs); returns whether anything was
        handed to each socket."""
        worker_conns, client_conns = self._worker_conns, self._client_conns
        to_each_worker = bool(to_workers) or bool(worker_conns.backlogged)  # type: ignore[union-attr]
        to_each_client = bool(to_clients) or bool(client_conns.backlogged)  # type: ignore[union-attr]
        # A disconnect reported meanwhile must stop what was meant for that peer (its identity may be reused).
        now = self._clock()
        if to_each_worker:
            worker_conns.poll_events(now, report=False)  # type: ignore[union-attr]
        if to_each_client:
            client_conns.poll_events(now, report=False)  # type: ignore[union-attr]
        if to_each_worker:
            to_workers.send(self._workers_sock, self._worker_conns)  # type: ignore[arg-type]
        if to_each_client:
            to_clients.send(self._clients, self._client_conns)  # type: ignore[arg-type]
        return to_each_worker, to_each_client

    def _fire_schedules(self, now: float) -> bool:
        """Submit the task of every cron tick due now; True if any tick fired."""
        requests = self._cron.due(now)  # type: ignore[union-attr]
        for request in requests:
            try:
                record, duplicate = self._book.submit(request, now)
            except CronoqError as exc:  # e.g. the pool is at max_backlog: this tick is skipped, loudly
                log.error("schedule tick %s not submitted: %s %s", request.key, exc.code, exc)
                continue
            if not duplicate:
                log.info("schedule tick %s submitted as task %s", request.key, record.id)
        return bool(requests)

    def _arm_timer(self) -> None:
        wake = self._book.next_wakeup()
        if self._cron is not None:
            tick = self._cron.next_wakeup()
            if tick is not None and (wake is None or tick < wake):
                wake = tick
        if wake == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake
        if wake is not None:
            delay = max(0.0, wake - self._clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    def _on_heartbeat_tick(self) -> None:
        """Beat to every worker, declare silent ones lost, cut idle unauthenticated connections, and forget old
        finished records."""
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_interval
        late = loop.time() - self._beat_due
        # Read what is waiting first: a worker's heartbeats and `done`s that queued up while this loop was
        # busy are signs of life, and must be counted before anyone is judged silent.
        self._pump()
        started = time.perf_counter()
        now = self._clock()
        if late > interval:
            # The broker itself stalled (a long pause, SIGSTOP, a swapped-out page): the workers' silence is
            # ours. Give everyone a fresh liveness window rather than losing workers that did their part.
            log.warning("the broker's loop stalled for %.1f s; workers get a fresh liveness window", late)
            self._workers.heard_from_all(now)
        deadline = now - interval * self.config.liveness
        beat = protocol.Heartbeat(protocol.PROTOCOL_VERSION)
        for worker, entry, silent in self._workers.silent_since(deadline):
            if silent:
                log.warning("worker %s silent for %.1f s: lost", worker.label, now - entry.last_seen)
                self._workers.lose(worker, now)
            else:
                self._to_workers.put(worker, beat)
        self._client_conns.sweep(now)  # type: ignore[union-attr]
        self._worker_conns.sweep(now)  # type: ignore[union-attr]
        self._book.forget_expired_records(now)
        self._rates.sample(now)
        self._compact_if_worthwhile()
        if not self._busy:
            self._collector.quiet(loop.time(), len(self._book.records))
        self._busy = False
        self.metrics.heartbeat_took(time.perf_counter() - started)
        self._beat_due = loop.time() + interval
        self._heartbeat = loop.call_later(interval, self._on_heartbeat_tick)
        self._pump()

    def _on_sync_tick(self) -> None:
        """With durability "sync", bound what a power loss could take to about SYNC_INTERVAL. The fdatasync runs
        in the sync thread: the loop goes on serving while the disk works; the next tick is armed once it is
        done, so syncs never pile up behind a slow disk."""
        self._syncer = None
        syncing = self._data.sync_in_background()
        if syncing is None:
            self._arm_sync()
        else:
            syncing.add_done_callback(self._on_synced)

    def _on_synced(self, syncing: asyncio.Future[None]) -> None:
        if self._stopped is None or self._stopped.is_set():
            return
        error = syncing.exception()
        if error is not None:
            self._fail(f"cannot fdatasync the journal in {self.config.data_dir}: {error}")
            return
        self._arm_sync()

    def _on_fence_tick(self) -> None:
        """Stop at once if data_dir's lock is no longer ours (cronoq.store.journal.fence): another broker may be taking
        it over, and from now on only it may accept, dispatch or write."""
        self._fence_check = None
        if self._stopped is None or self._stopped.is_set():
            return
        why = self._data.lost()
        if why is not None:
            self._fail(f"this broker no longer holds data_dir {self.config.data_dir}: {why}; it stops accepting and "
                       "dispatching so that only the broker holding the lock serves these tasks")
            return
        self._fence_check = asyncio.get_running_loop().call_later(FENCE_CHECK_INTERVAL, self._on_fence_tick)

    def _arm_sync(self) -> None:
        if self._stopped is not None and not self._stopped.is_set():
            self._syncer = asyncio.get_running_loop().call_later(SYNC_INTERVAL, self._on_sync_tick)

    def _compact_if_worthwhile(self) -> None:
        try:
            self._data.compact_if_worthwhile()
        except OSError as exc:  # the commit before the snapshot failed: fatal, as any failed commit
            self._journal_failed(exc)

    # ----------------------------------------------------------------- clients (requests: clients.py)

    def _identify(self, token: bytes, conn: Connection | None = None) -> Principal:
        """The caller behind a token (shown on `conn`), by the tokens of the current config (a reload swaps
        them)."""
        return self._auth.identify(token, conn)

    def _on_client_closed(self, conn: Connection, now: float) -> None:
        """A client left: nothing more goes to it (its waiters are skipped as their tasks end)."""
        self._requests.connection_closed(conn)

    def _on_worker_closed(self, conn: Connection, now: float) -> None:
        """A worker's connection ended: it is lost now, not a liveness period later, and its identity is free."""
        if self._workers.get(conn) is not None:
            log.info("worker %s disconnected: lost", conn.label)
            self._workers.lose(conn, now)

    def _on_terminal(self, record: TaskRecord) -> None:
        """The book says a task ended: count it, and send its outcome to whoever waits for it."""
        self.metrics.task_finished(record.pool, record.state, record.submitted_at, record.started_at,
                                   record.finished_at)
        self._requests.deliver_outcome(record)
        if record.state == FAILED:
            self.failures.add(record.id, record.pool, record.tenant, record.error_type, record.error_message,
                              record.traceback, record.attempts, record.finished_at)

    def reload(self) -> dict[str, Any]:
        """Reread the config file and apply it; FailedPrecondition (the running config stays) if it is invalid.

        Pools, weights (applied to the queued backlog at once), limits, tokens, schedules, heartbeats and
        retention change in place; pools left out drain and then go. Endpoints, data_dir, durability, the results
        store, metrics and the CURVE key take a restart: they keep their running values, and the answer says so.
        """
        if self.config.source == DEFAULTS_SOURCE:
            raise FailedPrecondition("this broker runs on built-in defaults: there is no config file to reload")
        try:
            # A member stays the member it is (--member, or the file's key when it started): that takes a restart.
            new = load_config(self.config.source, member=self.config.member)
            if self._overrides is not None:
                new = self._overrides(new)
        except ConfigError as exc:
            log.error("reload refused, the running config stays: %s", exc)
            raise FailedPrecondition(f"reload refused, the running config stays: {exc}") from None
        needs_restart = [key for key in RESTART_KEYS if getattr(new, key) != getattr(self.config, key)]
        if needs_restart:
            log.warning("reload: %s change only with a restart; keeping the running values", ", ".join(needs_restart))
            new = dataclasses.replace(new, **{key: getattr(self.config, key) for key in needs_restart})
        old_pools = {pool.name for pool in self.config.owned_pools}
        weights_changed = _weight_changes(self.config.owned_pools, new.owned_pools)
        shares_changed = _share_changes(self.config.owned_pools, new.owned_pools)
        self._book.configure(new.owned_pools, self._clock())  # a node the reload caps is capped since now, on our clock
        self._book.max_deliveries = new.max_deliveries
        self._book.set_retention(new.result_ttl, new.result_retention_bytes)
        self._auth = Authenticator(new.tokens)
        schedules = Membership.own_schedules(new)
        if schedules or self._cron is not None:
            if self._cron is None:
                self._cron = CronRunner(schedules, new.data_dir, self._clock())
            else:
                self._cron.configure(schedules, self._clock())
        self.config = new
        self._membership.configure(new)
        self._requests.member = new.member
        new_pools = {pool.name for pool in new.owned_pools}
        changes = {
            "pools_added": sorted(new_pools - old_pools), "pools_draining": sorted(old_pools - new_pools),
            "weights_changed": weights_changed, "shares_changed": shares_changed, "needs_restart": needs_restart,
        }
        log.info("reloaded %s: %s", new.source, _reload_summary(changes))
        return changes

    def explain(self, task_id: str, now: float | None = None, scope: str | None = None) -> dict[str, Any]:
        """Why the task is where it is, as plain maps and lists (cronoq.answers.Explanation's fields), or NotFound.
        Whoever calls it checks that the asker may see this task, and passes the tenant the asker is pinned to
        as `scope`: then nothing of other tenants' tasks is told (cronoq.core.explain)."""
        now = self._clock() if now is None else now
        record = self._book.get(task_id)
        explanation = self._book.explain(task_id, now, *self._rates.for_explain(record.pool, now), scope)
        return msgspec.to_builtins(explanation)

    def stats(self) -> dict[str, Any]:
        """Per-pool statistics from the core, plus the workers serving each pool, at once (the metrics endpoint
        asks this way); a pool with more than STATS_TENANTS tenants lists those the last search found busiest."""
        return self._stats_replies.now()

    async def stats_in_steps(self) -> dict[str, Any]:
        """What `stats()` answers, each pool's part made in a turn of the loop of its own (a scrape, the dashboard's
        sampling): a pool's part lists at most STATS_TENANTS tenants, so no turn holds the loop for more than
        about 2.5 ms, however many pools and tenants there are. Each pool's figures are of the moment its turn came."""
        chosen = self._stats_replies.latest()
        pools: dict[str, Any] = {}
        for name in self._core.all_pool_names():
            pools.update(self._pool_stats(chosen, (name,)))
            await asyncio.sleep(0)
        return self._stats_map(pools)

    def _pool_stats(self, chosen: dict[str, list[str | None]], only: tuple[str, ...] | None = None
                    ) -> dict[str, Any]:
        """The stats of every pool (or of those in `only`), with the workers serving each and its dispatch rate;
        each pool in `chosen` lists those tenants, any other at most STATS_TENANTS."""
        now = self._clock()
        pools = self._core.stats(chosen, limit=STATS_TENANTS, now=now, pools=only)
        rates = self._rates.rates(now)
        for name, pool_stats in pools.items():
            pool_stats["workers"] = self._workers.serving(name)
            pool_stats["dispatch_rate"] = rates.get(name, 0.0)
        return pools

    def _stats_map(self, pools: dict[str, Any]) -> dict[str, Any]:
        """The stats map around the pools' stats: the broker's own counts."""
        extra = {} if self.config.member is None else {"member": self.config.member}
        return {**extra, "pools": pools, "workers": len(self._workers), "late_results": self._workers.late_results,
                "schedules": {} if self._cron is None else self._cron.describe(),
                "memory": self._book.memory_stats(), "store": self._data.stats()}

    # ----------------------------------------------------------------- workers

    def _on_worker_message(self, conn: Connection, frames: list[bytes], now: float, until: float = math.inf) -> int:
        """Handle one message from a worker (or a batch of them); returns how many messages. A worker's batch is
        handled whole (`until` is not looked at): it holds at most one `done` per slot of the worker."""
        try:
            check_frame_count(frames, "a worker message has 2 or 3 frames (token, header, optional body)")
            principal = self._identify(frames[1], conn)
            principal.require("serve")
            messages = protocol.read_worker_messages(frames[2], body_frame(frames))
            refuse_if_misdirected(frames, messages, "worker", self.config.clients)
            authenticate(conn, principal)
        except CronoqError as exc:
            # One error for the whole message, under its rid where it has one (a refused `ready`'s), as on the
            # client socket; a peer without a valid token earns few of them.
            if refusal_allowed(conn, now):
                # A message meant for the client endpoint is answered under rid 0, which makes a client fail
                # every request it sent here (see wrong_endpoint_hint).
                hint = wrong_endpoint_hint(frames, "worker", self.config.clients)
                rid = 0 if hint is not None else protocol.peek_rid(frames[2]) if len(frames) > 2 else 0
                self._to_workers.put(conn, error_reply(rid, hint or exc))
            return 1
        for message, body in messages:
            try:
                self._handle_worker_message(conn, message, body, now)
            except CronoqError as exc:
                self._to_workers.put(conn, error_reply(getattr(message, "rid", 0), exc))
            except Exception:  # a bug: it must cost this one message, never the broker
                log.exception("failed to handle a worker message; it was dropped")
        return len(messages)

    def _handle_worker_message(self, conn: Connection, message: Any, body: bytes | None, now: float) -> None:
        entry = self._workers.get(conn)
        if entry is not None:
            entry.last_seen = now
            if message.__class__ is protocol.Done:  # nearly every message a busy worker sends: no match for it
                self._on_done(conn, entry, message, body, now)
                return
        match message:
            case protocol.Refused():  # an item of a batch that could not be read
                raise message.error
            case protocol.ClusterRequest():
                self._to_workers.put(conn, protocol.Ok(protocol.PROTOCOL_VERSION, message.rid, self._membership.map()))
            case protocol.Ready():
                if entry is None or entry.leaving or entry.pools != list(message.pools):
                    self._membership.require_servable(message.pools)
                    self._workers.register(conn, message, {pool.name: pool for pool in self.config.pools}, now,
                                           draining_served=self._membership.clustered)
                # else the same Ready again on a registered connection: a worker asks again when its Welcome is
                # slow to come (a busy machine), and by then it may hold tasks it has not seen yet. Its slots are
                # the broker's count, not the stale one it sent: it only gets its Welcome again.
                self._to_workers.put(conn, protocol.Welcome(
                    protocol.PROTOCOL_VERSION, message.rid, self.config.heartbeat_interval, self.config.liveness,
                    self.config.max_payload_bytes,
                ))
            case _ if entry is None:
                if message.__class__ is protocol.Done:  # a result from a worker the broker let go of
                    self._on_late_done(conn, message, body, now)
                if not isinstance(message, protocol.Bye):
                    # We restarted, or declared this worker lost: it must announce itself again.
                    self._to_workers.put(conn, protocol.Reregister(protocol.PROTOCOL_VERSION))
            case protocol.Heartbeat():
                pass
            # A registered worker's Done was handled before the match.
            case protocol.Leave():
                self._workers.leave(conn, entry)
                self._to_workers.put(conn, protocol.Left(protocol.PROTOCOL_VERSION))
                log.info("worker %s leaving: it takes no more tasks and finishes its %s", conn.label,
                         _count(len(self._core.worker_tasks(conn)), "running task"))
            case protocol.Bye():
                unfinished = len(self._core.worker_tasks(conn))
                self._workers.lose(conn, now)
                log.info("worker %s left%s", conn.label,
                         f" with {_count(unfinished, 'unfinished task')}" if unfinished else "")

    def _on_late_done(self, conn: Connection, done: protocol.Done, body: bytes | None, now: float) -> None:
        """A `done` from a connection that is no registered worker (the broker declared it lost)."""
        done = protocol.bounded(done)
        max_bytes = self.config.max_payload_bytes
        if done.ok and body is not None:
            try:
                if len(body) > max_bytes:
                    raise InvalidArgument("too large")
                protocol.check_body(body, "the result (the done's body)")
            except InvalidArgument:  # not a result the task could end with: counted late, like any other
                done = protocol.Done(protocol.PROTOCOL_VERSION, done.id, done.attempt, False)
                body = None
        self._workers.late(conn, done, body, now)

    def _on_done(self, conn: Connection, entry: WorkerEntry, done: protocol.Done, body: bytes | None,
                 now: float) -> None:
        """A registered worker's `done`: the outcome of one of its leases."""
        done = protocol.bounded(done)  # a worker that does not cut its failure's text is cut here
        max_bytes = self.config.max_payload_bytes
        if done.ok and body is not None and len(body) <= max_bytes:
            try:  # a result the client could not read fails its task here, not in the client
                protocol.check_body(body, "the result (the done's body)")
            except InvalidArgument as exc:
                done = protocol.Done(protocol.PROTOCOL_VERSION, done.id, done.attempt, False,
                                     "InvalidArgument", f"the worker sent a bad result: {exc.message}")
                body = None
        self._workers.complete(conn, entry, done, body, now, max_bytes)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _pools_in_both(old: tuple[PoolSettings, ...],
                   new: tuple[PoolSettings, ...]) -> list[tuple[PoolSettings, PoolSettings]]:
    """(old settings, new settings) of each pool both configs declare, in the new config's order."""
    before = {pool.name: pool for pool in old}
    return [(before[pool.name], pool) for pool in new if pool.name in before]


def _weight_changes(old: tuple[PoolSettings, ...], new: tuple[PoolSettings, ...]) -> list[dict[str, Any]]:
    """Tenant weights that differ between two configs, in the pools both declare (unlisted tenants weigh 1)."""
    changes = []
    for was, pool in _pools_in_both(old, new):
        for tenant in sorted(set(was.tenant_weights) | set(pool.tenant_weights)):
            if was.weight(tenant) != pool.weight(tenant):
                changes.append({"pool": pool.name, "tenant": tenant, "old": was.weight(tenant),
                                "new": pool.weight(tenant)})
    return changes


_SHARE_SETTINGS = ("share_by", "tenant_rates", "tenant_minimums")


def _share_changes(old: tuple[PoolSettings, ...], new: tuple[PoolSettings, ...]) -> list[dict[str, Any]]:
    """What a share counts, tenant rates and minimums that differ between two configs, in the pools both
    declare: one map per pool and setting, with the old and new value (a table per node for rates and minimums;
    a node left out has none)."""
    changes = []
    for was, pool in _pools_in_both(old, new):
        for setting in _SHARE_SETTINGS:
            then, now = getattr(was, setting), getattr(pool, setting)
            if then != now:
                plain = (lambda v: dict(v)) if setting != "share_by" else (lambda v: v)
                changes.append({"pool": pool.name, "setting": setting, "old": plain(then), "new": plain(now)})
    return changes


def _reload_summary(changes: dict[str, Any]) -> str:
    """What a reload changed, as one line of text (for the broker's log and `cronoq reload`)."""
    weights = ", ".join(f"{w['pool']} {w['tenant']} {w['old']:g} -> {w['new']:g}"
                        for w in changes.get("weights_changed", ()))
    shares = _shares_text(changes.get("shares_changed", ()))  # only when some changed: the line stays as it was
    return (f"pools added: {', '.join(changes['pools_added']) or 'none'}; "
            f"pools draining: {', '.join(changes['pools_draining']) or 'none'}; "
            f"weights changed: {weights or 'none'}; "
            + (f"shares changed: {shares}; " if shares else "") +
            f"kept until a restart: {', '.join(changes['needs_restart']) or 'none'}")


def _shares_text(changes: Any) -> str:
    return ", ".join(f"{c['pool']} {c['setting']} {c['old']} -> {c['new']}" for c in changes)


def authenticate(conn: Connection, principal: Principal) -> None:
    """Bind a connection to the principal of the first valid token it showed; a connection keeps its principal."""
    bound = conn.principal
    if bound is None or bound.name == principal.name:
        conn.principal = principal  # the same token's role or tenant may have changed with a reload
    else:
        raise PermissionDenied(f"this connection speaks for {bound.name!r}; open a new connection for another token")


def refusal_allowed(conn: Connection, now: float) -> bool:
    """Whether to answer a refused message: always for an authenticated peer, once a REFUSAL_INTERVAL for
    one that never showed a valid token (a flood of bad messages must not become a flood of replies)."""
    if conn.principal is not None:
        return True
    if now - conn.last_refusal < REFUSAL_INTERVAL:
        return False
    conn.last_refusal = now
    return True


def _seed_routing_ids() -> None:
    """Seed the C library's rand(), from which libzmq draws the first routing identity a ROUTER gives out.

    Unseeded, every broker process hands out the same sequence, and a peer that claims an identity the broker
    is about to generate makes libzmq abort (it assumes generated identities are free). Seeded from the OS,
    the sequence cannot be predicted; docs/security.md says what remains.
    """
    try:
        ctypes.CDLL(None).srand(int.from_bytes(os.urandom(4), "little"))
    except (OSError, AttributeError):  # no C library to seed (not a POSIX system): nothing to do
        log.warning("could not seed the C library's rand(): routing identities will be predictable")


def _connection_limit(configured: int | None) -> int:
    """Raise the open-file limit as far as allowed, and keep max_connections within it (when it was set, say so)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (OSError, ValueError) as exc:
        log.warning("could not raise the open-file limit: %s", exc)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    usable = max(1, (soft - SPARE_DESCRIPTORS) // 2)  # two endpoints share the descriptors
    if configured is None:
        return min(DEFAULT_MAX_CONNECTIONS, usable)
    if configured > usable:
        log.warning("max_connections = %d, but the open-file limit (%d) leaves room for %d per endpoint; using %d",
                    configured, soft, usable, usable)
        return usable
    return configured


def _task_ids(prefix: str = "") -> Callable[[], str]:
    """Task ids: 128 bits from the OS's CSPRNG each, as 32 hex digits, after `prefix` (a cluster member's name
    and a colon, so that any client knows whom to ask about the task; empty for a lone broker).

    An id tells nothing of any other id: no tenant derives another's ids from its own, or counts how
    many tasks the broker took in between. 128 random bits also keep ids unique across restarts
    without remembering anything (a repeat within 2**40 ids has odds of about 2**-49). The bytes are
    drawn 4 KiB at a time, so an id costs a slice of a string rather than a system call (half the
    time the prefix-and-counter ids before them took).
    """
    per_draw = 256

    def draw() -> list[str]:
        digits = os.urandom(16 * per_draw).hex()
        return [prefix + digits[start:start + 32] for start in range(0, 32 * per_draw, 32)]

    return itertools.chain.from_iterable(iter(draw, None)).__next__
