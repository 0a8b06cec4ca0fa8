"""Evaluation from webdataset shards (csclip.eval.shards): CLIP_benchmark's webdataset
folders, written here by clip_benchmark's own convert_dataset / convert_retrieval_dataset
and read back by its build_dataset("wds/...") as the outside reference, give the same
(image, label) and (image, captions) pairs, class names and templates through our reader;
the paper's zero-shot suite prefers the webdataset copies; retrieval over a shard pattern
groups captions by the JSON's image_id, and `csclip evaluate --retrieval-shards` reports it
as that dataset's retrieval suite; every bad sample is a counted rejection with its reason,
and a shard that cannot be opened is one DataError line. Every shard is read through
csclip.shards.read.iter_shard, whose grouping is checked against webdataset's own."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from paper_fixtures import write_zeroshot_paper
from PIL import Image

from csclip.config.eval import SuitesConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder, decode_image
from csclip.eval.shards import (
    WDS_IMAGE_SUFFIXES,
    evaluate_shard_retrieval,
    read_shard_retrieval,
    read_wds_classification,
)
from csclip.eval.suites import evaluate_named_suites
from csclip.eval.zeroshot import evaluate_zeroshot_datasets
from csclip.eval.zeroshot_paper import find_paper_datasets, paper_task
from csclip.shards.read import NO_CAPTION, iter_shard

pytest.importorskip("webdataset")  # clip_benchmark's wds reader and writer need it

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
COLORS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (200, 200, 0), (0, 90, 200))
CLASSES = ("abbey", "airport terminal", "bakery shop")
TEMPLATES = ("a photo of a {c}.", "a blurry photo of the {c}.")
LABELS = (0, 2, 1, 0, 1, 2, 0)  # 7 samples, 3 classes; 3 per shard: 3 shards


def encoded(color, fmt: str = "PNG", size: int = 4) -> bytes:
    out = io.BytesIO()
    options = {"lossless": True} if fmt == "WEBP" else {}
    Image.new("RGB", (size, size), color).save(out, format=fmt, **options)
    return out.getvalue()


class Listed(list):
    """A dataset as convert_dataset takes one: (input, label) items with classes and
    templates attributes."""

    classes: list[str] | None = None
    templates: list[str] | None = None


@pytest.fixture(scope="module")
def clip_benchmark():
    """clip_benchmark's builder (reads wds folders) and webdataset_builder (writes them)."""
    from clip_benchmark import webdataset_builder
    from clip_benchmark.datasets import builder

    return builder, webdataset_builder


def write_classification(writer, folder: Path, labels=LABELS, fmt: str = "WEBP",
                         max_count: int = 3) -> Path:
    dataset = Listed((encoded(COLORS[i % len(COLORS)], fmt, 4 + i), label)
                     for i, label in enumerate(labels))
    dataset.classes, dataset.templates = list(CLASSES), list(TEMPLATES)
    writer.convert_dataset(dataset, "test", str(folder), image_format=fmt.lower().replace(
        "jpeg", "jpg"), max_count=max_count, verbose=False)
    return folder


def pixels(image) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(image)) if isinstance(image, bytes) else image)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("fmt", ["WEBP", "PNG"])
def test_classification_reads_what_clip_benchmark_reads(tmp_path, clip_benchmark, fmt):
    builder, writer = clip_benchmark
    folder = write_classification(writer, tmp_path / "wds_vtab-caltech101", fmt=fmt)
    assert sorted(p.name for p in (folder / "test").iterdir()) == [
        "0.tar", "1.tar", "2.tar", "nshards.txt"]
    theirs = builder.build_dataset("wds/vtab/caltech101", root=str(folder), transform=None,
                                   download=False)
    ours = read_wds_classification(str(folder))
    their_pairs = [(pixels(image), label) for image, label in theirs]
    our_pairs = [(pixels(ours.images[k]), ours.labels[k]) for k in ours.labels]
    assert [label for _, label in our_pairs] == [label for _, label in their_pairs] == list(LABELS)
    for (mine, _), (their, _) in zip(our_pairs, their_pairs, strict=True):
        np.testing.assert_array_equal(mine, their)
    assert ours.classnames == tuple(theirs.classes) == CLASSES
    assert ours.templates == tuple(theirs.templates) == TEMPLATES
    assert (ours.accounting.num_read, ours.accounting.num_kept) == (7, 7)
    assert list(ours.labels)[:2] == ["test/0/s0000000", "test/0/s0000001"]
    # As the paper's suite builds its classifier: {c} filled as zeroshot_classifier does.
    task = paper_task("caltech101", str(folder))
    assert task.class_texts == tuple(tuple(t.format(c=c) for t in theirs.templates)
                                     for c in theirs.classes)
    assert task.labels == {f"zeroshot_paper/caltech101/{k}": v for k, v in ours.labels.items()}


