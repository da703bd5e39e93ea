"""deploy/systemd/: the unit files pass `systemd-analyze verify`, and their command lines are cronoq's own."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cronoq.broker.cli import build_parser as broker_parser
from cronoq.worker.cli import build_parser as worker_parser

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"
INSTALLED_AT = "/usr/local/bin/"


def exec_start(unit: Path) -> list[str]:
    lines = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, f"{unit.name}: one ExecStart"
    return shlex.split(lines[0].removeprefix("ExecStart="))


def test_the_units_are_the_three_the_docs_name():
    assert sorted(p.name for p in UNITS.iterdir()) == [
        "cronoq-broker-standby.service", "cronoq-broker.service", "cronoq-worker@.service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path):
    # verify checks that ExecStart's program exists and is executable: stand-ins take the installed commands'
    # place, at a path of the test's own; the rest of each unit is verified as shipped.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("cronoq-broker", "cronoq-worker"):
        (bin_dir / command).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / command).chmod(0o755)
    units = []
    for unit in UNITS.iterdir():
        name = unit.name.replace("@.service", "@example.service")  # a template is verified as an instance
        (tmp_path / name).write_text(unit.read_text().replace(INSTALLED_AT, f"{bin_dir}/"))
        units.append(str(tmp_path / name))
    result = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and "System has not been booted with systemd" in result.stderr:
        pytest.skip(f"systemd-analyze verify cannot run in this container: {result.stderr.strip()}")
    said = [line for line in (result.stdout + result.stderr).splitlines() if str(tmp_path) in line or "cronoq" in line]
    assert result.returncode == 0 and not said, result.stdout + result.stderr


def test_the_broker_units_run_the_broker_with_flags_it_takes():
    for name, standby in (("cronoq-broker.service", False), ("cronoq-broker-standby.service", True)):
        argv = exec_start(UNITS / name)
        assert argv[0] == INSTALLED_AT + "cronoq-broker"
        args = broker_parser().parse_args([a for a in argv[1:] if not a.startswith("$")])
        assert args.config == "/etc/cronoq/cronoq.toml" and args.standby is standby


def test_the_worker_unit_runs_the_worker_with_flags_it_takes():
    argv = exec_start(UNITS / "cronoq-worker@.service")
    assert argv[0] == INSTALLED_AT + "cronoq-worker"
    filled = {"${CRONOQ_BROKER}": "tcp://h1:5556,tcp://h2:5556", "${CRONOQ_CONCURRENCY}": "8",
              "${CRONOQ_TARGET}": "myapp.tasks:pools"}
    args = worker_parser().parse_args([filled.get(a, a) for a in argv[1:]])
    assert args.broker == ["tcp://h1:5556,tcp://h2:5556"] and args.target == "myapp.tasks:pools"
