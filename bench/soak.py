"""`python bench/soak.py`: the broker at full load for minutes, watched from the side by a probe.

    python bench/soak.py --minutes 10                 # the soak: full load, probe, samples over time
    python bench/soak.py --minutes 10 --slow-reader   # plus, in the middle third, a client that never reads
    python bench/soak.py --fill-drain 1000000         # queue 10^6 (pool paused), then drain them, probe throughout
    python bench/soak.py --minutes 2 --payload-bytes 900000 --window 16   # big payloads: big journal writes
    python bench/soak.py --seconds 60 --relay         # the same load and probe through the bare relay: the floor
    python bench/soak.py --seconds 60 --load-rate 15000   # the load paced to at most 15,000 tasks/s

One durable broker (built-in durability, data_dir in a temp folder) with two
pools: `default`, served by --workers worker processes of --concurrency
slots, and `probe`, served by one worker process of its own. A load process
keeps --window tasks in flight on `default`; a probe process submits one
task at a time to `probe` and records each round trip. The probe's pool is
idle, so its round trip is what the broker's loop adds while another pool is
saturated. Every --sample seconds this process reads the broker's RSS and
CPU, the workers' CPU and the size of data_dir, and the schedstat of every
thread of the broker, the probe's worker and the probe's client: how long
each waited for a CPU. The probe also reads those around each round trip.

With --relay the broker is bench/relay.py (no scheduling, no journal) and
its workers bench/relay.py's: the same load shape, the probe's requests
tagged so that the relay hands them to the probe's own worker. What the
probe sees there is the floor this machine puts under any broker.

Writes bench/results/soak-<stamp>.json (every sample, every probe, the
summary) and .png (tasks/s, probe p50/p99/max, RSS and data_dir over time),
and prints the summary. Child logs go to /tmp/cronoq-bench-<pid>/.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.common import (ROOT, Children, archiver_pids, child_env, cpu_seconds, free_port, log_dir,  # noqa: E402
                          percentile, python, rss_bytes, thread_schedstats)
from bench.stacks import TOKENS, CronoqBroker, broker_config, relay_stack, start_cronoq_worker  # noqa: E402

RESULTS = ROOT / "bench" / "results"
POOLS = '[[pools]]\nname = "default"\n\n[[pools]]\nname = "probe"\n'
# Targets from the issue this benchmark was made for (checked here, never in a test).
TARGET_P99_MS, TARGET_MAX_MS = 10.0, 50.0
TARGET_SLOW_READER_MIB = 64.0


@dataclass
class SoakSettings:
    """One soak or fill-and-drain run."""

    seconds: float = 600.0
    window: int = 1000
    workers: int = 2
    concurrency: int = 64
    probe_gap: float = 0.01
    sample: float = 1.0
    warmup: float = 10.0          # left out of the summary (the plot shows it)
    settle: float = 10.0          # fill-drain: how long to watch after the drain
    slow_reader: bool = False     # a client that never reads, during the middle third
    fill_drain: int = 0           # > 0: queue this many with the pool paused, then drain; no load process
    tokens: bool = False
    payload_bytes: int = 0        # > 0: the load's tasks carry this much padding (big journal writes)
    broker_nice: int = 0          # < 0: run the broker at this niceness, ahead of the clients and workers
    isolate_load: bool = False    # soak only: the load (and the archiver) on the last CPU, the broker and probe on the rest
    result_ttl: float | None = None  # None: the broker's default
    relay: bool = False           # soak only: bench/relay.py instead of cronoq, the probe served by a tagged worker
    load_rate: float = 0.0        # soak only: > 0: the load submits at most this many tasks/s (still within window)
    out: Path | None = RESULTS    # None: write nothing
    plot: bool = True
    note: str = ""


@dataclass
class Recording:
    """What a run collected, all stamped with unix time."""

    started: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    probes: list[tuple[float, float]] = field(default_factory=list)      # (time, round trip s)
    # (time, round trip s, run-queue wait s of the probe's client, then of each of `watched`'s, during the trip)
    probe_waits: list[list[float]] = field(default_factory=list)
    watched: dict[str, int] = field(default_factory=dict)  # name -> pid whose threads' schedstat is sampled
    progress: list[tuple[float, float]] = field(default_factory=list)    # (time, tasks done so far)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (start, end)
    loop: dict[str, Any] = field(default_factory=dict)  # the broker's own histograms of its loop, from /metrics
    isolation: str = ""  # with --isolate-load: which processes went on which CPU


def data_dir_bytes(path: Path) -> int:
    """Bytes in the files under `path` (0 if it is not there yet)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                pass  # replaced by a compaction meanwhile
    return total