def test_a_sample_with_two_images_gives_the_one_clip_benchmark_takes(tmp_path, clip_benchmark):
    builder, _ = clip_benchmark
    two = tar_bytes([("s0.jpg", encoded(COLORS[0], "JPEG")), ("s0.png", encoded(COLORS[1])),
                     ("s0.webp", encoded(COLORS[2], "WEBP")), ("s0.cls", b"1")])
    folder = write_wds_folder(tmp_path / "wds_sun397", [two])
    (theirs, label), = builder.build_dataset("wds/sun397", root=str(folder), transform=None,
                                             download=False)
    ours = read_wds_classification(str(folder))
    np.testing.assert_array_equal(pixels(ours.images["test/0/s0"]), pixels(theirs))
    assert pixels(theirs)[0, 0].tolist() == list(COLORS[2]) and label == 1  # the webp


class SameScorer:
    """Every image and text the same vector: each image ties every class and the tie goes
    to class 0, so top-1 is the share of images of class 0."""

    def encode_texts(self, texts):
        return np.ones((len(texts), 4))

    def encode_images(self, images):
        return np.ones((len(images), 4))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_paper_suite_reads_the_webdataset_copies_first(tmp_path, clip_benchmark):
    _, writer = clip_benchmark
    suite = tmp_path / "zeroshot_paper"
    write_zeroshot_paper(tmp_path, ("sun397", "cifar10"))  # sun397/ in torchvision's layout
    write_classification(writer, suite / "wds_sun397")
    # A copy in a folder of the paper's name is read from its shards too.
    write_classification(writer, suite / "caltech101", labels=(1, 1, 0, 2))
    found, missing = find_paper_datasets(str(suite))
    assert found == {"sun397": str(suite / "wds_sun397"), "caltech101": str(suite / "caltech101"),
                     "cifar10": str(suite / "cifar10")}
    assert missing["imagenet1k"].endswith("or its webdataset copy wds_imagenet1k/)")
    config = SuitesConfig(names=("zeroshot_paper",), data_root=str(tmp_path))
    metrics = evaluate_named_suites(Encoder(SameScorer()), config)
    assert metrics["zs_paper_sun397"] == pytest.approx(100 * 3 / 7)
    assert metrics["zs_paper_sun397_num_images"] == 7
    assert metrics["zs_paper_caltech101"] == pytest.approx(100 * 1 / 4)
    assert metrics["zs_paper_sun397_webdataset"] == metrics["zs_paper_caltech101_webdataset"] == 1
    assert (metrics["zs_paper_sun397_num_read"], metrics["zs_paper_sun397_num_rejected"]) == (7, 0)
    assert "zs_paper_cifar10_webdataset" not in metrics  # read from its pickles
    assert metrics["zs_paper_datasets_found"] == 3


def tar_bytes(members: list[tuple[str, bytes]], *, end: bool = True) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue() if end else out.getvalue()[:-tarfile.RECORDSIZE]


