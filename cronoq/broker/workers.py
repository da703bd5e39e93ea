"""The workers registered with a broker: their pools, liveness and slot credit.

A worker is its connection (`connections.Connection`), never a routing
identity: the core leases tasks to the connection, and only that connection
can complete them, so a peer that later shows up under the same identity
holds nothing.

Registration checks a worker's `Ready` against the broker's pools and
config; completion turns a `Done` into the book's outcome and gives the
worker its slot back. The credit rule: a worker states its free slots when
it registers, and each `Done` returns one. A worker that registers again
(after a broker restart, or after being declared lost) may still be running
tasks from before; it says its concurrency, so the broker knows how many
`Done`s of leases it no longer holds are owed a slot, and a replayed `Done`
beyond those returns nothing. A worker that does not say its concurrency is
owed nothing: only `Done`s of leases it holds return slots.

Decoding messages and sending replies stay with the broker; this module
only decides.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from cronoq.book.taskbook import TaskBook
from cronoq.broker.connections import Connection
from cronoq.core import PoolSettings, SchedulerCore
from cronoq.errors import FailedPrecondition, InvalidArgument, NotFound
from cronoq.pool import settings_disagreement
from cronoq.wire import protocol

log = logging.getLogger("cronoq.broker")

# Late results already logged, by (task id, attempt): a worker that sends the same late `done` again (it
# re-sends what it has not seen acknowledged) is counted each time but logged once.
LOGGED_LATE_RESULTS = 4096
# Leases taken back from lost workers whose result may still come before the task runs again, by task id: the
# token that held it. The oldest are forgotten first; a forgotten one only means a task runs again, as it would.
TAKEN_BACK = 100_000


@dataclass
class WorkerEntry:
    """A registered worker connection."""

    pools: list[str]
    last_seen: float
    leaving: bool = False
    owed: int = 0
    """Slots busy with tasks the worker ran before it (re-)registered: their `Done` returns them."""


class WorkerRegistry:
    """Worker connections, kept in step with the core's view of them."""

    def __init__(self, core: SchedulerCore, book: TaskBook) -> None:
        self._core = core
        self._book = book
        self._entries: dict[Connection, WorkerEntry] = {}
        self.late_results = 0
        """Results that came after the broker took their lease back (cronoq_late_results_total)."""
        self._logged_late: deque[tuple[str, int]] = deque(maxlen=LOGGED_LATE_RESULTS)
        self._taken_back: OrderedDict[str, str] = OrderedDict()
        """Task id -> the principal whose worker lost it, for `late` to accept a result from the same token."""
        self.rescued = 0
        """Late results that still ended their task, which had not run again yet."""

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, conn: Connection) -> WorkerEntry | None:
        return self._entries.get(conn)

    def describe(self) -> list[dict[str, Any]]:
        """Every registered worker as the dashboard lists it: its name (as logs give it), pools, busy slots (its
        leases, and the tasks from before it registered again), concurrency (busy and free slots), whether it is
        leaving, and when it was last heard from."""
        out = []
        for conn, entry in self._entries.items():
            busy = len(self._core.worker_tasks(conn)) + entry.owed
            out.append({"name": conn.label, "pools": list(entry.pools), "busy": busy,
                        "concurrency": busy + self._core.free_slots(conn), "leaving": entry.leaving,
                        "last_seen_at": entry.last_seen})
        return out

    def serving(self, pool: str) -> int:
        """How many registered workers serve `pool`."""
        return sum(1 for entry in self._entries.values() if pool in entry.pools)

    def heard_from_all(self, now: float) -> None:
        """Count every worker as heard from now (after the broker's own stall)."""
        for entry in self._entries.values():
            entry.last_seen = max(entry.last_seen, now)

    def silent_since(self, deadline: float) -> Iterator[tuple[Connection, WorkerEntry, bool]]:
        """Every worker, and whether it has been silent since `deadline` (a snapshot: safe to lose them meanwhile)."""
        for conn, entry in list(self._entries.items()):
            yield conn, entry, entry.last_seen < deadline

    def register(self, conn: Connection, ready: protocol.Ready, configured: Mapping[str, PoolSettings],
                 now: float, *, draining_served: bool = False) -> None:
        """Accept a worker's `Ready`, or raise the refusal: NotFound, FailedPrecondition, InvalidArgument.

        With `draining_served` (a cluster member), a worker may also serve the pools a reload moved away that
        still hold tasks here: they are served until empty.
        """
        accepting = set(self._core.pool_names())
        if draining_served:
            accepting.update(self._core.draining_pools())
        if not ready.pools:
            raise InvalidArgument("a worker must serve at least one pool")
        for name in ready.pools:
            if name not in accepting:
                raise NotFound(f"no pool named {name!r} on this broker; declared pools: {', '.join(sorted(accepting))}")
        for name, opinions in ready.settings.items():
            if name not in configured:
                raise NotFound(f"settings given for pool {name!r}, which this worker does not serve")
            problem = settings_disagreement(name, opinions, configured[name])
            if problem is not None:
                raise FailedPrecondition(f"{problem}; the broker's config owns pool settings")
        if ready.slots < 0:
            raise InvalidArgument(f"slots must not be negative, got {ready.slots}")
        owed = 0
        if ready.concurrency is not None:
            owed = ready.concurrency - ready.slots - len(self._core.worker_tasks(conn))
            if ready.slots > ready.concurrency or owed < 0:
                raise InvalidArgument(f"slots ({ready.slots}) and the tasks held cannot exceed concurrency "
                                      f"({ready.concurrency})")
        self._core.add_worker(conn, ready.pools, ready.slots, draining_ok=draining_served)
        self._entries[conn] = WorkerEntry(list(ready.pools), now, owed=owed)
        log.info("worker %s ready for pools %s with %d slot%s", conn.label, ", ".join(ready.pools),
                 ready.slots, "" if ready.slots == 1 else "s")

    def complete(self, conn: Connection, entry: WorkerEntry, done: protocol.Done, body: bytes | None,
                 now: float, max_result_bytes: int) -> None:
        """A lease's outcome. Stale ones change no task; replayed ones return no slot the worker never used."""
        if done.ok and body is not None and len(body) > max_result_bytes:
            record = self._book.complete(
                conn, done.id, done.attempt, now, ok=False, error_type="InvalidArgument",
                error_message=f"the result is {len(body)} bytes, over max_payload_bytes = {max_result_bytes}",
            )
        elif done.ok:
            record = self._book.complete(conn, done.id, done.attempt, now, ok=True,
                                         result=body if body is not None else b"\xc0")
        else:
            record = self._book.complete(
                conn, done.id, done.attempt, now, ok=False, error_type=done.error_type,
                error_message=done.error_message, traceback=done.traceback,
            )
        if record is None:
            if done.ok and body is not None and len(body) > max_result_bytes:  # no result a task may end with
                done, body = protocol.Done(done.v, done.id, done.attempt, False), None
            self.late(conn, done, body, now)
            if entry.owed <= 0:
                return  # a lease this worker does not hold, and no slot is owed: a replay
            entry.owed -= 1  # a task it ran before registering again: that slot is free now
        self._core.grant(conn, 1)

    def late(self, conn: Connection, done: protocol.Done, body: bytes | None, now: float) -> None:
        """A `done` of a lease the broker no longer holds for this connection: it came after the worker was lost
        (or from a connection the broker does not know).

        A result whose task has not run again yet ends it (from a worker with the token that held the lease,
        on this connection or a new one): a cut the worker did not outlast then costs no second run. Else it is
        dropped -- the task was run again, or will be -- and counted; logged once per lease, naming the task,
        when the lease was a real one (a `done` for a task or an attempt that never was counts, and logs
        nothing a peer could flood the log with)."""
        holder = self._taken_back.get(done.id)
        if done.ok and holder is not None and conn.principal is not None and conn.principal.name == holder:
            record = self._book.complete_taken_back(done.id, done.attempt, now,
                                                    body if body is not None else protocol.NIL_BODY)
            if record is not None:
                del self._taken_back[done.id]
                self.rescued += 1
                log.info("task %s: the result of its attempt %d came from worker %s after its lease was taken back, "
                         "before the task ran again: it ends the task", done.id, done.attempt, conn.label)
                return
        self.late_results += 1
        record = self._book.records.get(done.id)
        if record is None or not 1 <= done.attempt <= record.attempts or (done.id, done.attempt) in self._logged_late:
            return
        self._logged_late.append((done.id, done.attempt))
        log.warning("task %s: the outcome of its attempt %d came from worker %s after its lease was taken back "
                    "(the worker was lost); dropped -- the task is %s after %d attempt%s", done.id, done.attempt,
                    conn.label, record.state, record.attempts, "" if record.attempts == 1 else "s")

    def leave(self, conn: Connection, entry: WorkerEntry) -> None:
        """The worker is stopping: it keeps its running tasks and takes no new ones."""
        entry.leaving = True
        self._core.add_worker(conn, [], 0)

    def lose(self, conn: Connection, now: float) -> None:
        """The worker is gone (silent, disconnected, or said bye): its tasks go back to their queues, or fail
        past max_deliveries."""
        self._entries.pop(conn, None)
        holder = conn.principal.name if conn.principal is not None else None
        for record in self._book.lose_worker(conn, now):
            log.info("task %s requeued after its worker was lost", record.id)
            if holder is not None:
                self._taken_back[record.id] = holder
                self._taken_back.move_to_end(record.id)
                if len(self._taken_back) > TAKEN_BACK:
                    self._taken_back.popitem(last=False)
