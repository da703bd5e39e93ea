"""Delivery across cuts between a peer and a real broker process, as docs/protocol.md and docs/api.md promise.

A cut is made here by freezing a process (SIGSTOP, then SIGCONT): its connections stay open and what was
sent to it waits in the kernel's buffers, as behind a network partition that heals; no network namespaces
are needed.
"""

from __future__ import annotations

import asyncio
import os
import signal

import cronoq
from tests.support import until

POOLS = '[[pools]]\nname = "default"\n'


async def test_the_librarys_own_resend_of_a_submit_is_no_duplicate(broker_factory):
    broker = broker_factory(POOLS)
    async with cronoq.connect(broker.clients, request_timeout=60) as client:
        await client.ping()
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            # The submit waits in the broker's socket buffer; the client gives up on the frozen connection
            # (ZeroMQ's heartbeat), makes a new one and re-sends the submit once the broker answers again.
            submitting = asyncio.ensure_future(client.submit("once", pool="default"))

            async def link_down() -> bool:
                return not client._link.up  # what the client's socket monitor saw: the connection was dropped
            await until(link_down, "the client gives up on the frozen broker's connection")
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        handle = await asyncio.wait_for(submitting, 60)
        assert client.reconnects >= 1, "the submit must have been re-sent on a new connection"
        assert not handle.duplicate, "the client submitted once: no earlier task with its key was returned"
        stats = await client.stats()
        assert stats["pools"]["default"]["queued"] == 1, "the re-send made no second task"
        # A key the caller repeats is a duplicate, re-sent or not.
        first = await client.submit("a", key="k")
        again = await client.submit("b", key="k")
        assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)

