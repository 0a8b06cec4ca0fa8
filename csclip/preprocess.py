"""open_clip's eval image transform and its BPE tokenizer, for Ray Data's tasks, without
importing the open_clip package.

`import open_clip` is slow beyond torch's own import in every fresh process (torchvision
and torch._dynamo, transformers, timm, for towers we never build), and each Ray Data task
worker that decodes images or tokenizes captions is one. Here the eval transform is
rebuilt from PIL and numpy, step for step as torchvision applies it to a PIL image
(Resize with PIL's resampling, CenterCrop's rounding, ToTensor, Normalize in float32), and
the tokenizer is open_clip's own `tokenizer.py`, loaded as a module of its own. Both give
exactly open_clip's output (tests/test_preprocess.py compares them bit for bit); a
config they do not cover (an HF or SigLIP tokenizer, the `longest` resize, a non-square
`shortest`) falls back to open_clip itself.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from csclip.model_configs import SMALL_MODEL_CONFIGS, register_small_models

# open_clip's defaults (open_clip.constants, open_clip.factory), for a config without them.
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
DEFAULT_CONTEXT_LENGTH = 77


def _open_clip_dir() -> Path:
    spec = importlib.util.find_spec("open_clip")  # finds the package, does not run it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("open_clip is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def model_text_config(model_name: str) -> dict[str, Any] | None:
    """The `text_cfg` open_clip's get_tokenizer reads for `model_name`: ours
    (csclip.model_configs) or a built-in config file; None for a name open_clip resolves
    otherwise (hf-hub:, local-dir:, an unknown name)."""
    if model_name in SMALL_MODEL_CONFIGS:
        return dict(SMALL_MODEL_CONFIGS[model_name].get("text_cfg", {}))
    if ":" in model_name or "/" in model_name:
        return None
    path = _open_clip_dir() / "model_configs" / f"{model_name}.json"
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text()).get("text_cfg", {}))


@functools.lru_cache(maxsize=1)
def _tokenizer_module():
    """open_clip/tokenizer.py as a module of its own (it imports ftfy, regex, numpy and
    torch, nothing of open_clip), or open_clip's when the package is imported already."""
    if "open_clip" in sys.modules:
        from open_clip import tokenizer  # noqa: PLC0415  open_clip imports torch; data tasks tokenize without it

        return tokenizer
    path = _open_clip_dir() / "tokenizer.py"
    spec = importlib.util.spec_from_file_location("csclip._open_clip_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=4)
def tokenizer(model_name: str) -> Callable:
    """The tokenizer open_clip.get_tokenizer(model_name) returns: list[str] ->
    (n, context_length) int64 tensor; each text's tokens are remembered (CachedTokenizer)."""
    text_cfg = model_text_config(model_name)
    if (text_cfg is None or "hf_tokenizer_name" in text_cfg
            or "siglip" in model_name.lower()):
        import open_clip  # noqa: PLC0415  open_clip imports torch, which this light module defers

        register_small_models()
        return CachedTokenizer(open_clip.get_tokenizer(model_name))
    return CachedTokenizer(_tokenizer_module().SimpleTokenizer(
        context_length=text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH),
        **text_cfg.get("tokenizer_kwargs", {})))


class CachedTokenizer:
    """An open_clip tokenizer that tokenizes each distinct text once per process.

    The sampled slots repeat their texts across rows and epochs (units such as "a man",
    their foils), and open_clip's SimpleTokenizer is slow Python for every text (ftfy,
    a regex, BPE): a pure function of the text, so a text's tokens are kept (int32,
    up to MAX_TEXTS texts) and the result is the tokenizer's own, value for value."""

    MAX_TEXTS = 200_000

    def __init__(self, tokenize: Callable) -> None:
        self._tokenize = tokenize
        self._tokens: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:  # context_length, vocab_size, ...
        if name.startswith("_"):  # not set yet (unpickling): no recursion through _tokenize
            raise AttributeError(name)
        return getattr(self._tokenize, name)

    def __call__(self, texts: str | list[str]):
        import torch  # noqa: PLC0415  torch only where tensors are made; data tasks that tokenize to numpy skip it

        texts = [texts] if isinstance(texts, str) else list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self._tokens))
        if missing:
            fresh = self._tokenize(missing).numpy()                      # (m, L) int64
            if len(self._tokens) + len(missing) <= self.MAX_TEXTS:
                self._tokens.update(zip(missing, fresh.astype(np.int32), strict=True))
            else:  # full: these are used once, not kept
                found = dict(zip(missing, fresh, strict=True))
                return torch.from_numpy(np.stack([
                    found[t] if t in found else self._tokens[t] for t in texts]).astype(np.int64))
        if not texts:
            return self._tokenize(texts)
        return torch.from_numpy(np.stack([self._tokens[t] for t in texts]).astype(np.int64))


