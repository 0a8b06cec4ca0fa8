"""Model configs of our own, as open_clip reads them (csclip.model registers them).

Apart from csclip.model, which imports torch: the data tasks read the text config to
tokenize (csclip.preprocess) without it."""

from __future__ import annotations

from typing import Any

# Small configs for CPU runs, registered with open_clip under these names. The text tower
# keeps open_clip's BPE vocabulary (its tokenizer ships with the package and works
# offline); widths, depths and context length are cut down.
SMALL_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "csclip-tiny": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
    },
    # csclip-tiny with a deeper / wider text tower (docs/training.md, "Spatial relations").
    "csclip-tiny-t4": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 4},
    },
    "csclip-tiny-w128": {
        "embed_dim": 64,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 4, "layers": 2},
    },
    "csclip-small": {
        "embed_dim": 128,
        "vision_cfg": {"image_size": 64, "layers": 4, "width": 128, "patch_size": 8, "head_width": 32},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 128, "heads": 4, "layers": 4},
    },
}
