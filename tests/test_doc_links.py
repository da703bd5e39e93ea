"""Every relative link in the project's docs leads somewhere: the file exists, and a `#section` names a heading
of it (as GitHub makes anchors from headings).

Checked here because the benchmark docs are the most linked: bench/history/'s investigations link to each
other, to bench/README.md and to docs/, and README.md and docs/ link into them. A section renamed or a file
moved breaks such links silently otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "rust" / "README.md", ROOT / "bench" / "README.md",
         *sorted((ROOT / "bench" / "history").glob("*.md")), *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_the_anchor_rule_matches_githubs() -> None:
    assert anchor("The suite (`bench/run.py`)") == "the-suite-benchrunpy"
    assert anchor("Retention and the results store (`python -m bench.retention`)") == \
        "retention-and-the-results-store-python--m-benchretention"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        path_part, _, section = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif section and path.suffix == ".md":
            if section not in {anchor(h) for h in HEADING.findall(path.read_text())}:
                broken.append(f"{target}: no such section")
    assert broken == []
