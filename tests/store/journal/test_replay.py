"""Replay: the records it rebuilds, and their order, are those of a dict in which a record moves to the end
when it queues again or finishes — whatever mix of frames, moves, removals and repeated ids it reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.book.records import TaskRecord
from cronoq.core.shards import ShardedMap
from cronoq.store.journal import replay as replay_module
from cronoq.store.journal.records import Accepted, Dispatched, Finished, Forgotten, Kept, Requeued
from cronoq.store.journal.replay import Replay, kept_to_record

ids = st.integers(0, 12).map(lambda n: f"t{n}")
frames_of_records = st.lists(
    st.one_of(
        st.tuples(st.just("accepted"), st.lists(ids, min_size=1, max_size=6), st.integers(0, 6)),
        st.tuples(st.just("dispatched"), ids),
        st.tuples(st.just("requeued"), ids),
        st.tuples(st.just("finished"), ids, st.integers(0, 8)),
        st.tuples(st.just("forgotten"), ids),
        st.tuples(st.just("kept"), ids),
    ),
    max_size=40,
)


def _frames(specs: list[tuple]) -> list[list]:
    """The frames the specs describe: an `accepted` frame holds several records (with a `seq` over 3, a
    snapshot's records, finished with that number); every other change is a frame of its own."""
    frames: list[list] = []
    for n, (kind, *args) in enumerate(specs):
        if kind == "accepted":
            names, seq = args
            if seq > 3:
                frames.append([TaskRecord(name, "p", None, 0, b"", float(n), state="succeeded",
                                          finished_at=float(n), seq=seq) for name in names])
            else:
                frames.append([Accepted(name, "p", None, 0, f"{n}".encode(), float(n)) for name in names])
        elif kind == "dispatched":
            frames.append([Dispatched(args[0], 1, float(n))])
        elif kind == "requeued":
            frames.append([Requeued(args[0], error_type=f"E{n}")])
        elif kind == "finished":
            frames.append([Finished(args[0], "succeeded", float(n), seq=args[1])])
        elif kind == "forgotten":
            frames.append([Forgotten(args[0])])
        else:
            frames.append([Kept(args[0], "p", None, 0, "queued", float(n), payload=f"k{n}".encode())])
    return frames


def _model(frames: list[list], archived_through: int) -> dict[str, tuple]:
    """What the replay must give, by a plain dict (an id written again takes its place at the end)."""
    records: dict[str, TaskRecord] = {}

    def put(record: TaskRecord) -> None:
        records.pop(record.id, None)
        records[record.id] = record

    for frame in frames:
        for change in frame:
            if isinstance(change, TaskRecord):
                if not change.seq or change.seq > archived_through:
                    put(TaskRecord(*(getattr(change, f) for f in TaskRecord.__struct_fields__)))
            elif isinstance(change, Kept):
                put(kept_to_record(change))
            elif isinstance(change, Forgotten):
                records.pop(change.id, None)
            elif change.id in records:
                record = records[change.id]
                if isinstance(change, Dispatched):
                    record.state, record.attempts = "running", change.attempt
                elif isinstance(change, Requeued):
                    record.state, record.error_type = "queued", change.error_type
                    records[change.id] = records.pop(change.id)
                elif change.seq and change.seq <= archived_through:
                    del records[change.id]
                else:
                    record.state, record.finished_at, record.seq = change.state, change.finished_at, change.seq
                    record.error_type, record.payload = change.error_type, b""
                    records[change.id] = records.pop(change.id)
    return {task_id: _fields(record) for task_id, record in records.items()}


def _fields(record: TaskRecord) -> tuple:
    return (record.id, record.state, record.payload, record.attempts, record.error_type, record.finished_at,
            record.seq, record.submitted_at)


@settings(max_examples=400, deadline=None)
@given(frames_of_records, st.sampled_from([0, 0, 5]), st.sampled_from([1, 3, 10_000]), st.sampled_from([0, 2, 4096]))
def test_a_replay_keeps_every_record_in_the_order_a_dict_would(specs, archived_through, split_at, compact_at):
    frames = _frames(specs)
    replay = Replay(archived_through)
    replay.by_id = ShardedMap(split_at=split_at)  # sharded from the first few records on, or never
    before, replay_module.COMPACT_ORDER_AT = replay_module.COMPACT_ORDER_AT, compact_at  # stale places dropped
    try:  # as the replay goes (0, 2), or only at the end
        for frame in frames:
            replay.apply_batch(frame)
    finally:
        replay_module.COMPACT_ORDER_AT = before
    ordered = replay.ordered()
    expected = _model(frames, archived_through)
    assert [_fields(record) for record in ordered] == list(expected.values())
    assert sorted(replay.by_id) == sorted(expected) and all(replay.by_id[r.id] is r for r in ordered)
    assert all(record._seq == 0 for record in ordered)  # the core numbers them afresh
    assert replay.ordered() == ordered and list(replay.records) == list(expected)


def test_a_record_that_queued_again_comes_after_those_accepted_before_its_requeue():
    replay = Replay()
    replay.apply_batch([Accepted(name, "p", None, 0) for name in ("x", "y")])
    replay.apply_batch([Requeued("x")])
    replay.apply_batch([Accepted("z", "p", None, 0)])
    assert [record.id for record in replay.ordered()] == ["y", "x", "z"]
