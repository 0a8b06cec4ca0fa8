"""The worker's normalisation of the uint8 pixels training ships (a shard's `pixels`
encoding, or an encoded image decoded in its task) to the transform's float32 tensors.

Without augmentation the image a step sees is the same in every epoch, and the eval
transform quantises to uint8 before normalising (open_clip's ToTensor of a PIL image), so
the resized, cropped RGB pixels lose nothing: normalised on the worker they give the
float32 tensors bit for bit (tests/test_train_shards.py).
"""

from __future__ import annotations

import numpy as np

from csclip.preprocess import image_normalize
from csclip.train.stream import (
    preprocess_key,
)


def channel_lookup(preprocess_cfg: dict) -> np.ndarray:
    """(3, 256) float32: what the eval transform's normalisation makes of each uint8 value
    in each channel (csclip.preprocess.image_normalize's own arithmetic)."""
    values = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (3, 256, 1))
    return np.ascontiguousarray(image_normalize(preprocess_key(preprocess_cfg))(values)[:, :, 0])


class ImageNormalizer:
    """A batch's uint8 `image` and `image_foil` (B, 3, H, W), as every epoch ships them,
    normalised on the worker's device to the
    float32 tensors of the eval or training transform, bit for bit: on a CPU by
    csclip.preprocess.image_normalize itself, on an accelerator by looking each value up
    in channel_lookup's table (a copy, exact on any device; the device's own division may
    differ in the last bit). A float32 image passes through."""

    COLUMNS = ("image", "image_foil")

    def __init__(self, preprocess_cfg: dict, device) -> None:
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        self._normalize = image_normalize(preprocess_key(preprocess_cfg))
        self._lookup = torch.from_numpy(channel_lookup(preprocess_cfg)).to(device)  # (3, 256)

    def __call__(self, batch: dict) -> dict:
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        out = batch
        for name in self.COLUMNS:
            image = batch.get(name)
            if image is None or image.dtype != torch.uint8:
                continue
            out = dict(out) if out is batch else out
            out[name] = (torch.from_numpy(self._normalize(image.numpy()))
                         if image.device.type == "cpu" else self.by_lookup(image))
        return out

    def by_lookup(self, image):
        """(B, 3, H, W) uint8 -> float32 on the image's device, through the table."""
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        lookup = self._lookup.to(image.device)
        channels = [lookup[c][image[:, c].long()] for c in range(image.shape[1])]  # (B, H, W)
        return torch.stack(channels, dim=1)                                       # (B, 3, H, W)
