"""The broker: two ROUTER sockets around one task book, on one asyncio loop.

One pass of the loop (`_pump`): drain both sockets without blocking, handle
every message (client requests in `clients.py`, worker messages here:
decode, authorize, call the book), expire and dispatch what the core says
is due, commit the pass's changes to the journal in one write (group
commit), and only then send every reply and assignment at once, one batch
per peer (`outbox.py`): an `accepted` reply is never sent for a task that
is not in the journal. Passes repeat until a pass finds both sockets empty;
then the loop sleeps until a socket becomes readable, the core's next
wake-up, or the heartbeat tick.

No message, however malformed, may stop the loop: a refusal is answered
where a reply can be routed, anything else costs that one message only.
Every message is first matched to its connection (`connections.py`): the
broker trusts no routing identity a peer may have chosen, binds each
connection to the principal of the first valid token it shows, and gives
what it holds for each connection a byte budget.
"""
from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import itertools
import logging
import os
import resource
import time
from collections import deque
from typing import Any, Callable

import zmq

from cronoq import protocol
from cronoq.book import TaskBook, TaskRecord
from cronoq.broker.auth import Authenticator, Principal
from cronoq.broker.connections import Connection, Connections, peer_label
from cronoq.config import DEFAULTS_SOURCE, BrokerConfig, ConfigError, load_config
from cronoq.core import PRIORITIES, SchedulerCore
from cronoq.errors import CronoqError, FailedPrecondition, InvalidArgument, PermissionDenied
from cronoq.broker.clients import ClientRequests
from cronoq.broker.cron import CronRunner
from cronoq.curve import load_secret_key, serve_encrypted
from cronoq.metrics import BrokerMetrics, registry_for, serve_metrics
from cronoq.broker.durable import SYNC_INTERVAL, DataDir
from cronoq.broker.messages import body_frame, check_frame_count, error_reply
from cronoq.broker.outbox import Outbox
from cronoq.broker.workers import WorkerRegistry
from cronoq.transport import recv_routed, tune

log = logging.getLogger("cronoq.broker")

# Requests (a batch counts each of its own) taken from one socket before the other gets a turn and the
# core dispatches.
DRAIN_BATCH = 512
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
# Seconds over which `stats` reports each pool's dispatch rate.
RATE_WINDOW = 10.0
# Config keys a reload cannot change in a running broker.
# max_payload_bytes is among them: libzmq fixes the largest frame it accepts when the sockets bind.
RESTART_KEYS = ("clients", "workers", "data_dir", "durability", "metrics", "curve_secret_key_file",
                "max_payload_bytes", "auth_timeout", "max_connections", "connection_buffer_bytes")


