"""open_clip's model names and pretrained tags, offline-aware (csclip.pretrained): the tag
decides QuickGELU, weights come from the cache open_clip downloads into, and a tag that is
neither cached nor downloadable is one line before any data or Ray."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from csclip.config.model import ModelSource
from csclip.errors import CheckpointMismatch
from csclip.model import create_bundle, spec_from_config
from csclip.pretrained import cached_weights, tag_config, tag_quick_gelu

REPO = "csclip-test/tiny-clip"
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def tiny_tags(monkeypatch):
    """Two pretrained tags of csclip-tiny, as open_clip's registry declares them: "qg"
    (trained with QuickGELU) and "hub" (weights in a hub repository)."""
    import open_clip.pretrained as registry

    tags = {"qg": {"hf_hub": f"{REPO}/", "quick_gelu": True},
            "hub": {"hf_hub": f"{REPO}/", "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}}
    monkeypatch.setitem(registry._PRETRAINED, "csclip-tiny", tags)
    return tags


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache, the one huggingface_hub reads."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _cache_weights(cache: Path, state: dict) -> Path:
    """Weights in the hub cache's layout: refs/main names the snapshot that holds them."""
    repo = cache / f"models--{REPO.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    file = repo / "snapshots" / SNAPSHOT / "open_clip_pytorch_model.bin"
    file.parent.mkdir(parents=True)
    torch.save(state, file)
    return file


def test_the_tag_decides_quick_gelu_and_a_contradiction_is_refused(tiny_tags):
    assert tag_quick_gelu("ViT-B-32", "openai")  # open_clip's registry, no model built
    assert not tag_quick_gelu("ViT-B-32", "laion2b_s34b_b79k")
    assert spec_from_config(ModelSource(name="csclip-tiny", pretrained="qg")).quick_gelu
    assert not spec_from_config(ModelSource(name="csclip-tiny")).quick_gelu
    with pytest.raises(CheckpointMismatch, match="trained with quick_gelu=True"):
        spec_from_config(ModelSource(name="csclip-tiny", pretrained="qg", quick_gelu=False))


def test_a_checkpoint_brings_its_own_activation(tmp_path):
    from csclip.model import save_checkpoint, spec_of

    bundle = create_bundle("csclip-tiny", quick_gelu=True)
    directory = save_checkpoint(bundle.model, spec_of(bundle.model, "csclip-tiny"), tmp_path / "c")
    loaded = create_bundle("csclip-tiny", str(directory))  # quick_gelu unset: the checkpoint's
    assert spec_of(loaded.model, "csclip-tiny").quick_gelu


def test_cached_weights_load_without_network(tiny_tags, hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(3)
    state = create_bundle("csclip-tiny").model.state_dict()
    file = _cache_weights(hub_cache, state)
    assert cached_weights("csclip-tiny", "hub", tag_config("csclip-tiny", "hub")).file == str(file)
    bundle = create_bundle("csclip-tiny", "hub")
    loaded = bundle.model.state_dict()
    assert all(torch.equal(loaded[key], state[key]) for key in state)
    # The tag's preprocessing comes with its weights, as open_clip applies it.
    normalize = bundle.preprocess.transforms[-1]
    assert tuple(normalize.mean) == (0.5, 0.5, 0.5) and tuple(normalize.std) == (0.25, 0.25, 0.25)
    assert bundle.pretrained == "hub"  # labelled by its tag, not the cache path


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable hub"])
def test_a_tag_neither_cached_nor_downloadable_is_one_line_before_any_data(
        offline, hub_cache, tmp_path, capsys, monkeypatch):
    import ray
    from huggingface_hub import constants

    from csclip.entry.evaluate import main

    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # a closed port on this machine: the probe is refused at once
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    ray_was_up = ray.is_initialized()
    started = time.monotonic()
    # The units file does not exist: the weights are checked before any data is read.
    code = main(["--model", "ViT-B-32", "--pretrained", "openai", "--units",
                 str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "eval"),
                 "--set", "tracking.enabled=false"])
    seconds = time.monotonic() - started
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    folder = hub_cache / "models--timm--vit_base_patch32_clip_224.openai"
    reason = "HF_HUB_OFFLINE is set" if offline == "HF_HUB_OFFLINE" else \
        "http://127.0.0.1:9 unreachable"
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: weights for ViT-B-32/openai are not in the cache at "
                                f"{folder} and cannot be downloaded ({reason}")
    assert errors[0].endswith("pass --pretrained FILE (a state dict), or run once where the "
                              "hub is reachable")
    assert seconds < 30 and (ray_was_up or not ray.is_initialized())


def test_a_cached_tag_evaluates(tiny_tags, hub_cache, tmp_path, monkeypatch, capsys):
    from csclip.config.world import WorldConfig
    from csclip.entry.evaluate import main
    from csclip.units import write_units
    from csclip.world import iter_world

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_weights(hub_cache, create_bundle("csclip-tiny").model.state_dict())
    units = tmp_path / "units.parquet"
    write_units(list(iter_world(WorldConfig(num_train=0, num_val=4, num_test=0),
                                splits=("val",))), str(units))
    assert main(["--model", "csclip-tiny", "--pretrained", "hub", "--units", str(units),
                 "--out", str(tmp_path / "eval"), "--set", "tracking.enabled=false",
                 "--set", "benchmark.num_bootstrap=10"]) == 0
    assert "csclip-tiny:hub" in (tmp_path / "eval" / "table1.md").read_text()
