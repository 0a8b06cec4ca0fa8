"""What a new user types in the first hour, for `csclip evaluate` and `csclip benchmark`:
a named suite that is not under --data-root is refused before any model loads (unless
--allow-missing, and then the suite average says "k of n benchmarks"); what `csclip
extract --out` writes is taken as-is by `benchmark build`, `evaluate --units` and
`train`, with --image-root joined to its relative image paths; the same random-init
evaluation gives the same numbers; a missing checkpoint is "checkpoint not found". The
entry points run in-process, without Ray."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "suites"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # csclip.entry.common.LOG_FORMAT
# The smallest evaluation: a tiny model on a few world records, the half-truth items only
# (no bootstrap, image-side items or world suites), no MLflow.
SMALL = ["--model", "csclip-tiny", "--set", "model.image_size=32",
         "--set", "data.world.num_val=4", "--set", "data.world.image_size=32",
         "--set", "benchmark.num_bootstrap=0", "--set", "benchmark.image_side=false",
         "--set", "suites.retrieval=false", "--set", "suites.num_world_pairs=0",
         "--set", "suites.num_zeroshot_items=0", "--set", "tracking.enabled=false"]


def _error_line(code: int, capsys) -> str:
    """The one `error:` line of an entry point that exited 2 (nothing else but log lines)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the refusal must come first."""
    import csclip.eval.pipeline  # the module that loads the models, patched where it looks

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(csclip.eval.pipeline, "bundle_from_config", refuse)
    monkeypatch.setattr(csclip.eval.pipeline, "load_bundle", refuse)


def _one_benchmark_root(tmp_path: Path) -> Path:
    """A --data-root holding one of the paper's sixteen (COCO-Counterfactuals' fixture)."""
    root = tmp_path / "bench"
    shutil.copytree(FIXTURES / "coco_cf", root / "coco_cf")
    return root


# ---------------------------------------------------------------------------------------
# A suite named on the command line and not under --data-root
# ---------------------------------------------------------------------------------------

def test_a_named_suite_not_under_data_root_is_refused_before_the_model_loads(
        tmp_path, capsys, no_model):
    from csclip.entry.evaluate import main

    missing = tmp_path / "nonexistent"
    line = _error_line(main([*SMALL, "--suite", "sugarcrepe", "--data-root", str(missing),
                             "--out", str(tmp_path / "eval")]), capsys)
    assert f"sugarcrepe: not found under {missing}/sugarcrepe (expects " in line  # the layout
    assert f"found under {missing}: nothing" in line and "--allow-missing" in line
    # The paper's sixteen with one on disk: the same refusal, saying 15 of 16.
    root = _one_benchmark_root(tmp_path)
    line = _error_line(main([*SMALL, "--suite", "paper", "--data-root", str(root),
                             "--out", str(tmp_path / "eval")]), capsys)
    assert "15 of 16 named suites not found" in line and "coco_cf/" in line
    assert not (tmp_path / "eval" / "table1.md").exists()


def test_allow_missing_scores_what_is_there_and_says_k_of_n(tmp_path, capsys, monkeypatch):
    import csclip.eval.pipeline
    from csclip.entry.evaluate import main

    logged = {}  # what log_comparison sends to MLflow: each model's run, its metric keys

    def log_comparison(reports, files, tracking_uri, experiment, params):
        logged.update({name: report.metrics for name, report in reports.items()})
        return "run-id"

    monkeypatch.setattr(csclip.eval.pipeline, "log_comparison", log_comparison)
    root = _one_benchmark_root(tmp_path)
    out = tmp_path / "eval"
    argv = [*SMALL, "--suite", "paper", "--data-root", str(root), "--allow-missing",
            "--out", str(out), "--set", "tracking.enabled=true", "--set",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "suite (1 of 16 benchmarks)" in printed
    assert "suite (1 of 16 benchmarks)" in (out / "capabilities.md").read_text()
    rows = list(csv.DictReader((out / "capabilities.csv").open()))
    assert ("csclip-tiny", "suite (1 of 16 benchmarks)") == (rows[-1]["label"],
                                                            rows[-1]["capability"])
    assert "mean over 1 of 16 benchmarks" in (out / "suites.md").read_text()
    assert logged["csclip-tiny"]["suite_benchmarks_found"] == 1
    assert logged["csclip-tiny"]["suite_benchmarks_asked"] == 16
    assert "coco_cf_i2t" in logged["csclip-tiny"]


# ---------------------------------------------------------------------------------------
# What extract writes, the next command reads; --image-root with --units
# ---------------------------------------------------------------------------------------

CAPTIONS = ("a red cube on a blue table", "a small dog next to a green car",
            "a man riding a brown horse", "a yellow bird sitting on a wooden fence",
            "two black cats under a white chair", "a woman holding a red umbrella")


@pytest.fixture(scope="module")
def extract_out(tmp_path_factory) -> Path:
    """The --out folder of a rules extraction of CAPTIONS (JSON Lines whose image paths are
    relative to images/, as a user's file often is), written by extract's own code; the
    backend stage runs in this process instead of in Ray Data."""
    from PIL import Image

    from csclip.extract import pipeline

    tmp = tmp_path_factory.mktemp("extract")
    (tmp / "images").mkdir()
    lines = []
    for index, caption in enumerate(CAPTIONS):
        Image.new("RGB", (32, 32), (40 * index, 90, 160)).save(tmp / "images" / f"{index}.png")
        lines.append(json.dumps({"image": f"{index}.png", "image_id": str(index),
                                 "caption": caption, "split": "val"}))
    (tmp / "captions.jsonl").write_text("\n".join(lines) + "\n")

    def in_process(rows, config, engine, attempt):
        yield pipeline.backend_stage(rows, backend=config.backend.name)

    config = pipeline.ExtractConfig.model_validate({
        "input": {"format": "jsonl", "uri": str(tmp / "captions.jsonl")},
        "backend": {"name": "rules"}, "output": {"uri": str(tmp / "out")},
        "tracking": {"enabled": False}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "_run_backend", in_process)
        summary = pipeline.run_extraction(config)
    assert summary.with_units == len(CAPTIONS)
    return tmp


def test_extract_out_is_taken_by_benchmark_build_evaluate_and_train(extract_out, tmp_path,
                                                                    capsys):
    from csclip.config.train import DataConfig
    from csclip.entry import benchmark, evaluate
    from csclip.errors import DataError
    from csclip.train.shards import plan_shards
    from csclip.train.source_shards import source_shards

    out, images = extract_out / "out", extract_out / "images"
    frozen = tmp_path / "bench.json"
    assert benchmark.main(["build", "--units", str(out), "--image-root", str(images),
                           "--out", str(frozen)]) == 0, capsys.readouterr().err
    assert "43 items over 5 images" in capsys.readouterr().out  # the cube has no relation
    # Relative to --image-root in the file: verified against another copy of the images.
    copy = shutil.copytree(images, tmp_path / "copy")
    assert benchmark.main(["verify", str(frozen), "--image-root", str(copy)]) == 0
    assert evaluate.main([*SMALL, "--units", str(out), "--image-root", str(images),
                          "--out", str(tmp_path / "eval")]) == 0, capsys.readouterr().err
    assert "43 items" in (tmp_path / "eval" / "halftruth.md").read_text()
    # train resolves the folder the same way (--out, then its units/) and writes its rows
    # once as shards beside them, the images read under --image-root (a copy of the
    # folder, so that the other tests see extract's output alone).
    trained = shutil.copytree(out, tmp_path / "train_out")
    data = DataConfig(units_uri=str(trained), image_root=str(images), split="val", batch_size=2)
    written = source_shards(data, seed=0, preprocess_cfg={"size": 32}, model_name="csclip-tiny")
    assert written.uri.startswith(f"{trained}/train_shards/") and written.rejected == {}
    assert sum(shard.rows for shard in plan_shards(written.data(data))) == len(CAPTIONS)
    # Without --image-root its relative paths are read from the working directory: there
    # they are missing, which stops the run naming the flag instead of training on less.
    with pytest.raises(DataError, match=r"missing_image 6.*train --image-root"):
        source_shards(data.model_copy(update={"image_root": None}), seed=0,
                      preprocess_cfg={"size": 32}, model_name="csclip-tiny")


def test_image_root_is_joined_to_a_units_tables_relative_paths(extract_out, tmp_path, capsys):
    from csclip.entry import benchmark

    units = str(extract_out / "out" / "units")
    # Without --image-root the paths are relative to the working directory: one line.
    code = benchmark.main(["build", "--units", units, "--out", str(tmp_path / "b.json")])
    assert "cannot be read" in _error_line(code, capsys)
    assert benchmark.main(["build", "--units", units, "--image-root",
                           str(extract_out / "images"), "--out", str(tmp_path / "b.json")]) == 0


# ---------------------------------------------------------------------------------------
# Seeded random init; a missing checkpoint
# ---------------------------------------------------------------------------------------

def test_the_same_random_init_evaluation_gives_the_same_numbers(tmp_path, capsys):
    from csclip.entry.evaluate import main

    def table1(run: str, *seed: str) -> str:
        assert main([*SMALL, *seed, "--out", str(tmp_path / run)]) == 0
        return (tmp_path / run / "table1.csv").read_text()

    first = table1("a")
    assert table1("b") == first
    assert table1("c", "--seed", "1") != first  # the seed is what fixes them
    capsys.readouterr()


@pytest.mark.parametrize("flag", ["--checkpoint", "--model"])
def test_a_missing_checkpoint_is_checkpoint_not_found(flag, tmp_path, capsys, no_model):
    from csclip.entry.evaluate import main

    path = tmp_path / "runs" / "train" / "does-not-exist" / "final"
    line = _error_line(main([flag, str(path), "--out", str(tmp_path / "eval"),
                             "--set", "tracking.enabled=false"]), capsys)
    assert line == f"error: checkpoint not found: {path}"


def test_a_model_name_is_not_a_path():
    from csclip.entry.evaluate import looks_like_path

    assert not looks_like_path("ViT-B-32") and not looks_like_path("hf-hub:timm/ViT-B-16")
    assert looks_like_path("runs/train/x/final") and looks_like_path("s3://bucket/run/final")


@pytest.mark.parametrize("uri", ["s3://bucket/missing/final", "s3://no-such-bucket/run/final"])
def test_a_missing_s3_checkpoint_is_checkpoint_not_found(uri, s3_endpoint, monkeypatch, tmp_path,
                                                         capsys, no_model):
    from s3_helpers import fresh_bucket

    from csclip.entry.evaluate import main

    with fresh_bucket(s3_endpoint, monkeypatch, "bucket") as client:
        # Something else in the bucket: only the checkpoint's own prefix counts.
        client.put_object(Bucket="bucket", Key="missing/other/model_spec.json", Body=b"{}")
        line = _error_line(main(["--checkpoint", uri, "--out", str(tmp_path / "eval"),
                                 "--set", "tracking.enabled=false"]), capsys)
    assert line == f"error: checkpoint not found: {uri}"
