"""The package layout's boundaries: arrows point down only (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package,forbidden", [
    # Evaluation never imports training or the ablation; the ablation may import both.
    ("csclip.eval.pipeline, csclip.eval.report, csclip.eval.suites, csclip.eval.retrieval, "
     "csclip.eval.zeroshot",
     ("csclip.train", "csclip.ablation", "csclip.demo", "ray")),
    # Extraction never imports evaluation or training.
    ("csclip.extract.pipeline, csclip.extract.authors, csclip.extract.captions",
     ("csclip.eval", "csclip.train", "csclip.ablation")),
])
def test_stage_packages_do_not_import_upward(package, forbidden):
    code = (f"import sys, {package}; bad = [m for m in sys.modules if m.startswith({forbidden!r})]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_marked_section_takes_over_an_unmarked_heading_section(tmp_path):
    from csclip.markdoc import update_marked_section

    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## A (bench_a.py)\nold a\n\n## B\nkeep b\n")
    update_marked_section(doc, "a", "## A (bench_a.py)\nnew a", heading="## A (bench_a.py)")
    update_marked_section(doc, "a", "## A (bench_a.py)\nnewer a", heading="## A (bench_a.py)")
    text = doc.read_text()
    assert "old a" not in text and "new a\n" not in text and text.count("newer a") == 1
    assert "## B\nkeep b" in text and text.index("newer a") < text.index("## B")
