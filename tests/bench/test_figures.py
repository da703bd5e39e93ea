"""The generated tables of bench/README.md and README.md are what bench/figures.py writes from the committed
result files.

A run's file in bench/results/ is the source of its figures: change a table by hand, or commit a newer result
without running `python bench/figures.py`, and the first test fails, naming the table.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path

from bench import figures

ROOT = Path(__file__).resolve().parents[2]


def _committed_results() -> list[str]:
    """The result files git tracks (bench/results/ is ignored, so a local run's files are not quoted until
    committed); every file there when this is no git checkout (a tarball)."""
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "bench/results"],
                                capture_output=True, text=True, check=True).stdout.split()
        return [Path(name).name for name in listed if name.endswith(".json")]
    return [path.name for path in figures.RESULTS.glob("*.json")]


@functools.cache
def _built() -> dict[str, list[str]]:
    return figures.tables(_committed_results())


def test_every_generated_table_is_what_the_committed_results_give() -> None:
    built = _built()
    assert set(built) == {"run", "soak", "filldrain", "cluster", "rust", "fairness", "shares", "wire"}
    stale = figures.differences(figures.README.read_text(), built, every=True)
    assert stale == [], f"run `python bench/figures.py` and commit bench/README.md: {stale} differ"


def test_the_front_pages_tables_are_generated_too_and_link_from_where_it_stands() -> None:
    text = (ROOT / "README.md").read_text()
    mine = figures.for_page(_built(), "bench/")
    assert "<!-- figures:start run -->" in text and "](bench/results/" in "\n".join(mine["run"])
    stale = figures.differences(text, mine)
    assert stale == [], f"run `python bench/figures.py` and commit README.md: {stale} differ"


def test_a_figure_changed_by_hand_is_found_and_written_back() -> None:
    built = _built()
    text = figures.README.read_text()
    soak = "\n".join(built["soak"])
    assert soak in text
    edited = text.replace(soak, soak.replace("| tasks/s |", "| tasks/s | 99,999 (typed by hand) |", 1))
    assert figures.differences(edited, built) == ["soak"]
    assert figures.rewrite(edited, built) == text


def test_a_table_without_its_markers_is_reported_missing() -> None:
    built = _built()
    text = figures.README.read_text().replace("<!-- figures:start cluster -->", "<!-- (markers lost) -->")
    assert "cluster" in figures.differences(text, built, every=True)


def test_the_newest_file_of_a_kind_is_the_one_quoted(tmp_path: Path) -> None:
    # Two cluster runs: the table names the later one, whatever order the names come in.
    for stamp, rate in (("20300101T000000Z", 1000.0), ("20300102T000000Z", 2000.0)):
        row = {"median": {"tasks_per_s": rate, "cpu_ms_per_task": {"brokers": 0.02, "workers": 0.01, "client": 0.02}}}
        (tmp_path / f"cluster-{stamp}.json").write_text(
            json.dumps({"args": {}, "machine": {"cpus": 2}, "rows": {"one broker": row}}))
    built = figures.tables(["cluster-20300102T000000Z.json", "cluster-20300101T000000Z.json"], tmp_path)
    table = "\n".join(built["cluster"])
    assert "cluster-20300102T000000Z.json" in table and "| one broker | 2,000 |" in table
