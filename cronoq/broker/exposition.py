"""Prometheus metrics for the broker, served from the broker's own loop.

prometheus-client writes the text exposition format; we do not use its HTTP
server, which runs in a thread and would read the broker's state while the
loop changes it. Instead a small asyncio server on the broker's loop renders
the registry on each scrape, and a custom collector reads the core's
statistics and the broker's counters (broker/metrics.py) at that moment.

Only a broker whose config sets `metrics` imports this module (and so
prometheus-client): the others start without paying for it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import socket
from typing import Any, Awaitable, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from cronoq.broker.hosts import is_loopback, names_the_server, quoted
from cronoq.broker.metrics import DROP_REASONS, BrokerMetrics, Histogram

log = logging.getLogger("cronoq.metrics")

RENDER_CHUNK = 100
"""Samples written per turn of the broker's loop when a scrape is answered (`render_in_steps`): about a millisecond.
A pool of 1,000 tenants has some 7,000 samples, and writing them at once held the loop for 50 ms."""
# Samples generate_latest sets apart from the rest of their family (each such group under headers of its own): a family
# holding any is written whole.
_GROUPED_SUFFIXES = ("_created", "_gsum", "_gcount")


class BrokerCollector:
    """A prometheus-client collector over the broker's statistics and its BrokerMetrics."""

    def __init__(self, stats: Callable[[], dict[str, Any]], metrics: BrokerMetrics) -> None:
        self._stats = stats
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return _made_whole(self.families())

    def families(self, stats: dict[str, Any] | None = None) -> Iterator[Metric]:
        """The families of a scrape of `stats` (a stats map; the broker's at this moment when None), those with a
        sample per tenant or node still empty (`_Lazy`: their samples are made as they are written)."""
        if stats is None:
            stats = self._stats()
        pools = stats.get("pools", {})
        yield _gauge("cronoq_workers_connected", "Workers registered with the broker.", [], [([], stats.get("workers", 0))])
        yield _gauge("cronoq_pool_workers", "Registered workers serving the pool.", ["pool"],
                     [([name], p.get("workers", 0)) for name, p in pools.items()])
        yield _gauge("cronoq_pool_paused", "1 when the pool is paused (accepts but does not dispatch).", ["pool"],
                     [([name], int(p["paused"])) for name, p in pools.items()])
        yield _gauge("cronoq_queued_tasks", "Tasks waiting to be dispatched, by pool and priority class.",
                     ["pool", "class"],
                     [([name, cls], c["queued"]) for name, p in pools.items() for cls, c in p["classes"].items()])
        yield _gauge("cronoq_delayed_tasks", "Tasks waiting for their delay or retry backoff.", ["pool"],
                     [([name], p["delayed"]) for name, p in pools.items()])
        yield _gauge("cronoq_running_tasks", "Tasks held by workers, by pool and priority class.", ["pool", "class"],
                     [([name, cls], c["running"]) for name, p in pools.items() for cls, c in p["classes"].items()])
        tenants = [(name, tenant or "", t) for name, p in pools.items() for tenant, t in p["tenants"].items()]
        yield _gauge("cronoq_tenant_queued_tasks", "Tasks waiting, by pool and tenant ('' for none).",
                     ["pool", "tenant"], (([pool, tenant], t["queued"]) for pool, tenant, t in tenants))
        yield _gauge("cronoq_tenant_running_tasks", "Tasks running, by pool and tenant.", ["pool", "tenant"],
                     (([pool, tenant], t["running"]) for pool, tenant, t in tenants))
        yield _gauge("cronoq_tenant_weight", "The tenant's weight in the pool's fair share.", ["pool", "tenant"],
                     (([pool, tenant], t["weight"]) for pool, tenant, t in tenants))
        unit = {name: p.get("share_unit", "dispatches") for name, p in pools.items()}
        yield _gauge("cronoq_tenant_lag_dispatches",
                     "Dispatches the tenant trails (+) or leads (-) its place in the fair order, w*(V-S) summed over "
                     "the classes: between -1 and 0 per class on a correct broker; see docs/scheduling.md. Pools that "
                     "share by cost or run time are in cronoq_tenant_lag only.",
                     ["pool", "tenant"], (([pool, tenant], t.get("lag", 0.0)) for pool, tenant, t in tenants
                                          if unit[pool] == "dispatches"))
        yield _gauge("cronoq_tenant_lag",
                     "What the tenant trails (+) or leads (-) its place in the fair order, in the pool's share unit "
                     "(`unit`: dispatches, cost or seconds of worker time); see docs/scheduling.md.",
                     ["pool", "tenant", "unit"],
                     (([pool, tenant, unit[pool]], t.get("lag", 0.0)) for pool, tenant, t in tenants))
        yield _gauge("cronoq_pool_share_by", "1 for what the pool's fair share counts (share_by): dispatches, cost "
                     "or runtime.", ["pool", "share_by"],
                     [([name, p.get("share_by", "dispatches")], 1) for name, p in pools.items()])
        yield _gauge("cronoq_tenant_weighted_share",
                     "The fraction of the pool's fair dispatches the weights promise the tenant's own tasks now "
                     "(the tenant tree's share; compare with cronoq_dispatches_total).", ["pool", "tenant"],
                     (([pool, tenant], t.get("own_weighted_share", 0.0)) for pool, tenant, t in tenants))
        ceilings = [(name, node, c) for name, p in pools.items() for node, c in (p.get("ceilings") or {}).items()]
        yield _gauge("cronoq_tenant_ceiling", "The most tasks of the tenant's subtree that may run at once "
                     "(tenant_limits).", ["pool", "tenant"], (([pool, node], c["limit"]) for pool, node, c in ceilings))
        yield _gauge("cronoq_tenant_ceiling_running_tasks", "Running tasks of the tenant's subtree, counted "
                     "against its ceiling.", ["pool", "tenant"],
                     (([pool, node], c["running"]) for pool, node, c in ceilings))
        yield _gauge("cronoq_tenant_capped", "1 while the tenant is at its ceiling (none of its tasks starts).",
                     ["pool", "tenant"], (([pool, node], int(c["capped"])) for pool, node, c in ceilings))
        yield _gauge("cronoq_tenant_capped_seconds", "How long the tenant has been at its ceiling (0 when it is "
                     "not).", ["pool", "tenant"],
                     (([pool, node], c.get("capped_for") or 0.0) for pool, node, c in ceilings))
        rates = [(name, node, r) for name, p in pools.items() for node, r in (p.get("rates") or {}).items()]
        yield _gauge("cronoq_tenant_rate", "The most tasks of the tenant's subtree started per second "
                     "(tenant_rates).", ["pool", "tenant"], (([pool, node], r["rate"]) for pool, node, r in rates))
        yield _gauge("cronoq_tenant_rate_limited", "1 while the tenant is out of rate tokens (none of its tasks "
                     "starts until its next one).", ["pool", "tenant"],
                     (([pool, node], int(bool(r["limited"]))) for pool, node, r in rates))
        yield _gauge("cronoq_tenant_rate_next_start_seconds", "Seconds until a rate-limited tenant may start a task "
                     "again (0 when it may now).", ["pool", "tenant"],
                     (([pool, node], r.get("next_start_in") or 0.0) for pool, node, r in rates))
        minimums = [(name, node, m) for name, p in pools.items() for node, m in (p.get("minimums") or {}).items()]
        yield _gauge("cronoq_tenant_minimum", "Running tasks the tenant's subtree is guaranteed while it has work "
                     "queued (tenant_minimums).", ["pool", "tenant"],
                     (([pool, node], m["minimum"]) for pool, node, m in minimums))
        yield _gauge("cronoq_tenant_minimum_running_tasks", "Running tasks of the tenant's subtree, counted against "
                     "its minimum.", ["pool", "tenant"], (([pool, node], m["running"]) for pool, node, m in minimums))
        yield _gauge("cronoq_tenant_under_minimum", "1 while the tenant runs fewer than its minimum (its tasks go "
                     "ahead of the fair order).", ["pool", "tenant"],
                     (([pool, node], int(bool(m["under"]))) for pool, node, m in minimums))
        yield _LazyCounter("cronoq_dispatches", "Tasks handed to workers.", ["pool", "tenant"],
                           (([pool, tenant], t["dispatched"]) for pool, tenant, t in tenants))
        completions = CounterMetricFamily("cronoq_task_completions", "Tasks that reached a terminal state, by outcome.",
                                          labels=["pool", "outcome"])
        for (pool, outcome), count in sorted(self._metrics.completions.items()):
            completions.add_metric([pool, outcome], count)
        yield completions
        late = CounterMetricFamily("cronoq_late_results", "Results (and failures) that came from a worker after "
                                   "the broker took their task back from it (the worker was lost); dropped.")
        late.add_metric([], stats.get("late_results", 0))
        yield late
        resets = CounterMetricFamily("cronoq_dashboard_connections_reset", "Dashboard connections the peer reset "
                                     "or closed in the middle of a request or its answer.")
        resets.add_metric([], self._metrics.dashboard.reset)
        yield resets
        dropped = CounterMetricFamily("cronoq_dashboard_connections_dropped", "Dashboard connections the broker "
                                      "ended early, by reason: timeout, evicted (an unauthenticated one waiting, to "
                                      "make room), refused (no room).", labels=["reason"])
        for reason in DROP_REASONS:
            dropped.add_metric([reason], self._metrics.dashboard.dropped[reason])
        yield dropped
        yield _histogram_family("cronoq_queue_wait_seconds", "Time from submission to (last) dispatch.",
                                self._metrics.queue_wait)
        yield _histogram_family("cronoq_run_time_seconds", "Time from (last) dispatch to the outcome.",
                                self._metrics.run_time)
        commit = HistogramMetricFamily("cronoq_journal_commit_seconds", "Time to write one group commit to disk.")
        commit.add_metric([], self._metrics.commit_seconds.buckets(), self._metrics.commit_seconds.sum)
        sync = HistogramMetricFamily("cronoq_journal_sync_seconds",
                                     "Time of one fdatasync of the journal, in the broker's sync thread "
                                     "(durability \"sync\", about once a second).")
        sync.add_metric([], self._metrics.sync_seconds.buckets(), self._metrics.sync_seconds.sum)
        yield commit
        yield sync
        passes = HistogramMetricFamily("cronoq_loop_pass_seconds",
                                       "Time the broker's loop spent in one pass (handle, dispatch, commit, send).")
        passes.add_metric([], self._metrics.pass_seconds.buckets(), self._metrics.pass_seconds.sum)
        yield passes
        cpu = HistogramMetricFamily("cronoq_loop_pass_cpu_seconds",
                                    "CPU time the broker's loop used in one pass (below the pass's time when the "
                                    "machine ran other processes meanwhile).")
        cpu.add_metric([], self._metrics.pass_cpu_seconds.buckets(), self._metrics.pass_cpu_seconds.sum)
        yield cpu
        beat = HistogramMetricFamily("cronoq_loop_heartbeat_seconds",
                                     "Time the broker's loop spent on its once-a-heartbeat work (beats, liveness, "
                                     "sweeps, a journal compaction when one is due).")
        beat.add_metric([], self._metrics.heartbeat_seconds.buckets(), self._metrics.heartbeat_seconds.sum)
        yield beat
        start = HistogramMetricFamily("cronoq_snapshot_start_seconds",
                                     "Time the broker's loop spent starting a compaction's snapshot writer: a fork, "
                                     "or handing a new process's start to the housekeeping thread.")
        start.add_metric([], self._metrics.snapshot_start_seconds.buckets(), self._metrics.snapshot_start_seconds.sum)
        yield start
        spawn = HistogramMetricFamily("cronoq_snapshot_spawn_seconds",
                                      "Time the broker's housekeeping thread spent starting a compaction's process "
                                      "that reads the files back (the loop does not wait for it).")
        spawn.add_metric([], self._metrics.snapshot_spawn_seconds.buckets(), self._metrics.snapshot_spawn_seconds.sum)
        yield spawn
        yield _histogram_family("cronoq_gc_pause_seconds", "Time one collection of Python's garbage collector took.",
                                {str(g): h for g, h in enumerate(self._metrics.gc_seconds)}, label="generation")