def write_wds_folder(folder: Path, shards: list[bytes], kind: str | None = None) -> Path:
    (folder / "test").mkdir(parents=True)
    for n, data in enumerate(shards):
        (folder / "test" / f"{n}.tar").write_bytes(data)
    (folder / "test" / "nshards.txt").write_text(f"{len(shards)}\n")
    (folder / "classnames.txt").write_text("".join(f"{c}\n" for c in CLASSES))
    (folder / "zeroshot_classification_templates.txt").write_text("\n".join(TEMPLATES))
    if kind:
        (folder / "dataset_type.txt").write_text(f"{kind}\n")
    return folder


def test_samples_are_grouped_as_webdatasets_group_by_keys(tmp_path):
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    members = [("0001.webp", b"w1"), ("0001.cls", b"0"), ("0002.jpg", b"j2"),
               ("0002.CLS", b"1"), ("0002.txt", b"a caption"), ("README", b"no key"),
               ("dir.v1/0003.png", b"p3"), ("dir.v1/0003.cls", b"2"),
               ("dir.v1/0003.seg.png", b"s3"), ("0004.cls", b"0")]
    shard = tmp_path / "0.tar"
    shard.write_bytes(tar_bytes(members))
    with shard.open("rb") as handle:
        files = [{**f, "__url__": str(shard)} for f in tar_file_iterator(handle)]
        theirs = [{k: v for k, v in sample.items() if not k.startswith("__")} | {
            "__key__": sample["__key__"]} for sample in group_by_keys(files)]
    suffixes = ("webp", "jpg", "png", "cls", "txt", "seg.png")
    ours = list(iter_shard(str(shard), members=suffixes, require_caption=False,
                           image_suffixes=WDS_IMAGE_SUFFIXES))
    assert [s.reject for s in ours] == [None, None, None, "no_image"]
    assert [{**s.members, "__key__": s.key} for s in ours] == theirs
    assert [(s.image, s.caption) for s in ours[:3]] == [
        (b"w1", None), (b"j2", "a caption"), (b"p3", None)]
    # By default a sample without a caption is rejected, and asked-for members come back
    # only when asked for.
    default = list(iter_shard(str(shard)))
    assert [s.reject for s in default] == [NO_CAPTION, None, NO_CAPTION, NO_CAPTION]
    assert default[1].members == {} and default[1].image == b"j2"


