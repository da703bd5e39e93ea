"""Queue a burst for globex, then acme's work, and watch acme get 3 dispatches for each of globex's.

Run from this folder, with the broker and a worker started:
    python client.py
"""

import asyncio
import sys

import cronoq

BROKER = sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:5555"


async def main() -> None:
    async with cronoq.connect(BROKER) as sched:
        await sched.pause("llm")  # queue the whole backlog before anything is dispatched
        handles = []
        for i in range(8):  # globex queues first ...
            handles.append(await sched.submit({"tenant": "globex", "prompt": f"g{i}"}, pool="llm", tenant="globex"))
        for i in range(24):  # ... acme later, with three times the weight
            handles.append(await sched.submit({"tenant": "acme", "prompt": f"a{i}"}, pool="llm", tenant="acme"))
        await sched.resume("llm")
        infos = []
        for handle in handles:
            await handle.result(timeout=60)
            infos.append(await sched.status(handle.id))
        order = sorted(infos, key=lambda info: info.started_at)
        print("dispatch order:", " ".join(info.tenant[0] for info in order))
        print("first 16:", {t: sum(1 for i in order[:16] if i.tenant == t) for t in ("acme", "globex")})


if __name__ == "__main__":
    asyncio.run(main())