def scrape(address: str) -> str:
    """The broker's /metrics text ("" if it cannot be had: an older broker without the endpoint, say)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            return reply.read().decode()
    except OSError:
        return ""


HISTOGRAMS = {"pass": "cronoq_loop_pass_seconds", "pass cpu": "cronoq_loop_pass_cpu_seconds",
              "heartbeat work": "cronoq_loop_heartbeat_seconds",
              "gc": "cronoq_gc_pause_seconds",
              "snapshot start": "cronoq_snapshot_start_seconds",
              "snapshot spawn (housekeeping thread)": "cronoq_snapshot_spawn_seconds",
              "commit": "cronoq_journal_commit_seconds",
              "sync": "cronoq_journal_sync_seconds",
              # Submit to dispatch inside the broker, per pool: the probe pool's is the broker's own share of the
              # probe's round trip (the rest is the reply's pass, the sockets and the probe's processes).
              "queue wait": "cronoq_queue_wait_seconds"}


def loop_histograms(text: str) -> dict[str, Any]:
    """From the broker's own histograms: how many loop passes, collections and commits, and how many of each
    took longer than 2, 4, 8, 16, 32 ms ("over_ms"), plus the longest bucket reached ("max_le_ms")."""
    out: dict[str, Any] = {}
    for key, name in HISTOGRAMS.items():
        series: dict[str, dict[float, float]] = {}
        for line in text.splitlines():
            if line.startswith(name + "_bucket{"):
                labels, value = line[len(name) + 8:].rsplit("} ", 1)
                parts = dict(part.split("=", 1) for part in labels.split(","))
                bound = parts.pop("le").strip('"')
                label = " ".join(f"{k} {v.strip(chr(34))}" for k, v in parts.items())  # e.g. "generation 2"
                series.setdefault(label, {})[float("inf") if bound == "+Inf" else float(bound)] = float(value)
        for label, buckets in series.items():
            total = buckets[float("inf")]
            if not total:
                continue
            over = {ms: total - next((v for le, v in sorted(buckets.items()) if le >= ms / 1e3), total)
                    for ms in (2, 4, 8, 16, 32)}
            top = next(le for le, v in sorted(buckets.items()) if v >= total)
            out[f"{key} ({label})" if label else key] = {"count": total, "over_ms": over, "max_le_ms": top * 1e3}
    return out


def _watch_args(watched: dict[str, int]) -> list[str]:
    """The probe role's --watch arguments for these processes, in the order its lines give their waits."""
    return [arg for name, pid in watched.items() for arg in ("--watch", f"{name}={pid}")]


def _role(role: str, address: str, out: Path, *args: str, tokens: bool) -> subprocess.Popen:
    command = [python(), "-m", "bench.soak_roles", role, address, str(out), *args]
    if tokens:
        command += ["--token-env", "BENCH_CLIENT_TOKEN"]
    return Children.spawn(command, log_dir() / f"soak-{role}.log", env=child_env(TOKENS), cwd=log_dir())


def _pin(pid: int, cpus: set[int]) -> None:
    """Keep every thread of a process on `cpus` (sched_setaffinity applies to one thread; threads made later
    inherit from their maker)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, OSError):
            pass  # a thread that ended meanwhile


def isolate_load(broker: int, probe: list[int], load: list[int]) -> str:
    """Put the load's client and workers, and the broker's archiver, on the last CPU and the broker and the probe
    on the others: as if the flooding pool's processes ran on hosts of their own, which a shared 2-core machine
    cannot otherwise show. Returns what went where."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("--isolate-load needs at least 2 CPUs")
    rest, last = set(cpus[:-1]), {cpus[-1]}
    archivers = archiver_pids(broker)
    for pid in (broker, *probe):
        _pin(pid, rest)
    for pid in (*load, *archivers):
        _pin(pid, last)
    return (f"broker and probe on CPU {','.join(map(str, sorted(rest)))}; load and archiver "
            f"({len(load) + len(archivers)} processes) on CPU {cpus[-1]}")


async def _archiver_started(broker: int, timeout: float) -> None:
    """Wait for the broker's archiver, which an empty results store starts with the first finished task."""
    end = time.monotonic() + timeout
    while not archiver_pids(broker):
        if time.monotonic() > end:
            raise RuntimeError(f"the broker started no archiver within {timeout:.0f} s of the load's start")
        await asyncio.sleep(0.01)


def _lines(path: Path) -> Iterator[list[float]]:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            yield [float(x) for x in line.split()]
        except ValueError:
            continue  # a line cut short by the process being stopped


def _machine_seconds() -> float:
    """CPU seconds every process on the machine has spent busy since boot (bench/run.py's reading of /proc/stat)."""
    from bench.run import _busy_seconds

    return _busy_seconds()


