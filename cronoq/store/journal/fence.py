"""Fencing: the generation a broker holds data_dir at, and how it finds out that it no longer does.

The flock on `lock` decides which broker serves a data_dir. It can be lost without the holder noticing: an
NFS lease that expired while the host was partitioned, a lock state the server forgot, an operator who
removed or replaced the lock file. So, beside the lock:

- every broker that opens data_dir (a start, a restart, a standby's takeover) records a new **generation**
  in the `fence` file, one more than the last, before it reads anything: the file is written under a
  temporary name, fsynced and renamed into place, so each generation is a new inode;
- a broker checks before each journal write that `fence` is still the inode it wrote (a `stat`, no read):
  once another broker has recorded a later generation, this one refuses to write (`Fenced`), so it confirms
  nothing more, and stops;
- about twice a second it also checks the lock itself (`lost`): the path `lock` is still the file it holds,
  and another open of it cannot take the flock. Either failing means the lock is no longer ours, and the
  broker stops before anything else is accepted or dispatched.

What this guarantees depends on the storage; docs/scaling.md ("Fencing") says what, for each kind.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from cronoq.store.journal.reading import LOCK

FENCE = "fence"
_TEMPORARY = "fence.tmp"


class Fenced(OSError):
    """Another broker has taken data_dir over (a later generation): this one must not write to it."""


@dataclass(frozen=True)
class Fence:
    """The generation this broker recorded in data_dir, and the identity of the file that says so."""

    data_dir: Path
    generation: int
    _identity: tuple[int, int]

    def __post_init__(self) -> None:
        # Checked before every journal write: the path is joined once, not at each of them.
        object.__setattr__(self, "_path", os.path.join(self.data_dir, FENCE))

    def check(self) -> None:
        """Raise Fenced if another broker recorded a later generation since (one `stat`)."""
        try:
            st = os.stat(self._path)  # type: ignore[attr-defined]
        except FileNotFoundError:
            raise Fenced(self._taken("its fence file is gone")) from None
        if (st.st_dev, st.st_ino) != self._identity:
            raise Fenced(self._taken(f"generation {read_generation(self.data_dir)} was recorded since"))

    def _taken(self, what: str) -> str:
        return (f"data_dir {self.data_dir} was taken over by another broker ({what}; this broker holds generation "
                f"{self.generation}): refusing to write to it")


def read_generation(data_dir: Path) -> int:
    """The last generation recorded in data_dir (0: none yet, or unreadable)."""
    try:
        return int((data_dir / FENCE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def advance(data_dir: Path) -> Fence:
    """Record the next generation in data_dir (the caller holds its lock) and return it. Raises OSError."""
    generation = read_generation(data_dir) + 1
    temporary = data_dir / _TEMPORARY
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{generation} pid {os.getpid()}\n".encode())
        os.fsync(fd)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    os.rename(temporary, data_dir / FENCE)
    directory = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return Fence(data_dir, generation, (st.st_dev, st.st_ino))


def lost(data_dir: Path, lock_fd: int) -> str | None:
    """Why the flock held on `lock_fd` is no longer data_dir's lock, or None while it is."""
    path = data_dir / LOCK
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return f"its lock file {path} was removed"
    except OSError as exc:
        return f"its lock file {path} cannot be read: {exc.strerror or exc}"
    here = os.fstat(lock_fd)
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        return f"its lock file {path} was replaced by another file"
    # flocks belong to open file descriptions: another open of the file gets the lock only if ours is gone
    # (an NFS lease that expired, a lock state the server lost).
    try:
        probe = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return f"its lock file {path} cannot be opened: {exc.strerror or exc}"
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    except OSError as exc:
        return f"its lock on {path} cannot be checked: {exc.strerror or exc}"
    finally:
        os.close(probe)  # (if the probe took the lock, closing lets it go again)
    return f"its flock on {path} is no longer held (the storage dropped it)"
