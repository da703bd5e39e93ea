"""Fencing: a broker that no longer holds its data_dir's lock stops, and one of an older generation writes nothing.

Real broker processes on 127.0.0.1; the lock is taken away under them as an operator's mistake or a storage
failure would (the file removed, replaced and locked by another process, a later generation recorded by
another broker's start), and a real client asks them for things afterwards.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

import cronoq
from cronoq.store.journal.fence import FENCE, advance, read_generation
from cronoq.store.journal.reading import LOCK, journal_generations, journal_path
from tests.support import BrokerProcess, write_config

STOP_WITHIN = 15.0
"""Seconds a test waits for the broker to stop (it checks twice a second; the bound allows a loaded machine)."""


def serving(tmp_path: Path) -> tuple[BrokerProcess, Path]:
    config = write_config(tmp_path / "cronoq.toml", '[[pools]]\nname = "default"\n')
    broker = BrokerProcess(config, args=["--log-level", "INFO"]).start()
    return broker, tmp_path / "cronoq-data"


def journal_bytes(data_dir: Path) -> int:
    return sum(journal_path(data_dir, g).stat().st_size for g in journal_generations(data_dir))


@pytest.fixture
def brokers():
    started: list[BrokerProcess] = []
    yield started
    for broker in started:
        broker.kill()


async def submitted(broker: BrokerProcess) -> None:
    async with cronoq.connect(broker.clients, request_timeout=10) as client:
        await client.submit({"n": 1})


def test_each_start_records_a_later_generation(brokers, tmp_path):
    broker, data_dir = serving(tmp_path)
    brokers.append(broker)
    assert read_generation(data_dir) == 1
    assert broker.stop() == 0
    broker.start()
    assert read_generation(data_dir) == 2


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_a_broker_whose_lock_is_taken_away_stops_serving_and_says_why(brokers, tmp_path, how):
    broker, data_dir = serving(tmp_path)
    brokers.append(broker)
    await submitted(broker)
    lock = data_dir / LOCK
    lock.unlink()
    other = None
    if how == "replaced":
        # Another process makes a new lock file and takes its flock, as a second broker started by mistake would.
        other = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert broker.proc.wait(STOP_WITHIN) == 1, "it stops by itself once the lock is no longer its own"
    finally:
        if other is not None:
            os.close(other)
    log = broker.log.read_text()
    assert f"no longer holds data_dir {data_dir}: its lock file {lock} was {how}" in log
    assert "stops accepting and dispatching" in log and "Traceback" not in log


async def test_a_broker_of_an_older_generation_refuses_to_write(brokers, tmp_path):
    broker, data_dir = serving(tmp_path)
    brokers.append(broker)
    await submitted(broker)
    before = journal_bytes(data_dir)
    # Another broker's start (a standby whose storage let it take the lock) records the next generation.
    newer = advance(data_dir)
    assert newer.generation == 2
    with pytest.raises(cronoq.CronoqError):
        await submitted(broker)  # not accepted: accepting means writing it to the journal first
    assert broker.proc.wait(STOP_WITHIN) == 1
    assert journal_bytes(data_dir) == before, "nothing was written after the later generation was recorded"
    log = broker.log.read_text()
    assert "was taken over by another broker (generation 2 was recorded since; this broker holds generation 1)" in log
    assert (data_dir / FENCE).read_text().startswith("2 ")
