"""Start and stop the systems under test: the relay, and a real cronoq broker with its workers.

Each stack is a context manager that leaves no process behind, whatever
happens inside the `with` block.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from bench.common import Children, child_env, cpu_seconds, free_port, log_dir, python, wait_for_line

# Tokens for the "with tokens" variants; fixed test secrets, only ever sent to 127.0.0.1.
TOKENS = {"BENCH_CLIENT_TOKEN": "bench-client-secret", "BENCH_WORKER_TOKEN": "bench-worker-secret",
          "BENCH_ADMIN_TOKEN": "bench-admin-secret"}


@dataclass
class Stack:
    """A running system: where clients connect, and the processes to account CPU to."""

    address: str
    broker: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by the broker and by all workers together."""
        return {"broker": cpu_seconds([self.broker.pid]), "workers": cpu_seconds(w.pid for w in self.workers)}


@contextlib.contextmanager
def relay_stack(workers: int, credit: int, *, probe_worker: bool = False) -> Iterator[Stack]:
    """The bare relay: one broker process and `workers` worker processes with `credit` slots each; with
    `probe_worker`, one more (the last), of credit 1, that serves only requests tagged `probe`."""
    logs = log_dir()
    clients_port, workers_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    try:
        broker = Children.spawn([python(), "-m", "bench.relay", "broker", str(clients_port), str(workers_port)],
                                logs / "relay-broker.log")
        procs.append(broker)
        wait_for_line(broker, logs / "relay-broker.log", "relay broker ready")
        for i in range(workers + probe_worker):
            log = logs / f"relay-worker-{i}.log"
            args = [str(credit)] if i < workers else ["1", "--tag", "probe"]
            proc = Children.spawn([python(), "-m", "bench.relay", "worker", str(workers_port), *args], log)
            procs.append(proc)
            wait_for_line(proc, log, "relay worker ready")
        yield Stack(f"tcp://127.0.0.1:{clients_port}", broker, procs[1:])
    finally:
        for proc in reversed(procs):
            Children.stop(proc)


def broker_config(*, durable: bool | str, tokens: bool, data_dir: Path,
                  pools: str = '[[pools]]\nname = "default"\n', heartbeat: float = 1.0,
                  results_store: bool = True) -> tuple[str, str, str]:
    """A broker config on fresh loopback ports; returns (toml text, clients address, workers address).

    `durable`: False for durability "none", True for the default durability
    (only `data_dir` set), or a durability name to write out (e.g. "fsync").
    `results_store`: False writes `results_store = false` (finished tasks stay in memory and the journal).
    """
    clients, workers = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    lines = ["[broker]", f'clients = "{clients}"', f'workers = "{workers}"', f"heartbeat_interval = {heartbeat}"]
    lines.append(f'data_dir = "{data_dir}"' if durable else 'durability = "none"')
    if isinstance(durable, str):
        lines.append(f'durability = "{durable}"')
    if not results_store:
        lines.append("results_store = false")
    text = "\n".join(lines) + "\n\n" + pools + "\n"
    if tokens:
        for env, role in (("BENCH_CLIENT_TOKEN", "client"), ("BENCH_WORKER_TOKEN", "worker"),
                          ("BENCH_ADMIN_TOKEN", "admin")):
            text += f'[[auth.tokens]]\ntoken_env = "{env}"\nrole = "{role}"\n\n'
    return text, clients, workers


class CronoqBroker:
    """One real `cronoq-broker -c FILE` process that can be stopped and started again on the same config."""

    def __init__(self, config_text: str, folder: Path, name: str = "broker") -> None:
        self.folder = folder
        self.config = folder / f"{name}.toml"
        self.config.write_text(config_text)
        self.log = log_dir() / f"{folder.name}-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 30.0) -> subprocess.Popen:
        # The module form runs the same `main` as the cronoq-broker console script.
        self.proc = Children.spawn(
            [python(), "-m", "cronoq.broker.cli", "-c", str(self.config), "--log-level", "WARNING"],
            self.log, env=child_env(TOKENS), cwd=self.folder,
        )
        wait_for_line(self.proc, self.log, "cronoq broker ready", timeout=timeout)
        return self.proc

    def stop(self, sig: int = signal.SIGTERM, grace: float = 60.0) -> int:
        if self.proc is None:
            return 0
        code = Children.stop(self.proc, sig=sig, grace=grace)
        self.proc = None
        return code


def start_cronoq_worker(workers_address: str, target: str, concurrency: int, log: Path, *,
                        tokens: bool) -> subprocess.Popen:
    """One `cronoq-worker` process for `target`; returns once it has registered with the broker."""
    args = [python(), "-m", "cronoq.worker.cli", "--broker", workers_address, "--concurrency", str(concurrency),
            "--log-level", "INFO"]
    if tokens:
        args += ["--token-env", "BENCH_WORKER_TOKEN"]
    # Not from the repository: `python -m` puts its working directory first on sys.path, ahead of a copy of
    # cronoq named in PYTHONPATH (bench/README.md, "Benchmarking a modified copy").
    proc = Children.spawn([*args, target], log, env=child_env(TOKENS), cwd=log_dir())
    wait_for_line(proc, log, "registered with")
    return proc


@contextlib.contextmanager
def cronoq_stack(*, durable: bool | str, tokens: bool, workers: int, concurrency: int, target: str = "bench.apps:noop",
                 pools: str = '[[pools]]\nname = "default"\n', results_store: bool = True) -> Iterator[Stack]:
    """A real broker (durable in a temp data_dir, or durability none) and `workers` worker processes."""
    with tempfile.TemporaryDirectory(prefix="cronoq-bench-") as tmp:
        folder = Path(tmp)
        text, clients, workers_address = broker_config(durable=durable, tokens=tokens, data_dir=folder / "data",
                                                       pools=pools, results_store=results_store)
        broker = CronoqBroker(text, folder)
        procs: list[subprocess.Popen] = []
        try:
            broker.start()
            for i in range(workers):
                procs.append(start_cronoq_worker(workers_address, target, concurrency,
                                                 log_dir() / f"{folder.name}-worker-{i}.log", tokens=tokens))
            assert broker.proc is not None
            yield Stack(clients, broker.proc, procs)
        finally:
            for proc in procs:
                Children.stop(proc)
            broker.stop()
