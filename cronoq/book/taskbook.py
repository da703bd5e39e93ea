"""The task book: every task's record around the scheduling core, shared by broker and embedded mode.

The core (cronoq.core) decides which queued task runs next and forgets a
task once it is finished. The book keeps what users ask about afterwards —
payload, result, error, timings, idempotency keys — applies the rules that
sit around scheduling (validation, retries with backoff and jitter, lost
deliveries, retention), and reports every terminal task to its shell so
waiters can be answered. It does no I/O: the shell passes the time and
sends the messages; the optional journal makes the changes durable.
"""

from __future__ import annotations

from dataclasses import asdict
from itertools import compress, repeat
from operator import attrgetter, eq
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable, Iterator, Mapping, Protocol, Sequence

from cronoq.answers import AttemptEnd, Explanation, TaskInfo
from cronoq.book.records import TaskRecord, attempt_ended
from cronoq.book.retention import (
    DEFAULT_RESULT_TTL,
    DEFAULT_RETENTION_BYTES,
    MAX_UNARCHIVED,
    FinishedRecords,
    ResultArchive,
)
from cronoq.book.submission import FormerKey, SubmitRequest, validate_submit
from cronoq.core import (
    CANCELLED,
    DELAYED,
    EXPIRED,
    FAILED,
    PRIORITIES,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    ClassRates,
    PoolSettings,
    SchedulerCore,
)
from cronoq.core.shards import ShardedMap
from cronoq.errors import NotFound, ResourceExhausted

if TYPE_CHECKING:
    from random import Random

RETRY_BACKOFF_BASE = 0.5
"""Seconds before the first retry; each further retry waits twice as long (with jitter)."""
RETRY_BACKOFF_CAP = 60.0


class ChangeLog(Protocol):
    """Where the book reports every change of a record, to make it durable (the broker's journal).

    Each call describes the record as it is right after the change; nothing
    is durable until the owner of the log commits it.
    """

    def accepted(self, record: TaskRecord) -> None: ...
    def dispatched(self, record: TaskRecord) -> None: ...
    def requeued(self, record: TaskRecord) -> None: ...  # how its attempt ended: the last of its attempt_ends
    def finished(self, record: TaskRecord) -> None: ...
    def paused(self, pool: str, paused: bool) -> None: ...


