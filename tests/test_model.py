"""Models and checkpoints: the spec travels with the weights, a mismatch is refused, and an
exported checkpoint loads with plain open_clip."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch

from csclip.config.model import ModelConfig
from csclip.errors import CheckpointMismatch, ConfigError
from csclip.model import (
    SMALL_MODEL_CONFIGS,
    SPEC_FILE,
    WEIGHTS_FILE,
    create_bundle,
    load_bundle,
    load_train_state,
    register_small_models,
    save_checkpoint,
    spec_from_config,
    spec_of,
)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return create_bundle("csclip-tiny")


@pytest.fixture
def checkpoint_dir(tiny, tmp_path):
    spec = spec_of(tiny.model, "csclip-tiny")
    return save_checkpoint(tiny.model, spec, tmp_path / "ckpt", train_state={"step": 7},
                           config={"model": {"name": "csclip-tiny"}})


def test_spec_reads_the_built_model(tiny):
    spec = spec_of(tiny.model, "csclip-tiny")
    assert (spec.name, spec.quick_gelu, spec.image_size, spec.context_length, spec.embed_dim) == \
        ("csclip-tiny", False, 64, 32, 64)
    assert spec.model_cfg["vision_cfg"]["patch_size"] == 8


def test_quick_gelu_and_image_size_show_in_the_spec():
    spec = spec_from_config(ModelConfig(name="csclip-tiny", quick_gelu=True, image_size=32))
    assert spec.quick_gelu and spec.image_size == 32
    assert spec.preprocess_cfg["size"] == [32, 32]


def test_checkpoint_stores_full_model_config(checkpoint_dir):
    saved = json.loads((checkpoint_dir / SPEC_FILE).read_text())
    assert saved["name"] == "csclip-tiny"
    assert saved["model_cfg"]["quick_gelu"] is False
    assert saved["model_cfg"]["text_cfg"]["context_length"] == 32
    assert load_train_state(checkpoint_dir)["step"] == 7


def test_exported_checkpoint_loads_with_plain_open_clip(tiny, checkpoint_dir):
    register_small_models()  # our configs must be known to open_clip by name
    model, _, _ = open_clip.create_model_and_transforms(
        "csclip-tiny", pretrained=str(checkpoint_dir / WEIGHTS_FILE))
    for (key, a), b in zip(tiny.model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), key


def test_load_bundle_rebuilds_from_the_spec(tiny, checkpoint_dir):
    bundle = load_bundle(checkpoint_dir)
    assert bundle.name == "csclip-tiny"
    image = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(bundle.model.encode_image(image), tiny.model.encode_image(image))


@pytest.mark.parametrize("change, field", [({"quick_gelu": True}, "quick_gelu"),
                                           ({"image_size": 32}, "image_size"),
                                           ({"name": "csclip-small"}, "name")])
def test_spec_mismatch_is_refused(checkpoint_dir, change, field):
    expected = ModelConfig(name="csclip-tiny").model_copy(update=change)
    with pytest.raises(CheckpointMismatch, match=field):
        load_bundle(checkpoint_dir, expected=expected)
    with pytest.raises(CheckpointMismatch, match=field):
        create_bundle(expected.name, str(checkpoint_dir), quick_gelu=expected.quick_gelu,
                      image_size=expected.image_size)


def test_pretrained_tag_with_wrong_activation_is_refused():
    # OpenAI weights use QuickGELU; open_clip only warns. Checked before any download.
    with pytest.raises(CheckpointMismatch, match="quick_gelu"):
        spec_from_config(ModelConfig(name="ViT-B-32", pretrained="openai", quick_gelu=False))


def test_unknown_model_name_is_a_config_error():
    with pytest.raises(ConfigError, match="model.name"):
        create_bundle("csclip-huge")


def test_directory_without_spec_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointMismatch, match=SPEC_FILE):
        load_bundle(tmp_path)


def test_relative_pretrained_path_travels_as_absolute(tmp_path, monkeypatch):
    # Ray workers have another working directory; a relative checkpoint path must resolve.
    from csclip.config.model import ModelConfig

    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert ModelConfig(pretrained="ckpt").pretrained == str(tmp_path / "ckpt")
    assert ModelConfig(pretrained="openai").pretrained == "openai"
    assert ModelConfig(pretrained="s3://bucket/ckpt").pretrained == "s3://bucket/ckpt"


@pytest.mark.parametrize("name", sorted(SMALL_MODEL_CONFIGS))
def test_every_small_config_builds_as_declared(name):
    # Our registered configs (the CPU runs and the spatial study's text-tower variants)
    # build by name, with the depth and width they declare, and encode at their size.
    cfg = SMALL_MODEL_CONFIGS[name]
    model = create_bundle(name).model
    text, vision = cfg["text_cfg"], cfg["vision_cfg"]
    assert len(model.transformer.resblocks) == text["layers"]
    assert model.token_embedding.embedding_dim == text["width"]
    assert len(model.visual.transformer.resblocks) == vision["layers"]
    size = vision["image_size"]
    with torch.no_grad():
        image = model.encode_image(torch.rand(1, 3, size, size))
        tokens = model.encode_text(torch.zeros(1, text["context_length"], dtype=torch.long))
    assert image.shape == tokens.shape == (1, cfg["embed_dim"])
