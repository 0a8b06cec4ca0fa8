"""Shared markdown files (docs/results.md, docs/performance.md) that several writers own a
section of: each writer replaces only its own section."""

from __future__ import annotations

import re
from pathlib import Path

from csclip.errors import ConfigError


def update_marked_section(path: str | Path, marker: str, body: str, *,
                          heading: str | None = None, title: str = "# Results") -> Path:
    """Replace the text between `<!-- BEGIN marker -->` and `<!-- END marker -->` in `path`
    with `body`, leaving every other section untouched.

    Without the markers: when `heading` is given and a section starting with it exists
    (up to the next `## ` heading), that section becomes the marked block; otherwise the
    block is appended. A missing file starts with `title`.
    Raises ConfigError for unbalanced markers, and for a marked block that holds more
    `## ` sections than `body` (someone else's section written inside the markers, which
    the replacement would delete).
    """
    path = Path(path)
    begin, end = f"<!-- BEGIN {marker} -->", f"<!-- END {marker} -->"
    text = path.read_text() if path.exists() else title + "\n"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text and text.index(begin) < text.index(end):
        head, rest = text.split(begin, 1)
        current, tail = rest.split(end, 1)
        _refuse_foreign_sections(path, marker, current, body)
        text = head + block + tail
    elif begin in text or end in text:
        raise ConfigError(f"{path}: unbalanced {marker!r} markers; keep both "
                          f"{begin} and {end}, begin first")
    elif heading and (found := _heading_section(heading).search(text)):
        text = text[:found.start()] + block + "\n\n" + text[found.end():].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text.rstrip("\n") + "\n")
    return path


def _heading_section(heading: str) -> re.Pattern[str]:
    return re.compile(re.escape(heading) + r".*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)


def _refuse_foreign_sections(path: Path, marker: str, current: str, body: str) -> None:
    # A writer owns one block, whose `## ` headings it writes (their text may change from
    # run to run); more headings there than in its new body are another writer's.
    headings = re.compile(r"^## .*$", re.MULTILINE)
    present, written = headings.findall(current), headings.findall(body)
    if len(present) > len(written):
        foreign = [h for h in present if h not in written] or present[len(written):]
        raise ConfigError(
            f"{path}: the {marker!r} block holds {len(present)} sections, of which this "
            f"writer writes {len(written)}; replacing it would delete "
            f"{', '.join(repr(h) for h in foreign)}. Move that text out of the "
            f"<!-- BEGIN {marker} --> ... <!-- END {marker} --> markers and run again")
