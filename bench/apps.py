"""The cronoq pools the bench's workers serve (`cronoq-worker ... bench.apps:noop`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import cronoq


async def _noop(payload: dict[str, Any]) -> int:
    """No work: hand back the task's number so the client can check every result."""
    return payload["n"]


_received = itertools.count()


async def _arrival(payload: dict[str, Any]) -> list[Any]:
    """The fairness run's handler: the order in which this worker started tasks.

    Async handlers start on the worker's loop in the order their tasks
    arrived, and one connection delivers in the broker's dispatch order, so
    with one worker process this counter is the dispatch sequence.
    """
    return [next(_received), payload["n"]]


async def _arrival_then_work(payload: dict[str, Any]) -> list[Any]:
    """Like `_arrival`, then holds its slot for `work_s` seconds, so that a tenant's ceiling has something to bind."""
    started = next(_received)
    await asyncio.sleep(payload["work_s"])
    return [started, payload["n"]]


async def _service(payload: dict[str, Any]) -> int:
    """The estimates bench's handler (`bench/estimates.py`): a task that takes `payload["s"]` seconds."""
    await asyncio.sleep(payload["s"])
    return payload["n"]


async def _timed(payload: dict[str, Any]) -> list[float]:
    """The shares bench's handler (`bench/shares.py`): sleeps `payload["s"]` seconds and tells when its run began
    and ended on this worker's clock, the worker time the run took."""
    began = time.time()
    await asyncio.sleep(payload["s"])
    return [began, time.time()]


noop = cronoq.Pool("default", _noop)
fair = cronoq.Pool("fair", _arrival)
fair_work = cronoq.Pool("fair", _arrival_then_work)
"""The adversarial fairness bench's broker check (`bench/fairness_adversarial.py --broker`)."""
probe = cronoq.Pool("probe", _noop)
"""The soak's probe pool (`bench/soak.py`): one task at a time, on a worker of its own."""

pair = [cronoq.Pool("p0", _noop), cronoq.Pool("p1", _noop)]
"""The cluster bench's two pools (`bench/cluster.py`): one per member in the cluster, both on the lone broker."""
service = cronoq.Pool("est", _service)
"""The estimates bench's pool (`bench/estimates.py`); its weights and ceiling are the broker's."""
timed = cronoq.Pool("shares", _timed)
"""The shares bench's pool (`bench/shares.py`); what it shares by is the broker's."""