def test_bad_samples_are_counted_rejections_with_their_reason(tmp_path, caplog):
    png = encoded(COLORS[0])
    first = tar_bytes([
        ("s0.webp", encoded(COLORS[1], "WEBP")), ("s0.cls", b"1"),
        ("s1.cls", b"0"),  # no image
        ("s2.png", png),  # no class
        ("s3.png", png), ("s3.cls", b"one"),  # not an integer
        ("s4.png", png), ("s4.cls", b"3\n"),  # no class of 3
        ("s5.png", png), ("s5.cls", b"2"), ("s5.cls", b"0"),  # repeated member
        ("s6.jpg", encoded(COLORS[2], "JPEG")), ("s6.cls", b" 2\n"),  # int() takes it
        ("s0.cls", b"1"),  # a key that comes back
    ])
    cut = tar_bytes([("t0.png", png), ("t0.cls", b"0"), ("t1.png", png), ("t1.cls", b"2")])
    cut = cut[: len(cut) // 2 - 300]  # a second shard cut short in its second sample
    folder = write_wds_folder(tmp_path / "zeroshot_paper" / "wds_sun397", [first, cut])
    read = read_wds_classification(str(folder))
    assert read.labels == {"test/0/s0": 1, "test/0/s6": 2, "test/1/t0": 0}
    accounting = read.accounting
    assert accounting.by_reason() == {"bad_class": 2, "no_class": 1, "no_image": 1,
                                      "repeated_key": 1, "repeated_member": 1,
                                      "truncated_shard": 1}
    assert accounting.num_read == accounting.num_kept + len(accounting.rejected) == 10
    assert "s3: .cls b'one' is no class index of 0..2" in accounting.rejected[2].detail
    config = SuitesConfig(names=("zeroshot_paper",), data_root=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="csclip.eval.shards"):
        metrics = evaluate_named_suites(Encoder(SameScorer()), config)
    assert metrics["zs_paper_sun397_num_images"] == 3
    assert metrics["zs_paper_sun397_num_rejected"] == 7
    assert metrics["zs_paper_sun397_rejected_bad_class"] == 2
    assert metrics["zs_paper_sun397_rejected_truncated_shard"] == 1
    warning = [r.getMessage() for r in caplog.records if r.name == "csclip.eval.shards"]
    assert len(warning) == 1 and "10 samples read = 3 kept + 7 rejected (2 bad_class, " \
        "1 no_class, 1 no_image, 1 repeated_key, 1 repeated_member, 1 truncated_shard)" \
        in warning[0], warning


def test_a_shard_that_cannot_be_opened_is_one_data_error_line(tmp_path, capsys, monkeypatch):
    import csclip.eval.pipeline  # the module that loads the models, patched where it looks
    from csclip.entry.evaluate import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(csclip.eval.pipeline, "bundle_from_config", refuse)
    sample = tar_bytes([("s0.png", encoded(COLORS[0])), ("s0.cls", b"0")])
    folder = write_wds_folder(tmp_path / "zeroshot_paper" / "wds_vtab-caltech101",
                              [sample, sample])
    (folder / "test" / "nshards.txt").write_text("3\n")  # one more than there are
    code = main(["--model", "csclip-tiny", "--suite", "zeroshot_paper", "--data-root",
                 str(tmp_path), "--allow-missing", "--out", str(tmp_path / "eval"),
                 "--set", "tracking.enabled=false"])
    lines = [line for line in capsys.readouterr().err.splitlines() if not LOG_LINE.match(line)]
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"error: 1 of 3 shards do not exist, e.g. {folder}/test/2.tar")
    # A file that is no tar, and a shard gone after the folder was found.
    (folder / "test" / "nshards.txt").write_text("2\n")
    (folder / "test" / "1.tar").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(DataError, match=r"shard .*/test/1.tar is not a readable tar"):
        read_wds_classification(str(folder))
    (folder / "test" / "1.tar").unlink()
    with pytest.raises(DataError, match=r"1 of 2 shards do not exist"):
        read_wds_classification(str(folder))
    (folder / "test" / "nshards.txt").write_text("two\n")
    with pytest.raises(DataError, match=r"nshards.txt: 'two' is not a number of shards"):
        read_wds_classification(str(folder))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_zeroshot_suite_reads_a_webdataset_folder(tmp_path, clip_benchmark):
    _, writer = clip_benchmark
    write_classification(writer, tmp_path / "zeroshot" / "wds_vtab-pets", labels=(0, 0, 1))
    metrics = evaluate_zeroshot_datasets(Encoder(SameScorer()), str(tmp_path / "zeroshot"))
    assert metrics["zs_wds_vtab-pets"] == pytest.approx(100 * 2 / 3)
    assert metrics["zs_wds_vtab-pets_num_read"] == 3
    assert metrics["zs_wds_vtab-pets_num_rejected"] == 0


def test_the_shards_are_read_from_s3(tmp_path, s3_endpoint, monkeypatch):
    from s3_helpers import fresh_bucket

    sample = tar_bytes([("s0.png", encoded(COLORS[0])), ("s0.cls", b"2")])
    folder = write_wds_folder(tmp_path / "wds_sun397", [sample])
    with fresh_bucket(s3_endpoint, monkeypatch, "bench") as client:
        for path in folder.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), "bench", f"zs/{path.relative_to(tmp_path)}")
        read = read_wds_classification("s3://bench/zs/wds_sun397")
        assert read.labels == {"test/0/s0": 2} and read.classnames == CLASSES
        client.delete_object(Bucket="bench", Key="zs/wds_sun397/test/0.tar")
        with pytest.raises(DataError, match=r"cannot open shard s3://bench/zs/wds_sun397/"):
            read_wds_classification("s3://bench/zs/wds_sun397")