class _Lazy(Metric):
    """A family whose samples are made only as they are asked for (`more`): one with a sample per tenant of every
    pool is built a piece at a time while a scrape is written (render_in_steps), not at once."""

    _source: Iterator[tuple[list[str], float]]
    _also: dict[str, str]

    def more(self, count: int | None = None) -> int:
        """Add up to `count` more samples (all that are left when None); returns how many were added."""
        added = 0
        for values, value in itertools.islice(self._source, count):
            self.add_metric(values, value)  # type: ignore[attr-defined]
            added += 1
        if self._also and added:
            self.samples[-added:] = [sample._replace(labels={**sample.labels, **self._also})
                                     for sample in self.samples[-added:]]
        return added


class _LazyGauge(_Lazy, GaugeMetricFamily):
    def __init__(self, name: str, documentation: str, labels: list[str],
                 samples: Iterable[tuple[list[str], float]]) -> None:
        GaugeMetricFamily.__init__(self, name, documentation, labels=labels)
        self._source, self._also = iter(samples), {}


class _LazyCounter(_Lazy, CounterMetricFamily):
    def __init__(self, name: str, documentation: str, labels: list[str],
                 samples: Iterable[tuple[list[str], float]]) -> None:
        CounterMetricFamily.__init__(self, name, documentation, labels=labels)
        self._source, self._also = iter(samples), {}


