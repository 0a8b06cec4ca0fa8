"""Frozen benchmark files: `csclip benchmark build` writes the items with provenance and a
content hash; `csclip evaluate --benchmark FILE` scores exactly those items, the same in
any process; a tampered or bad file is a one-line error."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from csclip.authors import read_verbatim_records
from csclip.config.world import WorldConfig
from csclip.entry import benchmark as benchmark_entry
from csclip.entry import evaluate as evaluate_entry
from csclip.errors import DataError
from csclip.eval.benchmark_file import (
    build_frozen_benchmark,
    images_digest,
    prepare_frozen,
    read_benchmark_file,
    write_benchmark_file,
)
from csclip.eval.halftruth import BenchmarkConfig, benchmark_hash, build_paper_benchmark
from csclip.model import create_bundle, save_checkpoint, spec_of
from csclip.world import iter_world
from tests.conftest import REPO_ROOT

UNITS = Path(__file__).parent / "fixtures" / "halftruth_paper" / "units_older.json"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """A small distinct PNG at every image path of the unit file."""
    root = tmp_path_factory.mktemp("images")
    for index, record in enumerate(json.loads(UNITS.read_text())):
        if record.get("image_path"):
            path = root / record["image_path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), (index * 20 % 256, 90, 255 - index * 15)).save(path)
    return root


@pytest.fixture(scope="module")
def frozen_file(tmp_path_factory, images) -> Path:
    path = tmp_path_factory.mktemp("bench") / "paper.json"
    assert benchmark_entry.main(["build", "--units", str(UNITS), "--protocol", "paper",
                                 "--image-root", str(images), "--out", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    tiny = create_bundle("csclip-tiny")
    return save_checkpoint(tiny.model, spec_of(tiny.model, tiny.name),
                           tmp_path_factory.mktemp("ckpt") / "final")


def test_file_holds_the_paper_items_with_provenance_and_hash(frozen_file, images):
    frozen = read_benchmark_file(frozen_file)
    built = build_paper_benchmark(read_verbatim_records(str(UNITS)))
    assert frozen.benchmark.items == built.items and frozen.benchmark.protocol == "paper"
    # The hash covers the items and the images' bytes.
    digests = {image_id: hashlib.sha256((images / path).read_bytes()).hexdigest()
               for image_id, path in frozen.images.items()}
    assert frozen.image_sha256 == digests
    assert frozen.content_hash == benchmark_hash(built.items, "paper", images_digest(digests))
    assert frozen.content_hash != built.content_hash
    data = json.loads(frozen_file.read_text())
    assert data["content_hash"] == frozen.content_hash
    assert data["images_digest"] == images_digest(digests)
    assert data["built_from"]["num_samples"] == 5000 and data["built_from"]["seed"] == 42
    item = data["items"][0]
    assert item["image"] == "val2014/COCO_val2014_000000000101.jpg"
    assert {"image_id", "sample_id", "unit", "foil", "condition"} <= set(item)
    assert sum(data["counts"].values()) == len(data["items"])


def test_build_prints_the_hash_and_counts(frozen_file, images, capsys, tmp_path):
    assert benchmark_entry.main(["build", "--units", str(UNITS), "--image-root", str(images),
                                 "--out", str(tmp_path / "again.json")]) == 0
    out = capsys.readouterr().out
    assert read_benchmark_file(frozen_file).content_hash in out and "Swap 10" in out
    # Same input, same file, byte for byte.
    assert (tmp_path / "again.json").read_bytes() == frozen_file.read_bytes()


def _evaluate(checkpoint: Path, frozen_file: Path, images: Path, out: Path) -> list[str]:
    return ["--checkpoint", str(checkpoint), "--benchmark", str(frozen_file), "--image-root",
            str(images), "--out", str(out), "--set", "tracking.enabled=false",
            "--set", "benchmark.num_bootstrap=0"]


def _scores(out: Path):
    return pq.read_table(out / "scores.parquet").to_pylist()


@pytest.mark.slow
def test_same_scores_twice_and_in_another_process(checkpoint, frozen_file, images, tmp_path,
                                                  capsys):
    digest = read_benchmark_file(frozen_file).content_hash
    for run in ("a", "b"):
        assert evaluate_entry.main(_evaluate(checkpoint, frozen_file, images, tmp_path / run)) == 0
        out = capsys.readouterr().out
        assert digest in out and "protocol paper" in out
    assert _scores(tmp_path / "a") == _scores(tmp_path / "b")
    assert len(_scores(tmp_path / "a")) == len(read_benchmark_file(frozen_file).benchmark.items)
    command = [sys.executable, "-m", "csclip.cli", "evaluate",
               *_evaluate(checkpoint, frozen_file, images, tmp_path / "c")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    assert digest in result.stdout
    assert _scores(tmp_path / "c") == _scores(tmp_path / "a")
    assert digest[:19] in (tmp_path / "c" / "table1.md").read_text()


def _one_line_error(argv: list[str], capsys) -> str:
    assert evaluate_entry.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_tampered_and_bad_files_are_refused_in_one_line(checkpoint, frozen_file, images,
                                                        tmp_path, capsys):
    text = frozen_file.read_text()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(text.replace('"half_truth": "man and red jacket"',
                                     '"half_truth": "man and red shirt"', 1))
    assert tampered.read_text() != text
    err = _one_line_error(_evaluate(checkpoint, tampered, images, tmp_path / "o"), capsys)
    assert "content hash" in err and "edited or damaged" in err
    broken = tmp_path / "broken.json"
    broken.write_text(text[: len(text) // 2])
    assert "not valid JSON" in _one_line_error(_evaluate(checkpoint, broken, images, tmp_path / "o"),
                                               capsys)
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"positive_components": []}]))
    assert "not a benchmark file" in _one_line_error(
        _evaluate(checkpoint, other, images, tmp_path / "o"), capsys)
    missing_field = json.loads(text)
    del missing_field["items"][3]["anchor"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(missing_field))
    assert "items[3]" in _one_line_error(_evaluate(checkpoint, bad, images, tmp_path / "o"),
                                         capsys)
    assert "not found" in _one_line_error(
        _evaluate(checkpoint, tmp_path / "none.json", images, tmp_path / "o"), capsys)


def test_world_file_takes_its_images_from_the_world(tmp_path):
    frozen = build_frozen_benchmark(None, BenchmarkConfig())
    assert frozen.benchmark.protocol == "csclip" and set(frozen.images.values()) == {None}
    path = write_benchmark_file(frozen, tmp_path / "world.json")
    again = read_benchmark_file(path)
    with pytest.raises(DataError, match="no path in the file"):
        prepare_frozen(again)
    records = list(iter_world(WorldConfig(), splits=("val",)))
    prepared = prepare_frozen(again, records)
    assert set(prepared.images) == {i.image_id for i in again.benchmark.items}


def test_csclip_protocol_reads_the_unit_file_through_our_validation(images):
    frozen = build_frozen_benchmark(str(UNITS), BenchmarkConfig(protocol="csclip"),
                                    image_root=str(images))
    assert frozen.benchmark.protocol == "csclip"
    paper = build_frozen_benchmark(str(UNITS), BenchmarkConfig(), image_root=str(images))
    assert frozen.content_hash != paper.content_hash


def test_build_flag_errors_are_one_line(tmp_path, capsys):
    assert benchmark_entry.main(["build", "--units", str(tmp_path / "none.json"),
                                 "--out", str(tmp_path / "x.json")]) == 2
    assert "not found" in capsys.readouterr().err
    assert benchmark_entry.main(["build", "--num-samples", "-3",
                                 "--out", str(tmp_path / "x.json")]) == 2
    assert "num-samples" in capsys.readouterr().err


def test_evaluate_on_an_authors_unit_file_points_at_benchmark_build(capsys):
    err = _one_line_error(["--units", str(UNITS), "--set", "tracking.enabled=false"], capsys)
    assert "csclip benchmark build" in err