# ---------------------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::UserWarning")
def test_retrieval_reads_what_clip_benchmark_reads(tmp_path, clip_benchmark):
    builder, writer = clip_benchmark
    captions = [["a red square", "a red box"], ["a green square"],
                ["a blue square", "a blue\\nbox", "a third"]]
    dataset = [(encoded(COLORS[i], "WEBP", 4 + i), c) for i, c in enumerate(captions)]
    folder = tmp_path / "wds_flickr8k"
    writer.convert_retrieval_dataset(dataset, "test", str(folder), image_format="webp",
                                     max_count=2, verbose=False)
    theirs = list(builder.build_dataset("wds/flickr8k", root=str(folder), transform=None,
                                        task="zeroshot_retrieval", download=False))
    ours = read_shard_retrieval(str(folder))
    by_image = {i: [] for i in range(len(ours.rset.image_ids))}
    for image, text in ours.rset.instances:
        by_image[image].append(ours.rset.texts[text])
    assert [by_image[i] for i in by_image] == [c for _, c in theirs] == captions
    for image_id, (image, _) in zip(ours.rset.image_ids, theirs, strict=True):
        np.testing.assert_array_equal(pixels(ours.images[image_id]), pixels(image))
    assert ours.rset.image_ids == ("0/s0000000", "0/s0000001", "1/s0000002")
    with pytest.raises(DataError, match="a classification folder"):
        read_shard_retrieval(str(write_wds_folder(tmp_path / "cls", [tar_bytes([])])))


# Hand-set embeddings: three images (red, green, blue) and five captions.
IMAGE_VECTORS = {(255, 0, 0): (1, 0, 0), (0, 255, 0): (0, 1, 0), (0, 0, 255): (0, 0, 1)}
TEXT_VECTORS = {"a red square": (1, 0, 0), "a red box": (0.8, 0.6, 0),
                "a crimson square": (0, 0.6, 0.8), "a green square": (0, 1, 0),
                "a blue square": (0.8, 0, 0.6)}


class LookupScorer:
    def encode_texts(self, texts):
        return np.array([TEXT_VECTORS[t] for t in texts], dtype=np.float32)

    def encode_images(self, images):
        return np.array([IMAGE_VECTORS[decode_image(i).getpixel((0, 0))] for i in images],
                        dtype=np.float32)


def test_retrieval_over_a_shard_pattern_groups_captions_by_image_id(tmp_path):
    """Image red has three captions in three samples (one in the other shard) sharing the
    JSON's image_id; green and blue one each. Queries (CLIP_benchmark's counting): T2I
    red-square -> red, red-box -> red (0.8), crimson -> blue (0.8 over red's 0), green ->
    green, blue-square -> red (0.8 over blue's 0.6): 3 of 5. I2T: red's best row is its
    own red-square, green's green-square, blue's is crimson (0.8, red's): 2 of 3."""
    red, green, blue = (encoded(c) for c in COLORS[:3])
    first = tar_bytes([
        ("a1.png", red), ("a1.txt", b"a red square"), ("a1.json", b'{"image_id": 7}'),
        ("b.png", green), ("b.txt", b"a green square"),
        ("a2.png", red), ("a2.json", b'{"image_id": 7, "caption": "a red box"}'),
    ])
    second = tar_bytes([
        ("a3.png", red), ("a3.txt", b"a crimson square"), ("a3.json", b'{"image_id": 7}'),
        ("c.png", blue), ("c.txt", b"a blue square"), ("c.json", b'{"url": "x"}'),
        ("d.png", blue),  # no caption
        ("e.png", blue), ("e.txt", b"x"), ("e.json", b"{not json"),
        ("f.png", green), ("f.txt", b"a red square"), ("f.json", b'{"image_id": 7}'),
    ])
    for n, data in enumerate((first, second)):
        (tmp_path / f"{n:05d}.tar").write_bytes(data)
    pattern = f"{tmp_path}/{{00000..00001}}.tar"
    read = read_shard_retrieval(pattern)
    assert read.rset.image_ids == ("7", "00000/b", "00001/c")
    assert read.accounting.by_reason() == {"bad_json": 1, "conflicting_image": 1,
                                           "no_caption": 1}
    metrics = evaluate_shard_retrieval(Encoder(LookupScorer()), pattern, "coco")
    assert metrics["coco_ret_t2i"] == pytest.approx(100 * 3 / 5)
    assert metrics["coco_ret_i2t"] == pytest.approx(100 * 2 / 3)
    assert metrics["coco_ret_t2i_r5"] == metrics["coco_ret_i2t_r5"] == 100
    assert (metrics["coco_ret_num_images"], metrics["coco_ret_num_queries_t2i"]) == (3, 5)
    assert (metrics["coco_ret_num_read"], metrics["coco_ret_num_rejected"]) == (8, 3)
    assert metrics["coco_ret_rejected_conflicting_image"] == 1
    # Strict counting (ours) agrees here: no ties.
    strict = evaluate_shard_retrieval(Encoder(LookupScorer()), pattern, "coco", "strict")
    assert strict["coco_ret_i2t"] == metrics["coco_ret_i2t"]
    assert strict["coco_ret_t2i"] == metrics["coco_ret_t2i"]