def _made_whole(families: Iterator[Metric]) -> Iterator[Metric]:
    """`families` with every sample made: what prometheus-client's collect() must give (generate_latest at once)."""
    for family in families:
        if isinstance(family, _Lazy):
            family.more()
        yield family


def _gauge(name: str, documentation: str, labels: list[str], samples: Iterable[tuple[list[str], float]]) -> _LazyGauge:
    return _LazyGauge(name, documentation, labels, samples)


def _histogram_family(name: str, documentation: str, by_pool: dict[str, Histogram],
                      label: str = "pool") -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for pool, histogram in sorted(by_pool.items()):
        family.add_metric([pool], histogram.buckets(), histogram.sum)
    return family


class MemberLabel:
    """Wraps a collector so every sample also carries `member="NAME"`: each member of a cluster serves its own
    metrics, and one Prometheus scraping them all tells them apart by it."""

    def __init__(self, inner: BrokerCollector, member: str) -> None:
        self._inner = inner
        self._member = member

    def collect(self) -> Iterator[Metric]:
        return _made_whole(self.families())

    def families(self, stats: dict[str, Any] | None = None) -> Iterator[Metric]:
        for family in self._inner.families(stats):
            if isinstance(family, _Lazy):
                family._also = {"member": self._member}  # on each sample as it is made
            family.samples = [sample._replace(labels={**sample.labels, "member": self._member})
                              for sample in family.samples]
            yield family


