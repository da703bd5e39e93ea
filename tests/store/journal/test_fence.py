"""cronoq.store.journal.fence and cronoq.broker.held on real files and sockets, without a broker."""

from __future__ import annotations

import errno
import fcntl
import os
import socket

import pytest

from cronoq.broker.held import HeldAddresses
from cronoq.store.journal.fence import FENCE, Fenced, advance, lost, read_generation
from cronoq.store.journal.reading import LOCK, lock
from tests.support import free_port


def test_each_advance_records_the_next_generation_and_fences_the_one_before(tmp_path):
    assert read_generation(tmp_path) == 0
    first = advance(tmp_path)
    first.check()  # ours: no error
    second = advance(tmp_path)
    assert (first.generation, second.generation, read_generation(tmp_path)) == (1, 2, 2)
    second.check()
    with pytest.raises(Fenced, match="generation 2 was recorded since; this broker holds generation 1"):
        first.check()
    (tmp_path / FENCE).unlink()
    with pytest.raises(Fenced, match="its fence file is gone"):
        second.check()


def test_a_lock_is_lost_when_its_file_goes_is_replaced_or_its_flock_is_gone(tmp_path):
    fd, _ = lock(tmp_path)
    assert lost(tmp_path, fd) is None
    (tmp_path / LOCK).unlink()
    assert "was removed" in lost(tmp_path, fd)
    other, _ = lock(tmp_path)  # a new file, locked by someone else
    assert "was replaced by another file" in lost(tmp_path, fd)
    os.close(other)
    os.close(fd)
    # The same file, but our flock gone (as an NFS server's lost lock state would leave it).
    fd, _ = lock(tmp_path)
    fcntl.flock(fd, fcntl.LOCK_UN)
    assert "is no longer held" in lost(tmp_path, fd)
    os.close(fd)


def test_held_addresses_cannot_be_bound_by_others_and_answer_nothing(tmp_path):
    tcp = f"tcp://127.0.0.1:{free_port()}"
    ipc = f"ipc://{tmp_path / 'broker.sock'}"
    held = HeldAddresses()
    assert held.hold([tcp, ipc, "inproc://here"]) == []
    try:
        with pytest.raises(OSError) as taken:
            socket.create_server(("127.0.0.1", int(tcp.rpartition(":")[2])))
        assert taken.value.errno == errno.EADDRINUSE
        conn = socket.create_connection(("127.0.0.1", int(tcp.rpartition(":")[2])), timeout=5)
        conn.sendall(b"\xff" + bytes(8) + b"\x7f\x03")
        held.pause(0.2)  # accepts it and reads the greeting, answering nothing
        conn.settimeout(0.2)
        with pytest.raises(TimeoutError):
            conn.recv(16)
        conn.close()
        fds = held.hand_over()
        assert set(fds) == {tcp, ipc}
        for fd in fds.values():
            os.close(fd)
    finally:
        held.close()


def test_an_address_taken_by_another_process_is_reported_and_held_once_free(tmp_path):
    port = free_port()
    squatter = socket.create_server(("127.0.0.1", port))
    held = HeldAddresses()
    try:
        problems = held.hold([f"tcp://127.0.0.1:{port}"])
        assert problems == [f"cannot hold tcp://127.0.0.1:{port}: another process has bound it"]
        squatter.close()
        assert held.hold([f"tcp://127.0.0.1:{port}"]) == []
    finally:
        squatter.close()
        held.close()


def test_an_address_only_zeromq_can_resolve_is_left_to_the_takeover_not_reported_as_taken():
    held = HeldAddresses()
    try:
        assert held.hold(["tcp://no-such-interface-h6:5555"]) == []
        assert "does not resolve here" in held.unholdable["tcp://no-such-interface-h6:5555"]
        assert held.hand_over() == {}
    finally:
        held.close()