def test_retrieval_input_errors_are_one_line(tmp_path):
    with pytest.raises(DataError, match="neither a shard pattern"):
        read_shard_retrieval(str(tmp_path))
    (tmp_path / "00000.tar").write_bytes(tar_bytes([("d.png", encoded(COLORS[0]))]))
    with pytest.raises(DataError, match=r"no image with a caption in 1 shards \(1 samples "
                                        r"rejected: \{'no_caption': 1\}\)"):
        read_shard_retrieval(str(tmp_path / "00000.tar"))
    (tmp_path / "00001.tar").write_bytes(b"\x00garbage" * 200)
    with pytest.raises(DataError, match="00001.tar is not a readable tar"):
        read_shard_retrieval(f"{tmp_path}/{{00000..00001}}.tar")
    with pytest.raises(DataError, match="do not exist"):
        read_shard_retrieval(f"{tmp_path}/{{00000..00002}}.tar")
    pixels_only = tar_bytes([("p.pixels.npy", b"\x93NUMPY"), ("p.txt", b"a caption")])
    (tmp_path / "00003.tar").write_bytes(pixels_only)
    with pytest.raises(DataError, match="transformed pixels"):
        read_shard_retrieval(str(tmp_path / "00003.tar"))


# ---------------------------------------------------------------------------------------
# Retrieval over shards from `csclip evaluate`
# ---------------------------------------------------------------------------------------

# csclip-tiny with random weights on the tiny world (4 images), half-truth without
# bootstrap, no world suites: what remains is retrieval.
TINY_EVALUATE = ["--model", "csclip-tiny", "--set", "model.image_size=32",
                 "--set", "data.world.num_val=4", "--set", "data.world.image_size=32",
                 "--set", "benchmark.num_bootstrap=0", "--set", "benchmark.image_side=false",
                 "--set", "suites.num_world_pairs=0", "--set", "suites.num_zeroshot_items=0",
                 "--set", "tracking.enabled=false"]


