"""One broker's worth of worker: serves pools for ONE broker (its primary and standbys) over one DEALER socket.

`Runner` is the loop `cronoq.Worker` (`cronoq.worker.worker`) runs for a lone broker, and runs once per
member for a cluster (`cronoq.worker.cluster`, which decides which pools and how many slots each member's
runner gets). It knows nothing of the cluster's map beyond asking for it and handing on what it hears.

Flow control is by credit: the worker tells the broker how many slots it has
free when it registers (`Ready`), and each `Done` returns one slot, so the
broker never sends more than `concurrency` tasks at once.

A result is checked against the broker's max_payload_bytes (sent in
`Welcome`) before it is sent: libzmq would drop the connection of a worker
sending a frame far over it, and with it every task the worker holds. A
result over the limit is reported as the task's failure (`InvalidArgument`,
as the broker's own check says it), and the text of any failure is cut to a bounded size, so one task's output
never costs the others.

Liveness follows the Paranoid Pirate pattern: both sides heartbeat; when
the broker is silent for `liveness` intervals the worker drops its socket,
waits (doubling the wait, up to a cap) and registers again. Tasks that were
running meanwhile still report their outcome; the broker ignores outcomes of
leases it has given to someone else.

The socket monitor says why the broker cannot be reached (`cronoq.wire.link`),
and the log says it once: a refused connection is waited out (workers often
start before their broker), a CURVE mistake stops a worker that never got
through, as a refused registration does.

Given a broker's primary and standbys, the worker connects one socket to
all of them (ZMQ_IMMEDIATE: messages go only over a completed connection)
and registers on every new connection, so it serves a standby the moment
that has taken over.

Stopping is graceful (running tasks finish and report) or, with
`stop(now=True)`, at once: the socket closes, and the broker, losing the
connection, gives the running tasks to other workers.

A runner made with `asks_first` (the one a Worker starts with) asks its
broker for the cluster map before registering. A lone broker answers nil
(an older one refuses the question): the runner then registers as a worker
always did. A cluster member answers with the map, which goes to `on_map`.
A runner serving one `member` of a cluster asks its member for the map now
and then, to follow reloads, and hands what it hears to `on_map` too.

Leans on the wire (`protocol`, `transport`, `dealer`, `link`), `cronoq.pool`
and `cronoq.errors`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from cronoq.errors import CronoqError, InvalidArgument, Unavailable, error_from_code
from cronoq.pool import Pool
from cronoq.wire import protocol
from cronoq.wire.dealer import broker_dealer
from cronoq.wire.link import Links
from cronoq.wire.transport import Channel, Item

log = logging.getLogger("cronoq.worker")

RECONNECT_DELAY_MAX = 32.0
# A member's runner asks its member for the cluster map every this many heartbeats, to follow reloads.
MAP_POLL_BEATS = 5
# A failing handler's message in the worker's log is cut to this many bytes (the task's outcome keeps more).
LOGGED_MESSAGE_BYTES = 1024


class Runner:
    """Runs the tasks of `pools` that the broker at `addresses` (its primary and standbys) hands it, `concurrency`
    at a time, in the threads of the executor `run` is given.

    `token` and `server_key` are ready for the wire (bytes; the key None for an unencrypted broker). `gate`, when
    given, bounds the handlers running at once over several runners (a cluster's members share one worker's
    slots). `asks_first`: ask for the cluster map before registering (see the module's docstring); `member`:
    the cluster member this runner serves; `on_map` gets every cluster map the broker gives.
    """

    def __init__(
        self,
        addresses: tuple[str, ...],
        pools: dict[str, Pool],
        *,
        concurrency: int,
        token: bytes,
        server_key: bytes | None,
        heartbeat_interval: float,
        liveness: int,
        gate: asyncio.Semaphore | None = None,
        asks_first: bool = False,
        member: str | None = None,
        on_map: Callable[[Any], None] | None = None,
    ) -> None:
        self.brokers = addresses
        """The broker's worker endpoints: its primary's and its standbys' (one DEALER connects to them all)."""
        self.broker = " or ".join(self.brokers)
        self.pools = pools
        self.concurrency = concurrency
        self.member = member
        self._asks_first = asks_first
        self._on_map = on_map
        self._gate = gate
        self._map_rids: collections.deque[int] = collections.deque(maxlen=16)
        self._beats = 0
        self.heartbeat_interval = heartbeat_interval
        self.liveness = liveness
        self._token = token
        self._server_key = server_key
        self._rids = itertools.count(1)
        self._ready_rids: collections.deque[int] = collections.deque(maxlen=16)
        """The rids of the latest `ready`s: an error under one of them is a refused registration."""
        self._channel: Channel | None = None
        self._monitor: Channel | None = None
        self._link = Links(self.brokers, encrypted=self._server_key is not None)
        self._told: tuple[str, bool] | None = None  # the link's trouble as last logged: each is said once
        # The running tasks by a number of their own: each takes itself out as it ends (a done-callback would
        # cost another turn of the loop per message).
        self._running: dict[int, asyncio.Task[None]] = {}
        # Task id -> the attempts its one run here stands for, oldest first: a broker that lost this worker (a
        # cut it did not outlast) and took the task back may give it to this worker again, attempt n+1 while
        # attempt n still runs. One run is enough: it reports for the newest attempt, and the older ones'
        # leases get their `done` too, which the broker counts as late and which returns their slots.
        self._leases: dict[str, list[int]] = {}
        self._jobs = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._registered = asyncio.Event()
        self._left = asyncio.Event()
        self._stopped = asyncio.Event()
        self._fatal: CronoqError | None = None
        self._last_heard = 0.0
        self._reconnect_delay = heartbeat_interval
        self._told_silence = False  # the broker's silence was logged; the reconnects that follow are not, each
        self._stopping = False
        # The broker's max_payload_bytes from the last Welcome; None until one says (older brokers never do).
        self._max_result_bytes: int | None = None
        self.finished = 0
        """Tasks this worker ran to an outcome it reported (succeeded or failed)."""
        self.abandoned = 0
        """Tasks left running when it stopped (at once, or on a fatal error): the broker runs them again."""

    @property
    def registered(self) -> bool:
        """Whether the broker has accepted this runner on the current connection."""
        return self._registered.is_set()

    @property
    def running(self) -> int:
        """How many tasks run now."""
        return len(self._running)

    @property
    def stopping(self) -> bool:
        """`stop()` was called (or a fatal error stopped it)."""
        return self._stopping or self._stopped.is_set()

    # ----------------------------------------------------------------- lifecycle

    async def run(self, executor: ThreadPoolExecutor) -> None:
        """Serve until `stop()`, running handlers in `executor`'s threads; raises the broker's refusal (e.g.
        NotFound, FailedPrecondition) if it rejects us."""
        loop = self._loop = asyncio.get_running_loop()
        self._executor = executor
        self._connect()
        try:
            while not self._stopped.is_set():
                await self._tick(loop)
            if self._fatal is not None:
                raise self._fatal
        finally:
            self._abandon_running()
            self._disconnect()

    def hand_over(self) -> None:
        """Stop without a word to the broker, which was never asked to count this runner as a worker: the seed
        runner of a cluster's worker, once the map has said which members get its pools."""
        self._disconnect()
        self._stopped.set()

    async def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """One heartbeat period: beat, and reconnect when the broker has been silent too long."""
        began = loop.time()
        try:
            await asyncio.wait_for(self._stopped.wait(), self.heartbeat_interval)
            return
        except asyncio.TimeoutError:
            pass
        if loop.time() - began > 2 * self.heartbeat_interval:
            # This worker stalled (SIGSTOP, a paused VM, a long pause of its own): the silence is partly its own,
            # and what the broker sent meanwhile may not have reached the socket yet. It gives the broker a fresh
            # window, as the broker does its workers when it stalls, rather than hang up and drop the results
            # its handlers finish now.
            self._last_heard = loop.time()
        silent_for = loop.time() - self._last_heard
        if silent_for > self.heartbeat_interval * self.liveness:
            # Said once per outage: the reconnects that follow, until the broker is heard again, are its course.
            if self._link.trouble is None and not self._told_silence:
                log.warning("broker silent for %.1f s; reconnecting in %.1f s", silent_for, self._reconnect_delay)
            else:  # why was logged when it began
                log.debug("broker unreachable for %.1f s; reconnecting in %.1f s", silent_for, self._reconnect_delay)
            self._told_silence = True
            self._disconnect()
            try:
                await asyncio.wait_for(self._stopped.wait(), self._reconnect_delay)
                return
            except asyncio.TimeoutError:
                pass
            self._reconnect_delay = min(self._reconnect_delay * 2, RECONNECT_DELAY_MAX)
            self._connect()
        elif self._registered.is_set():
            self._send(protocol.Heartbeat(protocol.PROTOCOL_VERSION))
            self._beats += 1
            if self.member is not None and self._beats % MAP_POLL_BEATS == 0:
                self._ask_map()  # follow the cluster's map: a reload may have moved a pool
        else:
            self._register()  # the broker may have come up since; ask again

    async def stop(self, *, now: bool = False) -> None:
        """Take no more tasks, let the running ones finish and report, then leave.

        With `now` (also while a graceful stop waits): close the connection at once and abandon the running
        tasks; the broker, losing the connection, runs them again on another worker. A plain `def` handler
        cannot be interrupted: its thread runs on, and what it returns is dropped.
        """
        if now:
            self._stopping = True
            self._abandon_running()
            self._disconnect()
            self._stopped.set()
            return
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        if self._channel is not None and self._registered.is_set():
            self._send(protocol.Leave(protocol.PROTOCOL_VERSION))
            # Tasks sent before the broker saw Leave are still on their way.
            await self._until(self._left, self.heartbeat_interval * self.liveness)
        while self._running and not self._stopped.is_set():
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)
        if self._channel is not None:
            self._send(protocol.Bye(protocol.PROTOCOL_VERSION))
        self._stopped.set()

    async def _until(self, event: asyncio.Event, timeout: float) -> None:
        """Wait until `event` is set, the worker has stopped, or `timeout` seconds have passed."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopped.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _abandon_running(self) -> None:
        """Stop waiting for the running tasks: counted as abandoned, never reported."""
        running, self._running = self._running, {}
        self._leases.clear()
        self.abandoned += len(running)
        for job in running.values():
            job.cancel()

    def _connect(self) -> None:
        # ZMQ_IMMEDIATE: with a primary and standbys listed, the worker talks to whichever serves, and registers
        # with a standby the moment it has taken over.
        sock, monitor = broker_dealer(self.brokers, server_key=self._server_key)
        assert monitor is not None
        self._channel = Channel(sock, self._on_command, pack=functools.partial(protocol.pack, protocol.WorkerBatch),
                                prefix=[self._token], on_unsent=self._on_unsent)
        self._monitor = Channel(monitor, self._on_link_event)
        self._registered.clear()
        self._last_heard = asyncio.get_running_loop().time()
        self._register()

    def _disconnect(self) -> None:
        if self._monitor is not None:
            if self._channel is not None:
                self._channel.sock.disable_monitor()
            self._monitor.close()
            self._monitor = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._link.abandoned()  # what is sent until the next handshake has nowhere to go, and that is known
        self._registered.clear()

    def _on_link_event(self, frames: list[bytes]) -> None:
        """What the socket monitor saw: say why the broker cannot be reached, once; stop on a CURVE mistake
        made from the start (the configuration is wrong: waiting cannot mend it)."""
        event = parse_monitor_message(frames)
        link = self._link
        link.observe(event["event"], event["value"], event["endpoint"], asyncio.get_running_loop().time())
        if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            # Register at once on every new connection: what was sent before it was dropped (ZMQ_IMMEDIATE), and
            # the broker there may be another (a standby that took over) which does not know this worker yet.
            # (Until it knows whether the broker is a cluster member, `_register` asks for the map first.)
            self._registered.clear()
            self._register()
        if link.trouble is None:
            if self._told is not None:
                log.info("reached the broker at %s again", self.broker)
                self._told = None
            return
        if (link.trouble, link.final) == self._told:
            return
        self._told = (link.trouble, link.final)
        if link.final and link.handshakes == 0:
            self._fatal = Unavailable(link.trouble)
            log.error("cannot serve: %s", link.trouble)
            self._stopped.set()
        elif link.final:
            log.error("%s (trying again)", link.trouble)
        else:
            log.warning("%s (trying again until one answers)", link.trouble)

    def _on_unsent(self, items: list[Item]) -> None:
        """libzmq has no connection to queue for (ZMQ_IMMEDIATE), or its queue is full. Heartbeats and `ready` go
        again on their own; the broker runs again the tasks whose `done` is lost."""
        # No connection is expected while the broker is away (its cause is logged); a full queue is not.
        level = logging.WARNING if self._link.up else logging.DEBUG
        log.log(level, "no connection to the broker at %s; dropped %d message(s)", self.broker, len(items))

    # ----------------------------------------------------------------- messages

    def _send(self, message: Any, body: bytes | None = None) -> None:
        """Send at the end of this loop turn: the `done`s of tasks that finish together go as one batch."""
        if self._channel is not None:
            self._channel.post(message, body)

    def _register(self) -> None:
        """Register with the broker; first, if this runner `asks_first` and the broker is not yet known to be
        alone, ask whether it is a cluster member."""
        if self._asks_first:
            self._ask_map()
        else:
            self._send_ready()

    def _ask_map(self) -> None:
        rid = next(self._rids)
        self._map_rids.append(rid)
        self._send(protocol.ClusterRequest(protocol.PROTOCOL_VERSION, rid))

    def _send_ready(self) -> None:
        if self._stopping:
            return
        rid = next(self._rids)
        self._ready_rids.append(rid)
        self._send(protocol.Ready(
            protocol.PROTOCOL_VERSION, rid, pools=list(self.pools),
            slots=max(0, self.concurrency - len(self._running)),
            settings={name: pool.explicit_settings() for name, pool in self.pools.items() if pool.explicit_settings()},
            concurrency=max(self.concurrency, len(self._running)),
        ))

    def _on_command(self, frames: list[bytes]) -> None:
        self._last_heard = self._loop.time()  # type: ignore[union-attr]  # set by run(), which connects
        try:
            commands = protocol.unbatch(protocol.decode_worker_command(frames[0]), frames[1] if len(frames) > 1 else None)
        except CronoqError as exc:
            log.warning("ignoring a malformed message from the broker: %s", exc)
            return
        for command, body in commands:
            self._obey(command, body)

    def _obey(self, command: Any, body: bytes | None) -> None:
        match command:
            case protocol.Assign():
                self._start_task(command, b"\xc0" if body is None else body)
            case protocol.Heartbeat():
                pass
            case protocol.Welcome():
                if not self._registered.is_set():  # `ready`s queued while the broker was away are all welcomed
                    log.info("registered with %s for pools %s", self.broker, ", ".join(self.pools))
                self._told_silence = False
                self._registered.set()
                if command.max_payload_bytes is not None:
                    self._max_result_bytes = command.max_payload_bytes
                self._reconnect_delay = self.heartbeat_interval
            case protocol.Reregister():
                self._registered.clear()
                self._send_ready()
            case protocol.Left():
                self._left.set()
            case protocol.Ok() if command.rid in self._map_rids:
                self._take_map(command.value)
            case protocol.Ok():
                pass
            case protocol.Error() if command.rid and command.rid in self._map_rids:
                # A broker that does not know `cluster` (an older one) is a lone broker.
                self._take_map(None)
            case protocol.Error() if (command.rid in self._ready_rids and self.member is not None
                                      and isinstance(command.details, dict) and "member" in command.details):
                # A member's runner's pool moved to another member between the map it had and its `ready`: read
                # the map again (its parent then moves the pool) rather than stop.
                log.warning("%s: %s; reading the cluster map again", self.broker, command.message)
                self._ask_map()
            case protocol.Error() if command.rid and command.rid not in self._ready_rids:
                log.warning("the broker refused a message of this worker: %s %s", command.code, command.message)
            case protocol.Error():
                # A refused registration (or a message the broker could not take at all: the wrong endpoint, a
                # bad token) is a mistake of configuration: stop and report it.
                self._fatal = error_from_code(command.code, command.message, command.details)
                log.error("the broker refused this worker: %s %s", command.code, command.message)
                self._stopped.set()

    # ----------------------------------------------------------------- cluster

    def _take_map(self, value: Any) -> None:
        """The broker's answer to `cluster`: nil from a lone broker, which a runner that `asks_first` then
        registers with as always; a map goes to `on_map`, which decides."""
        if value is None:
            if self._asks_first:
                self._asks_first = False  # a lone broker: register as always, and on every connection from now on
                self._send_ready()
            return
        if self._on_map is not None:
            self._on_map(value)

    def retarget(self, pools: list[Pool], share: int) -> None:
        """Serve other pools, or another share of slots: register again when either changed."""
        names = [pool.name for pool in pools]
        if names == list(self.pools) and share == self.concurrency:
            return
        log.info("serving pools %s on %s with %d slot%s", ", ".join(names), self.broker, share,
                 "" if share == 1 else "s")
        self.pools = {pool.name: pool for pool in pools}
        self.concurrency = share
        if self._channel is not None:
            self._send_ready()

    # ----------------------------------------------------------------- tasks

    def _start_task(self, assign: protocol.Assign, body: bytes) -> None:
        attempts = self._leases.get(assign.id)
        if attempts is not None:
            if assign.attempt > attempts[-1]:
                attempts.append(assign.attempt)
                log.info("task %s: attempt %d given while attempt %d still runs here (the broker took the task "
                         "back meanwhile); the run reports for attempt %d rather than running the task twice",
                         assign.id, assign.attempt, attempts[0], assign.attempt)
            else:  # an assignment the broker has already replaced with a newer one, which runs here
                log.info("task %s: dropped attempt %d, older than attempt %d running here", assign.id,
                         assign.attempt, attempts[-1])
            return
        self._leases[assign.id] = [assign.attempt]
        key = next(self._jobs)
        # A task of the loop, not a first step taken here: a handler may need to be inside a task from its first
        # line (asyncio.timeout, current_task()), and before Python 3.12 no eager task gives it one at once.
        self._running[key] = self._loop.create_task(self._run_task(key, assign, body))  # type: ignore[union-attr]

    async def _run_task(self, key: int, assign: protocol.Assign, body: bytes) -> None:
        try:
            await self._serve(assign, body)
        finally:
            self._running.pop(key, None)  # absent when the task was abandoned
            self._leases.pop(assign.id, None)

    async def _serve(self, assign: protocol.Assign, body: bytes) -> None:
        """Run the handler and report the task's outcome."""
        pool = self.pools.get(assign.pool)
        try:
            if pool is None:
                raise LookupError(f"this worker does not serve pool {assign.pool!r}")
            if self._gate is None:
                value = await pool.call(protocol.decode_body(body), self._executor)
            else:
                async with self._gate:
                    value = await pool.call(protocol.decode_body(body), self._executor)
            result = protocol.encode_body(value)
        except Exception as exc:  # the handler's failure is the task's outcome, reported to the client
            error_type, message, trace = type(exc).__name__, _text(exc), traceback.format_exc()
            # One line per failure; the traceback goes with the outcome (TaskFailed.traceback), and into this
            # log at DEBUG only: a handler failing on every task must not bury the log in tracebacks.
            log.warning("task %s (pool %s, attempt %d) failed: %s: %s", assign.id, assign.pool, assign.attempt,
                        error_type, protocol.clip(message, LOGGED_MESSAGE_BYTES))
            log.debug("traceback of task %s:\n%s", assign.id, trace)
            self._report(_failure(assign, error_type, message, trace))
            return
        limit = self._max_result_bytes
        if limit is not None and len(result) > limit:
            # Sent, it would cost the connection and every task on it; this way only its own task fails.
            message = protocol.result_too_large(len(result), limit)
            log.warning("task %s (pool %s, attempt %d) failed: %s", assign.id, assign.pool, assign.attempt, message)
            self._report(_failure(assign, InvalidArgument.__name__, message, ""))
            return
        self._report(protocol.Done(protocol.PROTOCOL_VERSION, assign.id, assign.attempt, True), result)

    def _report(self, done: protocol.Done, result: bytes | None = None) -> None:
        """Send the outcome of a run for the newest attempt it stands for (`_leases`), then a `done` for each
        older one, whose lease the broker took back: those return their slots and are counted late."""
        self.finished += 1
        attempts = self._leases.pop(done.id, None)
        if attempts is None or attempts[-1] == done.attempt:
            self._send(done, result)
            return
        self._send(msgspec.structs.replace(done, attempt=attempts[-1]), result)
        for older in attempts[:-1]:
            self._send(protocol.Done(protocol.PROTOCOL_VERSION, done.id, older, False, "Superseded",
                                     f"attempt {attempts[-1]} of this task reported this run's outcome"))


def _failure(assign: protocol.Assign, error_type: str, message: str, trace: str) -> protocol.Done:
    """The `done` of a failed lease, its text cut to sizes that keep the header frame small."""
    return protocol.Done(
        protocol.PROTOCOL_VERSION, assign.id, assign.attempt, False,
        error_type=protocol.clip(error_type, protocol.MAX_ERROR_TYPE_BYTES),
        error_message=protocol.clip(message, protocol.MAX_ERROR_MESSAGE_BYTES),
        traceback=protocol.clip(trace, protocol.MAX_TRACEBACK_BYTES),
    )


def _text(exc: Exception) -> str:
    """An exception's message; one whose __str__ itself fails still gets a message."""
    try:
        return str(exc)
    except Exception as err:
        return f"<the exception's message could not be made: {type(err).__name__}>"

