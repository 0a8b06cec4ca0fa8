"""CLIP models from open_clip: our small configs for CPU work, pretrained tags or local
checkpoints on a cluster, and checkpoints that carry their model config.

(Started by the foundation slice; the training slice owns and extends this module.)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Small configs for CPU runs, registered with open_clip under these names. The text tower
# keeps open_clip's BPE vocabulary (its tokenizer ships with the package and works
# offline); widths, depths and context length are cut down.
SMALL_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "csclip-tiny": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
    "csclip-small": {
        "embed_dim": 128,
        "vision_cfg": {"image_size": 64, "layers": 4, "width": 128, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 4, "layers": 4},
    },
}


def register_small_models() -> None:
    """Register SMALL_MODEL_CONFIGS with open_clip (idempotent)."""
    from open_clip import factory

    for name, cfg in SMALL_MODEL_CONFIGS.items():
        factory._MODEL_CONFIGS.setdefault(name, copy.deepcopy(cfg))


@dataclass(frozen=True)
class ClipBundle:
    """A model with the preprocessing that belongs to it.

    model: open_clip CLIP (encode_image / encode_text / logit_scale).
    preprocess: PIL image -> (3, H, W) float tensor (open_clip's eval transform).
    tokenizer: list[str] -> (N, context_length) long tensor.
    name: open_clip model name; pretrained: tag or checkpoint path, or None.
    """

    model: torch.nn.Module
    preprocess: Callable
    tokenizer: Callable
    name: str
    pretrained: str | None = None


def create_bundle(name: str, pretrained: str | None = None, device: str = "cpu") -> ClipBundle:
    """Create an open_clip model by name, with random weights, a pretrained tag or a path."""
    import open_clip

    register_small_models()
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=pretrained, device=device)
    tokenizer = open_clip.get_tokenizer(name)
    model.eval()
    return ClipBundle(model, preprocess, tokenizer, name, pretrained)
