"""The public answer types (cronoq/answers.py): what they promise beyond their own fields."""

from __future__ import annotations

import dataclasses

from cronoq.answers import Explanation, TaskInfo


def test_an_explanation_carries_the_task_s_fields_as_task_info_has_them():
    """Explanation writes TaskInfo's fields out again (to keep the order they have always been given in, which
    inheriting would change); they must not drift: same names, types and defaults."""
    info = {f.name: (f.type, f.default) for f in dataclasses.fields(TaskInfo)}
    explained = {f.name: (f.type, f.default) for f in dataclasses.fields(Explanation)}
    drifted = {name: (info[name], explained.get(name)) for name in info if explained.get(name) != info[name]}
    assert not drifted, f"Explanation's task fields differ from TaskInfo's: {drifted}"
