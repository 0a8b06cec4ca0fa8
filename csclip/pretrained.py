"""Pretrained tags (`--model ViT-B-32 --pretrained openai`) as open_clip resolves them, but
offline-aware: the weights are looked up in the cache open_clip downloads into (the
Hugging Face hub cache, or ~/.cache/clip for URL-only tags) before anything else runs, and
a tag that is neither cached nor downloadable is one line, not minutes of retries.

Also what a tag says about the model: open_clip only warns when the activation differs
from the one the weights were trained with (QuickGELU for OpenAI's weights); csclip takes
the tag's activation when `model.quick_gelu` is not set, and refuses a contradiction.
"""

from __future__ import annotations

import os
import pickle
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csclip.errors import ConfigError
from csclip.model_configs import register_small_models

# What open_clip names a hub repository's weights (open_clip.constants.HF_WEIGHTS_NAME).
HF_WEIGHTS_NAME = "open_clip_pytorch_model.bin"
# Where open_clip's download_pretrained_from_url puts URL-only weights.
URL_CACHE_DIR = Path("~/.cache/clip")
# A download is tried only when the hub (huggingface_hub's endpoint: HF_ENDPOINT, else
# https://huggingface.co) answers within this many seconds.
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class TagWeights:
    """Where a pretrained tag's weights are: `file` (None when not cached), the place
    they were looked for (`where`: a hub cache folder or a file path) and, for a URL-only
    tag, the URL a download would fetch (`url`; None: the hub)."""

    name: str
    tag: str
    file: str | None
    where: str
    url: str | None = None


def may_be_tag(pretrained: str | None) -> bool:
    """True when `pretrained` can only be a tag: not a path, a URI or an existing file."""
    return bool(pretrained) and "://" not in pretrained and "/" not in pretrained \
        and not pretrained.endswith((".pt", ".pth", ".bin", ".safetensors")) \
        and not Path(pretrained).exists()


def tag_config(name: str, pretrained: str | None) -> dict:
    """open_clip's pretrained config of (name, tag); {} when `pretrained` is no known tag."""
    if not may_be_tag(pretrained):
        return {}
    import open_clip  # noqa: PLC0415  open_clip imports torch, which this light module defers

    register_small_models()
    return dict(open_clip.get_pretrained_cfg(name, pretrained) or {})


def tag_quick_gelu(name: str, pretrained: str | None) -> bool:
    """The activation the tag's weights were trained with (False for no tag)."""
    return bool(tag_config(name, pretrained).get("quick_gelu", False))


def cached_weights(name: str, tag: str, cfg: dict) -> TagWeights:
    """Look the tag's weights up where open_clip's download_pretrained would put them: the
    hub repository (safetensors first, as open_clip tries it) when huggingface_hub is
    installed and the tag names one, else the URL's file under ~/.cache/clip."""
    if cfg.get("file"):
        return TagWeights(name, tag, cfg["file"] if Path(cfg["file"]).is_file() else None,
                          cfg["file"])
    hub = cfg.get("hf_hub", "")
    try:
        import huggingface_hub  # noqa: PLC0415  huggingface_hub is optional (open_clip's hub tags only)
    except ImportError:
        huggingface_hub = None
    if hub and huggingface_hub is not None:
        repo_id, filename = os.path.split(hub)
        filename = filename or HF_WEIGHTS_NAME
        candidates = [*_safe_alternatives(filename), filename]
        for candidate in candidates:
            found = huggingface_hub.try_to_load_from_cache(repo_id, candidate)
            if isinstance(found, str):
                return TagWeights(name, tag, found, found)
        folder = Path(huggingface_hub.constants.HF_HUB_CACHE) / \
            f"models--{repo_id.replace('/', '--')}"
        return TagWeights(name, tag, None, str(folder))
    url = cfg.get("url", "")
    target = URL_CACHE_DIR.expanduser() / os.path.basename(url) if url else URL_CACHE_DIR
    return TagWeights(name, tag, str(target) if url and target.is_file() else None, str(target),
                      url or None)


def _safe_alternatives(filename: str) -> list[str]:
    # open_clip.pretrained._get_safe_alternatives, used only with safetensors installed.
    try:
        import safetensors  # noqa: PLC0415, F401  safetensors is optional: present or not is the answer
    except ImportError:
        return []
    if filename == HF_WEIGHTS_NAME:
        return ["open_clip_model.safetensors"]
    if filename.endswith((".bin", ".pth")):
        return [filename[:-4] + ".safetensors"]
    return []


