"""A pool whose handler records each run in a file, so a test can count how often each task ran."""

import os
import time

import cronoq


def record(payload):
    """Sleeps payload["sleep"] seconds, then appends payload["n"] to the file payload["runs"] (one line per run:
    an O_APPEND write of a few bytes is never torn or interleaved). With payload["after"], it first waits (up to a
    minute) until that file exists: a test holds its load back that way until it has done what must happen while
    the load runs."""
    gate = payload.get("after")
    give_up = time.monotonic() + 60
    while gate is not None and not os.path.exists(gate) and time.monotonic() < give_up:
        time.sleep(0.02)
    time.sleep(payload.get("sleep", 0))
    fd = os.open(payload["runs"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{payload['n']}\n".encode())
    finally:
        os.close(fd)
    return payload["n"]


pools = [cronoq.Pool("counted", record)]
