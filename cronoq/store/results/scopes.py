"""Which idempotency keys and submission ids the results store may hold, answered from memory.

Every submit that carries a submission id (every one the client library
sends) or a key must be checked against the retained tasks, most of which
are only in the results store: asking SQLite each time would cost the
broker several microseconds per task. A Bloom filter answers "certainly
not there" from a bit array of 32 bits per stored task instead; the store
is asked only when it says "maybe": when it is as full as it gets, about 1
time in 1,200 for tasks with a submission id only, 1 in 200 for tasks with
a key as well.

The filter is blocked: a scope's four bits all lie in one 64-bit word, the
word chosen by the hash's low bits, the bits by four 6-bit slices of its
high ones. Setting or testing a scope is then one read (and one write) of
a word instead of three scattered bytes: 0.4 µs a scope instead of 0.65 in
the archiver, which sets the bits of every stored task. Four bits in a
word miss as rarely as three spread over the whole array (0.5 % at 16 bits
a scope, 0.08 % at 32; three in a word would miss 0.8 % and 0.17 %). The
bits are never stored: each archiver builds its filter anew from the
store's hashes, and the broker reads it with the same code.

The archiver process keeps the filter in shared memory: it sets a stored
task's bits before it tells the broker the task is stored, and rebuilds the
filter when retention has dropped many tasks (a Bloom filter cannot forget)
or the store outgrew it. Both processes must hash a scope to the same bits,
so the hash is BLAKE2b of the scope's msgpack encoding (Python's own `hash`
is salted per process).
"""

from __future__ import annotations

import hashlib
import math
import mmap
from typing import Iterable

import msgspec

HASHES = 4
"""Bits per scope, all in one 64-bit word (`ScopeFilter` is unrolled for four)."""
BITS_PER_TASK = 32
"""Each task has one or two scopes (submission id, key): 16 or more bits each, about 0.5% false "maybe"s."""
MIN_LOG2 = 20
"""The smallest filter: 2**20 bits (128 KiB), room for 32,768 tasks."""
MAX_LOG2 = 46
"""The largest: a word's number takes the hash's low bits, which must stay below the slices the bits come from
(bit 40 up)."""

_encode = msgspec.msgpack.encode


def submission_scope(tenant: str | None, submission: str) -> int:
    return _hash(("s", tenant, submission))


def key_scope(pool: str, tenant: str | None, key: str) -> int:
    return _hash(("k", pool, tenant, key))


def _hash(scope: tuple) -> int:
    return int.from_bytes(hashlib.blake2b(_encode(scope), digest_size=8).digest(), "little")


def log2_for(tasks: int) -> int:
    """The size (log2 of its bits) of a filter with room for about `tasks` tasks."""
    return min(MAX_LOG2, max(MIN_LOG2, math.ceil(math.log2(max(tasks, 1) * BITS_PER_TASK))))


def word_bits(scope: int) -> int:
    """The HASHES bits `scope` sets in its word: four 6-bit slices of its high bits, from bit 40 up."""
    return (1 << (scope >> 40 & 63)) | (1 << (scope >> 46 & 63)) | (1 << (scope >> 52 & 63)) | (1 << (scope >> 58 & 63))


class ScopeFilter:
    """A blocked Bloom filter over `bits` (a writable or read-only buffer of 2**log2 bits, 8-byte aligned: a
    bytearray, or shared memory), read as native 64-bit words.

    A scope (unsigned, or signed as SQLite stores it: the same bits, since Python's shifts and masks of a
    negative int act on its two's complement) goes to word `scope & (words - 1)` and sets bits
    `scope >> 40 & 63`, `>> 46`, `>> 52` and `>> 58` in it. `release` lets go of the view of `bits` (before
    shared memory is unmapped).
    """

    def __init__(self, bits: bytearray | memoryview | mmap.mmap, log2: int) -> None:
        if not 6 <= log2 <= MAX_LOG2:
            raise ValueError(f"a scope filter of 2**{log2} bits is out of range")
        self.bits = bits
        self.log2 = log2
        self._words = memoryview(bits).cast("B").cast("Q")
        self._mask = (1 << (log2 - 6)) - 1

    @property
    def capacity(self) -> int:
        """How many tasks it holds with its intended false-positive rate."""
        return (1 << self.log2) // BITS_PER_TASK

    def might_hold(self, scope: int) -> bool:
        """False when `scope` was certainly never added."""
        need = word_bits(scope)
        return self._words[scope & self._mask] & need == need

    def add(self, scope: int) -> None:
        self.add_all((scope,))

    def add_all(self, scopes: Iterable[int | None]) -> None:
        """Add many scopes, skipping None (a task without that scope)."""
        words, mask = self._words, self._mask
        for scope in scopes:
            if scope is not None:
                words[scope & mask] |= word_bits(scope)

    def release(self) -> None:
        """Let go of the view of `bits` (the filter is unusable after)."""
        self._words.release()
