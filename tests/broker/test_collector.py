"""The broker's garbage-collector policy, on this very interpreter (it is process-wide state)."""

from __future__ import annotations

import gc

from cronoq.broker.collector import (NEVER, QUIET_COLLECTION_INTERVAL, QUIET_COLLECTION_RECORDS,
                                     YOUNG_COLLECTION_WORK, CollectorPolicy)


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_full_collections_wait_for_quiet_points_and_every_pause_is_timed():
    pauses: list[tuple[int, float]] = []
    policy = CollectorPolicy(lambda generation, seconds: pauses.append((generation, seconds)))
    before = gc.get_threshold()
    policy.start()
    try:
        assert gc.get_threshold() == (before[0], before[1], NEVER), "no automatic full collection"
        assert gc.get_freeze_count() > 0, "what start-up made is out of every collection's way"
        gc.collect(0)
        assert pauses and pauses[-1][0] == 0 and pauses[-1][1] >= 0
        kept = [[n] for n in range(1000)]  # new objects that stay, as a drain's records do
        frozen, count = gc.get_freeze_count(), len(pauses)
        policy.worked(YOUNG_COLLECTION_WORK - 1)
        assert len(pauses) == count, "not yet due"
        policy.worked(1)
        assert pauses[-1][0] == 1, "the young generations, collected"
        assert gc.get_freeze_count() >= frozen + len(kept), "and what survived them is out of every later walk"
        Cycle()  # garbage only a collection can reclaim
        assert not policy.quiet(now=1000.0, records=QUIET_COLLECTION_RECORDS + 1), "too large to walk now"
        assert policy.quiet(now=1000.0, records=10)
        assert pauses[-1][0] == 2
        assert not policy.quiet(now=1000.0 + QUIET_COLLECTION_INTERVAL / 2, records=10), "not again so soon"
    finally:
        policy.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before
    count = len(pauses)
    gc.collect(0)
    assert len(pauses) == count, "stopped: no longer timing"
