"""cronoq's benchmark suite: `python bench/run.py` (see bench/README.md).

Nothing here may import cronoq at package level: the arq peer runs these
modules inside a virtualenv of its own, where cronoq is not installed.
"""
