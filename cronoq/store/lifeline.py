"""A helper process of the broker (the results-store archiver, a compaction's snapshot writer) dies with it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def bind_to_parent(parent: int) -> bool:
    """Ask to be killed when the broker (`parent`) dies (Linux); False if it already has, and the caller
    should leave (it died before the request took effect)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent
