"""Test helpers that start real processes: the broker and command-line workers."""

from __future__ import annotations

import asyncio
import fcntl
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

from cronoq.broker.connections import Connection

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 15.0

# The heartbeat of the tests' brokers and workers, both ways. Frequent, so that what rides on beats (a lost
# worker noticed, a reconnect) happens within seconds; patient, so that a process a busy machine leaves
# unscheduled for a while is not lost by mistake. Three beats of 0.2 s (0.6 s) were not: under a parallel run on
# two busy cores, workers that were alive and well were lost and their tasks ran twice.
HEARTBEAT = 0.2
LIVENESS = 15  # beats missed before a peer counts as lost: 3 s
BEATS = {"heartbeat_interval": HEARTBEAT, "liveness": LIVENESS}  # as cronoq.Worker's keyword arguments


_peers: dict[bytes, Connection] = {}


def peer(identity: bytes) -> Connection:
    """The connection a broker driven in-process (no sockets) takes a message under `identity` to come from:
    one per identity, authenticated by the first message with a valid token, as over a real socket."""
    conn = _peers.get(identity)
    if conn is None or not conn.alive:
        conn = _peers[identity] = Connection(-1, 0.0)
        conn.identity = identity
    return conn


# Ports. The usual trick, binding port 0 and closing the socket, races once tests run side by side: another
# pytest-xdist worker, or any outgoing connection (those take their port from the same ephemeral range), may be
# given that number before the broker binds it. So each test process hands out ports from a range of its own,
# below the ephemeral range, one after another; a port is handed out only if it binds right now and no other
# test run on this machine holds it (a byte-range lock per port on one shared file: the kernel drops it when
# the process that took it exits, so a killed run leaves nothing behind).
PORTS_FROM = 20000
_PORT_LOCKS = Path(tempfile.gettempdir()) / "cronoq-test-ports.lock"


def _ephemeral_ports_from() -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default when it cannot say)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _this_process_ports() -> range:
    """This test process's share of the ports from PORTS_FROM up to the ephemeral range: all of it in a serial
    run, the N-th of equal slices for pytest-xdist's worker gwN (disjoint, so no two workers meet)."""
    end = _ephemeral_ports_from()
    if end - PORTS_FROM < 1000:  # the kernel hands out (nearly) every port: only the checks below guard
        end = 65536
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return range(PORTS_FROM, end)
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) % count
    span = (end - PORTS_FROM) // count
    return range(PORTS_FROM + index * span, PORTS_FROM + (index + 1) * span)


class _PortDealer:
    """Hands out this process's ports in turn, skipping any that is bound or that another test run holds."""

    def __init__(self) -> None:
        self.ports = _this_process_ports()
        self.next = 0
        self.locks: int | None = None

    def take(self, count: int = 1) -> int:
        """The first of `count` consecutive ports, all free, reserved for this process until it exits."""
        for _ in range(len(self.ports)):
            if self.next + count > len(self.ports):
                self.next = 0  # wrap around: ports handed out long ago were released with their test
            first = self.ports[self.next]
            self.next += count
            if self._reserve(first, count) and all(_bindable(port) for port in range(first, first + count)):
                return first
        raise AssertionError(f"no {count} free consecutive ports left in {self.ports}")

    def _reserve(self, first: int, count: int) -> bool:
        """Hold ports [first, first + count) against other test processes on this machine; True if it could."""
        if self.locks is None:
            try:
                self.locks = os.open(_PORT_LOCKS, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:
                self.locks = -1  # no shared lock file here: the disjoint range and the bind check still hold
        if self.locks < 0:
            return True
        try:
            fcntl.lockf(self.locks, fcntl.LOCK_EX | fcntl.LOCK_NB, count, first, os.SEEK_SET)
            return True
        except OSError:
            return False


def _bindable(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:`port` now (without SO_REUSEADDR: a port that still has
    connections in TIME_WAIT counts as taken, as it would for some listeners)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


_dealer = _PortDealer()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on and no other test (of this run or another) is given."""
    return _dealer.take()


def free_ports(count: int) -> range:
    """`count` consecutive free ports, reserved like free_port's (for a child that hands them out itself)."""
    first = _dealer.take(count)
    return range(first, first + count)


def write_config(path: Path, body: str, *, clients: str | None = None, workers: str | None = None,
                 broker_extra: str = "") -> Path:
    """Write a broker config on fresh loopback ports (unless `body` has its own [broker] table).

    Each config file gets its own data_dir beside it (`NAME-data` for `NAME.toml`): one broker per directory.
    """
    if "[broker]" not in body:
        clients = clients or f"tcp://127.0.0.1:{free_port()}"
        workers = workers or f"tcp://127.0.0.1:{free_port()}"
        liveness = "" if "liveness" in broker_extra else f"liveness = {LIVENESS}\n"
        header = (f'[broker]\nclients = "{clients}"\nworkers = "{workers}"\nheartbeat_interval = {HEARTBEAT}\n'
                  f'{liveness}data_dir = "{path.stem}-data"\n{broker_extra}\n')
        body = header + body
    path.write_text(body)
    return path


def cached_bytecode(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child Python that keeps its compiled bytecode even where PYTHONDONTWRITEBYTECODE is set (as in
    many containers): the suite starts some thousand brokers, workers and commands, and compiling cronoq afresh
    in each cost about half a second of CPU, a third of the whole run. The bytecode then goes to a directory of
    the tests' own (PYTHONPYCACHEPREFIX), not beside the sources the setting keeps clean."""
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        env = {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / f"cronoq-test-bytecode-{os.getuid()}")
    return env


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = cached_bytecode(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def wait_for_line(proc: subprocess.Popen, log: Path, text: str, *, timeout: float = START_TIMEOUT) -> str:
    """Poll the process's log file until a line contains `text`; fail showing what it printed."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in log.read_text().splitlines():
            if text in line:
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"process never printed {text!r}; exit {proc.poll()}; it printed:\n{log.read_text()}")


def _spawn(args: list[str], log: Path, *, env: dict[str, str] | None, cwd: Path,
           nofile: tuple[int, int] | None = None, python: str | None = None) -> subprocess.Popen:
    """Start `python ARGS` with its output in `log`; `nofile`: its (soft, hard) open-file limits; `python`:
    the interpreter's path, if not this one's (the child's sys.executable, which it starts its helpers with)."""
    limit = None if nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile))
    with open(log, "w") as out:
        return subprocess.Popen([python or sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=_env(env), cwd=cwd, preexec_fn=limit)


class BrokerProcess:
    """A real `cronoq-broker -c FILE` child process."""

    def __init__(self, config_path: Path, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 nofile: tuple[int, int] | None = None, log: Path | None = None, python: str | None = None) -> None:
        self.config_path = config_path
        self.log_path = log  # None: beside the config, named after it (members sharing one file need their own)
        self.env = env
        self.nofile = nofile
        self.python = python
        self.args = args or ["--log-level", "WARNING"]
        self.proc: subprocess.Popen | None = None
        self.clients = ""
        self.workers = ""

    def start(self, *, wait: bool = True, log: Path | None = None) -> "BrokerProcess":
        """Start the process; with `wait`, return once it serves (a standby's `wait_ready` waits later).
        `log`: where its output goes (default: the `log` it was made with, else beside the config, NAME.log)."""
        self.log = log or self.log_path or self.config_path.with_suffix(".log")
        self.proc = _spawn(["-m", "cronoq.broker.cli", "-c", str(self.config_path), *self.args],
                           self.log, env=self.env, cwd=self.config_path.parent, nofile=self.nofile,
                           python=self.python)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> "BrokerProcess":
        """Wait until the broker prints that it serves, and read its endpoints from that line."""
        assert self.proc is not None
        line = wait_for_line(self.proc, self.log, "cronoq broker ready", timeout=timeout)
        fields = dict(part.split("=", 1) for part in line[line.index("cronoq broker ready"):].split()[3:])
        self.clients, self.workers = fields["clients"], fields["workers"]
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the broker and wait for it; returns its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the broker did not exit within 10 s of SIGTERM")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_command(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 30.0,
                cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run one of cronoq's commands (as `python -m module`) and capture its output."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=_env(env), timeout=timeout, cwd=cwd,
    )


def start_worker_process(broker_workers: str, target: str, log: Path, *, concurrency: int = 1,
                         env: dict[str, str] | None = None, extra: list[str] | None = None,
                         cwd: Path = ROOT, wait: bool = True) -> subprocess.Popen:
    """Start `cronoq-worker` as a child process (output to `log`); returns once it has registered (`wait`)."""
    proc = _spawn(["-m", "cronoq.worker.cli", "--broker", broker_workers, "--concurrency", str(concurrency),
                   "--heartbeat-interval", str(HEARTBEAT), "--liveness", str(LIVENESS), *(extra or []), target],
                  log, env=env, cwd=cwd)
    if wait:
        wait_for_line(proc, log, "registered with")
    return proc


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds (never a speed assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting until {what}")


def rss_kib(pid: int) -> int:
    """The resident memory of a process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class LoopTurns:
    """Counts the turns the running loop takes while the block runs: `with LoopTurns() as loop: await ...`, then
    `loop.turns` says how often the awaited work let the loop serve something else (a task yielding each turn)."""

    def __init__(self) -> None:
        self.turns = 0
        self._counting: asyncio.Task[None] | None = None

    def __enter__(self) -> "LoopTurns":
        self._counting = asyncio.get_running_loop().create_task(self._count())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._counting is not None
        self._counting.cancel()

    async def _count(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.turns += 1
