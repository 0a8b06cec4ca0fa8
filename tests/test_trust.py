"""What a stranger hands us runs no code and writes nothing outside its place: an S3
checkpoint prefix whose keys climb out of the cache, a train_state.pt that would run code
when unpickled, a logging YAML in a shared /tmp directory someone else made, a run name
that leaves its storage path or breaks a filter. Each is the hostile input that worked
before; S3 is a real moto server on 127.0.0.1."""

from __future__ import annotations

import os
import random
import stat
import tempfile
import time
from pathlib import Path

import pytest
import torch
from s3_helpers import fresh_bucket

from csclip import storage
from csclip.errors import CheckpointMismatch, DataError
from csclip.model import create_bundle, load_bundle, load_train_state, save_checkpoint, spec_of

BUCKET = "csclip-trust"


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """A fresh bucket, the cache five directories below the test's directory."""
    with fresh_bucket(s3_endpoint, monkeypatch, BUCKET, **{
            storage.CACHE_ENV: str(tmp_path / "a" / "b" / "c" / "cache")}) as client:
        yield client


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory) -> dict[str, bytes]:
    model = create_bundle("csclip-tiny", image_size=32).model
    directory = save_checkpoint(model, spec_of(model, "csclip-tiny"),
                                tmp_path_factory.mktemp("ckpt") / "final")
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ---------------------------------------------------------------------------------------
# S3 prefixes copied into the cache
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("evil", ["../../../../EVIL.txt", "/EVIL.txt", "./EVIL.txt"])
def test_s3_checkpoint_with_a_key_outside_its_prefix_writes_nothing(s3, checkpoint_files,
                                                                   tmp_path, evil):
    prefix = "runs/train/r/final"
    for name, data in checkpoint_files.items():
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=data)
    # The listed key keeps its "..": the client reads it normalized ("EVIL.txt" at the
    # bucket's root), so the copy used to land four levels above its staging directory.
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{evil}", Body=b"echo owned\n")
    s3.put_object(Bucket=BUCKET, Key="EVIL.txt", Body=b"echo owned\n")
    with pytest.raises(DataError) as err:
        load_bundle(f"s3://{BUCKET}/{prefix}")
    assert repr(f"{BUCKET}/{prefix}/{evil}") in _one_line(err) and "nothing copied" in str(err.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "something was written"
    # The same through local_dir itself, for any kind of directory.
    with pytest.raises(DataError, match="refusing to copy key"):
        storage.local_dir(f"s3://{BUCKET}/{prefix}", kind="dirs")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_s3_prefix_over_the_cap_copies_nothing_and_a_killed_copys_staging_goes(s3, tmp_path):
    # report --paper s3://...: a bucket's root given for a report's folder is refused
    # before anything is downloaded; a copy killed mid-way left its .tmp-* folder, which
    # the next copy removes once it is stale (a live copy's is left alone).
    for index in range(3):
        s3.put_object(Bucket=BUCKET, Key=f"reports/big/{index}.bin", Body=b"x" * 1000)
    with pytest.raises(DataError) as err:
        storage.local_dir(f"s3://{BUCKET}/reports/big", kind="reports", max_bytes=2000)
    assert "3 files" in _one_line(err) and "give the folder itself" in str(err.value)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "something was written"
    cache = storage.cache_root() / "reports"
    stale, live = cache / ".tmp-killed", cache / ".tmp-running"
    for staging in (stale, live):
        staging.mkdir(parents=True)
        (staging / "0.bin").write_bytes(b"x")
    old = time.time() - 2 * storage.STALE_STAGING_S
    os.utime(stale, (old, old))
    folder = storage.local_dir(f"s3://{BUCKET}/reports/big", kind="reports", max_bytes=10_000)
    assert sorted(p.name for p in folder.glob("*.bin")) == ["0.bin", "1.bin", "2.bin"]
    assert not stale.exists() and live.exists()


def test_s3_prefix_without_a_spec_is_refused_before_its_weights_are_copied(s3, checkpoint_files,
                                                                          tmp_path):
    s3.put_object(Bucket=BUCKET, Key="other/model.pt", Body=checkpoint_files["model.pt"])
    with pytest.raises(CheckpointMismatch, match="has no model_spec.json") as err:
        load_bundle(f"s3://{BUCKET}/other")
    _one_line(err)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "downloaded before the check"


def test_s3_checkpoint_of_another_model_is_refused_before_its_weights_are_copied(
        s3, checkpoint_files, tmp_path):
    from csclip.config.model import ModelConfig

    for name, data in checkpoint_files.items():
        s3.put_object(Bucket=BUCKET, Key=f"final/{name}", Body=data)
    with pytest.raises(CheckpointMismatch, match="image_size=32"):
        load_bundle(f"s3://{BUCKET}/final", expected=ModelConfig(name="csclip-tiny", image_size=64))
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    # The right expectation loads it.
    bundle = load_bundle(f"s3://{BUCKET}/final",
                         expected=ModelConfig(name="csclip-tiny", image_size=32))
    assert bundle.name == "csclip-tiny"


# ---------------------------------------------------------------------------------------
# train_state.pt: weights_only
# ---------------------------------------------------------------------------------------

class _RunsCode:
    """Unpickling this opens (creates) the marker file: code run by a load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_crafted_train_state_is_refused_without_running_its_code(tmp_path):
    directory, marker = tmp_path / "checkpoint_000001", tmp_path / "MARKER"
    directory.mkdir()
    torch.save({"step": 3, "samples": 24, "optimizer": _RunsCode(marker)},
               directory / "train_state.pt")
    with pytest.raises(CheckpointMismatch, match="weights_only=True") as err:
        load_train_state(directory)
    assert "train_state.pt" in _one_line(err)
    assert not marker.exists()


def test_the_trainers_train_state_loads_with_weights_only(tmp_path):
    # What a checkpoint holds: AdamW's state after a step, the gradient scaler's (enabled,
    # as fp16 has it), step, samples, and RNG states as tensors and tuples of ints.
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    saved = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "step": 7,
             "samples": 56, "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()}
    save_checkpoint(model, spec_of(create_bundle("csclip-tiny", image_size=32).model,
                                   "csclip-tiny"), tmp_path / "ckpt", saved)
    loaded = load_train_state(tmp_path / "ckpt")
    assert (loaded["step"], loaded["samples"], loaded["scaler"]) == (7, 56, scaler.state_dict())
    assert torch.equal(loaded["torch_rng"], saved["torch_rng"])
    assert loaded["python_rng"] == saved["python_rng"]
    restored = torch.optim.AdamW(model.parameters())
    restored.load_state_dict(loaded["optimizer"])
    assert restored.param_groups[0]["betas"] == (0.9, 0.98)


def test_no_torch_load_in_csclip_unpickles_objects():
    import re

    root = Path(__file__).resolve().parents[1] / "csclip"
    calls = [(path, line) for path in root.rglob("*.py")
             for line in path.read_text().splitlines() if re.search(r"\btorch\.load\(", line)]
    assert calls
    for path, line in calls:
        assert "weights_only=True" in line, f"{path}: {line.strip()}"


# ---------------------------------------------------------------------------------------
# Ray Data's logging YAML: a private directory
# ---------------------------------------------------------------------------------------

HOSTILE = "version: 1\nhandlers:\n  x: {class: subprocess.Popen, args: ['touch', 'OWNED']}\n"


def _plant(directory: Path, mode: int, uid: int | None = None) -> Path:
    directory.mkdir()
    (directory / "ray_data_logging.yaml").write_text(HOSTILE)
    directory.chmod(mode)
    if uid is not None:
        os.chown(directory, uid, uid)
    return directory


def _check_private(path: Path, planted: list[Path]) -> None:
    from csclip.entry.ray_init import RAY_DATA_LOGGING

    info = path.parent.lstat()
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0
    assert path.read_text() == RAY_DATA_LOGGING
    for directory in planted:
        assert path.parent != directory
        assert (directory / "ray_data_logging.yaml").read_text() == HOSTILE  # untouched


def test_ray_data_logging_yaml_lives_in_a_private_directory(tmp_path, monkeypatch):
    from csclip.entry.ray_init import _ray_data_logging_file

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    path = Path(_ray_data_logging_file())
    _check_private(path, [])
    assert path.parent.parent == tmp_path
    assert Path(_ray_data_logging_file()) == path  # reused, not a new directory per run


def test_a_world_writable_directory_made_by_someone_else_is_not_used(tmp_path, monkeypatch):
    from csclip.entry.ray_init import _ray_data_logging_file

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    # Where csclip looked before and where it looks now, both made first and left 0777.
    planted = [_plant(tmp_path / name, 0o777) for name in ("csclip", f"csclip-{os.getuid()}")]
    _check_private(Path(_ray_data_logging_file()), planted)


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory owned by another user "
                                             "needs root (os.chown)")
def test_a_directory_owned_by_another_user_is_not_used(tmp_path, monkeypatch):
    from csclip.entry.ray_init import _ray_data_logging_file

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    planted = [_plant(tmp_path / name, 0o755, uid=1000)
               for name in ("csclip", f"csclip-{os.getuid()}")]
    _check_private(Path(_ray_data_logging_file()), planted)


# ---------------------------------------------------------------------------------------
# run.name
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a'b", "..", "../../elsewhere", "a/b", ".hidden", "x" * 201,
                                  'q"uote'])
def test_unsafe_run_names_are_refused_in_one_line_before_any_work(name, capsys):
    from pydantic import ValidationError

    from csclip.config.train import TrainConfig
    from csclip.entry import train as train_entry

    with pytest.raises(ValidationError, match="a run name is"):
        TrainConfig.model_validate({"run": {"name": name}})
    # The entry point: refused when the config is read, before Ray or a model.
    assert train_entry.main(["--set", f"run.name={name}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "run.name" in err and "a run name is" in err, err


def test_safe_run_names_pass():
    from csclip.config.train import TrainConfig

    for name in ("csclip-1a2b3c4d5e6f", "sweep-lr-1e-5_units-1", "my.run_2"):
        assert TrainConfig.model_validate({"run": {"name": name}}).run.name == name


# ---------------------------------------------------------------------------------------
# Frozen benchmark files: image paths inside the root, images pinned by their sha256
# ---------------------------------------------------------------------------------------

UNITS = Path(__file__).parent / "fixtures" / "halftruth_paper" / "units_older.json"


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, Path]:
    """(benchmark file, image root): a small distinct PNG at every image path of the unit
    file, and the paper benchmark built over them."""
    import json

    from PIL import Image

    from csclip.entry import benchmark as benchmark_entry

    root = tmp_path_factory.mktemp("trust-images") / "images"
    for index, record in enumerate(json.loads(UNITS.read_text())):
        if record.get("image_path"):
            path = root / record["image_path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), (index * 20 % 256, 90, 255 - index * 15)).save(path)
    out = root.parent / "paper.json"
    assert benchmark_entry.main(["build", "--units", str(UNITS), "--image-root", str(root),
                                 "--out", str(out)]) == 0
    return out, root


def _rc_and_error(main, argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err, err
    return rc, err


def _evaluate_argv(file: Path, root: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", "csclip-tiny", "--benchmark", str(file), "--image-root", str(root),
            "--out", str(out), "--set", "tracking.enabled=false",
            "--set", "benchmark.num_bootstrap=0", *extra]


def _with_paths(bench_file: Path, path_of, out: Path) -> Path:
    """The file with every image path replaced (paths are not in the hash: images moved
    to another root are the same benchmark)."""
    import json

    data = json.loads(bench_file.read_text())
    for item in data["items"]:
        item["image"] = path_of(item["image"])
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("hostile", ["../outside.png", "/etc/passwd", "a/../../outside.png"])
def test_benchmark_image_paths_outside_the_root_are_refused(bench, hostile, tmp_path, capsys):
    from csclip.entry import benchmark as benchmark_entry
    from csclip.entry import evaluate as evaluate_entry

    bench_file, root = bench
    moved = _with_paths(bench_file, lambda _: hostile, tmp_path / "moved.json")
    rc, err = _rc_and_error(benchmark_entry.main,
                            ["verify", str(moved), "--image-root", str(root)], capsys)
    assert rc == 2 and "outside --image-root" in err and repr(hostile) in err, err
    rc, err = _rc_and_error(evaluate_entry.main, _evaluate_argv(moved, root, tmp_path / "o"),
                            capsys)
    assert rc == 2 and "outside --image-root" in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_outside_paths_are_read_when_allowed_and_still_checked(bench, tmp_path, capsys):
    from csclip.entry import benchmark as benchmark_entry

    bench_file, root = bench
    # The same images at absolute paths elsewhere: allowed by the flag, bytes checked.
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(root, copy)
    moved = _with_paths(bench_file, lambda path: str(copy / path), tmp_path / "abs.json")
    assert _rc_and_error(benchmark_entry.main, ["verify", str(moved)], capsys)[0] == 2
    assert benchmark_entry.main(["verify", str(moved), "--allow-outside-image-root"]) == 0
    assert "ok (" in capsys.readouterr().out
    # Absolute paths under --image-root are inside it.
    assert benchmark_entry.main(["verify", str(moved), "--image-root", str(copy)]) == 0


def test_a_changed_image_fails_verify_and_scoring_naming_it(bench, tmp_path, capsys):
    import shutil

    from PIL import Image

    from csclip.entry import benchmark as benchmark_entry
    from csclip.entry import evaluate as evaluate_entry
    from csclip.eval.benchmark_file import read_benchmark_file

    bench_file, root = bench
    assert benchmark_entry.main(["verify", str(bench_file), "--image-root", str(root)]) == 0
    capsys.readouterr()
    changed = tmp_path / "images"
    shutil.copytree(root, changed)
    name = sorted(p for p in read_benchmark_file(bench_file).images.values())[0]
    Image.new("RGB", (16, 16), (1, 2, 3)).save(changed / name)  # same path, other pixels
    rc, err = _rc_and_error(benchmark_entry.main,
                            ["verify", str(bench_file), "--image-root", str(changed)], capsys)
    assert rc == 2 and name in err and "sha256" in err, err
    rc, err = _rc_and_error(evaluate_entry.main,
                            _evaluate_argv(bench_file, changed, tmp_path / "o"), capsys)
    assert rc == 2 and name in err and "sha256" in err, err


def test_benchmark_file_without_image_digests_is_refused_with_how_to_rebuild(bench, tmp_path,
                                                                             capsys):
    import json

    from csclip.entry import benchmark as benchmark_entry

    data = json.loads(bench[0].read_text())
    data["version"] = 1
    for item in data["items"]:
        del item["image_sha256"]
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(data))
    rc, err = _rc_and_error(benchmark_entry.main, ["verify", str(old)], capsys)
    assert rc == 2 and "version 1" in err and "csclip benchmark build" in err, err