def download_blocker(url: str | None = None) -> str | None:
    """Why a download cannot happen now (None when the source answers): HF_HUB_OFFLINE set,
    or no answer within PROBE_TIMEOUT_S from `url` (a URL-only tag's file) or the hub."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = url
    if endpoint is None:
        try:
            from huggingface_hub import constants  # noqa: PLC0415  huggingface_hub is optional

            endpoint = constants.ENDPOINT
        except ImportError:
            endpoint = "https://huggingface.co"
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"),
                               timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # the hub answered (with an error page): it is reachable
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return f"{endpoint} unreachable: {reason}"
    return None


def resolve_tag_weights(name: str, pretrained: str | None) -> TagWeights | None:
    """For a pretrained tag: its cached weights, or a ConfigError in one line when they are
    not cached and cannot be downloaded. None when `pretrained` is not a tag (random
    weights, a file, a checkpoint) or when the weights are to be downloaded now."""
    cfg = tag_config(name, pretrained)
    if not cfg:
        return None
    weights = cached_weights(name, pretrained, cfg)
    if weights.file is not None:
        return weights
    blocker = download_blocker(weights.url)
    if blocker is not None:
        raise ConfigError(f"weights for {name}/{pretrained} are not in the cache at "
                          f"{weights.where} and cannot be downloaded ({blocker}): pass "
                          "--pretrained FILE (a state dict), or run once where the hub is "
                          "reachable")
    return None


# An open_clip training checkpoint (open_clip's training/main.py, and NegCLIP's fork of it,
# vinid/neg_clip src/training/main.py:263-268): {"epoch", "name", "state_dict", "optimizer"
# [, "scaler"]}, the state dict's keys prefixed "module." when the model was wrapped in
# DistributedDataParallel. Its optimizer state holds the numpy float64 learning rate of
# open_clip's cosine schedule (training/scheduler.py), which torch.load(weights_only=True)
# refuses unless numpy's scalar and dtype classes are allowed.
DDP_PREFIX = "module."
# What csclip builds such a file with when model.quick_gelu is unset: the file does not
# record its activation. The CS-CLIP authors evaluated NegCLIP's released negCLIP.pt in
# open_clip's ViT-B-32 (nn.GELU): configs/eval_checkpoints.yaml at 16276c7, "NegCLIP COCO
# ViT-B/32" (force_openclip, base_model ViT-B/32@laion2b_s34b_b79k), loaded by
# utils/checkpoint_loader.py load_external_checkpoint; ARO and SugarCrepe load it the same
# way (open_clip.create_model_and_transforms("ViT-B-32", pretrained=path)).
TRAINING_CHECKPOINT_QUICK_GELU = False


@dataclass(frozen=True)
class WeightsFile:
    """A `--pretrained FILE` read with torch.load: its state dict (without the DDP prefix)
    and, for an open_clip training checkpoint, its epoch and run name (`training` True)."""

    path: str
    state_dict: dict
    training: bool
    epoch: int | None = None
    run_name: str | None = None


def _numpy_globals() -> list:
    # numpy's scalar reconstructor and dtypes under both module names: numpy 1.x pickles
    # say numpy.core.multiarray, numpy 2.x numpy._core.multiarray.

    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    dtypes = [getattr(np.dtypes, n) for n in ("Float64DType", "Float32DType", "Float16DType",
                                             "Int64DType", "Int32DType", "BoolDType")]
    return [scalar, (scalar, "numpy.core.multiarray.scalar"),
            (scalar, "numpy._core.multiarray.scalar"), np.dtype, *dtypes]


def read_weights_file(path: str) -> WeightsFile:
    """Read a torch-saved weights file: a plain state dict, or an open_clip training
    checkpoint (NegCLIP's released file) whose state dict is returned without its
    "module." prefix. Tensors, plain types and numpy scalars only (weights_only). A file
    torch cannot read (truncated, not a torch file, other pickled objects) is one
    ConfigError line."""
    import torch  # noqa: PLC0415  the entry checks a tag before torch loads

    def load(mmap: bool) -> object:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)

    try:
        try:
            loaded = load(mmap=True)
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            loaded = load(mmap=False)  # a file in torch's legacy (pre-1.6) format
    except (RuntimeError, pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError,
            OSError) as err:
        first = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else ""
        if "Weights only load failed" in first:
            first = "it holds objects other than tensors, plain types and numpy scalars"
        raise ConfigError(f"model.pretrained: {path} is not a readable weights file "
                          f"({type(err).__name__}: {first}); is it complete?") from err
    training = isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict)
    state = loaded["state_dict"] if training else loaded
    if not isinstance(state, dict) or not state or \
            not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"model.pretrained: {path} holds no state dict (a dict of tensors, "
                          "or an open_clip training checkpoint with one under 'state_dict')")
    if all(str(key).startswith(DDP_PREFIX) for key in state):
        state = {key[len(DDP_PREFIX):]: value for key, value in state.items()}
    if not training:
        return WeightsFile(path, state, False)
    epoch = loaded.get("epoch")
    return WeightsFile(path, state, True, epoch if isinstance(epoch, int) else None,
                       loaded.get("name") if isinstance(loaded.get("name"), str) else None)
