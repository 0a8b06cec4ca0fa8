"""The locked image tower's features, computed once per distinct image (ours).

With the image tower locked (model.lock.image, LiT) and the eval transform, a step's
image features are a function of its pixels alone: the same image gives the same
feature in every epoch. The demo's pretraining and both fine-tunings lock the tower, and
at csclip-tiny's size its forward on a batch's images and image foils is a large share of
a CS-CLIP step on a CPU. Here each image is keyed by a digest of
its pixels, and only the images not seen before run through the tower; a changed image
is a new key, never a stale feature.

Only where the tower's output cannot change between calls (no parameter of it trains, no
dropout, patch dropout or batch-norm statistics at work) and on a CPU: on a GPU the
digest would need the images on the host, which costs more than the tower saves.
Features computed in a batch of another size may differ from the whole batch's in the
last bit (another matrix shape sums in another order), as the trimmed text tower's do.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

# Per entry besides its feature: the 20-byte digest, the dict's slot and the tensor's
# header (measured ~250 bytes in CPython 3.11; counted generously).
_ENTRY_OVERHEAD_BYTES = 400


def tower_is_fixed(tower: torch.nn.Module) -> bool:
    """True when `tower`'s output depends on its input alone: none of its parameters
    trains and no module of it draws at random or updates statistics in training mode."""
    if any(param.requires_grad for param in tower.parameters()):
        return False
    for module in tower.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.training:
            return False
        name = type(module).__name__
        if "Dropout" in name or "DropPath" in name:  # nn.Dropout*, open_clip's PatchDropout, timm's
            rate = next((getattr(module, a) for a in ("p", "prob", "drop_prob")
                         if hasattr(module, a)), 0.0)
            if rate and module.training:
                return False
    return True


class LockedImageFeatures:
    """L2-normalised features of a fixed image tower, one computation per distinct image
    (by a SHA-1 digest of its dtype, shape and bytes), at most `max_mb` MiB of them: past
    that, images not yet seen run through the tower every time."""

    def __init__(self, max_mb: float):
        self.max_bytes = max_mb * 2**20
        self._features: dict[bytes, Tensor] = {}
        self._entry_bytes: int | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._features)

    @property
    def full(self) -> bool:
        return (self._entry_bytes is not None
                and (len(self._features) + 1) * self._entry_bytes > self.max_bytes)

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, images: Tensor) -> Tensor:
        """model.encode_image(images, normalize=True) (N, D), from the features kept for
        the images seen before. images: (N, C, H, W) on the CPU."""
        keys = digests(images)
        missing: dict[bytes, int] = {}  # key -> first row with it (a batch may repeat one)
        for row, key in enumerate(keys):
            if key not in self._features and key not in missing:
                missing[key] = row
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        computed: dict[bytes, Tensor] = {}
        if missing:
            rows = torch.as_tensor(list(missing.values()))
            features = model.encode_image(images[rows], normalize=True)
            if self._entry_bytes is None:
                self._entry_bytes = features.shape[1] * features.element_size() + _ENTRY_OVERHEAD_BYTES
            for key, feature in zip(missing, features, strict=True):
                computed[key] = feature
                if not self.full:  # a copy: a row of `features` would keep the whole batch
                    self._features[key] = feature.clone()
        return torch.stack([self._features.get(key, computed.get(key)) for key in keys])


def digests(images: Tensor) -> list[bytes]:
    """A SHA-1 digest per image of (N, ...) `images` (on the CPU), of its dtype, shape and
    bytes: equal digests, equal pixels."""
    flat = images.detach().reshape(images.shape[0], -1).contiguous().view(torch.uint8)
    header = hashlib.sha1(f"{images.dtype} {tuple(images.shape[1:])}".encode(), usedforsecurity=False)
    out = []
    for row in flat.numpy():
        digest = header.copy()
        digest.update(row)
        out.append(digest.digest())
    return out
