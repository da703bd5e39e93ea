"""The torn-tail rule of cronoq.store.journal.frames: a cut-short write is cut off, anything else is damage.

Files here are built frame by frame in memory and written for real; the
properties run on record batches as the journal writes them (with the
journal's resynchronisation filter) and on arbitrary bodies (trying every
offset).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.store.journal import frames
from cronoq.store.journal.frames import FrameReader
from cronoq.store.journal.records import Accepted, Dispatched, Finished, Forgotten, Paused, batch_starts, encode

ids = st.text(alphabet="0123456789abcdef", min_size=1, max_size=8)
times = st.floats(0, 2e9)
records = st.one_of(
    st.builds(Accepted, ids, st.sampled_from(["a", "llm"]), st.sampled_from([None, "acme"]), st.integers(0, 3),
              st.binary(max_size=40), times),
    st.builds(Dispatched, ids, st.integers(1, 5), times),
    st.builds(Finished, ids, st.sampled_from(["succeeded", "failed", "cancelled"]), times,
              st.none() | st.binary(max_size=20)),
    st.builds(Forgotten, ids),
    st.builds(Paused, st.text(max_size=5), st.booleans()),
)
batches = st.lists(records, min_size=1, max_size=5).map(encode)
# (strategy of bodies, the reader's candidate filter): journal batches with the journal's filter, or any bytes.
KINDS = {"batches": (batches, batch_starts), "any bytes": (st.binary(min_size=1, max_size=48), None)}
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def frame(body: bytes) -> bytes:
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def layout(bodies: list[bytes]) -> tuple[bytes, list[int]]:
    """The file holding these frames, and where each starts."""
    offsets, at = [], 0
    for body in bodies:
        offsets.append(at)
        at += frames.HEADER_SIZE + len(body)
    return b"".join(frame(body) for body in bodies), offsets


def read(path: Path, data: bytes, candidates, *, skip_damage: bool = False) -> tuple[list, FrameReader]:
    path.write_bytes(data)
    reader = FrameReader(path, candidates=candidates, skip_damage=skip_damage)
    return list(reader), reader


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_any_truncation_is_a_torn_tail_and_loses_nothing_before_the_cut(tmp_path, kind, data):
    bodies_strategy, candidates = KINDS[kind]
    bodies = data.draw(st.lists(bodies_strategy, min_size=1, max_size=6))
    whole, offsets = layout(bodies)
    cut = data.draw(st.integers(0, len(whole)), label="cut")
    zeros = data.draw(st.sampled_from([0, 0, 0, 1, 9, 300]), label="zeros")  # a power loss can leave zeros
    got, reader = read(tmp_path / "f", whole[:cut] + bytes(zeros), candidates)

    before_cut = [(o, b) for o, b in zip(offsets, bodies) if o + frames.HEADER_SIZE + len(b) <= cut]
    assert got[:len(before_cut)] == before_cut
    assert set(got) <= set(zip(offsets, bodies)), "only frames that were written come back"
    read_up_to = got[-1][0] + frames.HEADER_SIZE + len(got[-1][1]) if got else 0
    problem = reader.problem
    if problem is None:  # cut between frames (or the zeros happened to complete the last one)
        assert reader.end == read_up_to == cut + zeros
    else:
        assert problem.torn, problem
        assert problem.end == cut + zeros and reader.end == problem.start == read_up_to


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_a_flipped_bit_in_a_frame_followed_by_another_is_damage_never_dropped_silently(tmp_path, kind, data):
    bodies_strategy, candidates = KINDS[kind]
    bodies = data.draw(st.lists(bodies_strategy, min_size=2, max_size=6))
    whole, offsets = layout(bodies)
    victim = data.draw(st.integers(0, len(bodies) - 2), label="frame")
    bit = data.draw(st.integers(0, (frames.HEADER_SIZE + len(bodies[victim])) * 8 - 1), label="bit")
    damaged = bytearray(whole)
    damaged[offsets[victim] + bit // 8] ^= 1 << bit % 8

    got, reader = read(tmp_path / "f", bytes(damaged), candidates)
    assert got == list(zip(offsets, bodies))[:victim]
    problem = reader.problem
    assert problem is not None and not problem.torn
    assert (problem.start, problem.end) == (offsets[victim], offsets[victim + 1])

    # A repair reads every other frame; and the damaged one too when only its length is wrong and runs past the
    # end of the file (its checksum then finds where its body ends).
    got, reader = read(tmp_path / "f", bytes(damaged), candidates, skip_damage=True)
    others = [(o, b) for n, (o, b) in enumerate(zip(offsets, bodies)) if n != victim]
    [gap] = reader.gaps
    if gap.end == offsets[victim] + frames.HEADER_SIZE:
        assert bit < 32 and "length is damaged" in gap.what
        assert got == list(zip(offsets, bodies))
    else:
        assert got == others
        assert (gap.start, gap.end, gap.torn) == (offsets[victim], offsets[victim + 1], False)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(data=st.data())
def test_a_flipped_bit_in_the_last_frame_never_returns_it(tmp_path, kind, data):
    # A flip in the last frame can look exactly like a torn write (a length that runs past the end): it may be
    # taken for one. Either way the frame itself never comes back, and everything before it does.
    bodies_strategy, candidates = KINDS[kind]
    bodies = data.draw(st.lists(bodies_strategy, min_size=1, max_size=4))
    whole, offsets = layout(bodies)
    bit = data.draw(st.integers(0, (len(whole) - offsets[-1]) * 8 - 1))
    damaged = bytearray(whole)
    damaged[offsets[-1] + bit // 8] ^= 1 << bit % 8
    got, reader = read(tmp_path / "f", bytes(damaged), candidates)
    assert got == list(zip(offsets, bodies))[:-1]
    assert reader.problem is not None and reader.problem.start == offsets[-1]


def test_the_shapes_of_a_torn_tail(tmp_path):
    bodies = [encode([Forgotten(f"t{n}")]) for n in range(3)]
    whole, offsets = layout(bodies)
    last = whole[offsets[2]:]
    tails = {
        "header cut": whole[:offsets[2] + 5],
        "body cut": whole[:-1],
        "last checksum wrong": whole[:-1] + bytes([whole[-1] ^ 1]),
        "zeros after the last frame": whole + bytes(4096),
        "zeroed last frame": whole[:offsets[2]] + bytes(len(last)),
        "checksum wrong, then zeros": whole[:-3] + bytes(3 + 100),
    }
    for name, data in tails.items():
        got, reader = read(tmp_path / "f", data, batch_starts)
        problem = reader.problem
        assert problem is not None and problem.torn, (name, problem)
        assert [o for o, _ in got] == offsets[:len(got)] and len(got) >= 2, name


def test_what_is_damage_even_with_nothing_intact_after_it(tmp_path):
    bodies = [encode([Forgotten(f"t{n}")]) for n in range(3)]
    whole, offsets = layout(bodies)
    cases = {
        "impossible length": whole + struct.pack("<II", 0xFFFFFFFF, 0) + b"x" * 20,
        "zero length, then data": whole + bytes(8) + b"junk",
        "checksum wrong, then more bytes": whole[:-1] + bytes([whole[-1] ^ 1]) + b"more",
        "zeros, then intact frames": whole[:offsets[1]] + bytes(64) + whole[offsets[1]:],
        "bad first frame of a longer file": b"\x01" + whole[1:],
    }
    for name, data in cases.items():
        _, reader = read(tmp_path / "f", data, batch_starts)
        problem = reader.problem
        assert problem is not None and not problem.torn, (name, problem)


def test_a_payload_that_imitates_frames_does_not_turn_a_torn_tail_into_damage(tmp_path):
    # A client's payload can hold bytes that form intact frames. Inside a torn last frame they must not count as
    # "intact frames after the problem", or a crash while such a task is written would stop the broker starting.
    fake = frame(encode([Finished("someone-else", "succeeded", 0.0, b"forged")]))
    real = [encode([Forgotten("t0")]), encode([Accepted("t1", "a", None, 2, fake * 2 + b"tail" * 8, 0.0)])]
    whole, offsets = layout(real)
    for cut in range(offsets[1] + 1, len(whole)):
        _, reader = read(tmp_path / "f", whole[:cut], batch_starts)
        assert reader.problem is not None and reader.problem.torn and reader.problem.start == offsets[1], cut


def test_resynchronising_gives_up_past_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "RESYNC_WORK", 0)
    monkeypatch.setattr(frames, "RESYNC_MIN_WORK", 100)
    bodies = [b"abc", b"defg", b"hij"]
    whole, offsets = layout(bodies)
    # A damaged frame whose bytes each read as the header of a 1-byte frame: 1 byte to checksum per offset,
    # before the intact last frame.
    damaged = whole[:offsets[1]] + struct.pack("<II", 4 * 200, 0) + struct.pack("<I", 1) * 200 + whole[offsets[2]:]
    got, reader = read(tmp_path / "f", damaged, None, skip_damage=True)
    assert [b for _, b in got] == bodies[:1]
    [gap] = reader.gaps
    assert (gap.start, gap.end, gap.torn) == (offsets[1], len(damaged), False)
    assert "gave up looking for intact frames" in gap.what
    monkeypatch.setattr(frames, "RESYNC_MIN_WORK", 64 << 20)
    got, reader = read(tmp_path / "f", damaged, None, skip_damage=True)
    assert [b for _, b in got] == [b"abc", b"hij"]


@settings(max_examples=300, deadline=None)
@given(batch=batches, before=st.binary(max_size=30), after=st.binary(max_size=30), start=st.integers(0, 40))
def test_the_resync_filter_names_every_batch_start_in_order(batch, before, after, start):
    blob = before + batch + after
    found = list(batch_starts(blob, start))
    assert found == sorted(found) and all(offset >= start for offset in found)
    if len(before) >= start:
        assert len(before) in found