async def _sampler(rec: Recording, broker: subprocess.Popen, workers: list[subprocess.Popen], data: Path,
                   every: float, stop: asyncio.Event, admin: Any = None) -> None:
    """Sample until `stop`: RSS, CPU, data_dir size, the schedstat of every thread of `rec.watched` (the processes
    as they are added), and (with an admin client) the load pool's counts."""
    worker_pids = [w.pid for w in workers]
    while not stop.is_set():
        sample = {"t": time.time(), "rss": float(rss_bytes(broker.pid)), "data_dir": float(data_dir_bytes(data)),
                  "cpu_broker": cpu_seconds([broker.pid]), "cpu_workers": cpu_seconds(worker_pids),
                  "cpu_archiver": cpu_seconds(archiver_pids(broker.pid)), "cpu_machine": _machine_seconds(),
                  "sched": {name: thread_schedstats(pid) for name, pid in rec.watched.items()}}
        if admin is not None:
            pool = (await admin.stats())["pools"]["default"]
            sample.update(queued=pool["queued"], running=pool["running"], dispatched=pool["dispatched"])
        rec.samples.append(sample)
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


async def _wait_exit(proc: subprocess.Popen, timeout: float) -> None:
    end = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > end:
            raise RuntimeError(f"{' '.join(map(str, proc.args))} did not finish within {timeout:.0f} s")
        await asyncio.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, proc.args))} failed (exit {proc.returncode}); see {log_dir()}")


async def _soak(s: SoakSettings, address: str, broker: subprocess.Popen, workers: list[subprocess.Popen],
                data: Path, files: Path) -> Recording:
    rec = Recording(time.time())
    stop = asyncio.Event()
    rec.watched.update({"broker": broker.pid, "probe worker": workers[-1].pid})
    sampler = asyncio.ensure_future(_sampler(rec, broker, workers, data, s.sample, stop))
    kind = "relay-" if s.relay else ""
    probe = _role(kind + "probe", address, files / "probe.txt", "--seconds", str(s.seconds), "--gap",
                  str(s.probe_gap), *_watch_args(rec.watched), tokens=s.tokens)
    rec.watched["probe client"] = probe.pid
    rate = ["--rate", str(s.load_rate)] if s.load_rate else []
    if s.relay:
        load = _role("relay-load", address, files / "load.txt", "--seconds", str(s.seconds), "--window",
                     str(s.window), *rate, tokens=False)
    else:
        load = _role("load", address, files / "load.txt", "--seconds", str(s.seconds), "--window", str(s.window),
                     "--payload-bytes", str(s.payload_bytes), *rate, tokens=s.tokens)
    if s.isolate_load:  # workers: the load's, then the probe's own
        await _archiver_started(broker.pid, timeout=60)
        rec.isolation = isolate_load(broker.pid, [probe.pid, workers[-1].pid],
                                     [load.pid, *(w.pid for w in workers[:-1])])
    try:
        if s.slow_reader:
            third = s.seconds / 3
            await asyncio.sleep(third)
            started = time.time()
            slow = _role("slow-reader", address, files / "slow.txt", "--seconds", str(third), tokens=s.tokens)
            await _wait_exit(slow, third + 60)
            rec.phases["slow reader"] = (started, time.time())
        await _wait_exit(load, s.seconds + 180)
        await _wait_exit(probe, 120)
    finally:
        stop.set()
        await sampler
        for proc in (load, probe):
            Children.stop(proc)
    rec.probe_waits = [row for row in _lines(files / "probe.txt") if len(row) == 2 + len(rec.watched)]
    rec.probes = [(row[0], row[1]) for row in _lines(files / "probe.txt")]
    rec.progress = [(row[0], row[1]) for row in _lines(files / "load.txt")]
    return rec


async def _fill_drain(s: SoakSettings, address: str, broker: subprocess.Popen, workers: list[subprocess.Popen],
                      data: Path, files: Path) -> Recording:
    import cronoq

    token = TOKENS["BENCH_ADMIN_TOKEN"] if s.tokens else None
    rec = Recording(time.time())
    async with cronoq.connect(address, token=token) as admin:
        await admin.pause("default")
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(_sampler(rec, broker, workers, data, s.sample, stop, admin))
        probe = _role("probe", address, files / "probe.txt", "--gap", str(s.probe_gap), tokens=s.tokens)
        try:
            await asyncio.sleep(s.warmup)
            started = time.time()
            fill = _role("fill", address, files / "fill.txt", "--tasks", str(s.fill_drain), "--window",
                         str(s.window), tokens=s.tokens)
            await _wait_exit(fill, 3_600)
            rec.phases["fill"] = (started, time.time())
            started = time.time()
            await admin.resume("default")
            while True:
                pool = (await admin.stats())["pools"]["default"]
                if pool["queued"] == 0 and pool["running"] == 0:
                    break
                await asyncio.sleep(0.2)
            rec.phases["drain"] = (started, time.time())
            started = time.time()
            await asyncio.sleep(s.settle)  # what comes after a drain (the collection of its garbage, say)
            rec.phases["after"] = (started, time.time())
        finally:
            stop.set()
            await sampler
            Children.stop(probe)
    rec.probes = [(row[0], row[1]) for row in _lines(files / "probe.txt")]
    rec.progress = [(row[0], row[1]) for row in _lines(files / "fill.txt")]
    return rec


