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

from tests.support import BrokerProcess, cached_bytecode, free_ports, run_command, write_config

ROOT = Path(__file__).resolve().parents[2]
CRATE = ROOT / "rust"
CARGO = shutil.which("cargo") or next(
    (str(p) for p in [Path.home() / ".cargo" / "bin" / "cargo"] if p.exists()), None)
# Where cargo builds: rust/target, unless the environment names a target directory of its own.
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or CRATE / "target")


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_cargo_test_passes():
    env = cached_bytecode(dict(os.environ))  # for the brokers and Python peers its interop tests start
    env["CRONOQ_PYTHON"] = sys.executable  # the interop tests start this checkout's broker with it
    env["CARGO_TARGET_DIR"] = str(TARGET)
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
    assert "as letters:     gaaagaaagaaagaaaa" in _run_example("fair_share")


def _run_example(name: str) -> str:
    """`cargo run --example NAME` in the crate's own target directory; what it printed."""
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET))
    env.setdefault("CARGO_BUILD_JOBS", "2")
    proc = subprocess.run([CARGO, "run", "--locked", "--quiet", "--example", name], cwd=CRATE, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_the_documented_shares_example_runs():
    """rust/examples/shares.rs holds rust/README.md's share_by snippet; it prints the order of summed cost."""
    assert "as letters:     gatggggaggg" in _run_example("shares")
    readme = (CRATE / "README.md").read_text()
    example = (CRATE / "examples" / "shares.rs").read_text()
    snippet = 'let pool = PoolConfig::new("llm").share_by(ShareBy::Cost).tenant_rate("trial", 0.5);'
    assert snippet in readme and snippet in example
    assert "g a t g g g g a g g g" in readme


DEPENDENT_MAIN = r'''
//! A program of a team that depends on cronoq: a worker and a client, both over CURVE.
use std::time::Duration;

use cronoq::{Payload, PoolConfig, Task, Worker};

#[tokio::main]
async fn main() -> cronoq::Result<()> {
    let var = |name: &str| std::env::var(name).expect(name);
    let (clients, workers, key) = (var("BROKER_CLIENTS"), var("BROKER_WORKERS"), var("BROKER_KEY"));
    let worker = Worker::new(workers.as_str())
        .curve_server_key(key.as_str())
        .pool(PoolConfig::new("work"), |payload: Payload| async move {
            Ok::<_, cronoq::Error>(payload.decode::<String>()?.to_uppercase())
        });
    let stopper = worker.stopper();
    let running = tokio::spawn(worker.run());
    let client = cronoq::connect(clients.as_str()).curve_server_key(key.as_str()).await?;
    let task = client.submit(Task::new("over curve").pool("work")).await?;
    let answer: String = task.result_timeout(Duration::from_secs(60)).await?;
    println!("dependent got {answer}");
    stopper.stop().await;
    running.await.expect("the worker's task")?;
    Ok(())
}
'''


@pytest.mark.skipif(CARGO is None, reason="cargo is not installed: the Rust crate in rust/ is not built here")
@pytest.mark.long_running
def test_a_project_depending_on_the_crate_links_the_system_libzmq_and_talks_curve(tmp_path):
    """A project outside rust/ that depends on the crate by path gets the system's libzmq with CURVE by default.

    The crate's own `.cargo/config.toml` could never reach such a project: the link must come from the crate's
    build script. So: no libzmq compiled (no zeromq-src, no zmq-sys in its graph or its build output), and the
    program it builds encrypts with CURVE to a real broker, as a worker and as a client. It shares the crate's
    target directory (same profile and lock file), so only the crate and the program itself compile.
    """
    project = tmp_path / "dependent"
    (project / "src").mkdir(parents=True)
    (project / "Cargo.toml").write_text(
        '[package]\nname = "cronoq-dependent"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
        f'[dependencies]\ncronoq = {{ path = "{CRATE.as_posix()}" }}\n'
        'tokio = { version = "1", features = ["macros", "rt-multi-thread"] }\n\n'
        # The crate's own dev profile, so that the dependencies its tests built are reused, not rebuilt.
        '[profile.dev]\ndebug = 0\n\n[workspace]\n'
    )
    shutil.copy(CRATE / "Cargo.lock", project / "Cargo.lock")  # the versions the crate was tested with
    (project / "src" / "main.rs").write_text(DEPENDENT_MAIN)
    env = dict(os.environ, CARGO_TARGET_DIR=str(TARGET), CARGO_TERM_COLOR="never")
    env.setdefault("CARGO_BUILD_JOBS", "2")
    build = subprocess.run([CARGO, "build"], cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "zeromq-src" not in build.stderr and "zmq-sys" not in build.stderr, build.stderr
    tree = subprocess.run([CARGO, "tree", "--edges", "normal,build", "--prefix", "none"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert tree.returncode == 0, tree.stderr
    assert "cronoq v" in tree.stdout and "zeromq-src" not in tree.stdout and "zmq-sys" not in tree.stdout, tree.stdout

    keys = tmp_path / "keys"
    keygen = run_command(["-m", "cronoq.client.cli", "keygen", "--dir", str(keys)])
    assert keygen.returncode == 0, keygen.stdout + keygen.stderr
    config = write_config(tmp_path / "broker.toml", '[[pools]]\nname = "work"\n',
                          broker_extra=f'durability = "none"\ncurve_secret_key_file = "{keys / "broker.key_secret"}"')
    broker = BrokerProcess(config).start()
    try:
        binary = TARGET / "debug" / "cronoq-dependent"
        run = subprocess.run([str(binary)], env=dict(os.environ, BROKER_CLIENTS=broker.clients,
                                                     BROKER_WORKERS=broker.workers, BROKER_KEY=str(keys / "broker.key")),
                             capture_output=True, text=True, timeout=120)
    finally:
        broker.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "dependent got OVER CURVE" in run.stdout, run.stdout + run.stderr
