"""Which idempotency keys and submission ids the results store may hold, answered from memory.

Every submit that carries a submission id (every one the client library
sends) or a key must be checked against the retained tasks, most of which
are only in the results store: asking SQLite each time would cost the
broker several microseconds per task. A Bloom filter answers "certainly
not there" from a bit array of 32 bits per stored task instead; the store
is asked only when it says "maybe" (about 1 time in 300 when it is as full
as it gets).

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
from typing import Iterable

import msgspec

HASHES = 3
"""Bits per scope (`ScopeFilter.add_all` is unrolled for three)."""
BITS_PER_TASK = 32
"""Each task has one or two scopes (submission id, key): 16 or more bits each, about 0.5% false "maybe"s."""
MIN_LOG2 = 20
"""The smallest filter: 2**20 bits (128 KiB), room for 32,768 tasks."""

_encode = msgspec.msgpack.encode
_MASK64 = (1 << 64) - 1


def submission_scope(tenant: str | None, submission: str) -> int:
    return _hash(("s", tenant, submission))


def key_scope(pool: str, tenant: str | None, key: str) -> int:
    return _hash(("k", pool, tenant, key))


def _hash(scope: tuple) -> int:
    return int.from_bytes(hashlib.blake2b(_encode(scope), digest_size=8).digest(), "little")


def log2_for(tasks: int) -> int:
    """The size (log2 of its bits) of a filter with room for about `tasks` tasks."""
    return max(MIN_LOG2, math.ceil(math.log2(max(tasks, 1) * BITS_PER_TASK)))


class ScopeFilter:
    """A Bloom filter over `bits` (a writable or read-only buffer of 2**log2 bits)."""

    def __init__(self, bits: bytearray | memoryview, log2: int) -> None:
        self.bits = bits
        self.log2 = log2
        self._mask = (1 << log2) - 1

    @property
    def capacity(self) -> int:
        """How many tasks it holds with its intended false-positive rate."""
        return (1 << self.log2) // BITS_PER_TASK

    def might_hold(self, scope: int) -> bool:
        """False when `scope` was certainly never added."""
        bits, mask = self.bits, self._mask
        step = (scope >> 32) | 1
        at = scope
        for _ in range(HASHES):
            position = at & mask
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
            at += step
        return True

    def add(self, scope: int) -> None:
        bits, mask = self.bits, self._mask
        step = (scope >> 32) | 1
        at = scope
        for _ in range(HASHES):
            position = at & mask
            bits[position >> 3] |= 1 << (position & 7)
            at += step

    def add_all(self, scopes: Iterable[int]) -> None:
        """Add many scopes (unsigned, or signed as SQLite stores them: the same bits): `add`, unrolled."""
        bits, mask = self.bits, self._mask
        for scope in scopes:
            scope &= _MASK64  # a signed one as unsigned: the step is taken from its upper half
            step = (scope >> 32) | 1
            position = scope & mask
            bits[position >> 3] |= 1 << (position & 7)
            position = (scope + step) & mask
            bits[position >> 3] |= 1 << (position & 7)
            position = (scope + 2 * step) & mask
            bits[position >> 3] |= 1 << (position & 7)
