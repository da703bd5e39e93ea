"""Writing a snapshot in another process, while the broker carries on: a forked child, or one that reads the files.

The broker has just started journal g+1: the snapshot (generation g+1) must
hold exactly the state the snapshot and the journals before g+1 describe.
Two ways to write it off the loop:

- **Fork** (`BackgroundSnapshot.fork`): `os.fork()` gives the child the
  broker's memory as it is at that instant, copy-on-write: the records it
  iterates cannot change under it, and nothing the parent does afterwards
  reaches it (Redis' BGSAVE works the same way). Walking memory is cheap,
  but the fork itself copies the page tables of the broker's whole memory
  on its loop, and while the child lives every page the loop writes to is
  copied first (about 4 µs a page on a 2-core VM). With 10^6 queued tasks
  (300–800 MiB) the fork took 11–25 ms, 50 ms on a loaded machine, and a
  drain of them stalled another pool's one-at-a-time client for up to
  126 ms.
- **From the files** (`BackgroundSnapshot.read_back`): the files before
  g+1 no longer change, so a process started afresh (vfork and exec: about
  a millisecond, whatever the broker holds) reads them back as
  a broker starting up would (cronoq.store.journal.replay, leaving out the finished
  tasks the results store holds) and writes what it read. The broker has
  it started by its housekeeping thread (`BackgroundSnapshot.read_back_in`):
  vfork waits for the new process to exec, and on a busy machine that
  waited for a core, up to 25 ms, which the loop no longer does. Nothing is
  shared with the broker, but reading back costs CPU in proportion to the
  journal (about 0.6 s per 32 MiB), where a fork's child costs in
  proportion to what is in memory: a broker at full rate with little
  queued compacts every 4–5 s, and reading back each time would take an
  eighth of a core for what a forked child does in milliseconds.

So the broker forks while it is small (`FORK_MAX_RSS`), when both the fork
and the pages it copies cost little, and reads back from the files when it
is big. Either way the child writes `snapshot.tmp`, fsyncs it and exits;
only the broker, once it sees the child succeed, renames it over the
snapshot and deletes the older journals. A child that fails, or is killed,
changes nothing: the old snapshot and every journal since it are still
there, and a leftover `snapshot.tmp` is deleted at the next start.

A child touches nothing it shares with the broker but the file it writes:
it restores the default signal handlers or ignores SIGINT (a signal meant
for the broker must not reach it), holds neither the data directory's lock
nor the journal, dies with the broker (Linux: PR_SET_PDEATHSIG, which fires
when the *thread* that started the child ends: whatever starts one must live
as long as the broker), never runs
the cyclic GC (in a forked child it would write to every object's header
and copy the parent's whole heap), and reports "ok SIZE" or "error REASON"
on a pipe. A forked child leaves with `os._exit` (no atexit handlers, no
flushing of the parent's buffers).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from cronoq.store.journal import frames
from cronoq.store.journal.reading import SNAPSHOT, read_before
from cronoq.store.journal.snapshot import snapshot_frames
from cronoq.store.lifeline import bind_to_parent, helper_environment

log = logging.getLogger("cronoq.store")

HOLD_ENV = "CRONOQ_TEST_HOLD_COMPACTION"
"""For tests only: a path. The child creates it after the snapshot's first frame, then waits while it exists,
so that a test can kill the broker (or the child) at a known point without guessing at timings."""

FORK_MAX_RSS = 256 << 20
"""A broker holding more memory than this (resident) has its snapshot written from the files instead of by a
forked child: a fork at this size holds the loop for about 3–6 ms, and at 800 MiB for 11–25 ms."""
NICENESS = 10
"""How much lower the reading-back child's priority is than the broker's: on a busy host it yields the CPU to
the broker, its workers and clients (a niceness of 10 weighs a tenth of theirs), and still gets on with it."""

_STATUS_BYTES = 4096


class BackgroundSnapshot:
    """A child process writing `temporary`; `poll()` says how it went."""

    def __init__(self, pid: int, status_fd: int, generation: int, temporary: Path, *, forked: bool,
                 process: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self.generation = generation
        self.temporary = temporary
        self.forked = forked
        """True: a forked child walks the broker's memory; False: a process reads the files back."""
        self.started = time.monotonic()
        self.start_seconds = 0.0
        """How long starting the child held the caller (the broker's loop): the fork, the process's start, or
        with `read_back_in` only handing the start to the other thread."""
        self.spawn_seconds = 0.0
        """How long the process's start took, in whichever thread started it."""
        self.size = 0
        self._status_fd = status_fd
        self._process = process
        self._starting: concurrent.futures.Future[BackgroundSnapshot] | None = None
        """`read_back_in`: the other thread's start, until `poll` or `cancel` takes over the process it started."""

    @classmethod
    def fork(cls, generation: int, temporary: Path, frames_of: Callable[[], Iterable[bytes]],
             close_in_child: Iterable[int]) -> "BackgroundSnapshot":
        """Fork a child that writes the frames `frames_of()` gives (evaluated in the child, on its copy of
        memory) to `temporary` and fsyncs it. Raises OSError when the fork fails."""
        read_end, write_end = os.pipe()
        parent = os.getpid()
        starting = time.perf_counter()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:  # the child: never returns
            _forked_child(temporary, frames_of, [read_end, *close_in_child], write_end, parent)
        took = time.perf_counter() - starting
        os.close(write_end)
        os.set_blocking(read_end, False)
        snapshot = cls(pid, read_end, generation, temporary, forked=True)
        snapshot.start_seconds = took
        return snapshot

    @classmethod
    def read_back(cls, data_dir: Path, generation: int, archived_through: int) -> "BackgroundSnapshot":
        """Start a process that writes the snapshot of `generation` to `snapshot.tmp` from the snapshot and the
        journals before `generation` in `data_dir`, leaving out the finished tasks numbered up to
        `archived_through`. Raises OSError when it cannot be started."""
        read_end, write_end = os.pipe()
        env = helper_environment()
        starting = time.perf_counter()
        try:
            # No preexec_fn: subprocess then uses vfork, which copies none of the broker's page tables.
            process = subprocess.Popen(
                [sys.executable, "-m", "cronoq.store.journal.compaction", "--data-dir", str(data_dir),
                 "--generation", str(generation), "--archived-through", str(archived_through),
                 "--status-fd", str(write_end), "--parent", str(os.getpid())],
                pass_fds=(write_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, close_fds=True,
            )
        except OSError:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        took = time.perf_counter() - starting
        os.set_blocking(read_end, False)
        snapshot = cls(process.pid, read_end, generation, temporary_of(data_dir), forked=False, process=process)
        snapshot.start_seconds = snapshot.spawn_seconds = took
        return snapshot

    @classmethod
    def read_back_in(cls, starter: concurrent.futures.Executor, data_dir: Path, generation: int,
                     archived_through: int, *, started: Callable[["BackgroundSnapshot"], None] | None = None,
                     ) -> "BackgroundSnapshot":
        """Like `read_back`, but the process is started by `starter`, one thread, while the caller carries on:
        the snapshot returned is running from now on (`poll` is False until the process has started and is
        done), and `poll` raises the OSError of a start that failed. `started` is called in `starter`'s thread
        with what it started (to time and log it).

        The child is bound to the thread that starts it (PR_SET_PDEATHSIG fires when that *thread* ends, not
        the process), so `starter`'s thread must live as long as the broker, as its housekeeping thread does."""
        starting = time.perf_counter()
        snapshot = cls(0, -1, generation, temporary_of(data_dir), forked=False)

        def start() -> BackgroundSnapshot:
            running = cls.read_back(data_dir, generation, archived_through)
            if started is not None:
                try:
                    started(running)
                except Exception:  # noqa: BLE001 - the process runs: a failed log line must not orphan it
                    log.exception("after starting a compaction's snapshot writer")
            return running

        snapshot._starting = starter.submit(start)
        snapshot.start_seconds = time.perf_counter() - starting
        return snapshot

    def _take_started(self) -> bool:
        """Take over the process another thread started, once it has: False while it is being started.
        Raises the OSError of a start that failed (then nothing was started and no file was written)."""
        starting = self._starting
        if starting is None:
            return True
        if not starting.done():
            return False
        self._starting = None
        running = starting.result()
        self.pid, self._status_fd, self._process = running.pid, running._status_fd, running._process
        self.spawn_seconds = running.spawn_seconds
        return True

    def poll(self) -> bool:
        """True once the child has written the whole file; False while it runs (or is being started).
        Raises OSError (with the child's reason) when it failed, was killed or could not be started; the
        temporary file is then gone."""
        if not self._take_started():
            return False
        code = self._exit_code()
        if code is None:
            return False
        message = self._read_status()
        os.close(self._status_fd)
        self._status_fd = -1
        if code == 0 and message.startswith("ok "):
            self.size = int(message[3:])
            return True
        self.temporary.unlink(missing_ok=True)
        if code < 0:
            raise OSError(f"the snapshot writer was killed by signal {-code}")
        raise OSError(message.removeprefix("error ") or f"the snapshot writer exited with status {code}")

    def cancel(self) -> None:
        """Stop the child (if it still runs) and remove what it wrote."""
        starting = self._starting
        if starting is not None and not starting.cancel():  # cancel(): the other thread had not begun
            try:
                concurrent.futures.wait([starting])  # a start under way: a few milliseconds
                self._take_started()
            except Exception:  # noqa: BLE001 - it never started: nothing to stop
                return
        self._starting = None
        if self._status_fd < 0:
            return
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        else:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
        os.close(self._status_fd)
        self._status_fd = -1
        self.temporary.unlink(missing_ok=True)

    def _exit_code(self) -> int | None:
        """The child's exit code (negative: the signal that killed it), or None while it runs."""
        if self._process is not None:
            return self._process.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return None if pid == 0 else os.waitstatus_to_exitcode(status)

    def _read_status(self) -> str:
        try:
            return os.read(self._status_fd, _STATUS_BYTES).decode(errors="replace")
        except BlockingIOError:
            return ""


def temporary_of(data_dir: Path) -> Path:
    """Where a compaction writes the snapshot before it is renamed into place."""
    return data_dir / (SNAPSHOT + ".tmp")


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# --------------------------------------------------------------------- a forked child


def _forked_child(temporary: Path, frames_of: Callable[[], Iterable[bytes]], close: list[int], status_fd: int,
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
            os.write(status_fd, f"error {_reason(exc)}".encode()[:_STATUS_BYTES])
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
    _die_with(parent)


def _die_with(parent: int) -> None:
    """Be killed when the broker dies; leave now if it already has."""
    if not bind_to_parent(parent):
        os._exit(1)


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or repr(exc)


def _held(bodies: Iterable[bytes]) -> Iterator[bytes]:
    """The frames, pausing after the first one while the test hook's file exists (see HOLD_ENV)."""
    hold = os.environ.get(HOLD_ENV)
    for n, body in enumerate(bodies):
        yield body
        if n == 0 and hold:
            Path(hold).write_text(str(os.getpid()))
            while os.path.exists(hold):
                time.sleep(0.01)


# --------------------------------------------------------------------- a process reading the files back


def write_from_files(data_dir: Path, generation: int, archived_through: int) -> int:
    """Write `snapshot.tmp` of `generation` from the snapshot and the journals before it, and fsync it;
    returns its size. Raises StoreError (damage, a file of another format) or OSError."""
    replay = read_before(data_dir, generation, archived_through)
    return frames.write_durably(temporary_of(data_dir), _held(
        snapshot_frames(generation, replay.records.values(), sorted(replay.paused))))


def main(argv: list[str] | None = None) -> int:
    """`python -m cronoq.store.journal.compaction`: what `BackgroundSnapshot.read_back` starts."""
    parser = argparse.ArgumentParser(prog="cronoq-compaction", description="Write a compaction's snapshot.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--generation", type=int, required=True)
    parser.add_argument("--archived-through", type=int, required=True)
    parser.add_argument("--status-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the broker's terminal is the broker's
    _die_with(args.parent)
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    gc.disable()  # reading back allocates millions of objects and frees none: nothing for the collector
    try:
        size = write_from_files(args.data_dir, args.generation, args.archived_through)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the broker as a message
        os.write(args.status_fd, f"error {_reason(exc)}".encode()[:_STATUS_BYTES])
        return 1
    os.write(args.status_fd, f"ok {size}".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
