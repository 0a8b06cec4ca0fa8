"""The paper's ZS column (suite zeroshot_paper): the seven CLIP_benchmark datasets read
from their on-disk layouts with hand-checked labels, the same (image, label) listing,
class names and templates as clip_benchmark's build_dataset where it runs offline, a
`csclip evaluate` run filling zs_paper_* and ret_paper_*, and a missing dataset refused
in one line before any model loads."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from paper_fixtures import (
    CIFAR10_LABELS,
    CIFAR10_NAMES,
    PALETTE,
    write_coco,
    write_flickr8k,
    write_zeroshot_paper,
)

from csclip.config.eval import SuitesConfig
from csclip.eval import zeroshot_paper
from csclip.eval.encoder import Encoder
from csclip.eval.suites import evaluate_named_suites, find_named_suites
from csclip.eval.zeroshot_paper import PAPER_DATASETS, paper_task, read_paper_dataset

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")


def _package_json(name: str) -> dict:
    return json.loads(resources.files("clip_benchmark.datasets").joinpath(name).read_text())


@pytest.fixture(scope="module")
def paper_root(tmp_path_factory) -> tuple[Path, dict[str, dict[str, int]]]:
    root = tmp_path_factory.mktemp("paper")
    return root, write_zeroshot_paper(root)


def _labels(name: str, root: Path) -> dict[str, int]:
    dataset = read_paper_dataset(name, str(root / "zeroshot_paper" / name))
    prefix = f"zeroshot_paper/{name}/"
    return {key.removeprefix(prefix): label for key, label in dataset.labels.items()}


def test_readers_give_the_hand_checked_labels_and_names(paper_root):
    root, written = paper_root
    for name in PAPER_DATASETS:
        assert _labels(name, root) == written[name], name
    names = {n: read_paper_dataset(n, str(root / "zeroshot_paper" / n)).classnames
             for n in PAPER_DATASETS}
    imagenet = _package_json("en_classnames.json")["imagenet1k"]
    assert _labels("imagenet1k", root)["val/n01443537/ILSVRC2012_val_0001.JPEG"] == 1
    assert names["imagenet1k"] == names["imagenetv2"] == tuple(imagenet)
    assert names["imagenet1k"][1] == "goldfish" and names["imagenetv2"][999] == "toilet paper"
    assert _labels("imagenetv2", root)[
        f"ImageNetV2-matched-frequency/999/{1:040x}.jpeg"] == 999  # the folder's number
    # ImageNet-O: 200 classes, imagenet1k's names where the WordNet id is one of its own.
    assert len(names["imagenet-o"]) == 200
    assert names["imagenet-o"][:3] == ("goldfish", "triceratops", "harvestman")
    assert _labels("imagenet-o", root)["n01704323/o_0002.jpg"] == 1
    assert names["caltech101"][:3] == ("background", "off-center face", "centered face")
    assert _labels("caltech101", root)[
        "caltech101/101_ObjectCategories/Faces_easy/image_0001.jpg"] == 2
    assert names["sun397"] == ("abbey", "apartment building outdoor", "bakery shop")
    assert _labels("sun397", root)["SUN397/a/apartment_building/outdoor/sun_10abcdefgh.jpg"] == 1
    # CIFAR-10: the batch's labels, batches.meta's names, pixels as PNG (not held as paths).
    cifar = read_paper_dataset("cifar10", str(root / "zeroshot_paper" / "cifar10"))
    assert cifar.classnames == CIFAR10_NAMES
    assert [cifar.labels[k] for k in sorted(cifar.labels)] == list(CIFAR10_LABELS)
    import io

    from PIL import Image

    first = Image.open(io.BytesIO(cifar.images[sorted(cifar.images)[2]]))
    assert first.format == "PNG" and first.size == (32, 32)
    assert first.getpixel((5, 5)) == PALETTE[2]
    # The others are file paths, never bytes.
    sketch = read_paper_dataset("imagenet_sketch", str(root / "zeroshot_paper" /
                                                       "imagenet_sketch"))
    assert all(isinstance(v, str) and Path(v).is_file() for v in sketch.images.values())


def test_the_templates_are_clip_benchmarks(paper_root):
    root, _ = paper_root
    templates = _package_json("en_zeroshot_classification_templates.json")
    for name, key in (("cifar10", "cifar10"), ("sun397", "sun397"),
                      ("caltech101", "caltech101"), ("imagenet-o", "imagenet1k"),
                      ("imagenetv2", "imagenet1k")):
        task = paper_task(name, str(root / "zeroshot_paper" / name))
        assert task.class_texts == tuple(tuple(t.replace("{c}", c) for t in templates[key])
                                         for c in task.classnames), name
    assert len(templates["cifar10"]) == 18 and len(templates["imagenet1k"]) == 80


@pytest.fixture
def no_downloads(monkeypatch):
    """clip_benchmark's builder shells out (wget, gdown) and imagenetv2 calls requests:
    any of it fails the test."""
    import clip_benchmark.datasets.builder as builder
    import requests

    def refuse(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args}")

    monkeypatch.setattr(builder, "call", refuse)
    monkeypatch.setattr(requests, "get", refuse)
    return builder


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_same_listing_classes_and_templates_as_clip_benchmark_build_dataset(paper_root,
                                                                           no_downloads):
    """Where build_dataset runs offline on the fixture (CIFAR-10 checks md5s, imagenetv2
    downloads unless it finds 10,000 images)."""
    root, _ = paper_root
    for name in ("imagenet1k", "imagenet_sketch", "imagenet-o", "caltech101", "sun397"):
        folder = root / "zeroshot_paper" / name
        ds = no_downloads.build_dataset(name, root=str(folder), download=False)
        if name == "caltech101":
            base = Path(ds.root) / "101_ObjectCategories"
            theirs = {str(base / ds.categories[y] / f"image_{i:04d}.jpg"): y
                      for y, i in zip(ds.y, ds.index, strict=True)}
        elif name == "sun397":
            theirs = {str(p): y for p, y in zip(ds._image_files, ds._labels, strict=True)}
        else:
            theirs = {str(p): y for p, y in ds.samples}
        task = paper_task(name, str(folder))
        ours = {str(Path(task.images[k])): label for k, label in task.labels.items()}
        assert ours == theirs, name
        assert task.classnames == tuple(ds.classes), name
        assert [t[0] for t in task.class_texts] == [ds.templates[0].format(c=c)
                                                    for c in ds.classes], name
        assert task.class_texts[0] == tuple(t.format(c=ds.classes[0]) for t in ds.templates)


class SameScorer:
    """Every image and text the same vector: each image ties every class, and the tie goes
    to class 0 (argmax), so top-1 is the share of images of class 0."""

    def encode_texts(self, texts):
        return np.ones((len(texts), 4))

    def encode_images(self, images):
        return np.ones((len(images), 4))


def test_all_seven_give_zs_paper_avg_the_mean_top1(paper_root):
    root, written = paper_root
    config = SuitesConfig(names=("zeroshot_paper",), data_root=str(root))
    metrics = evaluate_named_suites(Encoder(SameScorer()), config)
    expected = {name: 100.0 * np.mean([label == 0 for label in listing.values()])
                for name, listing in written.items()}
    for name, value in expected.items():
        slug = name.replace("-", "_")
        assert metrics[f"zs_paper_{slug}"] == pytest.approx(value), name
        assert metrics[f"zs_paper_{slug}_num_images"] == len(written[name])
    assert metrics["zs_paper_cifar10"] == pytest.approx(100 * 2 / 6)
    # Mean per-class recall: class 0 all right, every other class present all wrong.
    assert metrics["zs_paper_cifar10_recall"] == pytest.approx(100 / 3)
    assert metrics["zs_paper_avg"] == pytest.approx(np.mean(list(expected.values())))
    assert (metrics["zs_paper_datasets_found"], metrics["zs_paper_datasets_asked"]) == (7, 7)


def test_a_missing_dataset_is_one_line_naming_its_layout(tmp_path, capsys, monkeypatch):
    import csclip.eval.pipeline  # the module that loads the models, patched where it looks
    from csclip.entry.evaluate import main

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(csclip.eval.pipeline, "bundle_from_config", refuse)
    write_zeroshot_paper(tmp_path, ("cifar10", "sun397"))
    (tmp_path / "zeroshot_paper" / "imagenet1k").mkdir()  # there, but not its layout
    code = main(["--model", "csclip-tiny", "--suite", "zeroshot_paper", "--data-root",
                 str(tmp_path), "--out", str(tmp_path / "eval"),
                 "--set", "tracking.enabled=false"])
    lines = [line for line in capsys.readouterr().err.splitlines() if not LOG_LINE.match(line)]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "zeroshot_paper: 5 of 7 datasets not found under " in lines[0]
    assert f"imagenet1k ({tmp_path}/zeroshot_paper/imagenet1k: expects val/<wnid>/" in lines[0]
    assert "caltech101/101_ObjectCategories/<category>/<image>.jpg" in lines[0]
    assert "--allow-missing" in lines[0]
    # Nothing there at all: "not found", with every dataset's layout.
    line = find_named_suites(SuitesConfig(names=("zeroshot_paper",),
                                          data_root=str(tmp_path / "none"))).missing
    assert line["zeroshot_paper"].startswith(f"zeroshot_paper: not found under {tmp_path}/none/")
    assert "cifar10/cifar-10-batches-py/test_batch" in line["zeroshot_paper"]


def test_evaluate_fills_zs_paper_and_ret_paper(tmp_path, capsys, monkeypatch):
    """`csclip evaluate --suite zeroshot_paper,coco_retrieval,flickr8k_retrieval` with
    csclip-tiny. The ImageNet family (80 templates x 1000 classes) and Caltech101 (34 x 102)
    take minutes of text encoding on a CPU: the run has CIFAR-10 and SUN397 (the other
    five: --allow-missing, k of n); the test above runs all seven."""
    import csclip.eval.pipeline
    from csclip.entry.evaluate import main

    logged, tasks = {}, {}

    def log_comparison(reports, files, tracking_uri, experiment, params):
        logged.update({name: report.metrics for name, report in reports.items()})
        return "run-id"

    original = zeroshot_paper.evaluate_task

    def spy(encoder, task):
        tasks[task.name] = task
        return original(encoder, task)

    monkeypatch.setattr(csclip.eval.pipeline, "log_comparison", log_comparison)
    monkeypatch.setattr(zeroshot_paper, "evaluate_task", spy)
    write_zeroshot_paper(tmp_path, ("cifar10", "sun397"))
    write_coco(tmp_path)
    write_flickr8k(tmp_path)
    argv = ["--model", "csclip-tiny", "--set", "model.image_size=32",
            "--set", "data.world.num_val=4", "--set", "data.world.image_size=32",
            "--set", "benchmark.num_bootstrap=0", "--set", "benchmark.image_side=false",
            "--set", "suites.retrieval=false", "--set", "suites.num_world_pairs=0",
            "--set", "suites.num_zeroshot_items=0",
            "--suite", "zeroshot_paper,coco_retrieval,flickr8k_retrieval",
            "--data-root", str(tmp_path), "--allow-missing", "--out", str(tmp_path / "eval"),
            "--set", "tracking.enabled=true",
            "--set", f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    assert main(argv) == 0
    metrics = logged["csclip-tiny"]
    assert (metrics["zs_paper_datasets_found"], metrics["zs_paper_datasets_asked"]) == (2, 7)
    assert metrics["zs_paper_avg"] == pytest.approx(
        (metrics["zs_paper_cifar10"] + metrics["zs_paper_sun397"]) / 2)
    assert metrics["zs_paper_cifar10_num_images"] == 6
    assert "zs_paper_imagenet1k" not in metrics
    for direction in ("i2t", "t2i"):
        assert metrics[f"ret_paper_{direction}"] == pytest.approx(
            (metrics[f"coco_ret_{direction}"] + metrics[f"flickr8k_ret_{direction}"]) / 2)
    assert metrics["flickr8k_ret_num_images"] == 3
    templates = _package_json("en_zeroshot_classification_templates.json")["cifar10"]
    assert tasks["cifar10"].class_texts == tuple(tuple(t.format(c=c) for t in templates)
                                                 for c in CIFAR10_NAMES)
    assert sorted(tasks) == ["cifar10", "sun397"]
    # CLIP_benchmark-shaped results: one JSON per dataset, by CLIP_benchmark's names and
    # scales (the mean over datasets stays in our tables).
    out = tmp_path / "eval"
    result = json.loads((out / "cifar10_random_csclip-tiny_zeroshot_classification.json"
                         ).read_text())
    assert result["dataset"] == "cifar10" and result["metrics"]["num_images"] == 6
    assert result["metrics"]["acc1"] == pytest.approx(metrics["zs_paper_cifar10"] / 100)
    flickr = json.loads((out / "flickr8k_random_csclip-tiny_zeroshot_retrieval.json"
                         ).read_text())
    assert flickr["metrics"]["text_retrieval_recall@1"] == pytest.approx(
        metrics["flickr8k_ret_i2t"] / 100)
