"""Shared by the benchmarks: replace one section of docs/performance.md in place."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def write_section(heading: str, section: str, path: Path = DOCS) -> None:
    """Replace the section that starts with `heading` (up to the next `## `), or append
    it, leaving every other benchmark's section untouched."""
    text = path.read_text() if path.exists() else "# Performance\n"
    pattern = re.compile(re.escape(heading) + r".*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def publish(heading: str, section: str, write: bool) -> None:
    """Print a benchmark's section; with `write`, also put it in docs/performance.md."""
    print(section)
    if write:
        write_section(heading, section)
