"""What reading a big broker's figures costs its other clients: a scrape of /metrics, the dashboard's sampling.

    python bench/scrapes.py                                  # 4 pools of 1,000 tenants, about a minute
    python bench/scrapes.py --pools 1 --tenants 1000 --seconds 5

A real broker (durable, no tokens) with `--pools` pools, each holding one queued task for each of `--tenants`
tenants (no worker: they stay queued, so every tenant is listed), `metrics` and `dashboard` on. A client pings
it one request at a time (a 2 ms pause between requests) for `--seconds`, four times: with nothing else going
on; while another thread scrapes /metrics every `--scrape-every` seconds; while it asks the dashboard's
overview (/api/overview) as often; and while it asks all pools' shares over time (/api/history). The
dashboard samples the stats every 5 s in all four. It prints each phase's ping p50, p99 and worst, how long a
read took, and how many of the broker's garbage collections meanwhile took over 5 ms (its own histogram).
What the loop is held for shows in the worst pings.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cronoq  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.common import free_port  # noqa: E402
from bench.stacks import CronoqBroker, broker_config  # noqa: E402

PAUSE = 0.002


async def _fill(address: str, pools: int, tenants: int) -> None:
    async with cronoq.connect(address) as client:
        for pool in range(pools):
            for first in range(0, tenants, 500):
                await asyncio.gather(*(client.submit(n, pool=f"p{pool}", tenant=f"tenant-{n}")
                                       for n in range(first, min(tenants, first + 500))))


async def _pings(address: str, seconds: float) -> list[float]:
    latencies = []
    async with cronoq.connect(address) as client:
        await client.ping()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            await client.ping()
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(PAUSE)
    return sorted(latencies)


def _reader(url: str, every: float, took: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as reply:
            reply.read()
        took.append(time.perf_counter() - started)
        stop.wait(every)


def _long_gc_pauses(metrics: str) -> int:
    """How many of the broker's garbage collections so far took over 5 ms (its own histogram, read off /metrics)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    total = under = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "cronoq_gc_pause_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    total += sample.value
                elif sample.name.endswith("_bucket") and sample.labels["le"] == "0.005":
                    under += sample.value
    return int(total - under)


def _phase(name: str, address: str, seconds: float, url: str | None, every: float, metrics: str,
           out: Callable[[str], None]) -> dict[str, Any]:
    gc_before = _long_gc_pauses(metrics)
    took: list[float] = []
    stop = threading.Event()
    reader = threading.Thread(target=_reader, args=(url, every, took, stop)) if url else None
    if reader is not None:
        reader.start()
    try:
        latencies = asyncio.run(_pings(address, seconds))
    finally:
        stop.set()
        if reader is not None:
            reader.join()
    row = {"phase": name, "pings": len(latencies), "p50_ms": latencies[len(latencies) // 2] * 1e3,
           "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3, "worst_ms": latencies[-1] * 1e3,
           "reads": len(took), "read_ms": statistics.median(took) * 1e3 if took else None,
           "gc_over_5ms": _long_gc_pauses(metrics) - gc_before}
    read = "" if not took else f"; {len(took)} reads, each {row['read_ms']:.0f} ms (median)"
    out(f"  {name:28} ping p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  worst {row['worst_ms']:6.2f} ms"
        f"  (collections over 5 ms: {row['gc_over_5ms']}){read}")
    return row


def measure(pools: int, tenants: int, seconds: float, every: float, out: Callable[[str], None] = print
            ) -> list[dict[str, Any]]:
    """The three phases against one broker; returns a row for each."""
    with tempfile.TemporaryDirectory(prefix="cronoq-scrapes-") as tmp:
        folder = Path(tmp)
        config = "".join(f'[[pools]]\nname = "p{n}"\n' for n in range(pools))
        text, clients, _ = broker_config(durable=True, tokens=False, data_dir=folder / "data", pools=config)
        metrics, dashboard = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        text = text.replace("[broker]\n", f'[broker]\nmetrics = "{metrics}"\ndashboard = "{dashboard}"\n', 1)
        broker = CronoqBroker(text, folder)
        broker.start()
        try:
            asyncio.run(_fill(clients, pools, tenants))
            out(f"{pools} pools × {tenants:,} tenants queued; pings for {seconds:g} s a phase")
            return [
                _phase("quiet (dashboard sampling)", clients, seconds, None, every, metrics, out),
                _phase("/metrics scraped", clients, seconds, f"http://{metrics}/metrics", every, metrics, out),
                _phase("dashboard overview read", clients, seconds, f"http://{dashboard}/api/overview", every,
                       metrics, out),
                _phase("all pools' history read", clients, seconds, f"http://{dashboard}/api/history", every,
                       metrics, out),
            ]
        finally:
            broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/scrapes.py", description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=1000, help="tenants per pool, one queued task each")
    parser.add_argument("--seconds", type=float, default=12.0, help="each phase's length")
    parser.add_argument("--scrape-every", type=float, default=0.5, help="seconds between two reads")
    args = parser.parse_args(argv)
    measure(args.pools, args.tenants, args.seconds, args.scrape_every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