def write_coco_shards(folder: Path) -> str:
    """Two shards: red with two captions (one image_id), green, blue, and one sample
    without a caption (rejected); their pattern."""
    red, green, blue = (encoded(c) for c in COLORS[:3])
    folder.mkdir()
    (folder / "00000.tar").write_bytes(tar_bytes([
        ("a1.png", red), ("a1.txt", b"a red square"), ("a1.json", b'{"image_id": 7}'),
        ("a2.png", red), ("a2.txt", b"a red box"), ("a2.json", b'{"image_id": 7}'),
        ("b.png", green), ("b.txt", b"a green square")]))
    (folder / "00001.tar").write_bytes(tar_bytes([
        ("c.png", blue), ("c.txt", b"a blue square"), ("d.png", blue)]))
    return f"{folder}/{{00000..00001}}.tar"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_evaluate_reports_retrieval_over_shards_as_the_datasets_suite(
        tmp_path, clip_benchmark, capsys):
    from csclip.entry.evaluate import main

    _, writer = clip_benchmark
    pattern = write_coco_shards(tmp_path / "coco")
    flickr = tmp_path / "wds_flickr8k"
    writer.convert_retrieval_dataset(
        [(encoded(COLORS[i], "WEBP"), [f"caption {i}", f"another {i}"]) for i in range(3)],
        "test", str(flickr), image_format="webp", max_count=2, verbose=False)
    out = tmp_path / "eval"
    assert main([*TINY_EVALUATE, "--out", str(out), "--retrieval-shards", f"coco={pattern}",
                 "--retrieval-shards", f"flickr8k={flickr}"]) == 0
    printed = capsys.readouterr().out
    assert "COCO I2T R@1" in printed  # the suites table, as --suite coco_retrieval fills it
    with (out / "suites.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert 0 <= float(row["coco_ret_i2t"]) <= 100 and 0 <= float(row["coco_ret_t2i"]) <= 100
    # One CLIP_benchmark result per dataset, under its names, with the shards' accounting.
    coco = json.loads((out / "mscoco_captions_random_csclip-tiny_zeroshot_retrieval.json")
                      .read_text())["metrics"]
    assert {f"{kind}_retrieval_recall@{k}" for kind in ("image", "text")
            for k in (1, 5, 10)} <= set(coco)
    assert (coco["num_images"], coco["num_queries_t2i"]) == (3, 4)
    assert (coco["num_read"], coco["num_rejected"], coco["rejected_no_caption"]) == (5, 1, 1)
    assert coco["text_retrieval_recall@1"] == pytest.approx(float(row["coco_ret_i2t"]) / 100)
    flickr8k = json.loads((out / "flickr8k_random_csclip-tiny_zeroshot_retrieval.json")
                          .read_text())["metrics"]
    assert (flickr8k["num_images"], flickr8k["num_queries_t2i"], flickr8k["num_read"]) == (
        3, 6, 3)


@pytest.mark.parametrize(("argv", "line"), [
    (["--retrieval-shards", "coco"], "--retrieval-shards 'coco' is not NAME=PATTERN"),
    (["--retrieval-shards", "CC-3M=x.tar"], "retrieval dataset name 'CC-3M'"),
    (["--retrieval-shards", "ret=x.tar"], "retrieval dataset name 'ret'"),
    (["--retrieval-shards", "coco=a.tar", "--retrieval-shards", "coco=b.tar"],
     "--retrieval-shards names coco twice"),
    (["--retrieval-shards", "coco=x.tar", "--suite", "coco_retrieval", "--data-root", "r"],
     "both measure coco_retrieval and retrieval_shards.coco"),
    # --data-root is read only for --suite: still refused next to --retrieval-shards.
    (["--retrieval-shards", "coco=x.tar", "--data-root", "r"], "suites.data_root='r'"),
])
def test_retrieval_shards_flags_that_cannot_run_are_one_line(argv, line, capsys):
    from csclip.entry.evaluate import main

    assert main([*argv, "--print-config"]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if not LOG_LINE.match(x)]
    assert len(lines) == 1 and line in lines[0], lines


def test_missing_retrieval_shards_are_refused_before_a_model_loads(tmp_path, capsys,
                                                                   monkeypatch):
    import csclip.eval.pipeline  # the module that loads the models, patched where it looks
    from csclip.entry.evaluate import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(csclip.eval.pipeline, "bundle_from_config", refuse)
    pattern = write_coco_shards(tmp_path / "coco").replace("00001}", "00002}")
    code = main([*TINY_EVALUATE, "--out", str(tmp_path / "eval"),
                 "--retrieval-shards", f"coco={pattern}"])
    lines = [x for x in capsys.readouterr().err.splitlines() if not LOG_LINE.match(x)]
    assert code == 2 and lines == [f"error: retrieval shards coco: 1 of 3 shards do not "
                                   f"exist, e.g. {tmp_path}/coco/00002.tar"], lines