def conflicts(s: SoakSettings) -> str | None:
    """What in `s` cannot go together, if anything."""
    if s.relay and (s.fill_drain or s.slow_reader or s.tokens or s.payload_bytes or s.broker_nice or s.isolate_load):
        return ("--relay runs the plain load and probe only: not with --fill-drain, --slow-reader, --tokens, "
                "--payload-bytes, --broker-nice or --isolate-load")
    if s.fill_drain and s.load_rate:
        return "--load-rate paces the soak's load, and a fill and drain has none"
    if s.load_rate < 0:
        return f"--load-rate must be 0 or more, got {s.load_rate:g}"
    return None


def run(s: SoakSettings, log: Any = print) -> dict[str, Any]:
    """Run one soak (or fill-and-drain) and return its summary; writes the JSON and PNG unless `s.out` is None."""
    import uvloop

    from bench.run import _busy_seconds, _our_seconds

    problem = conflicts(s)
    if problem:
        raise ValueError(problem)
    busy0, ours0, wall0 = _busy_seconds(), _our_seconds(), time.monotonic()
    durable_text = True
    with tempfile.TemporaryDirectory(prefix="cronoq-soak-") as tmp:
        folder = Path(tmp)
        data = folder / "data"
        if s.relay:
            with relay_stack(s.workers, s.concurrency, probe_worker=True) as stack:
                log(f"relay soak {s.seconds:g} s: relay pid {stack.broker.pid}, {s.workers} workers x {s.concurrency}, "
                    f"window {s.window}" + (f", load paced to {s.load_rate:,.0f} tasks/s" if s.load_rate else ""))
                rec = uvloop.run(_soak(s, stack.address, stack.broker, stack.workers, data, folder))
            return _finish(s, rec, busy0, ours0, wall0, log)
        text, address, workers_address = broker_config(durable=durable_text, tokens=s.tokens, data_dir=data,
                                                       pools=POOLS)
        metrics = f"127.0.0.1:{free_port()}"
        extra = f'metrics = "{metrics}"\n' + ("" if s.result_ttl is None else f"result_ttl = {s.result_ttl}\n")
        text = text.replace("[broker]\n", "[broker]\n" + extra, 1)
        broker = CronoqBroker(text, folder)
        workers: list[subprocess.Popen] = []
        try:
            proc = broker.start()
            if s.broker_nice:
                # As a deployment that gives the broker priority over the processes sharing its host (or a core
                # of its own): needs root or CAP_SYS_NICE to go below 0.
                os.setpriority(os.PRIO_PROCESS, proc.pid, s.broker_nice)
            for i in range(s.workers):
                workers.append(start_cronoq_worker(workers_address, "bench.apps:noop", s.concurrency,
                                                   log_dir() / f"soak-worker-{i}.log", tokens=s.tokens))
            workers.append(start_cronoq_worker(workers_address, "bench.apps:probe", 1,
                                               log_dir() / "soak-probe-worker.log", tokens=s.tokens))
            what = f"fill and drain {s.fill_drain:,}" if s.fill_drain else f"soak {s.seconds:g} s"
            if s.load_rate:
                what += f", load paced to {s.load_rate:,.0f} tasks/s"
            log(f"{what}: broker pid {proc.pid}{f' at nice {s.broker_nice}' if s.broker_nice else ''}, "
                f"{s.workers} workers x {s.concurrency}, window {s.window}; cronoq from {_cronoq_path()}")
            runner = _fill_drain if s.fill_drain else _soak
            rec = uvloop.run(runner(s, address, proc, workers, data, folder))
            rec.loop = loop_histograms(scrape(metrics))
        finally:
            for worker in workers:
                Children.stop(worker)
            broker.stop()
    return _finish(s, rec, busy0, ours0, wall0, log)


def _finish(s: SoakSettings, rec: Recording, busy0: float, ours0: float, wall0: float, log: Any) -> dict[str, Any]:
    """Summarize, print, and write the JSON and PNG (unless `s.out` is None)."""
    from bench.run import _busy_seconds, _our_seconds

    summary = summarize(s, rec)
    # The machine is shared: what other processes used meanwhile tells how far to trust the latencies.
    summary["foreign_load_cores"] = max(0.0, (_busy_seconds() - busy0) - (_our_seconds() - ours0)) / (
        time.monotonic() - wall0)
    log(summary_text(summary))
    if s.out is not None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(rec.started))
        kind = "filldrain" if s.fill_drain else "relay-soak" if s.relay else "soak"
        base = s.out / f"{kind}-{stamp}"
        s.out.mkdir(parents=True, exist_ok=True)
        document = {"summary": summary, "settings": {k: str(v) if isinstance(v, Path) else v
                                                     for k, v in vars(s).items()},
                    "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                "cronoq_path": _cronoq_path()},
                    "started": rec.started, "phases": rec.phases, "samples": rec.samples,
                    "progress": rec.progress, "probes": rec.probes, "probe_waits": rec.probe_waits,
                    "watched": rec.watched}
        base.with_suffix(".json").write_text(json.dumps(document, indent=None) + "\n")
        summary["json"] = str(base.with_suffix(".json"))
        if s.plot:
            try:
                draw(base.with_suffix(".png"), s, rec, summary)
                summary["png"] = str(base.with_suffix(".png"))
            except ImportError:
                log("matplotlib is not installed (pip install -e '.[bench]'): no PNG")
        log(f"wrote {base}.json" + (" and .png" if "png" in summary else ""))
    return summary


