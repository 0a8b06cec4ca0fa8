"""A crash leaves nothing that reads as finished: a checkpoint export (final/, best/)
SIGKILLed mid-way, locally and on S3 (moto); then what the next reader says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from csclip import storage
from csclip.config import load_config, to_yaml
from csclip.config.train import TrainConfig
from csclip.errors import DataError
from csclip.model import create_bundle, load_bundle, save_checkpoint, spec_of
from csclip.train import finished_result
from csclip.train.finished import export_final
from tests.conftest import REPO_ROOT

BUCKET = "csclip-crash"

# The exporting process: the copies are slowed down (a pause after each file, small files
# first, as pyarrow's multi-threaded copy lands them) so that the kill lands mid-export.
# Both copy paths are slowed: pyarrow's copy_files (S3, and the old local export) and
# shutil's (the local export's staging copy).
_EXPORTER = textwrap.dedent("""
    import shutil, sys, time
    from pathlib import Path
    import pyarrow.fs as pafs

    real_copy_files, real_copy2 = pafs.copy_files, shutil.copy2

    def slow_copy_files(source, destination, destination_filesystem=None, **kwargs):
        files = [Path(source)] if Path(source).is_file() else sorted(
            (p for p in Path(source).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        for file in files:
            target = destination if Path(source).is_file() else \\
                destination + "/" + file.relative_to(source).as_posix()
            real_copy_files(str(file), target, destination_filesystem=destination_filesystem)
            time.sleep(0.5)

    def slow_copy2(source, destination, **kwargs):
        real_copy2(source, destination, **kwargs)
        time.sleep(0.5)

    def slow_copytree(source, destination, **kwargs):
        return real_copytree(source, destination, **{"copy_function": slow_copy2, **kwargs})

    real_copytree = shutil.copytree
    pafs.copy_files, shutil.copytree = slow_copy_files, slow_copytree

    class Checkpoint:  # what export_final reads of Ray's checkpoint
        def to_directory(self, path):
            shutil.copytree(sys.argv[1], path, dirs_exist_ok=True)

    if sys.argv[2] == "final":
        from csclip.train.finished import export_final
        export_final(Checkpoint(), sys.argv[3], sys.argv[4])
    else:  # best/ (csclip.train.periodic) is the same upload
        from csclip.storage import upload_dir
        upload_dir(sys.argv[1], sys.argv[3])
    print("export finished", flush=True)
""")


def _config(storage_path: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", "run.name=crash",
        f"run.storage_path={storage_path}", "tracking.enabled=false"])


def _checkpoint(directory: Path, config: TrainConfig, seed: int, step: int) -> Path:
    """A training checkpoint as Ray Train hands it to the export (weights, spec, config,
    train state, metrics)."""
    torch.manual_seed(seed)
    model = create_bundle("csclip-tiny", image_size=32).model
    save_checkpoint(model, spec_of(model, "csclip-tiny"), directory, {"step": step},
                    config.model_dump(mode="json"))
    (directory / "metrics.json").write_text(json.dumps({"step": step, "loss": 1.0}))
    return directory


def _kill_export(args: list[str], landed: Callable[[], bool], env: dict | None = None) -> None:
    """Run the exporter and SIGKILL it as soon as `landed()` (a file of the export is
    there); fail if it finished first."""
    process = subprocess.Popen([sys.executable, "-c", _EXPORTER, *args], cwd=REPO_ROOT,
                               env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    _kill_when(process, landed, "the export", seconds=120)


def _kill_when(process: subprocess.Popen, landed: Callable[[], bool], what: str,
               seconds: float) -> None:
    """SIGKILL `process` as soon as `landed()`; fail if it ended (or `seconds` passed)
    first."""
    deadline = time.monotonic() + seconds
    while not landed():
        if process.poll() is not None or time.monotonic() > deadline:
            out, err = process.communicate()
            pytest.fail(f"{what} ended before the kill (rc {process.returncode}): {out}{err}")
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL


def _local_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_local_export_killed_mid_way_reads_as_unfinished_and_keeps_the_old_best(tmp_path):
    config = _config(str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / "crash"
    source = _checkpoint(tmp_path / "ckpt", config, seed=1, step=4)
    _kill_export([str(source), "final", str(tmp_path / "runs"), "crash"],
                 lambda: run_dir.exists() and any(name.endswith("metrics.json")
                                                   for name in _local_files(run_dir)))
    assert finished_result(config) is None  # the rerun trains (resumes) and exports again

    # best/ replaced mid-way: the old best stays whole, or there is none; never a mix.
    best = run_dir / "best"
    old = _checkpoint(tmp_path / "old", config, seed=2, step=2)
    storage.upload_dir(old, str(best))
    before = _local_files(run_dir)
    _kill_export([str(source), "best", str(best)],
                 lambda: len(_local_files(run_dir)) > len(before))
    loaded = load_bundle(best).model.state_dict()
    saved = torch.load(old / "model.pt", weights_only=True)
    assert all(torch.equal(loaded[key], saved[key]) for key in saved)

    # The same command again finishes, and reads as finished.
    export_final(_Checkpoint(source), str(tmp_path / "runs"), "crash")
    result = finished_result(config)
    assert result is not None and result.metrics["step"] == 4
    assert not list(run_dir.glob(".*final"))  # the killed export's staging copy is gone


class _Checkpoint:
    def __init__(self, directory: Path):
        self.directory = directory

    def to_directory(self, path: str) -> None:
        import shutil

        shutil.copytree(self.directory, path, dirs_exist_ok=True)


def test_a_finished_run_is_answered_by_train_without_starting_ray(tmp_path, capsys):
    # `csclip train` of a run that finished reads final/ and says where it is: no Ray.
    config = _config(str(tmp_path / "runs"))
    export_final(_Checkpoint(_checkpoint(tmp_path / "ckpt", config, seed=0, step=4)),
                 str(tmp_path / "runs"), "crash")
    (tmp_path / "run.yaml").write_text(to_yaml(config))
    code = ("import sys\nfrom csclip.cli import main\ncode = main(sys.argv[1:])\n"
            "print('ray started' if 'ray' in sys.modules else 'no ray')\nsys.exit(code)")
    done = subprocess.run(
        [sys.executable, "-c", code, "train", "--config", str(tmp_path / "run.yaml")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == f"run crash: final checkpoint {tmp_path / 'runs' / 'crash' / 'final'}"
    assert lines[-1] == "no ray"


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    from s3_helpers import fresh_bucket

    with fresh_bucket(s3_endpoint, monkeypatch, BUCKET,
                      CSCLIP_CACHE_DIR=str(tmp_path / "cache")) as client:
        yield client


def _keys(s3, prefix: str) -> set[str]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {obj["Key"].rsplit("/", 1)[1] for obj in listed}


def test_s3_export_killed_mid_way_is_refused_in_one_line_then_the_rerun_finishes(s3, tmp_path):
    config = _config(f"s3://{BUCKET}/runs")
    source = _checkpoint(tmp_path / "ckpt", config, seed=1, step=4)
    final = f"s3://{BUCKET}/runs/crash/final"
    # Killed once the small files (metrics.json among them) are there, model.pt not yet.
    _kill_export([str(source), "final", f"s3://{BUCKET}/runs", "crash"],
                 lambda: "metrics.json" in _keys(s3, "runs/crash/final/"))
    assert "manifest.json" not in _keys(s3, "runs/crash/final/")
    assert finished_result(config) is None
    with pytest.raises(DataError) as refused:
        load_bundle(final)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"checkpoint {final} is incomplete (export interrupted?): rerun the same command")

    export_final(_Checkpoint(source), f"s3://{BUCKET}/runs", "crash")
    assert finished_result(config).metrics["step"] == 4
    loaded = load_bundle(final).model.state_dict()
    saved = torch.load(source / "model.pt", weights_only=True)
    assert all(torch.equal(loaded[key], saved[key]) for key in saved)
    # A file changed after the export (here: truncated) no longer verifies.
    s3.put_object(Bucket=BUCKET, Key="runs/crash/final/model.pt", Body=b"truncated")
    assert finished_result(config) is None
    with pytest.raises(DataError, match="model.pt has 9 bytes"):
        load_bundle(final)


def test_an_s3_export_killed_before_its_spec_landed_reads_as_incomplete(s3):
    # The kill above lands after metrics.json; whether model_spec.json is there yet depends
    # on the copy threads. Without it the reader still says "incomplete", not "no checkpoint".
    s3.put_object(Bucket=BUCKET, Key="runs/early/final/metrics.json", Body=b'{"step": 4}')
    final = f"s3://{BUCKET}/runs/early/final"
    with pytest.raises(DataError, match=f"checkpoint {final} is incomplete .export interrupted"):
        load_bundle(final)


# ---------------------------------------------------------------------------------------
# Extraction: SIGKILLed after a few shards, then the readers, then the same command again
# ---------------------------------------------------------------------------------------

# The extraction driver, joined to the test session's Ray; a pause after each shard's
# marker so the kill lands between shards.
_EXTRACTOR = textwrap.dedent("""
    import sys, time
    import ray
    ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
    from csclip.config import load_config
    from csclip.extract.pipeline import ExtractConfig, run_extraction
    run_extraction(load_config(ExtractConfig, None, sys.argv[2:]),
                   on_shard_written=lambda shard: time.sleep(1.0))
""")

CAPTIONS = ["a red cube on a blue table", "two dogs running on the grass", "a man holding a cup",
            "a small cat under a wooden chair", "a woman riding a brown horse",
            "a green bus next to a tall building", "a boy kicking a white ball",
            "an old car parked near a tree"]


def _extract_overrides(captions: Path, out: Path) -> list[str]:
    return ["input.format=jsonl", f"input.uri={captions}", "input.split=val",
            "backend.name=rules", "output.shard_size=2", f"output.uri={out}",
            "tracking.enabled=false"]


def test_extraction_killed_mid_way_is_refused_by_its_readers_then_the_rerun_finishes(
        ray_session, tmp_path, capsys):
    from csclip.config.extract import ExtractConfig
    from csclip.config.world import WorldConfig
    from csclip.entry import benchmark
    from csclip.extract.backends import rules_outcome
    from csclip.extract.captions import caption_table
    from csclip.extract.pipeline import run_extraction
    from csclip.records import load_split
    from csclip.units import read_units

    captions = tmp_path / "captions.jsonl"
    captions.write_text("".join(json.dumps({"image": f"img{i}.jpg", "caption": text}) + "\n"
                                for i, text in enumerate(CAPTIONS * 2)))
    out = tmp_path / "out"
    overrides = _extract_overrides(captions, out)
    address = ray_session.get_runtime_context().gcs_address
    process = subprocess.Popen([sys.executable, "-c", _EXTRACTOR, address, *overrides],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    _kill_when(process, lambda: len(list((out / "_done").glob("*.json"))) >= 2, "extraction",
               seconds=240)
    assert len(list((out / "units").glob("*.parquet"))) == 2  # 2 of 8 shards written

    refusal = f"extraction at {out} stopped at shard 2 of 8; rerun the same command to finish"
    with pytest.raises(DataError) as refused:
        load_split(str(out / "units"), "val", WorldConfig())  # evaluate, training's val
    assert str(refused.value) == refusal
    with pytest.raises(DataError, match="stopped at shard 2 of 8"):
        read_units(str(out / "units"))
    code = benchmark.main(["build", "--units", str(out / "units"), "--out",
                           str(tmp_path / "bench.json")])
    assert code == 2 and not (tmp_path / "bench.json").exists()
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {refusal}"]

    # The same command again writes the other 6 shards and equals an uninterrupted run.
    config = load_config(ExtractConfig, None, overrides)
    summary = run_extraction(config)
    assert (summary.shards_written, summary.shards_skipped, summary.read) == (6, 2, 16)
    # What an uninterrupted run writes: the rules backend's records of every caption.
    direct = [rules_outcome(row).record for row in caption_table(config.input).to_pylist()]
    expected = sorted((r for r in direct if r is not None), key=lambda r: r.sample_id)
    assert [r.units for r in read_units(str(out / "units"))] == [r.units for r in expected]
    assert summary.with_units == len(expected) and summary.read == len(direct)
    assert len(load_split(str(out / "units"), "val", WorldConfig())) == len(expected)


# The evaluating process: each file's move from the staging folder into --out is slowed
# and announced, so the kill lands after some of the new tables replaced the old ones.
_EVALUATOR = textwrap.dedent("""
    import pathlib, sys, time

    real_replace = pathlib.Path.replace

    def slow_replace(self, target):
        moved = real_replace(self, target)
        print("moved", pathlib.Path(target).name, flush=True)
        time.sleep(0.5)
        return moved

    pathlib.Path.replace = slow_replace
    from csclip.entry.evaluate import main
    sys.exit(main(sys.argv[1:]))
""")


def _evaluate_argv(checkpoint: Path, units: Path, out: Path, seed: int) -> list[str]:
    return ["--checkpoint", str(checkpoint), "--units", str(units), "--out", str(out),
            "--set", "tracking.enabled=false", "--set", "benchmark.num_bootstrap=20",
            "--set", f"benchmark.seed={seed}"]


def _tables(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.suffix in (".md", ".csv")}


def test_evaluation_killed_mid_way_reads_as_unfinished_then_the_rerun_finishes(tmp_path):
    from csclip.config.world import WorldConfig
    from csclip.entry.evaluate import main
    from csclip.eval.report import EVALUATION_COMPLETE, check_evaluation, evaluation_problem
    from csclip.units import write_units
    from csclip.world import iter_world

    config = _config(str(tmp_path / "runs"))
    checkpoint = _checkpoint(tmp_path / "ckpt", config, seed=1, step=4)
    units = tmp_path / "units.parquet"
    write_units(list(iter_world(WorldConfig(num_train=0, num_val=8, num_test=0),
                                splits=("val",))), str(units))
    out, reference = tmp_path / "eval", tmp_path / "reference"
    assert main(_evaluate_argv(checkpoint, units, out, seed=1)) == 0
    check_evaluation(out)
    first = _tables(out)
    assert main(_evaluate_argv(checkpoint, units, reference, seed=2)) == 0
    assert _tables(reference) != first  # the second command's tables differ from the first's

    # The second command into the same folder, killed once one of its tables replaced the
    # first command's (the files move in name order, the tables after the binaries).
    process = subprocess.Popen([sys.executable, "-c", _EVALUATOR,
                                *_evaluate_argv(checkpoint, units, out, seed=2)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    for line in process.stdout:
        name = line.split()[-1]
        if name in first and (out / name).read_text() != first[name]:
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, process.stderr.read()
    mixed = _tables(out)
    assert any(mixed.get(name) not in (None, first[name]) for name in first)  # some new; ...
    # ... the first command's others went with its marker when the second began: none is
    # left to mix with the new ones, and the folder does not read as finished either way.
    assert all(mixed.get(name) in (None, _tables(reference)[name]) for name in first)
    assert not (out / EVALUATION_COMPLETE).exists()
    assert evaluation_problem(out) == f"it has no {EVALUATION_COMPLETE}"
    with pytest.raises(DataError, match=f"the evaluation in {out} did not finish"):
        check_evaluation(out)
    assert list(out.glob(".partial-*"))  # the killed run's staging folder

    # The same command again: finished, equal to the uninterrupted run, no leftovers.
    assert main(_evaluate_argv(checkpoint, units, out, seed=2)) == 0
    check_evaluation(out)
    assert _tables(out) == _tables(reference)
    assert not list(out.glob(".partial-*"))
    listed = json.loads((out / EVALUATION_COMPLETE).read_text())["files"]
    assert set(listed) == {p.name for p in out.iterdir() if p.name != EVALUATION_COMPLETE}


def test_a_write_cut_short_leaves_no_file_that_readers_list(tmp_path):
    # write_bytes_atomic writes `.tmp-<hex>-<name>` and renames it; a SIGKILL between the
    # two leaves that file, empty or partial, ending in the same suffix. Readers listing
    # the finished files (extraction's done markers) must not see it.
    import pyarrow.fs as pafs

    from csclip.storage import list_files, write_bytes_atomic

    fs = pafs.LocalFileSystem()
    write_bytes_atomic(fs, str(tmp_path / "00000.json"), b'{"with_units": 3}')
    (tmp_path / ".tmp-0123abcd-00001.json").write_bytes(b"")  # what a kill leaves
    assert list_files(fs, str(tmp_path), ".json") == [str(tmp_path / "00000.json")]
