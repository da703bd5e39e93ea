"""Repairing a damaged data_dir (`cronoq-broker --repair`): a copy first, every intact frame back, losses named.

Real journals and snapshots written by a real TaskBook, damaged by flipping
bits in their files, repaired by `cronoq.store.journal.repair.repair` and opened
again by `Journal.open`, as the broker does.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from cronoq.book.submission import SubmitRequest
from cronoq.store.journal import frames
from cronoq.store.journal import journal as journal_module
from cronoq.store.journal import snapshot as snapshot_module
from cronoq.store.journal.journal import SNAPSHOT, DamagedFile, Journal, journal_path
from cronoq.store.journal.records import decode_batch
from cronoq.store.journal.repair import repair
from cronoq.store.journal.replay import Replay, snapshot_record
from tests.store.journal.test_journal import World, _journal_files, random_workload


def _files(data_dir: Path) -> dict[str, bytes]:
    """Every file of data_dir but the fence, where each start records its generation (cronoq.store.journal.fence)."""
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir()) if p.is_file() and p.name != "fence"}


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x08
    path.write_bytes(bytes(data))


def _replay_without(paths: list[Path], lost: dict[Path, set[int]]) -> Replay:
    """What replaying these files gives when the frames numbered in `lost` are gone."""
    replay = Replay()
    for path in paths:
        for n, (_, body) in enumerate(frames.FrameReader(path)):
            if n not in lost.get(path, set()):
                for record in decode_batch(body):
                    replay.apply(record)
    return replay


def _state(replay: Replay) -> tuple[list, set[str]]:
    return [snapshot_record(r) for r in replay.records.values()], replay.paused


def _repair(data_dir: Path) -> tuple[int, str]:
    out = io.StringIO()
    status = repair(data_dir, out)
    return status, out.getvalue()


def _workload_with_orphans(data_dir: Path) -> tuple[Path, list[int], list[int], Replay]:
    """A journal from a random workload in which losing the victim frames leaves records naming tasks whose
    `accepted` was lost (the first seed that does, so the case stays whatever the workload's details)."""
    for seed in range(11, 111):
        for leftover in data_dir.iterdir():
            leftover.unlink()
        world = World(data_dir)
        random_workload(world, random.Random(seed), 400)
        world.journal.commit()
        world.crash()
        path = journal_path(data_dir, 1)
        offsets = [offset for offset, _ in frames.FrameReader(path)]
        victims = [0, len(offsets) // 3, len(offsets) // 2]  # the header frame and two commits
        expected = _replay_without([path], {path: set(victims)})
        if expected.orphan_ids:
            return path, offsets, victims, expected
    raise AssertionError("no workload made a lost accept visible through a later change")


def test_a_damaged_journal_is_repaired_from_every_intact_frame_with_a_copy_kept(tmp_path):
    path, offsets, victims, expected = _workload_with_orphans(tmp_path)
    original_frames = path.read_bytes()
    for n in victims:
        _flip(path, offsets[n] + frames.HEADER_SIZE + 1)
    damaged = _files(tmp_path)
    with pytest.raises(DamagedFile, match=f"is damaged at offset {offsets[0]}: "):
        Journal.open(tmp_path)

    status, report = _repair(tmp_path)
    assert status == 0, report
    [copy] = tmp_path.glob("damaged-*")
    assert {name: data for name, data in _files(copy).items() if name != "repair-report.txt"} == \
        {name: data for name, data in damaged.items() if name != "lock"}
    assert _files(copy)["journal.00000001"] != original_frames
    for n in victims:
        assert f"skipped bytes {offsets[n]} to {offsets[n + 1]} " in report
    assert f"journal.00000001: {len(offsets) - 3} intact frames" in report
    shown = report.split("(the payload is gone): ")[1].splitlines()[0]
    assert set(shown.split(", ")) == expected.orphan_ids
    assert "wrote a snapshot of" in report and "the broker can start" in report
    assert _journal_files(tmp_path) == sorted(["lock", SNAPSHOT, "journal.00000002", copy.name])

    journal, replay = Journal.open(tmp_path)
    assert _state(replay) == _state(expected)
    journal.close()
    status, again = _repair(tmp_path)
    assert status == 0 and "is healthy: nothing to repair, nothing changed" in again


def test_a_damaged_snapshot_is_repaired_and_the_report_counts_what_it_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_module, "SNAPSHOT_FRAME_RECORDS", 5)
    world = World(tmp_path)
    for n in range(40):
        world.book.submit(SubmitRequest(bytes([n]), pool="a"), world.now)
    world.book.pause("b")
    world.journal.commit()
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    later, _ = world.book.submit(SubmitRequest(b"after", pool="a"), world.now)
    world.journal.commit()
    world.crash()
    snapshot, journal2 = tmp_path / SNAPSHOT, journal_path(tmp_path, 2)
    offsets = [offset for offset, _ in frames.FrameReader(snapshot)]
    expected = _replay_without([snapshot, journal2], {snapshot: {3}})
    _flip(snapshot, offsets[3] + frames.HEADER_SIZE + 2)
    with pytest.raises(DamagedFile, match=f"snapshot is damaged at offset {offsets[3]}: .* intact frames follow at "
                                          f"offset {offsets[4]}; refusing to start"):
        Journal.open(tmp_path)

    status, report = _repair(tmp_path)
    assert status == 0, report
    assert "snapshot: generation 2; " in report and "its end record counts 41 records: 5 lost" in report
    assert "lost: no task is known by id to be lost" in report
    journal, replay = Journal.open(tmp_path)
    assert _state(replay) == _state(expected) and later.id in replay.records and replay.paused == {"b"}
    assert len(replay.records) == 40 - 5 + 1 and journal.generation == 3
    journal.close()


def test_a_healthy_data_dir_or_a_torn_tail_is_left_as_it_is(tmp_path):
    world = World(tmp_path)
    world.book.submit(SubmitRequest(b"x", pool="a"), world.now)
    world.journal.commit()
    world.crash()
    path = journal_path(tmp_path, 1)
    path.write_bytes(path.read_bytes()[:-3])  # the last write torn
    before = _files(tmp_path)
    status, report = _repair(tmp_path)
    assert status == 0
    assert report.startswith(f"{tmp_path} is healthy: nothing to repair, nothing changed\n")
    assert "a torn tail at offset" in report and "which a start cuts off anyway" in report
    assert _files(tmp_path) == before and not list(tmp_path.glob("damaged-*"))


def test_nothing_readable_changes_nothing_and_fails(tmp_path):
    world = World(tmp_path)
    world.crash()
    path = journal_path(tmp_path, 1)
    path.write_bytes(b"\xff" * 200)
    before = _files(tmp_path)
    status, report = _repair(tmp_path)
    assert status == 1
    assert "no record could be read" in report and "nothing was changed" in report
    assert _files(tmp_path) == before and not list(tmp_path.glob("damaged-*"))


def test_a_missing_data_dir_has_nothing_to_repair(tmp_path):
    status, report = _repair(tmp_path / "nowhere")
    assert status == 0 and "nothing to repair" in report
    assert not (tmp_path / "nowhere").exists()


def test_a_data_dir_in_use_is_not_repaired(tmp_path):
    world = World(tmp_path)
    with pytest.raises(journal_module.StoreError, match=r"is in use by another broker \(pid \d+\): stop it before"):
        _repair(tmp_path)
    world.journal.close()


def test_a_snapshot_whose_header_is_lost_is_repaired_with_every_journal_replayed_after_it(tmp_path):
    world = World(tmp_path, compact_min_bytes=1, compact_ratio=0)
    tasks = [world.book.submit(SubmitRequest(bytes([n]), pool="a"), world.now)[0] for n in range(5)]
    world.journal.commit()
    world.journal.compact(world.book.kept(), world.book.paused_pools())
    world.book.cancel(tasks[0].id, world.now)
    world.journal.commit()
    world.crash()
    _flip(tmp_path / SNAPSHOT, frames.HEADER_SIZE + 3)
    with pytest.raises(DamagedFile, match="snapshot is damaged at offset 0: "):
        Journal.open(tmp_path)
    status, report = _repair(tmp_path)
    assert status == 0, report
    assert "snapshot: its header frame is lost; 2 intact frames, 5 records" in report
    assert "every journal was replayed after it" in report
    journal, replay = Journal.open(tmp_path)
    assert [r.state for r in replay.records.values()] == ["queued"] * 4 + ["cancelled"]
    assert journal.generation == 3
    journal.close()
