"""Shared fixtures: run `async def` tests, start real brokers, and open either backend.

The `backend` fixture is the heart of the scenario tests: one test body runs
against the embedded `cronoq.Scheduler` and against a real `cronoq-broker`
process with a real worker over tcp on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from typing import Any, AsyncIterator, Iterable

import pytest

import cronoq
from tests import support
from tests.support import BEATS, BrokerProcess, write_config

WORKERS_PER_CORE = 3
"""Most tests wait on real processes and sockets: on an idle 2-core machine (2026-12-02) 4 workers took 137 s,
6 took 110-112 s and 8 took 109 s. With the CPU the only limit (all on one core) 4 and 6 took 205 and 212 s."""


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run the suite on several workers (pytest-xdist) unless told how many: most of its time is real brokers
    and workers waiting on each other, which overlaps well. `-n 0` or `-p no:xdist` runs it serially (this is
    not in addopts because `-n` there would make `-p no:xdist` an unknown option)."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput") or config.option.tx:
        return
    if config.option.numprocesses is None and not config.option.usepdb:
        config.option.numprocesses = "auto"
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "worksteal"  # tests take from 0.01 s to minutes: an idle worker takes queued ones


def pytest_configure(config: pytest.Config) -> None:
    """Every Python process the suite starts keeps its compiled bytecode (support.cached_bytecode), including the
    ones the benchmarks, the Rust crate's tests and pytest-xdist start, which build their own environments from
    this one: under PYTHONDONTWRITEBYTECODE each would compile cronoq afresh."""
    kept = support.cached_bytecode(dict(os.environ))
    if "PYTHONPYCACHEPREFIX" in kept and "PYTHONPYCACHEPREFIX" not in os.environ:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = kept["PYTHONPYCACHEPREFIX"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """What `-n auto` means here: WORKERS_PER_CORE workers per core (measured on 2 cores: see README.md)."""
    return max(2, WORKERS_PER_CORE * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                      else os.cpu_count() or 1))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked long_running start first, each module's on a worker of its own, so that the others fill the
    workers meanwhile instead of everyone waiting at the end for one that started last. `--dist worksteal` first
    hands the N workers equal runs of the collection, in order: each such run starts with one module's long tests
    (a module's stay together: the Rust crate's share one build)."""
    long_modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("long_running") is not None:
            long_modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    if not long_modules:
        return
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    runs: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for i, module in enumerate(long_modules.values()):
        runs[i % workers] += module
    rest = iter([item for item in items if item.get_closest_marker("long_running") is None])
    left = len(items)
    for i, run in enumerate(runs):  # the sizes worksteal gives: what is left over the workers still to serve
        size = left // (workers - i)
        run += [next(rest) for _ in range(max(0, size - len(run)))]
        left -= len(run)
    items[:] = [item for run in runs for item in run] + list(rest)


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests on a fresh event loop (no plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(asyncio.wait_for(pyfuncitem.obj(**kwargs), timeout=120))
    return True


@pytest.fixture(autouse=True)
def _fresh_in_process_peers():
    """Each test's in-process broker sees its peers connect afresh (a connection keeps its principal)."""
    support._peers.clear()


@pytest.fixture
def broker_factory(tmp_path):
    """Start real broker processes from config text; all are stopped (SIGTERM) at teardown."""
    started: list[BrokerProcess] = []

    def start(config_text: str = "", *, env: dict[str, str] | None = None, name: str = "cronoq.toml",
              broker_extra: str = "", args: list[str] | None = None,
              nofile: tuple[int, int] | None = None, python: str | None = None) -> BrokerProcess:
        path = write_config(tmp_path / name, config_text, broker_extra=broker_extra)
        broker = BrokerProcess(path, env=env, args=args, nofile=nofile, python=python)
        broker.start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def restarted():
    """Restart a broker process: `restarted(broker)` starts the same config (ports, data_dir) in a new process,
    with the same environment unless `env` is given; every one started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def restart(broker: BrokerProcess, env: dict[str, str] | None = None) -> BrokerProcess:
        again = BrokerProcess(broker.config_path, env=env if env is not None else broker.env).start()
        started.append(again)
        return again

    yield restart
    for broker in started:
        broker.stop()


class _BrokerBackend:
    """Pools served by a real broker process and an in-process cronoq.Worker over tcp."""

    name = "broker"

    def __init__(self, broker_factory: Any) -> None:
        self._broker_factory = broker_factory

    @contextlib.asynccontextmanager
    async def open(self, pools: Iterable[cronoq.Pool], concurrency: int = 1) -> AsyncIterator[Any]:
        pools = list(pools)
        broker = self._broker_factory(pools_toml(pools))
        worker = cronoq.Worker(broker.workers, pools, concurrency=concurrency, **BEATS)
        runner = asyncio.get_running_loop().create_task(worker.run())
        try:
            async with cronoq.connect(broker.clients) as client:
                yield client
        finally:
            await worker.stop()
            await runner


class _EmbeddedBackend:
    name = "embedded"

    @contextlib.asynccontextmanager
    async def open(self, pools: Iterable[cronoq.Pool], concurrency: int = 1) -> AsyncIterator[Any]:
        async with cronoq.Scheduler(list(pools), concurrency=concurrency) as sched:
            yield sched


@pytest.fixture(params=["embedded", "broker"])
def backend(request, broker_factory):
    """The same scheduling, embedded in-process or through a real broker process."""
    if request.param == "embedded":
        return _EmbeddedBackend()
    return _BrokerBackend(broker_factory)


def pools_toml(pools: Iterable[cronoq.Pool]) -> str:
    """The broker config section that declares these pools with the same settings."""
    lines = []
    for pool in pools:
        lines += ["[[pools]]", f'name = "{pool.name}"']
        if pool.fair_share:
            lines.append("fair_share = true")
        if pool.max_in_flight is not None:
            lines.append(f"max_in_flight = {pool.max_in_flight}")
        if pool.default_weight is not None:
            lines.append(f"default_weight = {pool.default_weight}")
        if pool.default_tenant_limit is not None:
            lines.append(f"default_tenant_limit = {pool.default_tenant_limit}")
        if pool.share_by is not None:
            lines.append(f'share_by = "{pool.share_by}"')
        for table in ("tenant_weights", "tenant_limits", "tenant_rates", "tenant_minimums"):
            values = getattr(pool, table)
            if values:
                lines.append(f"[pools.{table}]")
                lines += [f'"{tenant}" = {value}' for tenant, value in values.items()]
        lines.append("")
    return "\n".join(lines)
