"""The public answer types (cronoq/answers.py): what they promise beyond their own fields."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from cronoq.answers import Explanation, TaskInfo


def test_an_explanation_carries_the_task_s_fields_as_task_info_has_them():
    """Explanation writes TaskInfo's fields out again (to keep the order they have always been given in, which
    inheriting would change); they must not drift: same names, types and defaults."""
    info = {f.name: (f.type, f.default) for f in dataclasses.fields(TaskInfo)}
    explained = {f.name: (f.type, f.default) for f in dataclasses.fields(Explanation)}
    drifted = {name: (info[name], explained.get(name)) for name in info if explained.get(name) != info[name]}
    assert not drifted, f"Explanation's task fields differ from TaskInfo's: {drifted}"


def test_the_rust_crate_s_task_info_has_the_same_fields():
    """The Rust `TaskInfo` (rust/src/answers.rs, the fields `task_answer!` gives every answer) names the fields of
    Python's, in the same order: a field the broker's `info` adds must reach both clients."""
    source = (Path(__file__).resolve().parents[1] / "rust" / "src" / "answers.rs").read_text()
    macro = source[source.index("macro_rules! task_answer"):]
    start = macro.index("pub struct $name {")
    body = macro[start:macro.index("$( $(#[$field_meta])* pub $field: $type, )*", start)]
    rust_fields = re.findall(r"^\s*pub (\w+):", body, flags=re.M)
    assert rust_fields == [f.name for f in dataclasses.fields(TaskInfo)]