def collector_for(stats: Callable[[], dict[str, Any]], metrics: BrokerMetrics,
                  member: str | None = None) -> BrokerCollector | MemberLabel:
    """The collector /metrics serves; a cluster member's labels every sample with its `member` name."""
    collector = BrokerCollector(stats, metrics)
    return collector if member is None else MemberLabel(collector, member)


def registry_for(stats: Callable[[], dict[str, Any]], metrics: BrokerMetrics,
                 member: str | None = None) -> CollectorRegistry:
    """A registry of `collector_for`'s collector, for generate_latest (the whole scrape at once)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector_for(stats, metrics, member))  # type: ignore[arg-type]
    return registry


class _OneFamily:
    """A collector of one metric family, for generate_latest to write it alone."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


async def render_in_steps(collector: BrokerCollector | MemberLabel, stats: dict[str, Any],
                          chunk: int = RENDER_CHUNK) -> bytes:
    """What generate_latest writes for `collector` over the stats map `stats`, byte for byte, made and written at
    most `chunk` samples per turn of the loop.

    Each family is written in pieces of `chunk` samples: a piece after the first leaves out the family's HELP and
    TYPE lines, so the pieces join into the family as generate_latest writes it. A family with a sample per tenant
    makes its samples piece by piece too (`_Lazy`). Between pieces the loop serves everything else."""
    pieces: list[bytes] = []
    for family in collector.families(stats):
        if isinstance(family, _Lazy):
            written = False
            while True:
                family.samples = []
                added = family.more(chunk)
                if added or not written:  # (a family without samples is still written: its HELP and TYPE)
                    text = generate_latest(_OneFamily(family))  # type: ignore[arg-type]
                    pieces.append(text.split(b"\n", 2)[2] if written else text)  # after its HELP and TYPE
                    written = True
                await asyncio.sleep(0)
                if added < chunk:
                    break
            continue
        samples = family.samples
        grouped = tuple(family.name + suffix for suffix in _GROUPED_SUFFIXES)
        if len(samples) <= chunk or any(sample.name in grouped for sample in samples):
            pieces.append(generate_latest(_OneFamily(family)))  # type: ignore[arg-type]
            await asyncio.sleep(0)
        else:
            for start in range(0, len(samples), chunk):
                piece = copy.copy(family)
                piece.samples = samples[start:start + chunk]
                text = generate_latest(_OneFamily(piece))  # type: ignore[arg-type]
                pieces.append(text if start == 0 else text.split(b"\n", 2)[2])
                await asyncio.sleep(0)
    return b"".join(pieces)


MAX_HEADER_LINES = 100
"""Header lines a scrape's request may carry (Prometheus sends a handful); past them the connection is closed."""
REQUEST_SECONDS = 10.0
"""How long a scraper may take to send its whole request."""


