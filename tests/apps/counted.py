"""A pool whose handler records each run in a file, so a test can count how often each task ran."""

import os
import time

import cronoq


def record(payload):
    """Sleeps payload["sleep"] seconds, then appends payload["n"] to the file payload["runs"] (one line per run:
    an O_APPEND write of a few bytes is never torn or interleaved)."""
    time.sleep(payload.get("sleep", 0))
    fd = os.open(payload["runs"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{payload['n']}\n".encode())
    finally:
        os.close(fd)
    return payload["n"]


pools = [cronoq.Pool("counted", record)]