class Broker:
    """Serves one BrokerConfig until `stop()`."""

    def __init__(self, config: BrokerConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._auth = Authenticator(config.tokens)
        self._core = SchedulerCore(config.pools)
        self._book = TaskBook(
            self._core, new_id=_task_ids(), on_terminal=self._on_terminal,
            max_payload_bytes=config.max_payload_bytes, max_deliveries=config.max_deliveries,
            result_ttl=config.result_ttl, result_retention_bytes=config.result_retention_bytes,
            limits=self._pool_limits,
        )
        self._workers = WorkerRegistry(self._core, self._book)
        self._to_clients = Outbox(protocol.ReplyBatch)
        self._to_workers = Outbox(protocol.CommandBatch)
        self._requests = ClientRequests(self._book, self._to_clients, identify=self._identify,
                                        authenticate=authenticate, refusal_allowed=refusal_allowed,
                                        stats=self.stats, reload=self.reload)
        self._clients: zmq.Socket | None = None
        self._workers_sock: zmq.Socket | None = None
        self._client_conns: Connections | None = None
        self._worker_conns: Connections | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._beat_due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self._syncer: asyncio.TimerHandle | None = None
        self._stopped: asyncio.Event | None = None
        self._cron: CronRunner | None = None
        # (time, dispatches per pool) at each heartbeat over the last RATE_WINDOW seconds, for stats' rates.
        self._dispatch_samples: deque[tuple[float, dict[str, int]]] = deque()
        self.metrics = BrokerMetrics()
        self._data = DataDir(config, self._book, self.metrics)
        self._metrics_server: asyncio.base_events.Server | None = None
        self.failure: str | None = None
        """Why the broker stopped by itself (it could not write its journal), or None."""
        self.endpoints: tuple[str, str] = ("", "")

    def _pool_limits(self, pool: str) -> tuple[int | None, int | None]:
        limits = self.config.limits.get(pool)
        return (None, None) if limits is None else (limits.max_backlog, limits.max_tenant_backlog)

    # ----------------------------------------------------------------- lifecycle

    def open(self) -> dict[str, int] | None:
        """Lock data_dir and carry on from the state it holds; returns what recovery did (None: no data_dir).

        Raises StoreError when the directory cannot be used. `cronoq-broker` calls it after `bind()`, so that a
        broker that cannot have its ports leaves data_dir untouched.
        """
        return self._data.open(self._clock())

    def close(self) -> None:
        """Release data_dir: commit and fsync what is left (nothing, after a failure). Idempotent."""
        self._data.close(failed=self.failure is not None)

    def bind(self) -> tuple[str, str]:
        """Bind both ROUTER sockets; returns the endpoints actually bound. Raises OSError on failure."""
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

    async def start_metrics(self) -> None:
        """Serve /metrics when the config asks for it. Raises OSError when the address cannot be bound."""
        if self.config.metrics is not None:
            registry = registry_for(self.stats, self.metrics)
            self._metrics_server = await serve_metrics(self.config.metrics, registry)

    async def serve(self) -> None:
        """Run until `stop()`; `bind()` must have been called."""
        assert self._clients is not None and self._workers_sock is not None, "bind() first"
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        if self.config.schedules:
            self._cron = CronRunner(self.config.schedules, self.config.data_dir, self._clock())
        self._sample_dispatches(self._clock())  # rates count from the start, not from the first heartbeat
        for sock in self._watched_sockets():
            loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._beat_due = loop.time() + self.config.heartbeat_interval
        self._heartbeat = loop.call_later(self.config.heartbeat_interval, self._on_heartbeat_tick)
        if self._data.syncs_in_background:
            self._syncer = loop.call_later(SYNC_INTERVAL, self._on_sync_tick)
        self._data.watch(loop, self._pump)
        self._pump()
        await self._stopped.wait()
        for sock in self._watched_sockets():
            loop.remove_reader(sock.getsockopt(zmq.FD))
        for handle in (self._timer, self._heartbeat, self._syncer, self._retry):
            if handle is not None:
                handle.cancel()
        self._client_conns.close()  # type: ignore[union-attr]
        self._worker_conns.close()  # type: ignore[union-attr]
        self._clients.close(linger=0)
        self._workers_sock.close(linger=0)
        if self._metrics_server is not None:
            self._metrics_server.close()
        self.close()

    def _watched_sockets(self) -> list[zmq.Socket]:
        """The sockets whose readiness wakes the loop: both ROUTERs and their monitors."""
        return [self._clients, self._workers_sock, self._client_conns.monitor,  # type: ignore[list-item,union-attr]
                self._worker_conns.monitor]  # type: ignore[union-attr]

    def stop(self) -> None:
        """Stop accepting and return from `serve()` (graceful: changes are committed, replies sent)."""
        if self._stopped is not None and not self._stopped.is_set():
            if self._commit():
                self._flush()
            self._stopped.set()

    def _fail(self, reason: str) -> None:
        """Stop at once without answering: what this pass did is not durable, so nothing of it is confirmed."""
        log.critical("%s; stopping without sending the replies of this pass", reason)
        self.failure = reason
        self._to_clients.clear()
        self._to_workers.clear()
        if self._stopped is not None:
            self._stopped.set()

    # ----------------------------------------------------------------- the loop

    def _pump(self) -> None:
        if self._stopped is None or self._stopped.is_set():
            return
        clients, workers = self._clients, self._workers_sock
        client_conns, worker_conns = self._client_conns, self._worker_conns
        while True:
            now = self._clock()
            # Connects and disconnects first: a worker that left is lost before anything more is sent to it.
            worker_conns.poll_events(now)  # type: ignore[union-attr]
            client_conns.poll_events(now)  # type: ignore[union-attr]
            handled = self._drain(workers, worker_conns, self._on_worker_message, now)
            handled += self._drain(clients, client_conns, self._requests.on_message, now)
            fired = self._fire_schedules(now) if self._cron is not None else False
            self._dispatch(now)
            if not self._commit():
                return
            if fired:
                self._cron.save()  # type: ignore[union-attr]
            sent = bool(self._to_clients) or bool(self._to_workers)
            self._flush()
            handled += self._unpark(worker_conns, self._on_worker_message, now)
            handled += self._unpark(client_conns, self._requests.on_message, now)
            # A send can consume the FD's edge for a message that arrived meanwhile: after sending,
            # one more pass must find both sockets empty before the loop may sleep.
            if not handled and not sent and not (worker_conns.ending or client_conns.ending):
                break
        self._arm_timer()
        self._arm_retry()

    def _drain(self, sock: zmq.Socket, conns: Connections, handle: Callable[[Connection, list[bytes], float], int],
               now: float) -> int:
        """Handle messages until about DRAIN_BATCH requests; returns how many. Receiving until EAGAIN (one
        exception per pass) is cheaper than asking ZMQ_EVENTS before every message, and just as sure that
        libzmq's queue is empty. A message from a peer over its budget is set aside, unhandled."""
        count = 0
        while count < DRAIN_BATCH:
            try:
                frames, fd = recv_routed(sock, KEPT_FRAMES)
            except zmq.Again:
                conns.emptied()
                break
            conn = conns.admit(frames[0], fd, now)
            if conn is None:  # sent on a connection that has ended: nobody is left to answer
                count += 1
            elif conn.parked or conns.over_budget(conn):
                conns.park(conn, frames)
                count += 1
            else:
                count += handle(conn, frames, now)
        return count

    def _unpark(self, conns: Connections, handle: Callable[[Connection, list[bytes], float], int],
                now: float) -> int:
        """Handle the messages set aside for peers whose backlog has drained back under budget."""
        count = 0
        for conn in conns.parking():
            for frames in conns.unpark(conn):
                count += handle(conn, frames, now)
        return count

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
        """Group commit: the changes of this pass reach the journal before any of its replies leave."""
        try:
            self._data.commit()
        except OSError as exc:
            self._fail(f"cannot write the journal in {self.config.data_dir}: {exc}")
            return False
        return True

    def _dispatch(self, now: float) -> None:
        put = self._to_workers.put
        for worker, record, attempt in self._book.dispatch(now):
            put(worker, protocol.Assign(
                protocol.PROTOCOL_VERSION, record.id, attempt, record.pool, record.tenant, PRIORITIES[record.priority],
            ), record.payload)

    def _flush(self) -> None:
        # A disconnect reported meanwhile must stop what was meant for that peer (its identity may be reused).
        now = self._clock()
        self._worker_conns.poll_events(now, report=False)  # type: ignore[union-attr]
        self._client_conns.poll_events(now, report=False)  # type: ignore[union-attr]
        self._to_workers.send(self._workers_sock, self._worker_conns)  # type: ignore[arg-type]
        self._to_clients.send(self._clients, self._client_conns)  # type: ignore[arg-type]

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
        self._sample_dispatches(now)
        self._compact_if_worthwhile()
        self._beat_due = loop.time() + interval
        self._heartbeat = loop.call_later(interval, self._on_heartbeat_tick)
        self._pump()

    def _sample_dispatches(self, now: float) -> None:
        samples = self._dispatch_samples
        samples.append((now, {name: self._core.dispatched(name) for name in self._core.pool_names()}))
        while len(samples) > 2 and samples[1][0] <= now - RATE_WINDOW:
            samples.popleft()

    def _dispatch_rates(self, now: float) -> dict[str, float]:
        """Dispatches per second of each pool over the last RATE_WINDOW seconds (0 until sampled)."""
        if not self._dispatch_samples:
            return {}
        then, counts = self._dispatch_samples[0]
        elapsed = now - then
        if elapsed <= 0:
            return {}
        accepting = set(self._core.pool_names())
        return {name: (self._core.dispatched(name) - count) / elapsed for name, count in counts.items()
                if name in accepting}

    def _on_sync_tick(self) -> None:
        """With durability "sync", bound what a power loss could take to about SYNC_INTERVAL."""
        try:
            self._data.sync()
        except OSError as exc:
            self._fail(f"cannot fdatasync the journal in {self.config.data_dir}: {exc}")
            return
        self._syncer = asyncio.get_running_loop().call_later(SYNC_INTERVAL, self._on_sync_tick)

    def _compact_if_worthwhile(self) -> None:
        try:
            self._data.compact_if_worthwhile()
        except OSError as exc:  # the commit before the snapshot failed: fatal, as any failed commit
            self._fail(f"cannot write the journal in {self.config.data_dir}: {exc}")

    # ----------------------------------------------------------------- clients (requests: clients.py)

    def _identify(self, token: bytes) -> Principal:
        """The caller behind a token, by the tokens of the current config (a reload swaps them)."""
        return self._auth.identify(token)

    def _on_client_closed(self, conn: Connection, now: float) -> None:
        """A client left: nothing more goes to it (its waiters are skipped as their tasks end)."""

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

    def reload(self) -> dict[str, Any]:
        """Reread the config file and apply it; FailedPrecondition (the running config stays) if it is invalid.

        Pools, weights (applied to the queued backlog at once), limits, tokens, schedules, heartbeats and
        retention change in place; pools left out drain and then go. Endpoints, data_dir, durability,
        metrics and the CURVE key take a restart: they keep their running values, and the answer says so.
        """
        if self.config.source == DEFAULTS_SOURCE:
            raise FailedPrecondition("this broker runs on built-in defaults: there is no config file to reload")
        try:
            new = load_config(self.config.source)
        except ConfigError as exc:
            log.error("reload refused, the running config stays: %s", exc)
            raise FailedPrecondition(f"reload refused, the running config stays: {exc}") from None
        needs_restart = [key for key in RESTART_KEYS if getattr(new, key) != getattr(self.config, key)]
        if needs_restart:
            log.warning("reload: %s change only with a restart; keeping the running values", ", ".join(needs_restart))
            new = dataclasses.replace(new, **{key: getattr(self.config, key) for key in needs_restart})
        old_pools = {pool.name for pool in self.config.pools}
        self._book.configure(new.pools)
        self._book.max_deliveries = new.max_deliveries
        self._book.set_retention(new.result_ttl, new.result_retention_bytes)
        self._auth = Authenticator(new.tokens)
        if new.schedules or self._cron is not None:
            if self._cron is None:
                self._cron = CronRunner(new.schedules, new.data_dir, self._clock())
            else:
                self._cron.configure(new.schedules, self._clock())
        self.config = new
        new_pools = {pool.name for pool in new.pools}
        changes = {
            "pools_added": sorted(new_pools - old_pools), "pools_draining": sorted(old_pools - new_pools),
            "needs_restart": needs_restart,
        }
        log.info("reloaded %s: %s", new.source, changes)
        return changes

    def stats(self) -> dict[str, Any]:
        """Per-pool statistics from the core, plus the workers serving each pool."""
        pools = self._core.stats()
        rates = self._dispatch_rates(self._clock())
        for name, pool_stats in pools.items():
            pool_stats["workers"] = self._workers.serving(name)
            pool_stats["dispatch_rate"] = rates.get(name, 0.0)
        return {"pools": pools, "workers": len(self._workers),
                "schedules": {} if self._cron is None else self._cron.describe(),
                "memory": self._book.memory_stats(), "store": self._data.stats()}

    # ----------------------------------------------------------------- workers

    def _on_worker_message(self, conn: Connection, frames: list[bytes], now: float) -> int:
        """Handle one message from a worker (or a batch of them); returns how many messages."""
        try:
            check_frame_count(frames, "a worker message has 2 or 3 frames (token, header, optional body)")
            principal = self._identify(frames[1])
            principal.require("serve")
            messages = protocol.unbatch(protocol.decode_worker_message(frames[2]), body_frame(frames))
            authenticate(conn, principal)
        except CronoqError as exc:
            if refusal_allowed(conn, now):
                self._to_workers.put(conn, error_reply(0, exc))
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
        match message:
            case protocol.Ready():
                self._workers.register(conn, message, {pool.name: pool for pool in self.config.pools}, now)
                self._to_workers.put(conn, protocol.Welcome(
                    protocol.PROTOCOL_VERSION, message.rid, self.config.heartbeat_interval, self.config.liveness,
                    self.config.max_payload_bytes,
                ))
            case _ if entry is None:
                if not isinstance(message, protocol.Bye):
                    # We restarted, or declared this worker lost: it must announce itself again.
                    self._to_workers.put(conn, protocol.Reregister(protocol.PROTOCOL_VERSION))
            case protocol.Heartbeat():
                pass
            case protocol.Done():
                self._workers.complete(conn, entry, message, body, now, self.config.max_payload_bytes)
            case protocol.Leave():
                self._workers.leave(conn, entry)
                self._to_workers.put(conn, protocol.Left(protocol.PROTOCOL_VERSION))
            case protocol.Bye():
                self._workers.lose(conn, now)


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


def _connection_limit(configured: int) -> int:
    """Raise the open-file limit as far as allowed, and keep max_connections within it."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (OSError, ValueError) as exc:
        log.warning("could not raise the open-file limit: %s", exc)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    usable = max(1, soft - SPARE_DESCRIPTORS) // 2  # two endpoints share the descriptors
    if configured > usable:
        log.warning("max_connections = %d, but the open-file limit (%d) leaves room for %d per endpoint; using %d",
                    configured, soft, usable, usable)
        return usable
    return configured


def _task_ids() -> Callable[[], str]:
    """Task ids: 128 bits from the OS's CSPRNG each, as 32 hex digits.

    An id tells nothing of any other id: no tenant derives another's ids from its own, or counts how
    many tasks the broker took in between. 128 random bits also keep ids unique across restarts
    without remembering anything (a repeat within 2**40 ids has odds of about 2**-49). The bytes are
    drawn 4 KiB at a time, so an id costs a slice of a string rather than a system call (half the
    time the prefix-and-counter ids before them took).
    """
    per_draw = 256

    def draw() -> list[str]:
        digits = os.urandom(16 * per_draw).hex()
        return [digits[start:start + 32] for start in range(0, 32 * per_draw, 32)]

    return itertools.chain.from_iterable(iter(draw, None)).__next__
