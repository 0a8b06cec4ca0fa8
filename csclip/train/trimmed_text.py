"""The text tower without its padding (ours; open_clip_train always runs the full context).

open_clip's CLIP text tower is causal and pools at the end-of-text token (the row's
highest id, `text_pool_type` argmax), so what a row's feature depends on stops there: the
positions after it change neither the feature nor, therefore, any gradient (theirs are
exactly zero). A unit ("red circle") is 4-11 of csclip-tiny's 32 positions and a COCO
caption ~15-20 of ViT-B/32's 77, so most of the text tower's work is padding. Here each
batch's rows are grouped by length (bucket edges every BUCKET positions), each group cut to
its longest row and encoded apart. The features equal the full-context ones up to float
rounding (a different matrix shape sums in another order; tests/test_trimmed_text.py); the
optimisation path and its numbers are otherwise the same.

Only for the models whose text tower is open_clip's own causal transformer pooled at the
argmax token (CLIP, csclip's small configs); any other (a HuggingFace tower, SigLIP's
bias) runs its plain forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BUCKET = 8  # rows whose lengths round up to the same multiple of 8 share one call


def can_trim(model: torch.nn.Module) -> bool:
    """True when `model`'s text tower is open_clip's causal transformer pooled at the
    end-of-text token (argmax), the case where cutting the padding changes nothing."""
    return (getattr(model, "text_pool_type", None) == "argmax"
            and getattr(model, "attn_mask", None) is not None
            and hasattr(model, "token_embedding")
            and getattr(model, "logit_bias", None) is None)


def encode_text_trimmed(model: torch.nn.Module, text: Tensor) -> Tensor:
    """model.encode_text(text, normalize=True), each row run only up to its end-of-text
    token. text: (N, context_length) token ids; returns (N, D)."""
    lengths = text.argmax(dim=1) + 1                    # the end-of-text token's position + 1
    buckets = (lengths + BUCKET - 1) // BUCKET
    out: Tensor | None = None
    for bucket in torch.unique(buckets).tolist():
        rows = (buckets == bucket).nonzero(as_tuple=True)[0]
        length = int(lengths[rows].max())
        features = _encode(model, text[rows, :length])
        if out is None:
            out = features.new_empty(text.shape[0], features.shape[1])
        out[rows] = features
    assert out is not None
    return F.normalize(out, dim=-1)


def _encode(model: torch.nn.Module, text: Tensor) -> Tensor:
    # open_clip.model.CLIP.encode_text, with the positional embedding and causal mask cut
    # to the rows' length.
    length = text.shape[1]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(text).to(cast_dtype)
    x = x + model.positional_embedding[:length].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    x = model.ln_final(x)
    x = x[torch.arange(x.shape[0], device=x.device), text.argmax(dim=-1)]
    projection = model.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection


class TrimmedTextForward(torch.nn.Module):
    """CLIP's forward (normalised image features, text features, logit_scale.exp()) with
    the text tower run without its padding: the step's runner (csclip.train.step), so
    DDP still sees one forward call."""

    wraps_model = True  # csclip.model.unwrap finds the model inside

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, image: Tensor | None = None, text: Tensor | None = None):
        model = self.model
        image_features = model.encode_image(image, normalize=True) if image is not None else None
        text_features = encode_text_trimmed(model, text) if text is not None else None
        return image_features, text_features, model.logit_scale.exp()
