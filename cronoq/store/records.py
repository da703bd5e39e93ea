"""What the journal and the snapshot hold: one tagged msgspec struct per kind of change.

A journal frame holds the changes of one group commit as a msgpack array of
these records; a snapshot holds one `Kept` per task record plus `Paused`
pools. Each record is an array `[tag, field, ...]` so the common ones cost
a few dozen bytes; trailing fields left at their default are omitted.
Times are Unix seconds, as in the task book.

Changing a record's fields means a new `FORMAT`: a broker refuses files of a
format it does not know instead of guessing.
"""

from __future__ import annotations

from typing import Union

import msgspec

FORMAT = 1
"""Version of the on-disk format, in every file's header."""


class _Record(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    pass


class Header(_Record, tag="cronoq"):
    """First frame of every file: what it is, its format and its generation."""

    kind: str  # "journal" or "snapshot"
    format: int
    generation: int


class Accepted(_Record, tag="a"):
    """A task was accepted: everything needed to queue it again."""

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


class Finished(_Record, tag="f"):
    """A task reached a terminal state (succeeded, failed, cancelled, expired)."""

    id: str
    state: str
    finished_at: float
    result: Union[bytes, None] = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


class Forgotten(_Record, tag="x"):
    """A finished task's record passed result_ttl and was dropped."""

    id: str


class Paused(_Record, tag="p"):
    """A pool was paused (or resumed)."""

    pool: str
    paused: bool


class Kept(_Record, tag="k"):
    """A whole task record, as a snapshot holds it."""

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


Change = Union[Accepted, Dispatched, Requeued, Finished, Forgotten, Paused]
Record = Union[Header, Accepted, Dispatched, Requeued, Finished, Forgotten, Paused, Kept, End]

encode = msgspec.msgpack.Encoder().encode
_decoder = msgspec.msgpack.Decoder(list[Record])


def decode_batch(body: bytes) -> list[Record]:
    """The records of one frame. Raises msgspec.DecodeError on a body this format cannot read."""
    return _decoder.decode(body)