class TaskBook:
    """Records, idempotency keys, retries and retention around one SchedulerCore.

    Idempotency keys are scoped by (pool, tenant, key) and submission ids by
    (tenant, submission): a duplicate is only ever found among the
    submitting tenant's own tasks (tasks without a tenant are a scope of
    their own), so no tenant can claim, or learn of, another's names.

    `records` holds every live task, and the finished ones still in memory:
    all retained ones without an `archive`; with one, only those the archive
    does not hold yet (the shell ships them with `take_finished` and lets
    them go with `release_archived`). Lookups ask memory first, then the
    archive (cronoq.book.retention).

    The book reads no clock and draws no random number of its own: every
    change takes `now` (the shell's time, in seconds), retries draw their
    jitter from `rng`, and `pacing_clock` (a monotonic clock, in seconds) is
    read only to bound how long one call may hold the shell's loop
    (RELEASE_BUDGET), never for a task's times.
    """

    def __init__(
        self,
        core: SchedulerCore,
        *,
        new_id: Callable[[], str],
        on_terminal: Callable[[TaskRecord], None],
        rng: Random,
        pacing_clock: Callable[[], float],
        max_payload_bytes: int = 1 << 20,
        max_deliveries: int = 5,
        result_ttl: float = DEFAULT_RESULT_TTL,
        result_retention_bytes: int = DEFAULT_RETENTION_BYTES,
        limits: Callable[[str], tuple[int | None, int | None]] = lambda pool: (None, None),
        journal: ChangeLog | None = None,
    ) -> None:
        self.core = core
        self._new_id = new_id
        self._on_terminal = on_terminal
        self.max_payload_bytes = max_payload_bytes
        self.max_deliveries = max_deliveries
        self._limits = limits
        self._rng = rng
        self._pacing_clock = pacing_clock
        self.journal = journal
        self._accepting = frozenset(core.pool_names())  # asked on every submit: kept, not rebuilt
        # Maps that hold an entry per task are ShardedMaps: a million tasks grow them without one long pause
        # (cronoq/core/shards.py). They keep no order: `kept()` puts records in the order they are queued in.
        self.records: ShardedMap[str, TaskRecord] = ShardedMap()
        # A record is the core's task, so this map can be the core's map of its live tasks too: one entry per
        # queued task instead of two (about 35 bytes less each). A core handed over already holding tasks keeps
        # its own map.
        self._shares_records = not len(core)
        if self._shares_records:
            core.keep_tasks_in(self.records)  # type: ignore[arg-type]
        self._keys: ShardedMap[tuple[str, str | None, str], str] = ShardedMap()
        # tenant -> submission id -> task id: a map per tenant rather than (tenant, submission) keys, which
        # would cost every queued task a tuple (~60 bytes).
        self._submissions: dict[str | None, ShardedMap[str, str]] = {}
        self.finished = FinishedRecords(result_ttl, result_retention_bytes)
        """The finished records in memory, in the order they finished."""
        self._archive: ResultArchive | None = None
        self._unshipped: list[TaskRecord] = []
        self.max_unarchived = MAX_UNARCHIVED
        """Finished records waiting for the archive past which nothing more is dispatched."""

    # ----------------------------------------------------------------- submit

    def submit(self, request: SubmitRequest, now: float) -> tuple[TaskRecord, bool]:
        """Accept a task; returns its record, and whether it is an earlier task of the same tenant with the
        same key (in the same pool).

        A submit repeating an earlier one's submission id is that submit sent again (a client re-sends what it
        got no reply to, and the first copy may still have been on its way): it gets the task the first one
        made, answered as the first one was, not as a duplicate -- `duplicate` tells a caller that its own
        key found an earlier task, and a re-send is no doing of the caller's. (A first submit whose key found
        an earlier task made no task of its own, so its re-send finds that task by the key again: a duplicate
        both times.)"""
        priority = validate_submit(request, self._accepting, self.max_payload_bytes)
        if request.submission is not None:
            existing = self._by_submission(request.tenant, request.submission)
            if existing is not None:
                return existing, False
        if request.key is not None:
            existing = self._by_key(request.pool, request.tenant, request.key)
            if existing is None and request.former_key is not None:
                existing = self._under_former_key(request.pool, request.tenant, request.former_key)
            if existing is not None:
                return existing, True
        self._check_backlog(request.pool, request.tenant)
        deadline = None if request.deadline is None else now + request.deadline
        record = TaskRecord(
            self._new_id(), request.pool, request.tenant, priority, request.payload, now, deadline,
            None if not request.delay else now + request.delay, request.max_retries, request.key,
            request.submission,
        )
        if request.cost is not None:
            record.cost = float(request.cost)
        self._enter(record, now)
        if self.journal is not None:
            self.journal.accepted(record)
        return record, False

    def _by_submission(self, tenant: str | None, submission: str) -> TaskRecord | None:
        of_tenant = self._submissions.get(tenant)  # of_tenant.get(submission), inline (core/shards.py)
        task_id = None if of_tenant is None else (
            of_tenant.whole or of_tenant.shards[hash(submission) % of_tenant.count]).get(submission)
        if task_id is not None:
            return self.records[task_id]
        return None if self._archive is None else self._archive.find_submission(tenant, submission)

    def _by_key(self, pool: str, tenant: str | None, key: str) -> TaskRecord | None:
        task_id = self._keys.get((pool, tenant, key))
        if task_id is not None:
            return self.records[task_id]
        return None if self._archive is None else self._archive.find_key(pool, tenant, key)

    def _under_former_key(self, pool: str, tenant: str | None, former: FormerKey) -> TaskRecord | None:
        record = self._by_key(pool, tenant, former.key)
        if record is None or not former.since <= record.submitted_at < former.until:
            return None
        return record

    def _check_backlog(self, pool: str, tenant: str | None) -> None:
        max_backlog, max_tenant_backlog = self._limits(pool)
        if max_backlog is not None and self.core.backlog(pool) >= max_backlog:
            raise ResourceExhausted(
                f"pool {pool!r} already holds {max_backlog} waiting tasks (max_backlog); retry later"
            )
        if max_tenant_backlog is not None and self.core.tree_backlog(pool, tenant) >= max_tenant_backlog:
            # The whole tree of the top-level tenant counts: `acme/a`, `acme/b`, ... cannot each hold as many.
            top = tenant.split("/")[0] if tenant else tenant
            whose = (f"tenant {tenant!r}" if top == tenant
                     else f"tenant {top!r} (with {tenant!r} and the rest of its tree)")
            raise ResourceExhausted(
                f"{whose} already has {max_tenant_backlog} waiting tasks in pool {pool!r} "
                "(max_tenant_backlog); retry later"
            )

    def _enter(self, record: TaskRecord, now: float) -> None:
        """Queue a record's task in the core (DELAYED until its not_before) and keep the record."""
        self.core.submit(record, now)  # type: ignore[arg-type]  # a record is the core's task
        self._keep(record)

    def _keep(self, record: TaskRecord) -> None:
        # `records[record.id] = record` and `submissions[record.submission] = record.id`, inline: each submit
        # makes both (core/shards.py).
        if not self._shares_records:  # else the core's submit put it there
            records = self.records
            shard = records.whole or records.shards[hash(record.id) % records.count]
            shard[record.id] = record
            if len(shard) > records.split_at:
                records.split()
        if record.key is not None:
            self._keys[(record.pool, record.tenant, record.key)] = record.id
        if record.submission is not None:
            submissions = self._submissions.get(record.tenant)
            if submissions is None:
                submissions = self._submissions[record.tenant] = ShardedMap()
            shard = submissions.whole or submissions.shards[hash(record.submission) % submissions.count]
            shard[record.submission] = record.id
            if len(shard) > submissions.split_at:
                submissions.split()

    # ----------------------------------------------------------------- recovery

    def recover(self, records: Iterable[TaskRecord] | Mapping[str, TaskRecord], paused: Iterable[str], now: float,
                *, seq_floor: int = 0, by_id: ShardedMap[str, TaskRecord] | None = None) -> dict[str, int]:
        """Carry on from durable state: `records` (or a map of them by id) in the order a journal replay gives
        them (cronoq.store.journal.replay). `by_id`: a map of exactly those records by id, which a book that holds
        no record yet takes over as its own rather than copying it (a replay's `by_id`).

        Finished records are kept for lookups (in the order they finished;
        numbers up to `seq_floor` are taken); queued and delayed ones re-enter
        their class; ones that were running when the broker stopped were lost
        with their worker: they run again, unless they have used up
        max_deliveries. Tasks of pools no longer declared fail. Returns counts
        by what happened, for the start-up log.
        """
        core = self.core
        for pool in paused:
            if pool in core.pool_names():
                core.pause(pool)
        counts = {"finished": 0, "queued": 0, "requeued": 0, "failed": 0}
        pools = set(core.pool_names())
        finished: list[TaskRecord] = []
        lost: list[TaskRecord] = []
        tasks: list[TaskRecord] = []
        self.finished.next_seq = max(self.finished.next_seq, seq_floor + 1)
        # A million queued tasks come back through here: what can be done in bulk, at C speed, is.
        every = list(records.values()) if isinstance(records, Mapping) else list(records)
        if by_id is not None and not self.records:
            self.records = by_id
            if self._shares_records:  # the core holds nothing yet (no record, so no live task): it moves along
                core.keep_tasks_in(by_id)  # type: ignore[arg-type]
        else:
            self.records.put_all(list(map(_ID, every)), every)
        self._index(every)
        max_deliveries, journal = self.max_deliveries, self.journal
        for record in every:
            if record.finished_at is not None:
                finished.append(record)
            elif record.state != RUNNING:
                if record.pool in pools:
                    tasks.append(record)
                else:
                    lost.append(record)
            elif record.pool not in pools or record.attempts - record.retries >= max_deliveries:
                lost.append(record)
            else:
                record.not_before = None
                attempt_ended(record, "worker_lost", now)  # first: the journal's record says how it ended
                if journal is not None:
                    journal.requeued(record)
                counts["requeued"] += 1
                tasks.append(record)
        # A record is the core's task; and the book's map of records can serve as the core's map of its tasks.
        core.restore(tasks, now, index=self.records if self._shares_records or not len(core) else None)  # type: ignore[arg-type]
        counts["queued"] = len(tasks) - counts["requeued"]
        counts["finished"] = len(finished)
        self.finished.restore(finished, seq_floor)
        for record in lost:
            if record.pool not in pools:
                self._finish(record, FAILED, now, error_type="NotFound",
                             error_message=f"pool {record.pool!r} is no longer declared in the broker's config")
            else:
                self._fail_lost(record, now)
            counts["failed"] += 1
        if self._archive is not None:
            self._unshipped = list(self.finished)
        return counts

    def _index(self, records: list[TaskRecord]) -> None:
        """Enter the keys and submission ids of recovered records: a tenant's submission ids in bulk (most often
        every record has one, and they are all of one tenant)."""
        keys = list(map(_KEY, records))
        if keys.count(None) != len(keys):
            for record in compress(records, keys):
                self._keys[(record.pool, record.tenant, record.key)] = record.id  # type: ignore[index]
        submissions = list(map(_SUBMISSION, records))
        without = submissions.count(None)
        if without == len(submissions):
            return
        if without:
            records = list(compress(records, submissions))
            submissions = list(map(_SUBMISSION, records))
        tenants = list(map(_TENANT, records))
        distinct = set(tenants)
        if len(distinct) > BULK_TENANTS:  # many tenants, few tasks each: one at a time
            for record in records:
                of_tenant = self._submissions.get(record.tenant)
                if of_tenant is None:
                    of_tenant = self._submissions[record.tenant] = ShardedMap()
                of_tenant[record.submission] = record.id  # type: ignore[index]
            return
        for tenant in distinct:
            if len(distinct) == 1:
                ids = list(map(_ID, records))
            else:  # this tenant's, at C speed: a pass over the records per tenant
                mine = list(map(eq, tenants, repeat(tenant)))
                submissions = list(compress(map(_SUBMISSION, records), mine))
                ids = list(compress(map(_ID, records), mine))
            of_tenant = self._submissions.get(tenant)
            if of_tenant is None:
                of_tenant = self._submissions[tenant] = ShardedMap()
            of_tenant.put_all(submissions, ids)  # type: ignore[arg-type]

    def kept(self) -> Iterator[TaskRecord]:
        """Every record in memory in the order `recover` wants them: finished ones as they finished, then live
        ones in the order they last entered their queue or the timers (the core's arrival number).

        `records` keeps no order: the live ones are sorted here, O(n log n). The broker calls this in the
        forked child that writes a snapshot, off its loop."""
        yield from self.finished
        live = [record for record in self.records.values() if record.finished_at is None]
        live.sort(key=_ARRIVAL)
        yield from live

    def configure(self, pools: Iterable[PoolSettings], now: float | None = None) -> None:
        """Take new pool settings (a reload): new weights apply to the queued backlog at once; a node capped by
        new ceilings counts as capped since `now` (None: the last time the core was told)."""
        self.core.configure(pools, now)
        self._accepting = frozenset(self.core.pool_names())

    def paused_pools(self) -> list[str]:
        """Names of the paused pools."""
        return [name for name in self.core.pool_names() if self.core.is_paused(name)]

    def pause(self, pool: str) -> None:
        """Stop dispatching `pool` (durably); it still accepts tasks."""
        self.core.pause(pool)
        if self.journal is not None:
            self.journal.paused(pool, True)

    def resume(self, pool: str) -> None:
        """Dispatch `pool` again."""
        self.core.resume(pool)
        if self.journal is not None:
            self.journal.paused(pool, False)

    # ----------------------------------------------------------------- dispatch

    def dispatch(self, now: float) -> list[tuple[Hashable, TaskRecord, int]]:
        """Expire what is due, then hand out tasks: (worker id, record, attempt) for each."""
        for task in self.core.expire(now):
            self._finish(task, EXPIRED, now, error_type="DeadlineExceeded",  # type: ignore[arg-type]
                         error_message="the task's deadline passed before it was dispatched")
        assignments: list[tuple[Hashable, TaskRecord, int]] = []
        limit = None
        archive = self._archive
        if (archive is not None and len(self.finished) >= self.max_unarchived
                and not self.finished.releasable(archive.archived_through)):
            # The archive falls behind: let it catch up before many more tasks can finish. (Records it confirmed,
            # which merely wait for their batch to leave memory, do not count.) A trickle still goes out, to the
            # workers ready longest (an idle pool's first): a flood on one pool must not stall a lone task of
            # another for the whole catch-up. Twice the limit stops even that: memory stays bounded.
            if len(self.finished) >= 2 * self.max_unarchived:
                return assignments
            limit = GATED_DISPATCHES
        journal = self.journal
        for worker_id, task in self.core.dispatch(now, limit):
            record: TaskRecord = task  # type: ignore[assignment]  # the core set its state and attempts
            record.started_at = now
            if journal is not None:
                journal.dispatched(record)
            assignments.append((worker_id, record, record.attempts))
        return assignments

    def complete(
        self, worker_id: Hashable, task_id: str, attempt: int, now: float, *, ok: bool,
        result: bytes | None = None, error_type: str = "", error_message: str = "", traceback: str = "",
    ) -> TaskRecord | None:
        """A worker reports a lease's outcome. Stale leases (lost worker, old attempt) change nothing."""
        task = self.core.get(task_id)
        if task is None or task.state != RUNNING or task.worker != worker_id or task.attempts != attempt:
            return None
        record: TaskRecord = task  # type: ignore[assignment]
        if not ok and record.retries < record.max_retries:
            record.retries += 1
            retry_at = now + self._backoff(record.retries)
            self.core.requeue(task_id, now, worker_id=worker_id, attempt=attempt, not_before=retry_at)
            record.error_type, record.error_message, record.traceback = error_type, error_message, traceback
            attempt_ended(record, "retried", now)
            self._requeued(record)
            return record
        self.core.finish(task_id, now, worker_id=worker_id, attempt=attempt, state=SUCCEEDED if ok else FAILED)
        if ok:
            record.result = result
            self._finish(record, SUCCEEDED, now)
        else:
            self._finish(record, FAILED, now, error_type=error_type, error_message=error_message, traceback=traceback)
        return record

    def _backoff(self, retry: int) -> float:
        """Exponential backoff with jitter, so retries of a burst do not return in lockstep."""
        ceiling = min(RETRY_BACKOFF_CAP, RETRY_BACKOFF_BASE * 2 ** (retry - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)

    def lose_worker(self, worker_id: Hashable, now: float) -> list[TaskRecord]:
        """A worker is gone: its tasks run again, unless they have used up max_deliveries."""
        requeued = []
        for task in self.core.remove_worker(worker_id, now):
            record: TaskRecord = task  # type: ignore[assignment]
            if self._lost_deliveries(record) >= self.max_deliveries:
                self.core.cancel(task.id, now)
                self._fail_lost(record, now)  # its last attempt: the task's state says how it ended
            else:
                record.not_before = None
                attempt_ended(record, "worker_lost", now)
                self._requeued(record)
                requeued.append(record)
        return requeued

    def complete_taken_back(self, task_id: str, attempt: int, now: float, result: bytes) -> TaskRecord | None:
        """The result of a lease taken back from a worker declared lost, come before the task ran again: the
        task succeeds with it rather than run a second time. None (nothing changes) unless the task waits to run
        again because exactly that attempt was lost with its worker. Only a success is taken this way: a failure
        could only send the task back to the queue it is in."""
        record = self.records.get(task_id)
        if record is None or record.state not in (QUEUED, DELAYED) or record.attempts != attempt:
            return None
        ends = record.attempt_ends
        if not ends or ends[-1].attempt != attempt or ends[-1].ended != "worker_lost":
            return None
        if self.core.cancel(task_id, now) is None:
            return None
        record.result = result
        self._finish(record, SUCCEEDED, now)
        return record

    @staticmethod
    def _lost_deliveries(record: TaskRecord) -> int:
        """Of a running task's attempts, those that ended without an outcome, the one running now included:
        each earlier attempt was either that or a failure that was retried."""
        return record.attempts - record.retries

    def _fail_lost(self, record: TaskRecord, now: float) -> None:
        self._finish(
            record, FAILED, now, error_type="WorkerLost",
            error_message=f"the task's worker was lost on {self._lost_deliveries(record)} of its "
            f"{record.attempts} deliveries (max_deliveries = {self.max_deliveries})",
        )

    def _requeued(self, record: TaskRecord) -> None:
        # It queues again behind the others: the core gave it a new arrival number, which orders snapshots. Its
        # attempt's end is noted: the journal's record says how it ended.
        if self.journal is not None:
            self.journal.requeued(record)

    def cancel(self, task_id: str, now: float) -> bool:
        """Cancel a task that has not been dispatched. False if it is running or finished."""
        task = self.core.cancel(task_id, now)
        if task is None:
            return False
        self._finish(task, CANCELLED, now,  # type: ignore[arg-type]
                     error_type="Cancelled", error_message="the task was cancelled")
        return True

    def _finish(self, record: TaskRecord, state: str, now: float, *, error_type: str = "",
                error_message: str = "", traceback: str = "") -> None:
        record.state = state
        record.finished_at = now
        record.error_type, record.error_message, record.traceback = error_type, error_message, traceback
        record.payload = b""  # a finished task's payload is never needed again
        self.finished.add(record)
        if self.journal is not None:
            self.journal.finished(record)
        self._on_terminal(record)
        if self._archive is not None:
            self._unshipped.append(record)
        else:  # the oldest leave as this one comes (it costs a look at the oldest, most of the time)
            self.forget_expired_records(now)

    # ----------------------------------------------------------------- lookups

    def get(self, task_id: str) -> TaskRecord:
        """The record of a task (from memory, else from the archive), or NotFound."""
        if not isinstance(task_id, str):
            raise unknown_task(task_id)
        record = self.records.get(task_id)
        if record is None and self._archive is not None:
            record = self._archive.find(task_id)
        if record is None:
            raise unknown_task(task_id)
        return record

    def info(self, task_id: str) -> TaskInfo:
        """A snapshot of a task's state, attempts and timings."""
        return self._info(self.get(task_id))

    def _info(self, record: TaskRecord) -> TaskInfo:
        task = self.core.get(record.id)
        state, attempts = (task.state, task.attempts) if task is not None else (record.state, record.attempts)
        error = f"{record.error_type}: {record.error_message}" if record.error_type else None
        return TaskInfo(
            id=record.id, pool=record.pool, tenant=record.tenant, priority=PRIORITIES[record.priority],
            state=state, attempts=attempts, submitted_at=record.submitted_at, started_at=record.started_at,
            finished_at=record.finished_at, deadline=record.deadline, error=error, cost=record.cost,
        )

    def explain(self, task_id: str, now: float, dispatch_rate: float | None = None,
                arrival_rates: Sequence[ClassRates] | None = None, scope: str | None = None) -> Explanation:
        """Why the task is where it is (see `Explanation`), or NotFound. `dispatch_rate` is its pool's recent
        dispatches per second and `arrival_rates` its classes' arrivals per second, measured by the caller
        (None: none to tell); `scope` the tenant a pinned caller may see (cronoq.core.explain). Bounded cost:
        see cronoq.core.explain."""
        record = self.get(task_id)  # one lookup: an old task's is a read of the results store
        info = self._info(record)
        return Explanation(
            **asdict(info), max_retries=record.max_retries,
            not_before=record.not_before if info.state == DELAYED else None,
            history=self._history(record, info),
            waiting=self.core.explain(task_id, now, dispatch_rate, arrival_rates, scope),
            charged=self.core.charged_for(task_id) if info.state == RUNNING else None,
        )

    def _history(self, record: TaskRecord, info: TaskInfo) -> tuple[AttemptEnd, ...]:
        """How each attempt ended: those the record keeps, the last one from the task's state, the rest unknown
        (older than the kept ones, or ended before a broker that kept them)."""
        kept = {end.attempt: AttemptEnd(end.attempt, end.ended, end.at, end.error)
                for end in record.attempt_ends or ()}
        out = []
        for attempt in range(1, info.attempts + 1):
            end = kept.get(attempt)
            if end is None and attempt == info.attempts:
                if info.state == RUNNING:
                    end = AttemptEnd(attempt, "running")
                elif info.state in (SUCCEEDED, FAILED):
                    end = AttemptEnd(attempt, info.state, info.finished_at,
                                     info.error if info.state == FAILED else None)
            out.append(end or AttemptEnd(attempt, "unknown"))
        return tuple(out)

    def next_wakeup(self) -> float | None:
        return self.core.next_wakeup()

    # ----------------------------------------------------------------- retention

    @property
    def archive(self) -> ResultArchive | None:
        """Where finished records go once they leave memory (None: they stay in memory until retention ends)."""
        return self._archive

    @archive.setter
    def archive(self, archive: ResultArchive | None) -> None:
        self._archive = archive
        self.finished.weigh = archive is None

    @property
    def result_ttl(self) -> float:
        return self.finished.ttl

    @result_ttl.setter
    def result_ttl(self, ttl: float) -> None:
        self.set_retention(ttl, self.finished.max_bytes)

    def set_retention(self, ttl: float, max_bytes: int) -> None:
        """New retention limits (a reload); the archive applies them too."""
        self.finished.ttl, self.finished.max_bytes = ttl, max_bytes
        if self._archive is not None:
            self._archive.set_retention(ttl, max_bytes)

    def forget_expired_records(self, now: float) -> int:
        """Without an archive: drop the oldest finished records while they are older than result_ttl or weigh
        more than the retention budget (with their idempotency keys); returns how many. With one, the archive
        does that (told the time here)."""
        if self._archive is not None:
            self._archive.forget_expired(now)
            return 0
        gone = self.finished.expired(now)
        for record in gone:
            self._forget(record)
        return len(gone)

    def take_finished(self) -> list[TaskRecord]:
        """The records that finished since the last call, for the archive (once their journal commit is done)."""
        taken, self._unshipped = self._unshipped, []
        return taken

    def release_archived(self, through: int) -> list[TaskRecord]:
        """The archive holds every finished record numbered up to `through`: let them go from memory, RELEASE_CHUNK
        at a time until RELEASE_BUDGET has passed (at least one chunk; the caller comes back for the rest:
        `finished.releasable(through)`)."""
        finished = self.finished
        gone: list[TaskRecord] = []
        clock = self._pacing_clock
        until = clock() + RELEASE_BUDGET
        while True:
            chunk = finished.release(through, RELEASE_CHUNK)
            for record in chunk:
                self._forget(record)
            gone += chunk
            if len(chunk) < RELEASE_CHUNK or clock() >= until:
                return gone

    def _forget(self, record: TaskRecord) -> None:
        task_id = record.id
        records = self.records  # records.pop(task_id, None), inline (core/shards.py): a drain forgets hundreds a pass
        (records.whole or records.shards[hash(task_id) % records.count]).pop(task_id, None)
        if record.key is not None:
            key = (record.pool, record.tenant, record.key)
            if self._keys.get(key) == task_id:
                del self._keys[key]
        submission = record.submission
        if submission is not None:
            of_tenant = self._submissions.get(record.tenant)
            if of_tenant is not None:
                shard = of_tenant.whole or of_tenant.shards[hash(submission) % of_tenant.count]
                held = shard.pop(submission, None)
                if held != task_id and held is not None:
                    shard[submission] = held  # another task's now: not this one's to forget (and no growth)
                elif not shard and not of_tenant:
                    del self._submissions[record.tenant]

    def memory_stats(self) -> dict[str, int]:
        """Records in memory: live ones, finished ones (and the bytes they weigh)."""
        return {"records": len(self.records), "live": len(self.core), "finished": len(self.finished),
                "finished_bytes": self.finished.bytes}


BULK_TENANTS = 16
"""Up to this many tenants among recovered tasks, a restart indexes their submission ids a tenant at a time, in
bulk (a pass over every record per tenant); past it, a record at a time."""

GATED_DISPATCHES = 8
"""Tasks dispatched per pass while the results store falls behind (max_unarchived finished records wait for it),
to the workers ready longest: enough for the other pools' lone tasks, little enough to let the store catch up."""

RELEASE_BUDGET = 0.0005
"""Seconds of a pass spent letting go of finished records the results store confirmed: a drain of 10^6 tasks can
have the store confirm 10^5 in one reply, and forgetting them all in one pass held the loop for tens of
milliseconds. The rest go in the next passes. A bound by time, not by count: a count of 2,000 a pass took 2–8 ms
of a drain's passes, and up to 67 ms while a compaction's child shared the broker's memory (each page the loop
writes to is copied first, ten times the cost of freeing a record)."""
RELEASE_CHUNK = 100
"""Finished records let go between two looks at the clock (about 0.25 ms, 3 ms at worst while pages are copied)."""


_ID, _KEY, _SUBMISSION, _TENANT = (attrgetter(name) for name in ("id", "key", "submission", "tenant"))
_ARRIVAL = attrgetter("_seq")
"""A live task's arrival number in the core: the order it (last) entered its queue, or its timers."""


def unknown_task(task_id: Any) -> NotFound:
    """The answer for an id with no record, and for a task the asker may not see: the same, so that it
    tells nobody whether another tenant's task exists."""
    return NotFound(f"no task with id {task_id!r} (unknown, or its record has expired)")
