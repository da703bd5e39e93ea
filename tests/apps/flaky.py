"""A pool whose handler fails, holds or succeeds by how many times its task ran before, served from a separate
process so that a test can kill the worker mid-run (`cronoq-worker tests.apps.flaky:pools`)."""

import os
import time

import cronoq


def flaky(payload):
    """Counts this run in the file payload["runs"] (one line per run, O_APPEND: never torn), then: raises
    ValueError on runs up to payload["fail"], sleeps until killed on run payload["hold_on"], else returns "done"."""
    fd = os.open(payload["runs"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"run\n")
    finally:
        os.close(fd)
    with open(payload["runs"]) as f:
        run = len(f.readlines())
    if run <= payload.get("fail", 0):
        raise ValueError(f"run {run} failed")
    if run == payload.get("hold_on"):
        time.sleep(3600)  # until the test kills this worker
    return "done"


pools = [cronoq.Pool("flaky", flaky)]
