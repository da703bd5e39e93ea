"""A helper process of the broker (the results-store archiver, a compaction's snapshot writer): how the broker
starts it on this copy of cronoq, and how it dies with the broker."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1

_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory that holds this copy of the cronoq package."""


def helper_environment() -> dict[str, str]:
    """The broker's environment, with this copy of cronoq first on PYTHONPATH: a helper started with
    `python -m` runs the same code as the broker, wherever that was imported from."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
    return env


def bind_to_parent(parent: int) -> bool:
    """Ask to be killed when the broker (`parent`) dies (Linux); False if it already has, and the caller
    should leave (it died before the request took effect)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    return os.getppid() == parent
