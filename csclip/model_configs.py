"""Model configs of our own, as open_clip reads them: one JSON file each in
csclip/open_clip_configs/, registered with open_clip's public add_model_config.

Apart from csclip.model, which imports torch: the data tasks read the text config to
tokenize (csclip.preprocess) without it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

__all__ = ["CONFIG_DIR", "SMALL_MODEL_CONFIGS", "register_small_models"]

# Small configs for CPU runs, registered with open_clip under their file names. The text
# tower keeps open_clip's BPE vocabulary (its tokenizer ships with the package and works
# offline); widths, depths and context length are cut down. csclip-tiny-t4 is csclip-tiny
# with a deeper text tower (docs/training.md, "Spatial relations").
CONFIG_DIR = Path(__file__).resolve().parent / "open_clip_configs"
SMALL_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    path.stem: json.loads(path.read_text(encoding="utf-8"))
    for path in sorted(CONFIG_DIR.glob("*.json"))
}


@functools.cache
def register_small_models() -> None:
    """Register SMALL_MODEL_CONFIGS with open_clip (once per process)."""
    import open_clip  # noqa: PLC0415  open_clip imports torch; the data tasks read the configs without it

    open_clip.add_model_config(CONFIG_DIR)
