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
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import time
from collections import deque
from typing import Any, Callable

import zmq

from cronoq import protocol
from cronoq.book import TaskBook, TaskRecord
from cronoq.broker.auth import Authenticator, Principal
from cronoq.config import DEFAULTS_SOURCE, BrokerConfig, ConfigError, load_config
from cronoq.core import PRIORITIES, SchedulerCore
from cronoq.errors import CronoqError, FailedPrecondition, InvalidArgument
from cronoq.broker.clients import ClientRequests
from cronoq.broker.cron import CronRunner
from cronoq.curve import load_secret_key, serve_encrypted
from cronoq.metrics import BrokerMetrics, registry_for, serve_metrics
from cronoq.broker.durable import SYNC_INTERVAL, DataDir
from cronoq.broker.messages import body_frame, check_frame_count, error_reply
from cronoq.broker.outbox import Outbox
from cronoq.broker.workers import WorkerRegistry
from cronoq.transport import recv_frames, tune

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
# Seconds over which `stats` reports each pool's dispatch rate.
RATE_WINDOW = 10.0
# Config keys a reload cannot change in a running broker.
RESTART_KEYS = ("clients", "workers", "data_dir", "durability", "metrics", "curve_secret_key_file")


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
            result_ttl=config.result_ttl, limits=self._pool_limits,
        )
        self._workers = WorkerRegistry(self._core, self._book)
        self._to_clients = Outbox(protocol.ReplyBatch)
        self._to_workers = Outbox(protocol.CommandBatch)
        self._requests = ClientRequests(self._book, self._to_clients, identify=self._identify, stats=self.stats,
                                        reload=self.reload)
        self._clients: zmq.Socket | None = None
        self._workers_sock: zmq.Socket | None = None
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

        Raises StoreError when the directory cannot be used. Call before `bind()`.
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
        sockets = []
        for endpoint in (self.config.clients, self.config.workers):
            sock = ctx.socket(zmq.ROUTER)
            tune(sock, max_message_bytes=max_frame)
            sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            if secret_key is not None:
                serve_encrypted(sock, secret_key)
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                for other in sockets:
                    other.close(linger=0)
                raise OSError(f"cannot bind {endpoint}: {exc}") from None
            sockets.append(sock)
        self._clients, self._workers_sock = sockets
        self.endpoints = tuple(s.getsockopt_string(zmq.LAST_ENDPOINT) for s in sockets)  # type: ignore[assignment]
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
        for sock in (self._clients, self._workers_sock):
            loop.add_reader(sock.getsockopt(zmq.FD), self._pump)
        self._heartbeat = loop.call_later(self.config.heartbeat_interval, self._on_heartbeat_tick)
        if self._data.syncs_in_background:
            self._syncer = loop.call_later(SYNC_INTERVAL, self._on_sync_tick)
        self._pump()
        await self._stopped.wait()
        for sock in (self._clients, self._workers_sock):
            loop.remove_reader(sock.getsockopt(zmq.FD))
        for handle in (self._timer, self._heartbeat, self._syncer):
            if handle is not None:
                handle.cancel()
        self._clients.close(linger=0)
        self._workers_sock.close(linger=0)
        if self._metrics_server is not None:
            self._metrics_server.close()
        self.close()

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
        while True:
            now = self._clock()
            handled = self._drain(workers, self._on_worker_message, now)
            handled += self._drain(clients, self._requests.on_message, now)
            fired = self._fire_schedules(now) if self._cron is not None else False
            self._dispatch(now)
            if not self._commit():
                return
            if fired:
                self._cron.save()  # type: ignore[union-attr]
            sent = bool(self._to_clients) or bool(self._to_workers)
            self._flush()
            # A send can consume the FD's edge for a message that arrived meanwhile: after sending,
            # one more pass must find both sockets empty before the loop may sleep.
            if not handled and not sent:
                break
        self._arm_timer()

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[bytes], float], int], now: float) -> int:
        """Handle messages until about DRAIN_BATCH requests; returns how many. Receiving until EAGAIN (one
        exception per pass) is cheaper than asking ZMQ_EVENTS before every message, and just as sure that
        libzmq's queue is empty."""
        count = 0
        while count < DRAIN_BATCH:
            try:
                frames = recv_frames(sock, KEPT_FRAMES)
            except zmq.Again:
                break
            count += handle(frames, now)
        return count

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
        for worker_id, record, attempt in self._book.dispatch(now):
            put(worker_id, protocol.Assign(
                protocol.PROTOCOL_VERSION, record.id, attempt, record.pool, record.tenant, PRIORITIES[record.priority],
            ), record.payload)

    def _flush(self) -> None:
        self._to_workers.send(self._workers_sock)  # type: ignore[arg-type]
        self._to_clients.send(self._clients)  # type: ignore[arg-type]

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
        """Beat to every worker, declare silent ones lost, and forget old finished records."""
        now = self._clock()
        deadline = now - self.config.heartbeat_interval * self.config.liveness
        beat = protocol.Heartbeat(protocol.PROTOCOL_VERSION)
        for worker_id, entry, silent in self._workers.silent_since(deadline):
            if silent:
                log.warning("worker %s silent for %.1f s: lost", worker_id.hex(), now - entry.last_seen)
                self._workers.lose(worker_id, now)
            else:
                self._to_workers.put(worker_id, beat)
        self._book.forget_expired_records(now)
        self._sample_dispatches(now)
        self._compact_if_worthwhile()
        self._heartbeat = asyncio.get_running_loop().call_later(self.config.heartbeat_interval, self._on_heartbeat_tick)
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
        self._book.max_payload_bytes = new.max_payload_bytes
        self._book.max_deliveries = new.max_deliveries
        self._book.result_ttl = new.result_ttl
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
                "schedules": {} if self._cron is None else self._cron.describe()}

    # ----------------------------------------------------------------- workers

    def _on_worker_message(self, frames: list[bytes], now: float) -> int:
        """Handle one message from a worker (or a batch of them); returns how many messages."""
        identity = frames[0]
        try:
            check_frame_count(frames, "a worker message has 2 or 3 frames (token, header, optional body)")
            self._identify(frames[1]).require("serve")
            messages = protocol.unbatch(protocol.decode_worker_message(frames[2]), body_frame(frames))
        except CronoqError as exc:
            self._to_workers.put(identity, error_reply(0, exc))
            return 1
        for message, body in messages:
            try:
                self._handle_worker_message(identity, message, body, now)
            except CronoqError as exc:
                self._to_workers.put(identity, error_reply(getattr(message, "rid", 0), exc))
            except Exception:  # a bug: it must cost this one message, never the broker
                log.exception("failed to handle a worker message; it was dropped")
        return len(messages)

    def _handle_worker_message(self, identity: bytes, message: Any, body: bytes | None, now: float) -> None:
        entry = self._workers.get(identity)
        if entry is not None:
            entry.last_seen = now
        match message:
            case protocol.Ready():
                self._workers.register(identity, message, {pool.name: pool for pool in self.config.pools}, now)
                self._to_worker(identity, protocol.Welcome(
                    protocol.PROTOCOL_VERSION, message.rid, self.config.heartbeat_interval, self.config.liveness,
                    self.config.max_payload_bytes,
                ))
            case _ if entry is None:
                if not isinstance(message, protocol.Bye):
                    # We restarted, or declared this worker lost: it must announce itself again.
                    self._to_worker(identity, protocol.Reregister(protocol.PROTOCOL_VERSION))
            case protocol.Heartbeat():
                pass
            case protocol.Done():
                self._workers.complete(identity, entry, message, body, now, self.config.max_payload_bytes)
            case protocol.Leave():
                self._workers.leave(identity, entry)
                self._to_worker(identity, protocol.Left(protocol.PROTOCOL_VERSION))
            case protocol.Bye():
                self._workers.lose(identity, now)

    def _to_worker(self, identity: bytes, message: Any) -> None:
        self._to_workers.put(identity, message)


def _task_ids() -> Callable[[], str]:
    """Task ids: a random prefix per broker start and a counter (a uuid4 each costs 4x more).

    A fresh 64-bit prefix each start keeps ids unique across restarts; ids stay unguessable enough
    that a task id alone never grants access (tokens and tenants do that).
    """
    prefix = os.urandom(8).hex()
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):08x}"