def _cronoq_path() -> str:
    import cronoq

    return str(Path(cronoq.__file__).resolve().parent)


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"count": len(ordered), "p50_ms": percentile(ordered, 0.5) * 1e3, "p99_ms": percentile(ordered, 0.99) * 1e3,
            "max_ms": (ordered[-1] if ordered else float("nan")) * 1e3}


def _count_at(progress: list[tuple[float, float]], t: float) -> float:
    """Tasks done by time `t`, interpolated between the progress lines around it."""
    index = bisect.bisect_left(progress, (t, float("-inf")))
    if index == 0:
        return progress[0][1]
    if index == len(progress):
        return progress[-1][1]
    (t0, n0), (t1, n1) = progress[index - 1], progress[index]
    return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else n1


def _rate(progress: list[tuple[float, float]], start: float, end: float) -> float:
    """Tasks per second between `start` and `end` (within the span the progress lines cover)."""
    if len(progress) < 2:
        return float("nan")
    start, end = max(start, progress[0][0]), min(end, progress[-1][0])
    if end <= start:
        return float("nan")
    return (_count_at(progress, end) - _count_at(progress, start)) / (end - start)


def summarize(s: SoakSettings, rec: Recording) -> dict[str, Any]:
    """Probe p50/p99/max, tasks/s, CPU per task, RSS and data_dir: overall (after warm-up) and per phase."""
    begin = rec.started + (0 if s.fill_drain else s.warmup)
    end = max([rec.samples[-1]["t"]] if rec.samples else [begin])
    kind = "fill-drain" if s.fill_drain else "relay soak" if s.relay else "soak"
    out: dict[str, Any] = {"kind": kind, "seconds": end - rec.started,
                           "samples": len(rec.samples), "probe": _latency([lat for t, lat in rec.probes if t >= begin])}
    if rec.isolation:
        out["isolation"] = rec.isolation
    steady = [x for x in rec.samples if x["t"] >= begin] or rec.samples
    if steady:
        first, last = steady[0], steady[-1]
        out["rss_mib"] = {"first": first["rss"] / 2**20, "last": last["rss"] / 2**20,
                          "max": max(x["rss"] for x in steady) / 2**20}
        out["data_dir_mib"] = {"first": first["data_dir"] / 2**20, "last": last["data_dir"] / 2**20,
                               "max": max(x["data_dir"] for x in steady) / 2**20}
    if s.load_rate:
        out["load_rate"] = s.load_rate
    if not s.fill_drain:
        out["tasks_per_s"] = _rate(rec.progress, begin, end)
        out["run_queue"] = run_queue(rec, begin)
        done = [n for t, n in rec.progress if begin <= t <= end]
        if len(done) >= 2 and len(steady) >= 2 and done[-1] > done[0]:
            tasks = done[-1] - done[0]
            if "cpu_machine" in steady[0]:  # every process on the machine, ours and others', by /proc/stat
                out["machine_busy_cores"] = (steady[-1]["cpu_machine"] - steady[0]["cpu_machine"]) / (
                    steady[-1]["t"] - steady[0]["t"])
            out["cpu_us_per_task"] = {
                "broker": (steady[-1]["cpu_broker"] - steady[0]["cpu_broker"]) / tasks * 1e6,
                "workers": (steady[-1]["cpu_workers"] - steady[0]["cpu_workers"]) / tasks * 1e6,
                "archiver": (steady[-1]["cpu_archiver"] - steady[0]["cpu_archiver"]) / tasks * 1e6}
        out["targets"] = {f"probe p99 < {TARGET_P99_MS:g} ms": out["probe"]["p99_ms"] < TARGET_P99_MS,
                          f"probe worst < {TARGET_MAX_MS:g} ms": out["probe"]["max_ms"] < TARGET_MAX_MS}
    phases: dict[str, Any] = {}
    for name, (start, stop) in rec.phases.items():
        phase: dict[str, Any] = {"seconds": stop - start,
                                 "probe": _latency([lat for t, lat in rec.probes if start <= t <= stop])}
        inside = [x for x in rec.samples if start <= x["t"] <= stop]
        before = [x for x in rec.samples if x["t"] < start]
        if inside:
            base = before[-1]["rss"] if before else inside[0]["rss"]
            phase["rss_growth_mib"] = (max(x["rss"] for x in inside) - base) / 2**20
        if not s.fill_drain:
            phase["tasks_per_s"] = _rate(rec.progress, start, stop)
        phases[name] = phase
    if s.fill_drain:
        out["tasks"] = s.fill_drain
        fill, drain = rec.phases.get("fill"), rec.phases.get("drain")
        if fill:
            phases["fill"]["tasks_per_s"] = s.fill_drain / (fill[1] - fill[0])
        if drain:
            phases["drain"]["tasks_per_s"] = s.fill_drain / (drain[1] - drain[0])
        out["targets"] = {f"probe worst < {TARGET_MAX_MS:g} ms over fill and drain":
                          max(phases[p]["probe"]["max_ms"] for p in phases) < TARGET_MAX_MS}
    if "slow reader" in phases:
        growth = phases["slow reader"].get("rss_growth_mib", float("nan"))
        out["targets"][f"slow reader: RSS growth < {TARGET_SLOW_READER_MIB:g} MiB"] = growth < TARGET_SLOW_READER_MIB
    out["phases"] = phases
    out["loop"] = rec.loop
    return out


