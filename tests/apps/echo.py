"""Pools that test workers serve from a separate process (`cronoq-worker tests.apps.echo:pools`)."""

import os
import sys
import time

import cronoq


async def echo(payload):
    return {"echo": payload, "pid": os.getpid()}


def sleepy(payload):
    """Sleeps `payload` seconds in a thread; reports which process ran it. Says on stderr when it starts: the
    broker calls a task running once it is sent, before the worker process has it."""
    print(f"sleepy: started, sleeping {payload} s", file=sys.stderr, flush=True)
    time.sleep(float(payload))
    return os.getpid()


async def refuse(payload):
    raise ValueError(f"cannot take {payload!r}")


pools = [cronoq.Pool("default", echo), cronoq.Pool("slow", sleepy)]
failing = cronoq.Pool("failing", refuse)
default = pools[0]
llm_conflicting = cronoq.Pool("default", echo, max_in_flight=99)
not_a_pool = 42
