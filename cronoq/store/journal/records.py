"""What the journal and the snapshot hold: one tagged msgspec struct per kind of change.

A journal frame holds the changes of one group commit as a msgpack array of
these records; a snapshot holds one record per task plus `Paused` pools.
Each record is an array `[tag, field, ...]`, so the common ones cost a few
dozen bytes. Times are Unix seconds, as in the task book.

Changing a record's fields means a new `FORMAT`: a broker refuses files of a
format it does not know instead of guessing. The one exception is a field
added at the end with a default (`TaskRecord.retries`,
`TaskRecord.attempt_ends` and `TaskRecord.cost`, `Requeued.retries`, `Requeued.ended` and
`Requeued.ended_at`): a file without it reads as the default, and a broker
that does not know it skips it, so such a file keeps its format. Format 2
(this one) stores a task record as the book's own `TaskRecord` (`t`; an
`accepted` record is the first fields of one), and numbers finished tasks
(`Finished.seq`); format 1 files (with `Kept` snapshot records) are still
read.
"""

from __future__ import annotations

import heapq
import re
from typing import Iterator, Union

import msgspec

from cronoq.book.records import TaskRecord
from cronoq.core import QUEUED

FORMAT = 2
"""Version of the on-disk format written, in every file's header."""
READABLE_FORMATS = (1, 2)


class _Record(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    pass


class Header(_Record, tag="cronoq"):
    """First frame of every file: what it is, its format and its generation."""

    kind: str  # "journal" or "snapshot"
    format: int
    generation: int


class Accepted(TaskRecord, tag="a"):
    """A task was accepted: read back as the task's record itself, from the fields up to `submission` (the
    rest take their defaults). Written as an AcceptedEntry."""


class AcceptedEntry(_Record, tag="a"):
    """An `accepted` record as the journal writes it: a submit's fields, the first ones of a TaskRecord."""

    id: str
    pool: str
    tenant: Union[str, None]
    priority: int
    payload: bytes
    submitted_at: float
    deadline: Union[float, None] = None
    not_before: Union[float, None] = None
    max_retries: int = 0
    key: Union[str, None] = None
    submission: Union[str, None] = None
    # The TaskRecord fields between `submission` and `cost`, at their defaults, so that an accepted task with a
    # cost reads back with it in its place; omitted (omit_defaults) when the task has no cost, as before.
    state: str = QUEUED
    attempts: int = 0
    started_at: Union[float, None] = None
    finished_at: Union[float, None] = None
    result: Union[bytes, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    seq: int = 0
    retries: int = 0
    attempt_ends: None = None
    cost: Union[float, None] = None


class Dispatched(_Record, tag="d"):
    """A task was handed to a worker: its attempt number and when."""

    id: str
    attempt: int
    started_at: float


class Requeued(_Record, tag="r"):
    """A running task went back to its queue (retry after a failure, or a lost worker)."""

    id: str
    not_before: Union[float, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    retries: int = 0
    """The task's `retries` (the handler raised and it went back) so far: a lost worker's requeue carries it
    unchanged."""
    ended: str = ""
    """How the attempt ended that this requeue follows: `retried` or `worker_lost` ("" in files written before
    it was kept: the attempt's end is then unknown). A replay rebuilds the record's `attempt_ends` entry from
    it, `ended_at`, the task's attempt number and, for a retry, the error above (cronoq.book.records.attempt_ended)."""
    ended_at: float = 0.0
    """When that attempt ended (Unix seconds)."""


class Finished(_Record, tag="f"):
    """A task reached a terminal state (succeeded, failed, cancelled, expired)."""

    id: str
    state: str
    finished_at: float
    result: Union[bytes, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    seq: int = 0
    """The task's number in the order tasks finished (format 2; 0 in format 1)."""


class Forgotten(_Record, tag="x"):
    """A finished task's record passed result_ttl and was dropped (format 1 only: the results store forgets
    now)."""

    id: str


class Paused(_Record, tag="p"):
    """A pool was paused (or resumed)."""

    pool: str
    paused: bool


class Kept(_Record, tag="k"):
    """A whole task record, as a format 1 snapshot holds it (format 2 stores the TaskRecord itself)."""

    id: str
    pool: str
    tenant: Union[str, None]
    priority: int
    state: str
    submitted_at: float
    payload: bytes = b""
    deadline: Union[float, None] = None
    not_before: Union[float, None] = None
    max_retries: int = 0
    key: Union[str, None] = None
    submission: Union[str, None] = None
    attempts: int = 0
    started_at: Union[float, None] = None
    finished_at: Union[float, None] = None
    result: Union[bytes, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


class End(_Record, tag="end"):
    """Last frame of a snapshot: how many records it holds, so a cut-off one is recognised."""

    count: int


Change = Union[AcceptedEntry, Dispatched, Requeued, Finished, Paused]
Record = Union[Header, TaskRecord, Accepted, Dispatched, Requeued, Finished, Forgotten, Paused, Kept, End]

encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(list[Record])


def decode_batch(body: bytes) -> list[Record]:
    """The records of one frame. Raises msgspec.DecodeError on a body this format cannot read."""
    return _decoder.decode(body)


# Where a frame body can begin, for resynchronising past damage (cronoq.store.journal.frames): a body is a msgpack
# array (fixarray, array16 or array32) whose first item is a record, itself an array (fixarray or array16)
# whose first item is one of the tags above as a short string. Searching for the tags runs at C speed; the
# bytes before each are then checked for the two array headers.
_TAG = re.compile(rb"\xa1[adrfxpkt]|\xa3end|\xa6cronoq")
_FIXARRAY = range(0x91, 0xA0)


def batch_starts(buf: bytes, start: int) -> Iterator[int]:
    """Ascending offsets >= `start` where an encoded batch could begin (every real one is among them)."""
    pending: list[int] = []  # a min-heap: one tag's candidates can lie a few bytes before the previous tag's
    for match in _TAG.finditer(buf, start):
        tag = match.start()
        while pending and pending[0] < tag - 8:  # the earliest a later tag can name
            yield heapq.heappop(pending)
        for record in _array_headers_before(buf, tag, array32=False):
            for body in _array_headers_before(buf, record, array32=True):
                if body >= start:
                    heapq.heappush(pending, body)
    while pending:
        yield heapq.heappop(pending)


def _array_headers_before(buf: bytes, item: int, *, array32: bool) -> Iterator[int]:
    """Offsets of the array headers that could end just before `item` (fixarray, array16, array32)."""
    if item >= 1 and buf[item - 1] in _FIXARRAY:
        yield item - 1
    if item >= 3 and buf[item - 3] == 0xDC:
        yield item - 3
    if array32 and item >= 5 and buf[item - 5] == 0xDD:
        yield item - 5
