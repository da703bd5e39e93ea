"""Record what the lag alert sees on a fair pool: issue #23's pool, scraped from a real broker's /metrics.

Three tenants weighted 3 : 1 : 1, initech under a ceiling of 1, one worker of
5 slots, every tenant kept backlogged; tasks of equal length. Every
`--every` seconds the broker's `cronoq_tenant_lag_dispatches` and
`cronoq_tenant_queued_tasks` are read per tenant, and the dispatches since the
start counted. The output is the `input_series` block that
deploy/prometheus/alerts.test.yml replays (one sample per test interval),
then one line of shares on stderr.

With `--share-by runtime` the same pool shares worker time: acme's tasks
take 20 ms, globex's anywhere from 5 to 150 ms (so its estimates miss, and
corrections owe it time: its lag goes above 0), initech's 50 ms. The lag is
then read from `cronoq_tenant_lag{unit="seconds"}`, and
`cronoq_dispatches_total` is recorded too (the alert's runtime rule reads it).

    python -m bench.lag_record --samples 30 --every 1 > series.yml
    python -m bench.lag_record --share-by runtime --samples 30 --every 1 > series.yml

Not part of `bench.run`: it is how the alert's "fair pool" test data was
made, kept so that it can be made again.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import cronoq
from bench.common import Children, child_env, free_port, python, wait_for_line

WEIGHTS = {"acme": 3, "globex": 1, "initech": 1}
CEILING = {"initech": 1}
SLOTS = 5
TASK_SECONDS = 0.02
BACKLOG = 600  # per tenant, topped up after every scrape (a scrape apart, 250 dispatches at most are made)
RUNTIME_SECONDS = {"acme": (0.02, 0.02), "globex": (0.005, 0.15), "initech": (0.05, 0.05)}
"""With --share-by runtime: each tenant's tasks run for a time drawn evenly from this range."""


async def _equal_work(payload: int | float) -> int | float:
    # An int payload (the dispatches recording) runs TASK_SECONDS; a float one runs that many seconds.
    await asyncio.sleep(payload if isinstance(payload, float) else TASK_SECONDS)
    return payload


pool = cronoq.Pool("llm", _equal_work)
"""The pool the recording's worker serves (`cronoq-worker ... bench.lag_record:pool`)."""

CONFIG = """\
[broker]
clients = "tcp://127.0.0.1:{clients}"
workers = "tcp://127.0.0.1:{workers}"
durability = "none"
metrics = "127.0.0.1:{metrics}"

[[pools]]
name = "llm"
share_by = "{share_by}"
[pools.tenant_weights]
{weights}
[pools.tenant_limits]
{limits}
"""


def _metrics(share_by: str) -> tuple[str, ...]:
    """The per-tenant series the alert reads for a pool that shares by `share_by`."""
    if share_by == "dispatches":
        return ("cronoq_tenant_lag_dispatches", "cronoq_tenant_queued_tasks")
    return ("cronoq_tenant_lag", "cronoq_tenant_queued_tasks", "cronoq_dispatches_total")


def _scrape(port: int, share_by: str) -> dict[tuple[str, str], float]:
    """(metric, tenant) -> value of the per-tenant series the alert reads, for pool llm."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        for metric in _metrics(share_by):
            if line.startswith(metric + "{") and 'pool="llm"' in line:
                tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
                out[(metric, tenant)] = float(line.rsplit(" ", 1)[1])
    return out


async def _record(clients: str, metrics: int, samples: int, every: float,
                  share_by: str) -> tuple[list[dict], dict[str, int]]:
    recorded: list[dict[tuple[str, str], float]] = []
    draw = random.Random(26)  # the run times of a runtime recording: the same draws each time

    def payload(tenant: str) -> int | float:
        if share_by == "dispatches":
            return 0
        low, high = RUNTIME_SECONDS[tenant]
        return round(draw.uniform(low, high), 4)

    async with cronoq.connect(clients) as sched:

        async def top_up() -> None:
            stats = await sched.stats()
            for tenant in WEIGHTS:
                queued = stats["pools"]["llm"]["tenants"].get(tenant, {}).get("queued", 0)
                await asyncio.gather(*(sched.submit(payload(tenant), pool="llm", tenant=tenant)
                                       for _ in range(BACKLOG - queued)))

        await top_up()
        first = (await sched.stats())["pools"]["llm"]["tenants"]
        base = {tenant: first.get(tenant, {}).get("dispatched", 0) for tenant in WEIGHTS}
        next_at = time.monotonic()
        for _ in range(samples):
            next_at += every
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            recorded.append(_scrape(metrics, share_by))
            await top_up()
        last = (await sched.stats())["pools"]["llm"]["tenants"]
        started = {tenant: last[tenant]["dispatched"] - base[tenant] for tenant in WEIGHTS}
    return recorded, started


def _series_yaml(recorded: list[dict[tuple[str, str], float]], share_by: str) -> str:
    lines = []
    for metric in _metrics(share_by):
        unit = ',unit="seconds"' if metric == "cronoq_tenant_lag" else ""
        for tenant in WEIGHTS:
            values = " ".join(f"{sample.get((metric, tenant), 0.0):g}" for sample in recorded)
            lines.append(f"      - series: '{metric}{{job=\"cronoq\",instance=\"b:9464\",pool=\"llm\","
                         f"tenant=\"{tenant}\"{unit}}}'")
            lines.append(f"        values: '{values}'")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="scrapes to record (default 30)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between scrapes (default 1)")
    parser.add_argument("--share-by", choices=("dispatches", "runtime"), default="dispatches",
                        help="what the pool's fair share counts (default dispatches)")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.every <= 0:
        parser.error("--samples must be at least 1 and --every a positive number of seconds")
    ports = {"clients": free_port(), "workers": free_port(), "metrics": free_port()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "cronoq.toml"
        config.write_text(CONFIG.format(**ports, share_by=args.share_by,
                                        weights="\n".join(f"{t} = {w}" for t, w in WEIGHTS.items()),
                                        limits="\n".join(f"{t} = {n}" for t, n in CEILING.items())))
        broker_log, worker_log = work / "broker.log", work / "worker.log"
        broker = Children.spawn([python(), "-m", "cronoq.broker.cli", "-c", str(config)], broker_log, env=child_env())
        wait_for_line(broker, broker_log, "cronoq broker ready")
        worker = Children.spawn([python(), "-m", "cronoq.worker.cli", "--broker", f"tcp://127.0.0.1:{ports['workers']}",
                                 "--concurrency", str(SLOTS), "bench.lag_record:pool"], worker_log, env=child_env())
        try:
            recorded, started = asyncio.run(_record(f"tcp://127.0.0.1:{ports['clients']}", ports["metrics"],
                                                    args.samples, args.every, args.share_by))
        finally:
            Children.stop(worker)
            Children.stop(broker)
    print(_series_yaml(recorded, args.share_by))
    total = sum(started.values()) or 1
    shares = ", ".join(f"{tenant} {n / total:.1%} (weight {WEIGHTS[tenant] / sum(WEIGHTS.values()):.0%})"
                       for tenant, n in started.items())
    lag = _metrics(args.share_by)[0]
    lags = {tenant: [s.get((lag, tenant), 0.0) for s in recorded] for tenant in WEIGHTS}
    span = ", ".join(f"{tenant} {min(v):+.2f}..{max(v):+.2f}" for tenant, v in lags.items())
    print(f"{total} dispatches: {shares}; lag ranges: {span}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
