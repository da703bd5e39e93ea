"""The Rust crate next to the Python implementation: client throughput on one broker, and dispatch cost.

    python bench/rust.py            # ~2 minutes after the release build (which takes a few more, once)
    python bench/rust.py --quick    # a smoke run

1. **Clients.** One real `cronoq-broker` (durability none) with two `cronoq-worker` processes
   (`--concurrency 64`, bench.apps:noop), loaded in turn by the Python client (bench/load.py) and by
   the Rust client (rust/examples/bench_client.rs), each keeping 1,000 tasks in flight, then one. The
   question is whether the Rust client is ever the bottleneck: it should drive the broker at least as
   hard as the Python client does, for less CPU of its own. The Rust client runs twice: `submit` then
   `result`, and `call` (one request, the outcome its only reply).
2. **Dispatch cost.** The same submit + dispatch pairs at the same backlogs, in the Python core
   (bench/core_dispatch.py) and in the Rust embedded scheduler's core (rust/examples/bench_core.rs).

Prints one table per part and writes bench/results/rust-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import core_dispatch  # noqa: E402
from bench.common import median_of  # noqa: E402
from bench.load import drive_cronoq  # noqa: E402
from bench.stacks import cronoq_stack  # noqa: E402

CRATE = ROOT / "rust"
RESULTS = ROOT / "bench" / "results"


def build() -> Path:
    """Build the two bench programs in release mode; the directory holding them (under rust/target, or the
    target directory CARGO_TARGET_DIR names)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or CRATE / "target")
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    env.setdefault("CARGO_BUILD_JOBS", "2")
    subprocess.run(["cargo", "build", "--release", "--locked", "--example", "bench_client", "--example", "bench_core"],
                   cwd=CRATE, env=env, check=True)
    return target / "release" / "examples"


def python_client(address: str, tasks: int, window: int, stack: Any) -> dict[str, Any]:
    import uvloop

    before, client_before = stack.cpu(), time.process_time()
    run, results = uvloop.run(drive_cronoq(address, tasks, window))
    after, client_after = stack.cpu(), time.process_time()
    assert results == list(range(tasks)), "every result checked"
    run.cpu = {group: after[group] - before[group] for group in after}
    run.cpu["client"] = client_after - client_before
    return run.summary()


def rust_client(binary: Path, address: str, tasks: int, window: int, stack: Any, way: str = "submit") -> dict[str, Any]:
    before = stack.cpu()
    out = subprocess.run([str(binary), address, str(tasks), str(window), way], capture_output=True, text=True,
                         check=True, timeout=900)
    after = stack.cpu()
    got = json.loads(out.stdout.strip().splitlines()[-1])
    n = got["tasks"]
    row = {"tasks": n, "elapsed_s": got["elapsed_s"], "tasks_per_s": n / got["elapsed_s"], "p50_ms": got["p50_ms"],
           "p99_ms": got["p99_ms"], "cpu_us_per_task_client": got["cpu_s"] / n * 1e6}
    for group in after:
        row[f"cpu_us_per_task_{group}"] = (after[group] - before[group]) / n * 1e6
    return row


def clients(binary: Path, quick: bool) -> list[dict[str, Any]]:
    tasks, repeats = (5_000, 1) if quick else (50_000, 3)
    rows = []
    with cronoq_stack(durable=False, tokens=False, workers=2, concurrency=64) as stack:
        for window, n in ((1000, tasks), (1, tasks // 20)):
            for name, drive in (("Python client", lambda: python_client(stack.address, n, window, stack)),
                                ("Rust client", lambda: rust_client(binary / "bench_client", stack.address, n,
                                                                    window, stack)),
                                ("Rust client, call", lambda: rust_client(binary / "bench_client", stack.address,
                                                                          n, window, stack, "call"))):
                runs = [drive() for _ in range(repeats)]
                rows.append({"name": name, "in_flight": window, **median_of(runs)})
                print(f"  {name}, {window} in flight: {rows[-1]['tasks_per_s']:,.0f} tasks/s", flush=True)
    return rows


def dispatch(binary: Path, quick: bool) -> list[dict[str, Any]]:
    pairs = 20_000 if quick else 100_000
    rust = {}
    out = subprocess.run([str(binary / "bench_core"), str(pairs)], capture_output=True, text=True, check=True,
                         timeout=1800)
    for line in out.stdout.splitlines():
        row = json.loads(line)
        rust[(row["backlog"], row["tenants"], row["fair"])] = row["ns_per_pair"]
    rows = []
    for (backlog, tenants, fair), rust_ns in rust.items():
        if quick and backlog > 100_000:
            continue
        python_s, _cycle = core_dispatch.measure(backlog, tenants, pairs, fair)
        rows.append({"backlog": backlog, "tenants": tenants, "pool": "fair" if fair else "fifo",
                     "python_ns": python_s * 1e9, "rust_ns": rust_ns, "ratio": python_s * 1e9 / rust_ns})
        print(f"  {backlog:>9,} queued, {tenants:>7,} tenants, {rows[-1]['pool']}: Python {python_s * 1e9:,.0f} ns, "
              f"Rust {rust_ns:,.0f} ns", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer tasks, one run each")
    parser.add_argument("--only", choices=["clients", "dispatch"], help="run one part only")
    args = parser.parse_args()
    binary = build()
    client_rows: list[dict[str, Any]] = []
    core_rows: list[dict[str, Any]] = []
    if args.only != "dispatch":
        print("clients on one broker (durability none, 2 workers x 64 slots):", flush=True)
        client_rows = clients(binary, args.quick)
    if args.only != "clients":
        print("dispatch cost, submit + dispatch per pair (CPU ns, best of 3):", flush=True)
        core_rows = dispatch(binary, args.quick)

    print("\n| client | in flight | tasks/s | p50 ms | p99 ms | client CPU µs/task | broker CPU µs/task |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in client_rows:
        print(f"| {r['name']} | {r['in_flight']:,} | {r['tasks_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['cpu_us_per_task_client']:.1f} | {r['cpu_us_per_task_broker']:.1f} |")
    print("\n| backlog | tenants | pool | Python core ns | Rust core ns | Python / Rust |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for r in core_rows:
        print(f"| {r['backlog']:,} | {r['tenants']:,} | {r['pool']} | {r['python_ns']:,.0f} | {r['rust_ns']:,.0f} | "
              f"{r['ratio']:.1f}× |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = RESULTS / f"rust-{stamp}.json"
    path.write_text(json.dumps({"quick": args.quick, "clients": client_rows, "dispatch": core_rows}, indent=2))
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