@functools.lru_cache(maxsize=8)
def image_transform(preprocess_key: tuple, is_train: bool = False) -> Callable:
    """open_clip's image_transform_v2 for a ModelSpec.preprocess_cfg (as
    csclip.train.stream.preprocess_key makes it hashable): PIL image -> (3, H, W) float32
    numpy array. The eval transform is ours where it covers the config, open_clip's
    otherwise (and always for training's random crops)."""
    if not is_train:
        transform = _eval_transform(preprocess_key)
        return transform if isinstance(transform, _EvalTransform) else \
            (lambda image: transform(image))
    from open_clip.transform import PreprocessCfg, image_transform_v2  # noqa: PLC0415  open_clip imports torch; data tasks that only tokenize never load it

    transform = image_transform_v2(PreprocessCfg(**_cfg(preprocess_key)), is_train=True)
    return lambda image: transform(image).numpy()


def _cfg(preprocess_key: tuple) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(preprocess_key).items()}


@functools.lru_cache(maxsize=8)
def _eval_transform(preprocess_key: tuple) -> _EvalTransform | _OpenClipEval:
    cfg = _cfg(preprocess_key)
    return _EvalTransform.covering(cfg) or _OpenClipEval(cfg)


def image_pixels(preprocess_key: tuple, is_train: bool = False) -> Callable:
    """The transform up to its pixels: PIL image -> (3, H, W) uint8, the resized,
    cropped RGB image before ToTensor. `image_normalize(key)(image_pixels(key)(image))`
    equals `image_transform(key)(image)` bit for bit: the transform quantises to uint8
    there anyway (a PIL image is uint8), so storing or shipping these pixels loses nothing
    (csclip.train.prepared, csclip.train.stream). is_train: open_clip's training transform
    (RandomResizedCrop and RGB on the PIL image, then ToTensor and the same Normalize), its
    random crop drawn from torch's generator as the whole transform draws it."""
    if is_train:
        return _train_transform(preprocess_key).pixels
    return _eval_transform(preprocess_key).pixels


@functools.lru_cache(maxsize=8)
def _train_transform(preprocess_key: tuple) -> _OpenClipEval:
    return _OpenClipEval(_cfg(preprocess_key), is_train=True)


def image_normalize(preprocess_key: tuple) -> Callable:
    """The eval transform's last steps: (..., 3, H, W) uint8 -> float32 in [0, 1], then
    normalized by the config's mean and std (ToTensor and Normalize)."""
    return _eval_transform(preprocess_key).normalize


