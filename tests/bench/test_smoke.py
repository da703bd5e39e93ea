"""The bench must not rot: a tiny run of the limit and of cronoq end to end completes with every task back.

Speed is never asserted here; only that the runs finish and count right.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import report
from bench.fairness import deviations, sfq_bound
from bench.settings import BenchSettings
from bench.throughput import CRONOQ_VARIANTS, cronoq_rows, limit_rows

TINY = BenchSettings(repeat=1, tasks=300, window=50, workers=2, concurrency=8, light_tasks=20)


def _sane(row: dict, tasks: int) -> None:
    assert row["tasks"] == tasks
    assert row["tasks_per_s"] > 0
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"]


def test_limit_and_cronoq_rows_complete() -> None:
    rows = limit_rows(TINY, lambda line: None)
    # The plainest variant and the one the targets are about (durable, with tokens).
    rows += cronoq_rows(TINY, lambda line: None, [CRONOQ_VARIANTS[0], CRONOQ_VARIANTS[-1]])
    names = [row["name"] for row in rows]
    assert names == [
        "limit: bare pyzmq relay", "limit: one in flight",
        "cronoq, durability none", "cronoq, durability none: one in flight",
        "cronoq, durable, tokens", "cronoq, durable, tokens: one in flight",
    ]
    for row in rows:
        _sane(row, TINY.light_tasks if row["kind"] == "light" else TINY.tasks)
    report.add_ratios(rows)
    assert rows[0]["vs_limit"] == 1.0
    assert "cronoq, durable, tokens" in report.table(rows)


def test_fairness_deviation_against_the_sfq_bound() -> None:
    weights = {"a": 3, "b": 1, "c": 1}
    assert sfq_bound(weights) == {"a": 8 / 5, "b": 6 / 5, "c": 6 / 5}
    worst, prefix = deviations(list("cbaaa" * 10 + "aaa"), weights)
    assert prefix == 46  # c's last dispatch: while all three are backlogged
    assert worst["a"] <= 8 / 5 and worst["b"] <= 6 / 5
    unfair, _ = deviations(list("aaaaaaaaaabcbc"), weights)
    assert unfair["a"] > 8 / 5


def test_the_per_thread_cpu_report_names_every_process(capsys) -> None:
    from bench import threads

    assert threads.main(["--tasks", "300", "--window", "50"]) == 0
    out = capsys.readouterr().out
    assert "over 300 tasks" in out
    assert {line.split()[0] for line in out.splitlines()[1:]} == {"broker", "client", "worker", "archiver"}
    assert "python" in out and "ZMQbg" in out, "the main thread and libzmq's I/O thread, apart"
    # The relay beside it, one task at a time: the same processes but the archiver it does not have.
    assert threads.main(["--relay", "--tasks", "100", "--window", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("relay:") and "1 in flight" in out
    assert {line.split()[0] for line in out.splitlines()[1:]} == {"broker", "client", "worker"}


def test_a_short_soak_samples_the_broker_and_the_probe(tmp_path) -> None:
    import importlib.util

    from bench.soak import SoakSettings, run

    isolate = len(os.sched_getaffinity(0)) >= 2  # --isolate-load needs a CPU for the load and one for the rest
    # Two seconds at full rate: the soak's parts all run (a third of it with the slow reader), each sampled 8 times.
    summary = run(SoakSettings(seconds=2, window=50, workers=1, concurrency=8, sample=0.25, warmup=0,
                               slow_reader=True, isolate_load=isolate, out=tmp_path), log=lambda line: None)
    assert Path(summary["json"]).exists()
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra: the PNG too
        assert Path(summary["png"]).stat().st_size > 0
    assert summary["samples"] >= 4
    assert summary["probe"]["count"] > 0 and summary["probe"]["max_ms"] > 0
    assert summary["tasks_per_s"] > 0
    assert summary["rss_mib"]["max"] > 0 and summary["data_dir_mib"]["last"] > 0
    assert "slow reader" in summary["phases"]
    if isolate:  # the load's client, its worker and the archiver
        assert summary["isolation"].endswith("load and archiver (3 processes) on CPU "
                                             f"{max(os.sched_getaffinity(0))}")


def test_the_soak_through_the_bare_relay_reports_the_probe_and_each_process_s_run_queue_wait() -> None:
    from bench.soak import SoakSettings, run

    summary = run(SoakSettings(seconds=2, window=50, workers=1, concurrency=8, sample=0.25, warmup=0, relay=True,
                               out=None), log=lambda line: None)
    assert summary["kind"] == "relay soak"
    assert summary["probe"]["count"] > 0 and summary["tasks_per_s"] > 0
    over_the_run = summary["run_queue"]["over the run"]
    assert set(over_the_run) == {"broker", "probe worker", "probe client"}
    for figures in over_the_run.values():
        assert figures["ran_s"] > 0 and figures["waited_s"] >= 0
        assert any(thread.startswith("ZMQbg") for thread in figures["threads"]), "libzmq's I/O thread counted too"
    trips = summary["run_queue"]["per round trip"]
    assert trips["probes"] == summary["probe"]["count"]
    assert set(trips["median"]) == {"round_trip_ms", "probe client_wait_ms", "broker_wait_ms", "probe worker_wait_ms"}


def test_a_paced_load_keeps_under_its_rate() -> None:
    from bench.soak import SoakSettings, run

    for relay in (False, True):
        summary = run(SoakSettings(seconds=3, window=50, workers=1, concurrency=8, sample=0.5, warmup=1,
                                   relay=relay, load_rate=300, out=None), log=lambda line: None)
        # Never a speed: only that the pacing holds the load back (both stacks do thousands a second unpaced).
        assert 0 < summary["tasks_per_s"] <= 300 * 1.1, summary["tasks_per_s"]
        assert summary["probe"]["count"] > 0


def test_the_soak_refuses_what_its_modes_cannot_do() -> None:
    import pytest

    from bench.soak import SoakSettings, main, run

    with pytest.raises(ValueError, match="--relay runs the plain load and probe only"):
        run(SoakSettings(seconds=1, relay=True, slow_reader=True, out=None), log=lambda line: None)
    with pytest.raises(SystemExit):
        main(["--seconds", "1", "--fill-drain", "10", "--load-rate", "100"])


def test_a_small_fill_and_drain_reports_the_probe_over_each_phase() -> None:
    from bench.soak import SoakSettings, run

    summary = run(SoakSettings(fill_drain=300, window=50, workers=1, concurrency=8, sample=0.5, warmup=0.5,
                               settle=0.5, out=None), log=lambda line: None)
    assert set(summary["phases"]) == {"fill", "drain", "after"}
    assert summary["phases"]["drain"]["tasks_per_s"] > 0
    assert summary["probe"]["count"] > 0


def test_a_takeover_run_finds_every_queued_task_at_the_standby() -> None:
    from bench import takeover

    out = takeover.run(tasks=200, runs=2, window=50)  # raises unless all 200 are still queued after each
    assert len(out["runs"]) == 2
    for figures in out["runs"]:
        assert 0 < figures["served_s"] and figures["recovery_s"] >= 0


def test_a_small_cluster_run_completes_both_pools_and_reports_cpu_per_task() -> None:
    from bench import cluster

    for members in (["solo"], ["b1", "b2"]):
        # Enough tasks for the workers' CPU to pass /proc's 10 ms tick: with 400 it read 0 now and then.
        out = cluster.measure(members, tasks=1_000, window=20, workers=1, concurrency=8)
        assert out["tasks"] == 2_000 and out["tasks_per_s"] > 0
        assert out["cpu_ms_per_task"]["brokers"] > 0 and out["cpu_ms_per_task"]["workers"] > 0, out


def test_water_filling_gives_a_capped_tenant_what_its_ceiling_let_it_take() -> None:
    from bench.fairness_adversarial import entitlement

    shares = {"a": 0.6, "b": 0.2, "c": 0.2}
    # c took 10 of 100 under its ceiling: a and b are entitled to the other 90, 3:1.
    assert entitlement({"a": 68, "b": 22, "c": 10}, shares, {"c"}) == {"c": 10, "a": 67.5, "b": 22.5}
    # Without a ceiling, c's 10 is the scheduler's doing: it is entitled to 20.
    assert entitlement({"a": 68, "b": 22, "c": 10}, shares, set()) == {"a": 60, "b": 20, "c": 20}


def test_the_adversarial_fairness_bench_tells_cronoq_from_its_baselines(tmp_path) -> None:
    import importlib.util

    from bench import fairness_adversarial

    result = fairness_adversarial.main(["--quick", "--json", str(tmp_path / "fair.json")], log=lambda line: None)
    assert json.loads((tmp_path / "fair.json").read_text())["rows"] == result["rows"]
    rows = {(row["workload"], row["discipline"]): row for row in result["rows"]}
    large = f"window_{result['windows'][1]}"
    for workload in ("skew", "trickle", "many sub-tenants", "ceiling", "priorities", "reweight"):
        # Counts of dispatches, exact and reproducible: SFQ keeps every backlogged tenant near its entitlement.
        assert rows[workload, "cronoq"][large]["worst"] >= 0.9, rows[workload, "cronoq"]
    assert rows["skew", "FIFO"][large]["worst"] == 0  # b waits behind a's whole backlog
    assert rows["many sub-tenants", "round-robin"][large]["worst"] < 0.05  # 1,001 groups: small gets 1/1,001
    assert rows["ceiling", "round-robin"][large]["worst"] < 0.8  # no weights
    for tenant in ("t", "s"):  # one task at a time; a steady 0.5/s
        assert rows["trickle", "FIFO"]["waits"][tenant]["started"] == 0  # behind the whole backlog
        assert rows["trickle", "cronoq"]["waits"][tenant]["p99_s"] < 2  # seconds: a few tasks' run times at most
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra: a (small) PNG too
        workload = fairness_adversarial.workloads(500, 1_000)[3]
        _, runs = fairness_adversarial.measure([workload.name], 500, 1_000, (50, 250), log=lambda line: None)
        fairness_adversarial.plot(workload, {label: run for (_, label), run in runs.items()}, tmp_path / "c.png", 250)
        assert (tmp_path / "c.png").stat().st_size > 0


def test_the_broker_and_the_simulation_agree_on_a_skewed_pool_with_a_ceiling() -> None:
    from bench.fairness_adversarial import broker_check

    out = broker_check({"a": 600, "b": 300, "c": 150}, 0.01, log=lambda line: None)
    for tenant in ("a", "b", "c"):
        assert abs(out["broker"][tenant] - out["simulation"][tenant]) < 0.05, out
    # c weighs 1 of 5 (0.2 of the dispatches) but runs one task at a time in 10 slots: the ceiling binds.
    assert out["broker"]["c"] < 0.15 and out["broker"]["a"] > 0.6, out


def test_the_estimates_bench_explains_a_sample_and_judges_each_against_its_start(capsys) -> None:
    from bench import estimates

    samples = estimates.run_core(3.0, 5)
    assert samples and all(s.outcome in ("started", "started before explain", "expired", "not started")
                           for s in samples)
    assert any(s.estimate is not None and s.wait is not None for s in samples)
    summary = estimates.summarize(samples)
    assert summary["explained"] == len(samples) and 0 <= summary["new"]["within_2x"] <= 1
    # Through a real broker and worker, briefly: every explained task is judged, nothing is a speed.
    assert estimates.main(["--seconds", "3", "--every", "20"]) == 0
    out = capsys.readouterr().out
    assert "explain now" in out and "before (queued work only)" in out


def test_the_shares_bench_counts_shares_rates_and_floors_as_the_rules_say() -> None:
    # bench/shares.py's simulated parts, two simulated seconds each (the simulation is exact: no timing here).
    from bench import shares

    quiet = lambda line: None  # noqa: E731
    by_mode = shares.modes(2.0, quiet)
    assert by_mode["dispatches"]["dispatches"]["slow"] == pytest.approx(0.5, abs=0.01)
    assert by_mode["dispatches"]["worker_time"]["slow"] == pytest.approx(10 / 11, abs=0.01)
    assert by_mode["runtime"]["worker_time"]["slow"] == pytest.approx(0.5, abs=0.02)
    assert by_mode["cost"]["cost"]["slow"] == pytest.approx(0.5, abs=0.02)
    rated = shares.rates(2.0, quiet)["dispatches"]
    assert rated["limited_first_second"] <= 10 and rated["limited_busiest_later_second"] <= 5
    assert rated["others_per_s"] == pytest.approx(rated["others_capacity_per_s"], rel=0.02)
    floors = shares.minimums(2.0, quiet)["rows"]
    assert floors["dispatches, minimum 2"]["light_least_running"] == 2
    assert floors["dispatches, no minimum"]["light_mean_running"] < 1
    (row,) = shares.dispatch_cost([200], 50, quiet)
    assert set(row) == {"backlog", "tenants", *shares.DISPATCH_MODES}


def test_close_to_wire_takes_each_figure_both_ways_and_judges_it_against_its_bound(capsys) -> None:
    from bench import close_to_wire

    assert close_to_wire.main(["--only", "sequential,throughput,memory", "--repeat", "1", "--tasks", "200",
                               "--window", "20", "--light-tasks", "20", "--memory-tasks", "2000", "--no-write"]) == 0
    rows = {line.split("  ")[0].strip(): line for line in capsys.readouterr().out.splitlines() if "bound" in line}
    # cronoq waits with `call`, then with submit and result, each beside the same relay runs; and the broker that
    # gives up the results store, for what that costs.
    assert set(rows) == {"sequential", "sequential (submit, result)", "throughput", "throughput (submit, result)",
                         "throughput (no store)", "memory"}
    assert all(line.endswith("met") for line in rows.values()), "each row is judged: met or NOT met"
    assert "B/task at 2,000 queued" in rows["memory"]

    # The judgement: throughput is "at least" its bound, the round trip "at most"; memory in bytes.
    figure = {"unit": "x", "relay": 1.0, "cronoq": 1.0, "target_ratio": 1.5}
    table = close_to_wire.table([{**figure, "figure": "sequential", "way": "call", "ratio": 1.6},
                                 {**figure, "figure": "throughput", "way": "submit", "ratio": 0.9,
                                  "target_ratio": 0.85},
                                 {"figure": "memory", "cronoq": 601.0, "tasks": 10, "target_bytes": 600.0}])
    assert [line.endswith("NOT met") for line in table.splitlines()] == [True, False, True]
    assert "throughput (submit, result)" in table

    with pytest.raises(SystemExit, match="unknown figure"):
        close_to_wire.main(["--only", "latency"])
    with pytest.raises(SystemExit, match="--probe-seconds must be at least 10"):
        close_to_wire.main(["--probe-seconds", "5"])


def test_an_ab_run_takes_turns_and_runs_each_side_s_own_copy(capsys, tmp_path) -> None:
    from bench import ab
    from bench.common import ROOT

    # Both sides the checkout itself (a folder holding `cronoq`), so no git history is needed.
    assert ab.main([str(ROOT), str(ROOT), "--rounds", "2", "--tasks", "40", "--no-relay"]) == 0
    out = capsys.readouterr().out
    rounds = [line.split()[2] for line in out.splitlines() if line.strip().startswith("round")]
    assert rounds == ["A", "B", "B", "A"], "the order turns round every round"
    assert "B's p50 below A's in" in out and "of 2 rounds" in out
    with pytest.raises(SystemExit, match="neither a folder holding a cronoq package nor a revision git knows"):
        ab.main([str(tmp_path), str(ROOT), "--rounds", "1", "--tasks", "10", "--no-relay"])


def test_hops_splits_every_round_trip_of_both_sides() -> None:
    import re
    import subprocess
    import sys

    from bench.common import ROOT

    # A process of its own: the tracer wraps cronoq's socket calls for the rest of the process it runs in.
    timed = "cronoq.store.journal.fence:Fence.check"  # before each journal write: two a task
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "hops.py"), "--tasks", "30", "--rounds", "1",
                           "--time", timed], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The round trips are found in every process's events (the tracer reached the client, the broker and the
    # workers) on both sides; a heartbeat in the middle of one may leave it out.
    traced = re.findall(r"round 1 (relay|cronoq): p50 [0-9.]+ ms, (\d+) of 30 round trips traced", done.stderr)
    assert sorted(side for side, _ in traced) == ["cronoq", "relay"], done.stderr
    assert all(int(count) >= 27 for _, count in traced), done.stderr
    tables = [[[cell.strip() for cell in line.split("|")[1:-1]] for line in block.splitlines()[2:]]
              for block in done.stdout.split("\n\n") if block.startswith("| ")]
    assert len(tables) == 4, done.stdout  # the parts of both sides, cronoq's transits, its broker's steps, timed
    parts, transits, steps = ({row[0]: row[1:] for row in table} for table in tables[:3])
    [[function, process, per_task, _]] = tables[3]
    assert (function, process) == (f"`{timed}`", "broker")
    assert 1.8 <= float(per_task) <= 2.2, per_task  # (a retried write or a heartbeat's commit may add one)

    def number(cell: str) -> bool:
        return cell.replace(",", "").isdigit()

    for part in ("client → broker", "broker holds the request", "broker → worker", "worker holds the task",
                 "worker → broker", "broker holds the result", "broker → client", "client sent → client received"):
        assert all(number(cell) for cell in parts[part]), (part, parts[part])
    assert len(transits) == 4 and all(number(cell) for row in transits.values() for cell in row), transits
    # cronoq's broker notes each step of its pass; a step renamed in the broker would leave a dash here.
    assert len(steps) == 8 and all(number(row[0]) for row in steps.values()), steps


def test_a_burst_is_accepted_whole(capsys) -> None:
    from bench import burst

    assert burst.main(["--tasks", "300", "--rounds", "2"]) == 0
    assert "A burst of 300 submits, durable with tokens: median" in capsys.readouterr().out


def test_scrapes_pings_through_each_kind_of_reading() -> None:
    from bench import scrapes

    lines: list[str] = []
    rows = scrapes.measure(pools=1, tenants=50, seconds=0.5, every=0.1, out=lines.append)
    assert [row["phase"] for row in rows] == ["quiet (dashboard sampling)", "/metrics scraped",
                                              "dashboard overview read", "all pools' history read"]
    assert rows[0]["reads"] == 0 and all(row["reads"] > 0 for row in rows[1:])
    for row in rows:
        assert row["pings"] > 10 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["worst_ms"]
    assert lines[0] == "1 pools × 50 tenants queued; pings for 0.5 s a phase" and len(lines) == 5
