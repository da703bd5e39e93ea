"""Writing a snapshot in a forked child, while the broker carries on.

`os.fork()` gives the child the broker's memory as it is at that instant,
copy-on-write: the records it iterates cannot change under it, and nothing
the parent does afterwards reaches it (Redis' BGSAVE works the same way).
The parent has just started a new journal, so the snapshot describes
exactly the journals before it. The child writes `snapshot.tmp`, fsyncs it
and exits; only the parent, once it sees the child succeed, renames it over
the snapshot and deletes the older journals. A child that fails, or is
killed, changes nothing: the old snapshot and every journal since it are
still there, and a leftover `snapshot.tmp` is deleted at the next start.

The child touches nothing it shares with the parent but the file it
writes: it restores the default signal handlers (a signal meant for it must
not wake the parent's event loop), closes the data directory's lock and
journal (so only the parent holds them), dies with the parent (Linux:
PR_SET_PDEATHSIG), never runs the cyclic GC (which would write to every
object's header and copy the parent's whole heap), and leaves with
`os._exit` (no atexit handlers, no flushing of the parent's buffers).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from cronoq.store import frames

HOLD_ENV = "CRONOQ_TEST_HOLD_COMPACTION"
"""For tests only: a path. The child creates it after the snapshot's first frame, then waits while it exists,
so that a test can kill the broker (or the child) at a known point without guessing at timings."""

_PR_SET_PDEATHSIG = 1
_STATUS_BYTES = 4096


class BackgroundSnapshot:
    """A child process writing `temporary`; `poll()` says how it went."""

    def __init__(self, pid: int, status_fd: int, generation: int, temporary: Path) -> None:
        self.pid = pid
        self.generation = generation
        self.temporary = temporary
        self.started = time.monotonic()
        self.size = 0
        self.fork_seconds = 0.0  # how long fork() held the caller
        self._status_fd = status_fd

    @classmethod
    def start(cls, generation: int, temporary: Path, frames_of: Callable[[], Iterable[bytes]],
              close_in_child: Iterable[int]) -> "BackgroundSnapshot":
        """Fork a child that writes the frames `frames_of()` gives (evaluated in the child, on its copy of
        memory) to `temporary` and fsyncs it. Raises OSError when the fork fails."""
        read_end, write_end = os.pipe()
        parent = os.getpid()
        forking = time.perf_counter()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:  # the child: never returns
            _child(temporary, frames_of, [read_end, *close_in_child], write_end, parent)
        forked = time.perf_counter() - forking
        os.close(write_end)
        os.set_blocking(read_end, False)
        snapshot = cls(pid, read_end, generation, temporary)
        snapshot.fork_seconds = forked
        return snapshot

    def poll(self) -> bool:
        """True once the child has written the whole file; False while it runs. Raises OSError (with the
        child's reason) when it failed or was killed; the temporary file is then gone."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return False
        message = self._read_status()
        os.close(self._status_fd)
        self._status_fd = -1
        if os.waitstatus_to_exitcode(status) == 0 and message.startswith("ok "):
            self.size = int(message[3:])
            return True
        self.temporary.unlink(missing_ok=True)
        if os.WIFSIGNALED(status):
            raise OSError(f"the snapshot writer was killed by signal {os.WTERMSIG(status)}")
        raise OSError(message.removeprefix("error ") or f"the snapshot writer exited with status {status}")

    def cancel(self) -> None:
        """Stop the child (if it still runs) and remove what it wrote."""
        if self._status_fd < 0:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self._status_fd)
        self._status_fd = -1
        self.temporary.unlink(missing_ok=True)

    def _read_status(self) -> str:
        try:
            return os.read(self._status_fd, _STATUS_BYTES).decode(errors="replace")
        except BlockingIOError:
            return ""


def _child(temporary: Path, frames_of: Callable[[], Iterable[bytes]], close: list[int], status_fd: int,
           parent: int) -> None:
    code = 1
    try:
        gc.disable()
        _detach(close, parent)
        size = frames.write_durably(temporary, _held(frames_of()))
        os.write(status_fd, f"ok {size}".encode())
        code = 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a message
        try:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            os.write(status_fd, f"error {reason}".encode()[:_STATUS_BYTES])
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _detach(close: list[int], parent: int) -> None:
    """Let go of everything the child shares with the broker but the memory it reads."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for fd in close:
        try:
            os.close(fd)
        except OSError:
            pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the broker died before the line above took effect
        os._exit(1)


def _held(bodies: Iterable[bytes]) -> Iterator[bytes]:
    """The frames, pausing after the first one while the test hook's file exists (see HOLD_ENV)."""
    hold = os.environ.get(HOLD_ENV)
    for n, body in enumerate(bodies):
        yield body
        if n == 0 and hold:
            Path(hold).write_text(str(os.getpid()))
            while os.path.exists(hold):
                time.sleep(0.01)
