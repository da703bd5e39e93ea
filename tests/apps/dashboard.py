"""Pools for the dashboard's tests: `llm` is slow enough to keep a backlog, `failing` always raises."""

import asyncio

import cronoq


async def work(payload):
    await asyncio.sleep(0.05)
    return payload


def _check(payload):
    raise ValueError(f"payload {payload!r} is not a prompt")


async def refuse(payload):
    _check(payload)  # a frame of our own in the traceback


pools = [cronoq.Pool("llm", work), cronoq.Pool("failing", refuse)]
