"""The handlers a worker runs: `cronoq-worker --broker tcp://127.0.0.1:5556 tasks:llm`."""

import asyncio

import cronoq


async def complete(payload):
    """Pretend to run a language model: a little latency, then an answer."""
    await asyncio.sleep(0.05)
    return {"tenant": payload["tenant"], "answer": payload["prompt"].upper()}


# Settings left out here come from the broker's cronoq.toml, which owns them.
llm = cronoq.Pool("llm", complete)
