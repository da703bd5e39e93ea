"""The Rust crate (rust/) is built and tested by the README's one test command: this runs its `cargo test`.

cargo's own tests start the real broker of this checkout with this same Python (CRONOQ_PYTHON), so the Rust
client, worker and embedded scheduler are checked against the Python implementation and the shared vectors.
Skipped, saying why, only where no `cargo` is installed (CI has one: .ci/run installs libzmq for it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cached_bytecode, free_ports

ROOT = Path(__file__).resolve().parents[2]
CRATE = ROOT / "rust"
CARGO = shutil.which("cargo") or next(
    (str(p) for p in [Path.home() / ".cargo" / "bin" / "cargo"] if p.exists()), None)


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_cargo_test_passes():
    env = cached_bytecode(dict(os.environ))  # for the brokers and Python peers its interop tests start
    env["CRONOQ_PYTHON"] = sys.executable  # the interop tests start this checkout's broker with it
    env["CARGO_TARGET_DIR"] = str(CRATE / "target")
    ports = free_ports(200)  # the interop tests' brokers bind these, not ports the OS may give someone else
    env["CRONOQ_TEST_PORTS"] = f"{ports[0]}-{ports[-1]}"
    env.setdefault("CARGO_BUILD_JOBS", "2")  # a shared 2-core machine
    env.setdefault("CARGO_TERM_COLOR", "never")
    proc = subprocess.run(
        [CARGO, "test", "--locked"], cwd=CRATE, env=env, capture_output=True, text=True,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"cargo test failed in {CRATE}:\n{output[-20000:]}"
    assert "test result: ok" in output, output[-5000:]


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_the_documented_fair_share_example_runs():
    """rust/examples/fair_share.rs holds the documentation's Rust snippet verbatim; it prints the 3:1 order."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(CRATE / "target"))
    env.setdefault("CARGO_BUILD_JOBS", "2")
    proc = subprocess.run([CARGO, "run", "--locked", "--quiet", "--example", "fair_share"], cwd=CRATE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "as letters:     gaaagaaagaaagaaaa" in proc.stdout, proc.stdout


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_the_documented_shares_example_runs():
    """rust/examples/shares.rs holds rust/README.md's share_by snippet; it prints the order of summed cost."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(CRATE / "target"))
    env.setdefault("CARGO_BUILD_JOBS", "2")
    proc = subprocess.run([CARGO, "run", "--locked", "--quiet", "--example", "shares"], cwd=CRATE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "as letters:     gatggggaggg" in proc.stdout, proc.stdout
    readme = (CRATE / "README.md").read_text()
    example = (CRATE / "examples" / "shares.rs").read_text()
    snippet = 'let pool = PoolConfig::new("llm").share_by(ShareBy::Cost).tenant_rate("trial", 0.5);'
    assert snippet in readme and snippet in example
    assert "g a t g g g g a g g g" in readme