def _thread_deltas(rec: Recording, name: str, begin: float) -> tuple[float, float, dict[str, list[float]]]:
    """For process `name`: the times of the first sample at or after `begin` and of the last one that saw it, and
    per thread name what its threads added between them: [ran s, waited s, times given a CPU]."""
    seen = [x for x in rec.samples if x["t"] >= begin and x.get("sched", {}).get(name)]
    if len(seen) < 2:
        return 0.0, 0.0, {}
    first = seen[0]["sched"][name]
    last: dict[str, Any] = {}
    for sample in seen:  # each thread's latest reading: a process's I/O threads end before its main thread does
        last.update(sample["sched"][name])
    out: dict[str, list[float]] = {}
    for tid, (thread, ran, waited, slices) in last.items():
        ran0, waited0, slices0 = first.get(tid, (thread, 0, 0, 0))[1:]  # a thread made since counts from 0
        row = out.setdefault(thread, [0.0, 0.0, 0.0])
        row[0] += (ran - ran0) / 1e9
        row[1] += (waited - waited0) / 1e9
        row[2] += slices - slices0
    return seen[0]["t"], seen[-1]["t"], out


def run_queue(rec: Recording, begin: float) -> dict[str, Any]:
    """How long the probe's client and worker and the broker waited for a CPU.

    "over the run": from the samples of every thread's schedstat, per process and per thread name: seconds
    waited and run, the share of the span spent waiting, the mean wait each time it was given a CPU, and the
    wait per probe round trip made meanwhile. "per round trip": read by the probe around each trip, the wait of
    each process's threads inside it, for the median trip and the slowest 1 %."""
    out: dict[str, Any] = {"over the run": {}}
    for name in rec.watched:
        start, stop, threads = _thread_deltas(rec, name, begin)
        if not threads:
            continue
        probes = sum(1 for t, _ in rec.probes if start < t <= stop)
        ran, waited, slices = (sum(row[i] for row in threads.values()) for i in range(3))
        out["over the run"][name] = {
            "seconds": stop - start, "ran_s": ran, "waited_s": waited, "waiting_share": waited / (stop - start),
            "wait_per_slice_us": waited / slices * 1e6 if slices else float("nan"),
            "wait_per_probe_ms": waited / probes * 1e3 if probes else float("nan"),
            "threads": {thread: {"ran_s": r, "waited_s": w, "slices": n,
                                 "wait_per_probe_ms": w / probes * 1e3 if probes else float("nan")}
                        for thread, (r, w, n) in sorted(threads.items())}}
    rows = [row for row in rec.probe_waits if row[0] >= begin]
    if rows:
        names = ["probe client", *(n for n in rec.watched if n != "probe client")]
        ordered = sorted(rows, key=lambda row: row[1])
        slowest = ordered[len(ordered) - max(1, len(ordered) // 100):]

        def part(chosen: list[list[float]]) -> dict[str, float]:
            return {"round_trip_ms": sum(r[1] for r in chosen) / len(chosen) * 1e3,
                    **{f"{n}_wait_ms": sum(r[2 + i] for r in chosen) / len(chosen) * 1e3 for i, n in enumerate(names)}}

        middle = len(ordered) // 2
        out["per round trip"] = {
            "probes": len(rows),
            # The median trip and its neighbours (1 % of the trips around it), so that one trip's noise is averaged.
            "median": part(ordered[max(0, middle - len(ordered) // 200):middle + len(ordered) // 200 + 1]),
            "mean": part(rows), "slowest 1 %": part(slowest)}
    return out


def summary_text(summary: dict[str, Any]) -> str:
    def lat(p: dict[str, float]) -> str:
        return f"probe p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, worst {p['max_ms']:.1f} ms ({p['count']:,} probes)"

    lines = [f"{summary['kind']} over {summary['seconds']:.0f} s: {lat(summary['probe'])}"]
    if "load_rate" in summary:
        lines.append(f"  the load paced to at most {summary['load_rate']:,.0f} tasks/s")
    if "isolation" in summary:
        lines.append(f"  {summary['isolation']}")
    if "foreign_load_cores" in summary:
        lines.append(f"  other processes on the machine used {summary['foreign_load_cores']:.2f} cores meanwhile")
    if "tasks_per_s" in summary:
        cpu = summary.get("cpu_us_per_task", {})
        lines.append(f"  {summary['tasks_per_s']:,.0f} tasks/s; CPU µs/task broker {cpu.get('broker', float('nan')):.1f}, "
                     f"workers {cpu.get('workers', float('nan')):.1f}, archiver {cpu.get('archiver', float('nan')):.1f}")
    if "machine_busy_cores" in summary:
        lines.append(f"  the machine's CPUs were busy {summary['machine_busy_cores']:.2f} cores' worth of "
                     f"{len(os.sched_getaffinity(0))} (every process, after the warm-up)")
    if "rss_mib" in summary:
        r, d = summary["rss_mib"], summary["data_dir_mib"]
        lines.append(f"  broker RSS {r['first']:.0f} -> {r['last']:.0f} MiB (max {r['max']:.0f}); "
                     f"data_dir {d['first']:.1f} -> {d['last']:.1f} MiB (max {d['max']:.1f})")
    for name, phase in summary["phases"].items():
        extra = f", {phase['tasks_per_s']:,.0f} tasks/s" if "tasks_per_s" in phase else ""
        growth = f", RSS +{phase['rss_growth_mib']:.1f} MiB" if "rss_growth_mib" in phase else ""
        lines.append(f"  {name} ({phase['seconds']:.0f} s): {lat(phase['probe'])}{extra}{growth}")
    for key, h in summary.get("loop", {}).items():
        over = ", ".join(f">{ms} ms {n:,.0f}" for ms, n in h["over_ms"].items() if n)
        lines.append(f"  broker {key}: {h['count']:,.0f}, longest <= {h['max_le_ms']:g} ms" + (f"; {over}" if over else ""))
    queue = summary.get("run_queue", {})
    for name, figures in queue.get("over the run", {}).items():
        threads = ", ".join(f"{thread} {f['waited_s'] * 1e3:,.0f}" for thread, f in figures["threads"].items())
        lines.append(f"  run-queue wait, {name}: {figures['waited_s']:.2f} s in {figures['seconds']:.0f} s "
                     f"({figures['waiting_share']:.1%}; ran {figures['ran_s']:.1f} s), {figures['wait_per_slice_us']:.0f} µs "
                     f"per turn on a CPU" + ("" if name == "broker" else  # whose waits are mostly the load's
                                             f", {figures['wait_per_probe_ms']:.2f} ms per probe")
                     + f" (ms by thread: {threads})")
    for key, figures in queue.get("per round trip", {}).items():
        if key != "probes":
            waits = ", ".join(f"{k[:-8]} {v:.2f}" for k, v in figures.items() if k.endswith("_wait_ms"))
            lines.append(f"  per round trip, {key}: {figures['round_trip_ms']:.2f} ms, of which waiting for a CPU "
                         f"(ms): {waits}")
    for target, met in summary.get("targets", {}).items():
        lines.append(f"  {'met' if met else 'NOT met':>7}  {target}")
    return "\n".join(lines)


def buckets(rec: Recording, width: float) -> list[dict[str, float]]:
    """Per `width` seconds: probe p50/p99/max and tasks/s, for the plot."""
    end = max([t for t, _ in rec.probes] + [x["t"] for x in rec.samples] + [rec.started])
    out = []
    start = rec.started
    probes = sorted(rec.probes)
    index = 0
    while start < end:
        stop = start + width
        lats = []
        while index < len(probes) and probes[index][0] < stop:
            if probes[index][0] >= start:
                lats.append(probes[index][1])
            index += 1
        row = {"t": start + width / 2 - rec.started, "tasks_per_s": _rate(rec.progress, start, stop)}
        if lats:
            row.update(_latency(lats))
        out.append(row)
        start = stop
    return out


def draw(path: Path, s: SoakSettings, rec: Recording, summary: dict[str, Any]) -> None:
    """Four panels over time: tasks/s, probe latency, broker RSS, data_dir size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = summary["seconds"]
    width = max(1.0, total / 90)
    rows = buckets(rec, width)
    fig, axes = plt.subplots(4, 1, figsize=(12, 12), sharex=True)
    x = [r["t"] for r in rows]

    ax = axes[0]
    if s.fill_drain:
        dispatched = [(x_["t"], x_.get("dispatched", 0.0)) for x_ in rec.samples]
        ax.plot([t - rec.started for t, _ in rec.progress[1:]],
                [_rate(rec.progress, a[0], b[0]) for a, b in zip(rec.progress, rec.progress[1:])], label="accepted/s")
        ax.plot([t - rec.started for t, _ in dispatched[1:]],
                [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(dispatched, dispatched[1:])], label="dispatched/s")
        ax.legend(loc="upper right")
    else:
        ax.plot(x, [r["tasks_per_s"] for r in rows], color="#37a")
    ax.set_ylabel("tasks/s")
    ax.set_title(f"{'relay' if s.relay else 'cronoq'} {'fill and drain of ' + format(s.fill_drain, ',') if s.fill_drain else 'soak'}: "
                 f"{s.workers} workers x {s.concurrency}, window {s.window}; probe on its own pool"
                 + (f" — {s.note}" if s.note else ""))

    ax = axes[1]
    for key, label, style in (("max_ms", "worst", ":"), ("p99_ms", "p99", "-"), ("p50_ms", "p50", "--")):
        ax.plot([r["t"] for r in rows if key in r], [r[key] for r in rows if key in r], style, label=label)
    ax.axhline(TARGET_P99_MS, color="#c44", lw=0.8)
    ax.axhline(TARGET_MAX_MS, color="#c44", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_ylabel(f"probe round trip, ms\n(per {width:.0f} s)")
    ax.legend(loc="upper right")

    ax = axes[2]
    ax.plot([x_["t"] - rec.started for x_ in rec.samples], [x_["rss"] / 2**20 for x_ in rec.samples], color="#a52")
    ax.set_ylabel("broker RSS, MiB")
    ax.set_ylim(bottom=0)

    ax = axes[3]
    ax.plot([x_["t"] - rec.started for x_ in rec.samples], [x_["data_dir"] / 2**20 for x_ in rec.samples],
            color="#585")
    ax.set_ylabel("data_dir, MiB")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds")

    for name, (start, stop) in rec.phases.items():
        for ax in axes:
            ax.axvspan(start - rec.started, stop - rec.started, alpha=0.08, color="#777")
        axes[0].text(start - rec.started, axes[0].get_ylim()[1], f" {name}", va="top", fontsize=8)
    p = summary["probe"]
    fig.text(0.01, 0.005, f"probe p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, worst {p['max_ms']:.1f} ms; "
             + (f"{summary['tasks_per_s']:,.0f} tasks/s" if "tasks_per_s" in summary else ""), fontsize=9)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/soak.py", description=__doc__.split("\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long the soak runs (default 10)")
    length.add_argument("--seconds", type=float, help="the same in seconds")
    parser.add_argument("--fill-drain", type=int, default=0, metavar="N",
                        help="instead of a soak: queue N tasks with the pool paused, then drain them")
    parser.add_argument("--slow-reader", action="store_true",
                        help="in the middle third, add a client that submits with watch and never reads")
    parser.add_argument("--window", type=int, default=1000, help="tasks the load keeps in flight (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for the load (default 2)")
    parser.add_argument("--concurrency", type=int, default=64, help="slots per load worker (default 64)")
    parser.add_argument("--probe-gap", type=float, default=0.01, help="seconds between probes (default 0.01)")
    parser.add_argument("--sample", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds left out of the summary (default 10)")
    parser.add_argument("--tokens", action="store_true", help="run the broker with tokens")
    parser.add_argument("--broker-nice", type=int, default=0, metavar="N",
                        help="run the broker at niceness N (e.g. -10: ahead of its clients and workers; needs root)")
    parser.add_argument("--isolate-load", action="store_true",
                        help="the load's client and workers and the archiver on the last CPU, the broker and the "
                             "probe on the others (as if the load ran on hosts of its own)")
    parser.add_argument("--payload-bytes", type=int, default=0,
                        help="pad each load task to about this many bytes (default: ~100-byte tasks)")
    parser.add_argument("--result-ttl", type=float,
                        help="the broker's result_ttl (default: the broker's own, which keeps records for a day)")
    parser.add_argument("--relay", action="store_true",
                        help="the same load and probe through bench/relay.py (no scheduling): the machine's floor")
    parser.add_argument("--load-rate", type=float, default=0.0, metavar="N",
                        help="the load submits at most N tasks/s (still at most --window in flight; default: no limit)")
    parser.add_argument("--note", default=os.environ.get("BENCH_CRONOQ_NOTE", ""), help="a note for the plot and JSON")
    parser.add_argument("--no-write", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (args.minutes if args.minutes is not None else 10) * 60
    s = SoakSettings(seconds=seconds, window=args.window, workers=args.workers, concurrency=args.concurrency,
                     probe_gap=args.probe_gap, sample=args.sample, warmup=args.warmup, slow_reader=args.slow_reader,
                     fill_drain=args.fill_drain, tokens=args.tokens, payload_bytes=args.payload_bytes, broker_nice=args.broker_nice,
                     isolate_load=args.isolate_load, result_ttl=args.result_ttl, relay=args.relay,
                     load_rate=args.load_rate, out=None if args.no_write else RESULTS, note=args.note)
    problem = conflicts(s)
    if problem:
        parser.error(problem)
    run(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
