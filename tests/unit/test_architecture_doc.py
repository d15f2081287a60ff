"""docs/architecture.md names every package of ``ingest/`` and ``pipelines/``, and no other."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = re.compile(r"`((?:ingest|pipelines)(?:/[A-Za-z0-9_]+)*/)`")


def _packages_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Packages\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _named() -> set[str]:
    """The packages the section's table gives a row of their own (the first cell of a row)."""
    named = set()
    for line in _packages_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = PACKAGE.fullmatch(cells[0]) if line.startswith("|") else None
        if match:
            named.add(match.group(1))
    return named


def _packages() -> set[str]:
    found = set()
    for top in ("ingest", "pipelines"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(init.parent.relative_to(ROOT).as_posix() + "/")
    return found


def test_the_doc_lists_every_package() -> None:
    missing = sorted(_packages() - _named())
    assert not missing, f"docs/architecture.md's package list lacks {missing}"


def test_the_doc_lists_no_package_that_does_not_exist() -> None:
    unknown = sorted(_named() - _packages())
    assert not unknown, f"docs/architecture.md names packages that do not exist: {unknown}"
