"""Every bad input file is one line: 33 bad inputs across the commands (config files,
caption files of each format, units tables, checkpoints, benchmark files, images), each
exit 2 with exactly one stderr line "error: ..." that names the file, and no traceback.
The entry points run in-process (`csclip.entry.<command>.main(argv)`); each case fails
before Ray starts."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from csclip.config.world import WorldConfig
from csclip.units import records_to_table
from csclip.world import world_record

WORLD = WorldConfig(image_size=32)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # csclip.entry.common.LOG_FORMAT


def _units(tmp: Path, name: str = "units.parquet") -> Path:
    """A valid units table of four world records (val split)."""
    path = tmp / name
    pq.write_table(records_to_table([world_record(WORLD, "val", i) for i in range(4)]), path)
    return path


def _checkpoint(tmp: Path) -> Path:
    from csclip.model import create_bundle, save_checkpoint, spec_of

    model = create_bundle("csclip-tiny", image_size=32).model
    return save_checkpoint(model, spec_of(model, "csclip-tiny"), tmp / "checkpoint")


@dataclass(frozen=True)
class Case:
    """command: csclip.entry.<command>; make(tmp) writes the bad file and returns
    (argv, the file the error line must name)."""

    command: str
    make: Callable[[Path], tuple[list[str], Path]]


def _write(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def _config(content: str | bytes) -> Callable[[Path], tuple[list[str], Path]]:
    def make(tmp: Path):
        path = _write(tmp, "config.yaml", content)
        return ["--config", str(path), "--set", "tracking.enabled=false"], path
    return make


def _captions(fmt: str, name: str, content: str | bytes | dict[str, str | bytes],
              backend: str = "rules") -> Callable[[Path], tuple[list[str], Path]]:
    """extract --format fmt on a file `name` (or a directory of files: content a dict)."""
    def make(tmp: Path):
        if isinstance(content, dict):
            path = tmp / name
            for file, text in content.items():
                _write(path, file, text)
        else:
            path = _write(tmp, name, content)
        return ["--backend", backend, "--format", fmt, "--input", str(path), "--out",
                str(tmp / "out"), "--set", "tracking.enabled=false"], path
    return make


def _table(content: Callable[[Path], Path]) -> Callable[[Path], tuple[list[str], Path]]:
    """benchmark build --units on the table content(tmp) writes."""
    def make(tmp: Path):
        path = content(tmp)
        return ["build", "--units", str(path), "--protocol", "csclip", "--out",
                str(tmp / "bench.json")], path
    return make


def _table_of(change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], Path]:
    def content(tmp: Path) -> Path:
        good = pq.read_table(_units(tmp, "good.parquet"))
        pq.write_table(change(good), tmp / "units.parquet")
        return tmp / "units.parquet"
    return content


def _bytes_table(data: Callable[[bytes], bytes]) -> Callable[[Path], Path]:
    def content(tmp: Path) -> Path:
        good = _units(tmp, "good.parquet").read_bytes()
        return _write(tmp, "units.parquet", data(good))
    return content


def _damaged_checkpoint(damage: Callable[[Path], None]) -> Callable[[Path], tuple[list[str], Path]]:
    """evaluate --checkpoint on a csclip checkpoint damaged by damage(directory)."""
    def make(tmp: Path):
        directory = _checkpoint(tmp)
        damage(directory)
        return ["--checkpoint", str(directory), "--units", str(_units(tmp)), "--out",
                str(tmp / "eval"), "--set", "tracking.enabled=false"], directory
    return make


def _resealed(write: Callable[[Path], None]) -> Callable[[Path], None]:
    """A damage whose manifest is written again: the file itself must be refused."""
    def damage(directory: Path) -> None:
        from csclip.storage import write_manifest

        write(directory)
        write_manifest(directory)
    return damage


def _benchmark(content: str | bytes) -> Callable[[Path], tuple[list[str], Path]]:
    def make(tmp: Path):
        path = _write(tmp, "bench.json", content)
        return ["verify", str(path)], path
    return make


def _corrupt_image(tmp: Path) -> tuple[list[str], Path]:
    """evaluate on a units table whose image file is not an image."""
    image = _write(tmp, "images/broken.png", b"\x89PNG\r\n\x1a\n not really")
    rows = [world_record(WORLD, "val", i) for i in range(4)]
    table = records_to_table(rows)
    paths = pa.array([str(image)] * table.num_rows, pa.string())
    table = table.set_column(table.schema.get_field_index("image_path"), "image_path", paths)
    table = table.set_column(table.schema.get_field_index("image_bytes"), "image_bytes",
                             pa.nulls(table.num_rows, pa.binary()))
    pq.write_table(table, tmp / "units.parquet")
    return ["--units", str(tmp / "units.parquet"), "--model", "csclip-tiny", "--out",
            str(tmp / "eval"), "--set", "model.image_size=32",
            "--set", "tracking.enabled=false"], image


def _suite(names: str, present: tuple[str, ...] = ()) -> Callable[[Path], tuple[list[str], Path]]:
    """evaluate --suite names on a --data-root holding the fixtures of `present` only."""
    def make(tmp: Path):
        import shutil

        root = tmp / "bench"
        for name in present:
            shutil.copytree(Path(__file__).parent / "fixtures" / "suites" / name, root / name)
        return ["--model", "csclip-tiny", "--suite", names, "--data-root", str(root), "--out",
                str(tmp / "eval"), "--set", "tracking.enabled=false"], root
    return make


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[: len(data) // 2])
    return damage


COCO = "captions_val2017.json"
KARPATHY_OK = {"images": [{"split": "val", "filename": "a.jpg", "cocoid": 1,
                           "sentences": [{"sentid": 1, "raw": "a cat"}]}]}

CASES: dict[str, Case] = {
    # config files (any command; extract here)
    "config_not_utf8": Case("extract", _config(b"input:\n  format: \xff\xfe world\n")),
    "config_not_yaml": Case("extract", _config("input: [unclosed\n")),
    "config_unknown_key": Case("extract", _config("input:\n  formt: jsonl\n")),
    "config_wrong_type": Case("extract", _config("output:\n  shard_size: many\n")),
    "config_top_level_list": Case("extract", _config("- input\n- output\n")),
    "config_missing": Case("extract", lambda tmp: (["--config", str(tmp / "nope.yaml")],
                                                   tmp / "nope.yaml")),
    "config_is_a_directory": Case("extract", lambda tmp: (["--config", str(tmp)], tmp)),
    # caption files
    "jsonl_not_utf8": Case("extract", _captions("jsonl", "c.jsonl",
                                                b'{"image": "a.jpg", "caption": "\xff"}\n')),
    "jsonl_malformed_line": Case("extract", _captions("jsonl", "c.jsonl", '{"image": "a.jpg", "cap\n')),
    "jsonl_line_not_an_object": Case("extract", _captions("jsonl", "c.jsonl", "[1, 2]\n")),
    "jsonl_missing_caption": Case("extract", _captions("jsonl", "c.jsonl", '{"image": "a.jpg"}\n')),
    "jsonl_empty": Case("extract", _captions("jsonl", "c.jsonl", "")),
    "jsonl_missing_file": Case("extract", lambda tmp: (
        ["--backend", "rules", "--format", "jsonl", "--input", str(tmp / "x.jsonl"), "--out",
         str(tmp / "out")],
        tmp / "x.jsonl")),
    "csv_not_utf8": Case("extract", _captions("csv", "c.csv", b"image,caption\na.jpg,\xff\xfe\n")),
    "csv_missing_columns": Case("extract", _captions("csv", "c.csv", "path,text\na.jpg,a cat\n")),
    "coco_truncated": Case("extract", _captions("coco", COCO, '{"annotations": [{"image_id": 1, "ca')),
    "coco_missing_keys": Case("extract", _captions("coco", COCO, '{"annotations": [{"caption": "x"}]}')),
    "coco_wrong_top_level": Case("extract", _captions("coco", COCO, "[]")),
    "karpathy_not_utf8": Case("extract", _captions("karpathy", "k.json", b'{"images": "\xff"}')),
    "karpathy_missing_filename": Case("extract", _captions("karpathy", "k.json", json.dumps(
        {"images": [{"split": "val", "sentences": [{"sentid": 1, "raw": "a cat"}]}]}))),
    "karpathy_sentences_wrong_type": Case("extract", _captions("karpathy", "k.json", json.dumps(
        {"images": [{**KARPATHY_OK["images"][0], "sentences": [7]}]}))),
    "sugarcrepe_key_not_a_number": Case("extract", _captions("sugarcrepe", "sc", {"a.json": json.dumps(
        {"first": {"filename": "a.jpg", "caption": "a cat"}})})),
    "sugarcrepe_wrong_top_level": Case("extract", _captions("sugarcrepe", "sc", {"a.json": "[1]"})),
    "authors_units_not_utf8": Case("extract", _captions("jsonl", "u.json", b'[{"caption": "\xff"}]',
                                                       backend="authors")),
    # units tables (Parquet)
    "parquet_empty_file": Case("benchmark", _table(_bytes_table(lambda good: b""))),
    "parquet_random_bytes": Case("benchmark", _table(_bytes_table(lambda good: bytes(range(256)) * 8))),
    "parquet_truncated": Case("benchmark", _table(_bytes_table(lambda good: good[: len(good) // 2]))),
    "parquet_missing_columns": Case("benchmark", _table(_table_of(
        lambda t: t.drop_columns(["caption", "entities"])))),
    "parquet_wrong_type": Case("benchmark", _table(_table_of(lambda t: t.set_column(
        t.schema.get_field_index("split"), "split", pa.array(range(t.num_rows), pa.int64()))))),
    "parquet_duplicate_sample_ids": Case("benchmark", _table(_table_of(
        lambda t: pa.concat_tables([t, t.slice(0, 2)])))),
    # checkpoints
    "checkpoint_truncated": Case("evaluate", _damaged_checkpoint(_truncate("model.pt"))),
    "checkpoint_missing_weights": Case("evaluate", _damaged_checkpoint(
        lambda d: (d / "model.pt").unlink())),
    "checkpoint_random_bytes": Case("evaluate", _damaged_checkpoint(_resealed(
        lambda d: (d / "model.pt").write_bytes(bytes(range(256)) * 64)))),
    "checkpoint_weights_of_another_model": Case("evaluate", _damaged_checkpoint(_resealed(
        lambda d: __import__("torch").save({"visual.proj": __import__("torch").zeros(2)},
                                           d / "model.pt")))),
    "checkpoint_without_manifest": Case("evaluate", _damaged_checkpoint(
        lambda d: (d / "manifest.json").unlink())),
    # suites named on the command line and not under --data-root
    "suite_not_under_data_root": Case("evaluate", _suite("sugarcrepe")),
    "suite_paper_with_one_of_sixteen": Case("evaluate", _suite("paper", ("coco_cf",))),
    # benchmark files and images
    "benchmark_not_json": Case("benchmark", _benchmark('{"format": ')),
    "benchmark_not_utf8": Case("benchmark", _benchmark(b'{"format": "\xff"}')),
    "image_corrupt": Case("evaluate", _corrupt_image),
}


def _main(command: str) -> Callable[[list[str]], int]:
    from importlib import import_module

    return import_module(f"csclip.entry.{command}").main


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_input_is_one_error_line_and_exit_2(name, tmp_path, capsys, monkeypatch):
    import ray

    import csclip.entry.ray_init

    # Another test in this worker may have started Ray already, so the check is on the call
    # that starts it (every command goes through init_ray), plus Ray's own state when it was
    # down before this command ran (Ray Data would start it implicitly).
    ray_was_up = ray.is_initialized()
    ray_starts: list[object] = []

    def refuse_to_start_ray(*args: object, **kwargs: object) -> None:
        ray_starts.append((args, kwargs))
        raise AssertionError("Ray started before the input was read")

    monkeypatch.setattr(csclip.entry.ray_init, "init_ray", refuse_to_start_ray)
    monkeypatch.setenv("CSCLIP_CACHE_DIR", str(tmp_path / "cache"))
    case = CASES[name]
    argv, bad = case.make(tmp_path)
    code = _main(case.command)(argv)
    assert not ray_starts, "Ray started before the input was read"
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    # Exactly one line besides the log's own (timestamped) lines.
    assert [line for line in err.splitlines() if not LOG_LINE.match(line)] == errors, err
    assert len(errors) == 1, err
    assert str(bad) in errors[0] or bad.name in errors[0], errors[0]
    assert ray_was_up or not ray.is_initialized(), "Ray started before the input was read"


def test_the_table_holds_the_cases_of_every_kind():
    kinds = {name.split("_", 1)[0] for name in CASES}
    assert len(CASES) >= 33 and kinds >= {"config", "jsonl", "csv", "coco", "karpathy",
                                          "sugarcrepe", "parquet", "checkpoint", "benchmark",
                                          "image"}


def test_an_overlong_caption_is_a_counted_rejection_of_the_rules_backend():
    from csclip.extract.backends import MAX_RULES_CAPTION_CHARS, rules_outcome
    from csclip.units import RejectReason

    caption = "a red cube on a blue table " * 100  # 2,700 characters
    outcome = rules_outcome({"sample_id": "s", "image_id": "i", "caption": caption,
                             "split": "val", "image_path": None, "image_bytes": None})
    assert outcome.record is None and outcome.reason == RejectReason.CAPTION_TOO_LONG
    assert outcome.detail == f"caption of {len(caption)} characters > {MAX_RULES_CAPTION_CHARS}"
    assert rules_outcome({"sample_id": "s", "image_id": "i", "caption": caption[:200],
                          "split": "val", "image_path": None, "image_bytes": None}).record


def test_a_suites_image_path_that_leaves_its_folder_is_never_read(tmp_path):
    # A benchmark file naming an absolute path, a URI or a path above its image folder:
    # a counted skip (missing_image), not a file read from elsewhere and scored.
    from csclip.eval.suites.core import MISSING_IMAGE, ImageFolder

    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"jpeg")
    (tmp_path / "secret.jpg").write_bytes(b"jpeg")
    folder = ImageFolder(str(tmp_path / "images"))
    assert folder.lookup("a.jpg") == (str(tmp_path / "images" / "a.jpg"), None)
    for outside in ("../secret.jpg", str(tmp_path / "secret.jpg"), "images/../../secret.jpg",
                    "s3://bucket/secret.jpg", "..\\secret.jpg"):
        assert folder.lookup(outside) == (None, MISSING_IMAGE), outside


def test_train_image_root_is_refused_without_a_units_table():
    # How it joins a units table's relative paths, and refuses those that leave it:
    # tests/test_source_shards.py.
    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.errors import ConfigError

    # The world's and the shards' images are theirs: image_root applies to a units table.
    with pytest.raises(ConfigError, match="data.image_root"):
        load_config(TrainConfig, None, ["data.image_root=/data"])
    config = load_config(TrainConfig, None, ["data.image_root=/data", "data.units_uri=/u"])
    assert config.data.image_root == "/data"