class _OpenClipEval:
    """open_clip's own eval transform (a config _EvalTransform does not cover), or with
    is_train its training transform, split where it turns the PIL image into a tensor."""

    def __init__(self, cfg: Mapping[str, Any], is_train: bool = False) -> None:
        from open_clip.transform import PreprocessCfg, image_transform_v2  # noqa: PLC0415  open_clip imports torch; deferred to the processes that transform images
        from torchvision.transforms import Compose, Normalize, ToTensor  # noqa: PLC0415  torchvision imports torch; as above

        transform = image_transform_v2(PreprocessCfg(**cfg), is_train=is_train)
        steps = list(transform.transforms)
        split = next(i for i, step in enumerate(steps) if isinstance(step, ToTensor))
        if steps[split + 1:] != steps[-1:] or not isinstance(steps[-1], Normalize):
            raise ValueError(f"open_clip's transform ends in {steps[split:]}, not ToTensor "
                             "and Normalize: its pixels are not the image before the tensor")
        self._to_image, self._tail = Compose(steps[:split]), Compose(steps[split:])
        self._normalize = steps[split + 1]  # Normalize, after ToTensor

    def __call__(self, image) -> np.ndarray:
        return self._tail(self._to_image(image)).numpy()

    def pixels(self, image) -> np.ndarray:
        image = self._to_image(image)
        if getattr(image, "mode", None) != "RGB":  # a PIL image, uint8 RGB, or not pixels
            raise ValueError(f"open_clip's transform gave {type(image).__name__} before "
                             "ToTensor, not an RGB PIL image")
        return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)          # (3, H, W)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        import torch  # noqa: PLC0415  torch only where tensors are made

        # ToTensor on a uint8 image: to float32, divided by 255; then Normalize's sub, div.
        tensor = torch.from_numpy(np.ascontiguousarray(pixels)).to(torch.float32).div(255)
        mean = torch.as_tensor(self._normalize.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.as_tensor(self._normalize.std, dtype=torch.float32).view(-1, 1, 1)
        return tensor.sub(mean).div(std).numpy()


class _EvalTransform:
    """Resize (shortest side, or both sides for `squash`), center crop, RGB, to float in
    [0, 1], normalize: torchvision's steps on a PIL image, in the same arithmetic."""

    def __init__(self, size: tuple[int, int], squash: bool, resample: int,
                 mean: tuple, std: tuple) -> None:
        self.size, self.squash, self.resample = size, squash, resample
        self.mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)

    @classmethod
    def covering(cls, cfg: Mapping[str, Any]) -> _EvalTransform | None:
        size = cfg.get("size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        resize_mode = cfg.get("resize_mode") or "shortest"
        interpolation = cfg.get("interpolation") or "bicubic"
        if resize_mode not in ("shortest", "squash") or interpolation not in ("bicubic",
                                                                              "bilinear", "random"):
            return None
        if resize_mode == "shortest" and height != width:
            return None  # open_clip's ResizeKeepRatio: left to open_clip
        # open_clip maps anything but bilinear (random included) to bicubic for inference.
        resample = Image.Resampling.BILINEAR if interpolation == "bilinear" else \
            Image.Resampling.BICUBIC
        mean, std = cfg.get("mean") or OPENAI_MEAN, cfg.get("std") or OPENAI_STD
        mean = mean if isinstance(mean, tuple | list) else (mean,) * 3
        std = std if isinstance(std, tuple | list) else (std,) * 3
        return cls((int(height), int(width)), resize_mode == "squash", resample,
                   tuple(mean), tuple(std))

    def _resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after torchvision's Resize (its _compute_resized_output_size)."""
        if self.squash:
            return self.size[1], self.size[0]
        target = self.size[0]
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(target * long / short)
        return (target, new_long) if width <= height else (new_long, target)

    def __call__(self, image) -> np.ndarray:
        return self.normalize(self.pixels(image))

    def pixels(self, image) -> np.ndarray:
        new_size = self._resized_size(*image.size)
        if new_size != image.size:  # torchvision returns the image itself when it fits
            image = image.resize(new_size, self.resample)
        if not self.squash:
            width, height = image.size
            crop_height, crop_width = self.size
            top = int(round((height - crop_height) / 2.0))
            left = int(round((width - crop_width) / 2.0))
            image = image.crop((left, top, left + crop_width, top + crop_height))
        if image.mode != "RGB":  # convert("RGB") of an RGB image is a copy
            image = image.convert("RGB")
        return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)          # (3, H, W)

    def normalize(self, pixels: np.ndarray) -> np.ndarray:
        # The same IEEE operations, in the same order, as (pixels / 255 - mean) / std in
        # float32, into one (..., 3, H, W) buffer, one image at a time: the uint8 to
        # float32 cast is the division's own (exact), and an image's 600 KB at 224 px stay
        # in the cache for the three passes (less CPU than whole-batch passes).
        tensor = np.empty(pixels.shape, dtype=np.float32)
        images = tensor.reshape(-1, *pixels.shape[-3:])
        for source, image in zip(pixels.reshape(-1, *pixels.shape[-3:]), images, strict=True):
            np.divide(source, np.float32(255), out=image, dtype=np.float32)
            image -= self.mean
            image /= self.std
        return tensor
