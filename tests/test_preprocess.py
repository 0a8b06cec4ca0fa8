"""csclip.preprocess gives exactly open_clip's eval transform and tokenizer, bit for bit,
and a data task that decodes, transforms, samples and tokenizes imports neither open_clip
nor torchvision."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import open_clip
import pytest
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from csclip.model_configs import SMALL_MODEL_CONFIGS, register_small_models
from csclip.preprocess import image_transform, model_text_config, tokenizer
from tests.conftest import REPO_ROOT, SHARED_DATA

# Widths and heights around each target: smaller, equal, larger, odd, very wide and tall
# (the crop's rounding and the resize's floor both show on odd differences).
SIZES = [(32, 32), (31, 47), (64, 33), (200, 57), (57, 200), (16, 16), (333, 250), (7, 90)]


def _images():
    rng = np.random.default_rng(0)
    for width, height in SIZES:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        yield Image.fromarray(pixels, "RGB")
    gray = rng.integers(0, 256, (45, 61), dtype=np.uint8)
    yield Image.fromarray(gray, "L")  # resized as L, made RGB after the crop


@pytest.mark.parametrize("cfg", [
    {"size": 32},
    {"size": 64, "interpolation": "bilinear"},
    {"size": 224, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)},
    {"size": (48, 40), "resize_mode": "squash"},
    {"size": 40, "resize_mode": "shortest", "interpolation": "random"},
])
def test_eval_transform_is_open_clips_bit_for_bit(cfg):
    key = tuple(sorted(cfg.items()))
    ours = image_transform(key)
    assert type(ours).__name__ == "_EvalTransform"  # ours, not the fallback
    theirs = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
    for image in _images():
        expected = theirs(image).numpy()
        got = ours(image)
        assert got.dtype == np.float32 and got.shape == expected.shape
        assert np.array_equal(got, expected), (cfg, image.size, image.mode)


def test_uncovered_transforms_are_open_clips_own():
    for cfg in ({"size": (48, 40)}, {"size": 32, "resize_mode": "longest"}):
        key = tuple(sorted(cfg.items()))
        assert type(image_transform(key)).__name__ == "function"  # open_clip's, wrapped
        image = next(_images())
        expected = image_transform_v2(PreprocessCfg(**cfg), is_train=False)(image).numpy()
        assert np.array_equal(image_transform(key)(image), expected)


def _captions() -> list[str]:
    path = SHARED_DATA / "sugarcrepe" / "replace_rel.json"
    texts = []
    if path.exists():
        for item in list(json.loads(path.read_text()).values())[:300]:
            texts += [item["caption"], item["negative_caption"]]
    # Edge cases: empty, past the context length, unicode, HTML entities, odd spacing.
    return texts + ["", "a " * 200, "Café crème brûlée — naïve façade", "dogs &amp; cats",
                    "  two\tspaces \n and lines ", "A DOG ON A SOFA!!!"]


@pytest.mark.parametrize("name", [*SMALL_MODEL_CONFIGS, "ViT-B-32", "ViT-B-16", "RN50"])
def test_tokenizer_is_open_clips(name):
    register_small_models()
    texts = _captions()
    expected = open_clip.get_tokenizer(name)(texts)
    got = tokenizer(name)(texts)
    assert got.dtype == expected.dtype and np.array_equal(got.numpy(), expected.numpy())
    assert model_text_config(name)["context_length"] == expected.shape[1]


def test_data_tasks_import_neither_open_clip_nor_torchvision(tmp_path):
    # A fresh interpreter, as a Ray Data task worker is: decode + transform + tokenize
    # (decode_batch) and sample + tokenize (sample_batch) on world rows.
    code = """
import sys
from csclip.train.sampling import SamplingConfig
from csclip.train.stream import decode_batch, image_shape, preprocess_key, sample_batch
from csclip.units import records_to_table
from csclip.world import WorldConfig, world_record
cfg = {"size": 32, "mode": "RGB", "mean": [0.48145466, 0.4578275, 0.40821073],
        "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic",
        "resize_mode": "shortest", "fill_color": 0}
table = records_to_table([world_record(WorldConfig(image_size=32), "train", i) for i in range(4)])
rows = decode_batch(table, preprocess=preprocess_key(cfg), model_name="csclip-tiny")
out = sample_batch(rows, sampling=SamplingConfig().model_dump(mode="json"),
                   model_name="csclip-tiny", seed=0, epoch=0, image_shape=image_shape(cfg))
assert out["image"].shape == (4, 3, 32, 32) and out["unit_0"].shape == (4, 32), out.keys()
import json
from csclip.preprocess import tokenizer
texts = json.loads(sys.argv[1])
print(json.dumps({"loaded": sorted(m for m in ("open_clip", "torchvision", "transformers",
                                                "csclip.loss") if m in sys.modules),
                  "tokens": {name: tokenizer(name)(texts).tolist()
                             for name in ("csclip-tiny", "ViT-B-32")}}))
"""
    texts = _captions()
    done = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["loaded"] == []
    # open_clip's tokenizer.py loaded on its own tokenizes as the package does.
    register_small_models()
    for name, tokens in seen["tokens"].items():
        assert tokens == open_clip.get_tokenizer(name)(texts).tolist(), name
