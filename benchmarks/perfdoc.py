"""Shared by the benchmarks: replace their own section of docs/performance.md in place
(csclip.markdoc, the writer docs/results.md's sections use too)."""

from __future__ import annotations

import re
from pathlib import Path

from csclip.markdoc import update_marked_section

DOCS = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def write_section(heading: str, section: str, path: Path = DOCS) -> None:
    """Replace the benchmark's section (marked by a slug of `heading`; an older unmarked
    section that starts with `heading` is taken over), or append it, leaving every other
    benchmark's section untouched."""
    marker = re.sub(r"[^a-z0-9]+", "-", heading.lstrip("#").strip().lower()).strip("-")
    update_marked_section(path, marker, section, heading=heading, title="# Performance")


def publish(heading: str, section: str, write: bool) -> None:
    """Print a benchmark's section; with `write`, also put it in docs/performance.md."""
    print(section)
    if write:
        write_section(heading, section)
