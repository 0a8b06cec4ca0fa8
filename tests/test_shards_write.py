"""`csclip shards`: any captions input written as webdataset shards, read back by our reader
and by webdataset's own, byte for byte deterministic, every bad image a counted rejection."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from csclip import cli
from csclip.config import load_config
from csclip.config.extract import InputConfig
from csclip.config.model import ModelSource
from csclip.config.shards import ShardsConfig, ShardsOutputConfig
from csclip.config.world import WorldConfig
from csclip.entry.shards import pixel_encoding
from csclip.errors import DataError
from csclip.extract.captions import caption_table
from csclip.preprocess import image_pixels
from csclip.shards import SHARDS_MANIFEST, ShardsSummary, read_manifest, stats_name, write_shards
from csclip.shards.read import iter_shard
from csclip.shards.write import REJECTS_FILE, sample_key
from csclip.train.stream import preprocess_key
from tests.s3_helpers import fresh_bucket

TINY_WORLD = WorldConfig(num_train=20, num_val=4, num_test=4, image_size=32)
WORLD_FLAGS = ["--format", "world", "--set", "input.world.num_train=20",
               "--set", "input.world.num_val=4", "--set", "input.world.num_test=4",
               "--set", "input.world.image_size=32"]


def world_rows() -> list[dict]:
    return caption_table(InputConfig(world=TINY_WORLD)).to_pylist()


def write(rows: list[dict], uri: str, **output) -> ShardsSummary:
    return write_shards(rows, ShardsOutputConfig(uri=uri, **output))


def shard_uris(uri: str) -> list[str]:
    return [f"{uri}/{shard['name']}" for shard in read_manifest(uri)["shards"]]


def read_back(uri: str) -> list:
    samples = [s for shard in shard_uris(uri) for s in iter_shard(shard)]
    assert not [s for s in samples if s.reject], "our own shards read without rejections"
    return samples


def png(path, color=(200, 30, 30), size=(24, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_world_shards_hold_every_sample_once_with_its_caption_image_and_gold(tmp_path):
    rows = world_rows()
    out = str(tmp_path / "shards")
    summary = write(rows, out, samples_per_shard=8, encoding="original")
    samples = read_back(out)
    assert sorted(s.meta["sample_id"] for s in samples) == sorted(r["sample_id"] for r in rows)
    by_id = {r["sample_id"]: r for r in rows}
    for sample in samples:
        row = by_id[sample.meta["sample_id"]]
        assert sample.key == sample_key(row["sample_id"])
        assert sample.caption == row["caption"] and sample.meta["caption"] == row["caption"]
        assert sample.image_suffix == "png" and sample.image == row["image_bytes"]
        assert sample.meta["gold_json"] == row["gold_json"]
        assert (sample.meta["split"], sample.meta["image_id"]) == (row["split"], row["image_id"])
    manifest = read_manifest(out)
    assert manifest["num_samples"] == manifest["num_read"] == len(rows) == 28
    assert [s["count"] for s in manifest["shards"]] == [8, 8, 8, 4]
    assert manifest["encoding"] == "original" and manifest["decoded"] is True
    for shard, entry in zip(shard_uris(out), manifest["shards"], strict=True):
        stats = json.loads(open(stats_name(shard)).read())
        assert stats["count"] == stats["successes"] == entry["count"]
        assert stats["failed_to_download"] == stats["failed_to_resize"] == 0
    assert pq.read_table(f"{out}/{REJECTS_FILE}").num_rows == 0
    assert (summary.num_read, summary.num_written, summary.num_shards) == (28, 28, 4)


def test_jpeg_encoding_is_the_source_re_encoded_at_quality_95(tmp_path):
    rows = world_rows()[:5]
    out = str(tmp_path / "jpeg")
    write(rows, out, samples_per_shard=10)
    by_id = {r["sample_id"]: r for r in rows}
    for sample in read_back(out):
        expected = io.BytesIO()
        source = Image.open(io.BytesIO(by_id[sample.meta["sample_id"]]["image_bytes"]))
        source.convert("RGB").save(expected, format="JPEG", quality=95)
        assert sample.image_suffix == "jpg" and sample.image == expected.getvalue()


def _digests(uri: str) -> dict[str, str]:
    return {os.path.basename(shard): hashlib.sha256(open(shard, "rb").read()).hexdigest()
            for shard in shard_uris(uri)}


def test_same_input_and_seed_give_the_same_bytes_and_another_seed_another_order(tmp_path):
    rows = world_rows()
    write(rows, str(tmp_path / "a"), samples_per_shard=10, seed=3)
    write(list(reversed(rows)), str(tmp_path / "b"), samples_per_shard=10, seed=3)
    write(rows, str(tmp_path / "c"), samples_per_shard=10, seed=4)
    assert _digests(str(tmp_path / "a")) == _digests(str(tmp_path / "b"))
    # Fixed headers, not only the same second: no time, user or group of this machine.
    with tarfile.open(shard_uris(str(tmp_path / "a"))[0]) as tar:
        headers = {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in tar.getmembers()}
    assert headers == {(0, 0, 0, "csclip", "csclip")}
    order = [[s.key for s in read_back(str(tmp_path / name))] for name in "ac"]
    assert sorted(order[0]) == sorted(order[1]) and order[0] != order[1]


def _coco(tmp_path, num_images: int = 8, captions_per_image: int = 5) -> str:
    images = tmp_path / "coco" / "images"
    images.mkdir(parents=True)
    data = {"images": [], "annotations": []}
    for image_id in range(num_images):
        png(images / f"{image_id:012d}.png", color=(image_id * 30, 10, 10))
        data["images"].append({"id": image_id, "file_name": f"{image_id:012d}.png"})
        for number in range(captions_per_image):
            data["annotations"].append({"id": image_id * 100 + number, "image_id": image_id,
                                        "caption": f"image {image_id}, caption {number}"})
    path = tmp_path / "coco" / "captions_train2017.json"
    path.write_text(json.dumps(data))
    return str(path)


def _same_image_neighbours(image_ids: list[str]) -> int:
    return sum(a == b for a, b in zip(image_ids, image_ids[1:], strict=False))


def test_the_captions_of_an_image_are_scattered_across_the_shards(tmp_path, capsys):
    captions = _coco(tmp_path)
    out = str(tmp_path / "out")
    code = cli.main(["shards", "--input", captions, "--image-root", str(tmp_path / "coco/images"),
                     "--samples-per-shard", "16", "--encoding", "original", "--out", out])
    assert code == 0
    assert "read 40 = written 40 + rejected 0" in capsys.readouterr().out
    source = [r["image_id"] for r in caption_table(InputConfig(
        uri=captions, image_root=str(tmp_path / "coco/images")), ).to_pylist()]
    written = [s.meta["image_id"] for s in read_back(out)]
    assert sorted(written) == sorted(source)
    # The source keeps an image's five captions together (32 same-image neighbours of 39).
    assert _same_image_neighbours(source) == 32
    assert _same_image_neighbours(written) <= 8


def test_webdatasets_own_reader_sees_our_keys_and_captions(tmp_path):
    import webdataset

    rows = world_rows()
    out = str(tmp_path / "shards")
    write(rows, out, samples_per_shard=7)
    ours = [(s.key, s.caption) for s in read_back(out)]
    dataset = webdataset.WebDataset(shard_uris(out), shardshuffle=False, empty_check=False)
    theirs = [(sample["__key__"], sample["txt"].decode()) for sample in dataset]
    assert theirs == ours and len(theirs) == len(rows)
    assert all(set(s) >= {"jpg", "txt", "json"} for s in webdataset.WebDataset(
        shard_uris(out), shardshuffle=False, empty_check=False))


def test_bad_images_are_counted_rejections_with_their_reasons(tmp_path, capsys):
    root = tmp_path / "images"
    root.mkdir()
    for name in ("a", "b", "c"):
        png(root / f"{name}.png")
    (root / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    png(tmp_path / "outside.png")
    lines = [{"image": "a.png", "caption": "a red block"},
             {"image": "b.png", "caption": "another red block"},
             {"image": "c.png", "caption": "   "},
             {"image": "corrupt.jpg", "caption": "a broken file"},
             {"image": "gone.png", "caption": "a file that is not there"},
             {"image": "../outside.png", "caption": "a file outside the root"},
             {"image": str(tmp_path / "outside.png"), "caption": "an absolute path outside"}]
    captions = tmp_path / "pairs.jsonl"
    captions.write_text("\n".join(json.dumps(line) for line in lines))
    out = str(tmp_path / "out")
    assert cli.main(["shards", "--input", str(captions), "--image-root", str(root),
                     "--samples-per-shard", "3", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "read 7 = written 2 + rejected 5" in printed
    rejects = pq.read_table(f"{out}/{REJECTS_FILE}").to_pylist()
    reasons = {r["sample_id"]: r["reason"] for r in rejects}
    assert reasons == {"pairs-00000002": "empty_caption", "pairs-00000003": "undecodable_image",
                       "pairs-00000004": "missing_image", "pairs-00000005": "outside_image_root",
                       "pairs-00000006": "outside_image_root"}
    assert all(r["detail"] for r in rejects)
    manifest = read_manifest(out)
    assert manifest["num_samples"] == 2 and manifest["rejected"] == {
        "empty_caption": 1, "missing_image": 1, "outside_image_root": 2, "undecodable_image": 1}
    assert sum(s["count"] for s in manifest["shards"]) == 2 == len(read_back(out))
    stats = [json.loads(open(stats_name(uri)).read()) for uri in shard_uris(out)]
    assert sum(s["failed_to_resize"] for s in stats) == 5
    assert all(s["count"] == s["successes"] + s["failed_to_resize"] for s in stats)


def test_pixels_are_the_models_transform_of_the_source_image(tmp_path, capsys):
    out = str(tmp_path / "pixels")
    assert cli.main(["shards", *WORLD_FLAGS, "--split", "val", "--encoding", "pixels",
                     "--model", "csclip-tiny", "--out", out]) == 0
    rows = {r["sample_id"]: r for r in world_rows()}
    preprocess = pixel_encoding(ModelSource(name="csclip-tiny")).preprocess
    transform = image_pixels(preprocess_key(preprocess))
    samples = read_back(out)
    assert len(samples) == TINY_WORLD.num_val
    manifest = read_manifest(out)
    for sample in samples:
        assert sample.image_suffix == "pixels.npy" and sample.meta["split"] == "val"
        pixels = np.load(io.BytesIO(sample.image), allow_pickle=False)
        source = Image.open(io.BytesIO(rows[sample.meta["sample_id"]]["image_bytes"]))
        expected = transform(source.convert("RGB"))
        assert pixels.dtype == np.uint8 and list(pixels.shape) == manifest["image_shape"]
        np.testing.assert_array_equal(pixels, expected)
    assert manifest["model"] == "csclip-tiny" and manifest["preprocess"] == preprocess


def test_s3_output_is_written_and_read_back(tmp_path, s3_endpoint, monkeypatch):
    with fresh_bucket(s3_endpoint, monkeypatch, "shards-test"):
        rows = world_rows()
        uri = "s3://shards-test/world/train"
        summary = write(rows, uri, samples_per_shard=10)
        assert summary.num_written == len(rows) and summary.num_shards == 3
        manifest = read_manifest(uri)
        assert [s["name"] for s in manifest["shards"]] == ["00000.tar", "00001.tar", "00002.tar"]
        samples = read_back(uri)
        assert sorted(s.meta["sample_id"] for s in samples) == sorted(r["sample_id"] for r in rows)
        again = write(rows, uri, samples_per_shard=10)
        assert again.already_written


def test_a_rerun_is_already_written_and_other_settings_are_refused(tmp_path, capsys):
    out = str(tmp_path / "out")
    argv = ["shards", *WORLD_FLAGS, "--samples-per-shard", "9", "--out", out]
    assert cli.main(argv) == 0
    before = {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)}
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "already written" in capsys.readouterr().out
    assert before == {name: os.stat(os.path.join(out, name)).st_mtime_ns
                      for name in os.listdir(out)}
    assert cli.main([*argv, "--seed", "1"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error:") and "seed 0 there, 1 now" in error and "\n" not in error


def test_an_unfinished_folder_is_rewritten_without_its_stale_shards(tmp_path):
    rows = world_rows()
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.yaml").write_text("output: {}\n")  # an earlier run of ours took it
    (out / "00007.tar").write_bytes(b"left by a run killed before its shards.json")
    (out / "00007_stats.json").write_text("{}")
    write(rows, str(out), samples_per_shard=10)
    assert sorted(p.name for p in out.glob("0*")) == [
        "00000.tar", "00000_stats.json", "00001.tar", "00001_stats.json", "00002.tar",
        "00002_stats.json"]


def test_a_folder_of_other_shards_is_refused(tmp_path):
    (tmp_path / "00000.tar").write_bytes(b"someone else's shard")
    with pytest.raises(DataError, match="did not write"):
        write(world_rows(), str(tmp_path), samples_per_shard=10)
    assert not (tmp_path / SHARDS_MANIFEST).exists()


def test_two_samples_with_one_key_are_refused(tmp_path):
    rows = world_rows()[:2]
    rows[0]["sample_id"], rows[1]["sample_id"] = "coco/1.a", "coco_1 a"
    with pytest.raises(DataError, match="both make the shard key 'coco_1_a'"):
        write(rows, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_mistyped_flag_or_setting_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["shards", "--samples-per-shards", "3", "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "unrecognized arguments: --samples-per-shards" in capsys.readouterr().err
    code = cli.main(["shards", "--set", "output.sample_per_shard=3", "--out", str(tmp_path)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error
    assert "unknown setting output.sample_per_shard (did you mean output.samples_per_shard?)" \
        in error
    assert cli.main(["shards", "--format", "world"]) == 2  # no --out
    assert "output.uri is required" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_print_config_prints_what_a_run_would_use(tmp_path, capsys):
    assert cli.main(["shards", *WORLD_FLAGS, "--encoding", "pixels", "--model", "csclip-tiny",
                     "--split", "train", "--out", str(tmp_path / "out"), "--print-config"]) == 0
    printed = capsys.readouterr().out
    path = tmp_path / "config.yaml"
    path.write_text(printed)
    config = load_config(ShardsConfig, path)
    assert config.output.encoding == "pixels" and config.model.name == "csclip-tiny"
    assert config.input.splits == ("train",) and config.input.world == TINY_WORLD
    assert not (tmp_path / "out").exists()
