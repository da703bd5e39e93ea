"""The shared scheduling vectors (docs/scheduling-vectors/), replayed through the Python core.

rust/tests/scheduling_vectors.rs replays the same files through the Rust crate's embedded scheduler: the two
cores agree on every decision of every vector. The random scenarios come from Hypothesis
(`tests.core.scheduling_vectors.scenarios`, and `tree_scenarios` over tenant trees); `test_emit_random_scenarios`
and `test_emit_random_tree_scenarios` write each one they draw to the directory named by
CRONOQ_EMIT_SCHEDULING_VECTORS, when that is set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.core import scheduling_vectors
from tests.core.scheduling_vectors import VECTORS, emit, replay, scenarios, tree_scenarios

NAMES = sorted(path.stem for path in VECTORS.glob("*.json"))
EMIT_DIR = os.environ.get("CRONOQ_EMIT_SCHEDULING_VECTORS")


def test_the_hand_written_vectors_on_disk_are_what_the_cases_write():
    """Edit tests/core/scheduling_vectors.py and run `python -m tests.core.scheduling_vectors`, not the JSON."""
    on_disk = {path.name: path.read_text() for path in VECTORS.glob("*.json") if not path.name.startswith("hypothesis-")}
    assert on_disk == scheduling_vectors.rendered()


def test_there_are_random_scenarios_too():
    assert len([n for n in NAMES if n.startswith("hypothesis-")]) >= 10


@pytest.mark.parametrize("name", NAMES)
def test_the_python_core_makes_every_decision_of(name: str):
    vector = json.loads((VECTORS / f"{name}.json").read_text())
    assert replay(vector) == []


def test_a_vector_can_fail():
    """A changed expectation is caught: the replay is not vacuous."""
    vector = json.loads((VECTORS / "weights-three-to-one.json").read_text())
    dispatch = next(step for step in vector["steps"] if step["op"] == "dispatch")
    dispatch["expect"][0], dispatch["expect"][1] = dispatch["expect"][1], dispatch["expect"][0]
    assert len(replay(vector)) == 1


@settings(max_examples=int(os.environ.get("CRONOQ_EMIT_COUNT", "20")) if EMIT_DIR else 20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_emit_random_scenarios(vector):
    """Every drawn scenario replays on a fresh core as it was recorded (the recording is deterministic); with
    CRONOQ_EMIT_SCHEDULING_VECTORS set, it is also written there as a new vector."""
    assert replay(vector) == []
    if EMIT_DIR:
        emit(vector, Path(EMIT_DIR))


@settings(max_examples=int(os.environ.get("CRONOQ_EMIT_COUNT", "20")) if EMIT_DIR else 20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tree_scenarios())
def test_emit_random_tree_scenarios(vector):
    """As test_emit_random_scenarios, over tenant trees (the vectors it writes need "tenant_trees")."""
    assert replay(vector) == []
    if EMIT_DIR:
        emit(vector, Path(EMIT_DIR))