def browser_problem(host: str | None, fetch_site: str | None, served_host: str,
                    configured: Iterable[str] = ()) -> tuple[bytes, str] | None:
    """Why a request is refused as a page's script reading the metrics through a name of its own (DNS
    rebinding; see docs/security.md), as (status, reason); None for a scraper, curl, or a person's browser.
    `configured`: the names in `[broker] metrics_hosts`.

    A page of another site that points its own name at this address is, to the browser, the same origin as
    the metrics: its script may read them, tenant names and all. Two signs give it away:

    - `Sec-Fetch-Site: same-origin`, which every current browser sends with a request a page of the same
      origin makes. Nothing here serves a page, so no such request is ours. Scrapers send no such header, and a
      person who types the address gets `none`;
    - a `Host` that names neither an IP address, `localhost`, the host of `metrics`, nor one of `configured`
      (the page's own name, from browsers without that header). Checked on a loopback address, where every
      honest client names the broker `localhost` or by its address, and on any address once `metrics_hosts`
      says which names the scrapers use; without it, a name a scraper's config gives is not known here."""
    if fetch_site is not None and fetch_site.strip().lower() == "same-origin":
        return (b"403 Forbidden", "a page's script may not read the metrics (Sec-Fetch-Site: same-origin): nothing "
                "here serves a page, so the page reached this address under a name of its own (DNS rebinding)")
    configured = tuple(configured)
    if host is None or not (configured or is_loopback(served_host)):
        return None
    if names_the_server(host, served_host, configured):
        return None
    names = ("localhost, IP addresses and the names in [broker] metrics_hosts" if configured
             else "localhost and IP addresses (list the names your scrapers use in [broker] metrics_hosts)")
    return (b"421 Misdirected Request", f"the metrics answer only to {names}, not to the name {quoted(host)} (the "
            f"Host header): another site could point that name here")


async def serve_metrics(address: str, collector: BrokerCollector | MemberLabel,
                        stats_in_steps: Callable[[], Awaitable[dict[str, Any]]],
                        sockets: list[socket.socket] | None = None,
                        hosts: Callable[[], Iterable[str]] = tuple) -> list[asyncio.base_events.Server]:
    """Serve GET /metrics at "host:port" on the running loop (on `sockets` when given: listening at it already);
    returns the asyncio servers. A scrape takes the stats a pool per turn of the loop (`stats_in_steps`) and
    writes them a piece per turn (`render_in_steps`): it never holds the loop for long, however many tenants.
    Scrapes that come while one is being written get that one's text: however many scrapers there are (or
    however hostile), one scrape's work is under way at a time. Another site's page reading them through a name
    of its own is refused (`browser_problem`; `hosts()` gives `metrics_hosts` as the config now says)."""
    host, _, port = address.rpartition(":")
    under_way: asyncio.Future[bytes] | None = None

    async def scrape() -> bytes:
        return await render_in_steps(collector, await stats_in_steps())

    async def text() -> bytes:
        nonlocal under_way
        if under_way is None or under_way.done():
            under_way = asyncio.ensure_future(scrape())
        # Shielded: a scraper that goes away takes its wait with it, not the others' scrape.
        return await asyncio.shield(under_way)

    async def request_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, str]]:
        """The request line, and the headers `browser_problem` reads (lower-case names)."""
        line = await reader.readline()
        headers: dict[bytes, str] = {}
        for _ in range(MAX_HEADER_LINES):
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                return line, headers
            name, colon, value = header.partition(b":")
            name = name.strip().lower()
            if colon and name in (b"host", b"sec-fetch-site"):
                headers[name] = value.strip().decode("latin-1")
        raise ValueError(f"more than {MAX_HEADER_LINES} header lines")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line, headers = await asyncio.wait_for(request_head(reader), REQUEST_SECONDS)
            parts = line.split()
            refused = browser_problem(headers.get(b"host"), headers.get(b"sec-fetch-site"), host or "127.0.0.1",
                                      hosts())
            if refused is not None:
                status, reason = refused
                body, content_type = reason.encode() + b"\n", b"text/plain; charset=utf-8"
            elif len(parts) >= 2 and parts[0] == b"GET" and parts[1].split(b"?")[0] in (b"/metrics", b"/"):
                body, status = await text(), b"200 OK"
                content_type = b"text/plain; version=0.0.4; charset=utf-8"
            else:
                body, status, content_type = b"only GET /metrics is served here\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type +
                         b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, ValueError) as exc:  # ValueError: a line past the limit
            log.debug("metrics request dropped: %s", exc)
        finally:
            writer.close()

    if sockets:
        return [await asyncio.start_server(handle, sock=sock) for sock in sockets]
    return [await asyncio.start_server(handle, host.strip("[]") or "127.0.0.1", int(port))]
