"""cronoq.store.journal.reading.wait_for_lock: how a standby takes data_dir's lock (real flocks, no broker)."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from cronoq.store.journal.reading import LOCK, lock, wait_for_lock

INTERVAL = 0.01


def waiting(data_dir: Path) -> tuple[threading.Thread, list, threading.Event]:
    """wait_for_lock in a thread; its result lands in the list, the event stops it."""
    stop, out = threading.Event(), []
    thread = threading.Thread(target=lambda: out.append(wait_for_lock(data_dir, stop.is_set, INTERVAL)))
    thread.start()
    return thread, out, stop


def held_by_us(fd: int) -> bool:
    """Whether `fd` holds its file's flock: another open of the file cannot take it."""
    other = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(other)
    return False


def test_the_lock_is_taken_once_its_holder_lets_go(tmp_path):
    primary, _ = lock(tmp_path)
    thread, out, stop = waiting(tmp_path)
    thread.join(0.2)
    assert thread.is_alive(), "waits while the lock is held"
    os.close(primary)
    thread.join(10)
    assert not thread.is_alive() and out[0] is not None and held_by_us(out[0])
    os.close(out[0])


def test_a_missing_data_dir_or_lock_file_is_waited_for_never_created(tmp_path):
    data_dir = tmp_path / "data"
    thread, out, stop = waiting(data_dir)
    thread.join(0.2)
    assert thread.is_alive() and not data_dir.exists()
    data_dir.mkdir()
    thread.join(0.1)
    assert thread.is_alive() and not (data_dir / LOCK).exists()
    stop.set()
    thread.join(10)
    assert out == [None]


def test_a_lock_file_replaced_while_waiting_is_the_one_taken(tmp_path):
    primary, _ = lock(tmp_path)
    thread, out, stop = waiting(tmp_path)
    thread.join(0.1)
    (tmp_path / LOCK).unlink()  # the holder lets go of a file it removed; a new one takes its place
    os.close(primary)
    replacement, _ = lock(tmp_path)
    thread.join(0.3)
    assert thread.is_alive(), "the old file's free lock is no lock at all: the new file's is held"
    os.close(replacement)
    thread.join(10)
    taken = out[0]
    assert taken is not None
    assert os.fstat(taken).st_ino == os.stat(tmp_path / LOCK).st_ino
    os.close(taken)


def test_a_free_lock_is_not_taken_while_the_standby_is_not_ready_to_serve(tmp_path):
    primary, _ = lock(tmp_path)
    os.close(primary)  # free, but the standby cannot hold its addresses yet
    ready, pauses = threading.Event(), []
    stop, out = threading.Event(), []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        stop.wait(seconds)

    thread = threading.Thread(target=lambda: out.append(
        wait_for_lock(tmp_path, stop.is_set, INTERVAL, pause=pause, ready=ready.is_set)))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and pauses, "waits (through `pause`) while not ready"
    ready.set()
    thread.join(10)
    assert not thread.is_alive() and out[0] is not None and held_by_us(out[0])
    os.close(out[0])
