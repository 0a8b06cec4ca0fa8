"""The text tower without its padding (ours; open_clip_train always runs the full context).

open_clip's CLIP text tower is causal and pools at the end-of-text token (the row's
highest id, `text_pool_type` argmax), so what a row's feature depends on stops there: the
positions after it change neither the feature nor, therefore, any gradient (theirs are
exactly zero). A unit ("red circle") is 4-11 of csclip-tiny's 32 positions and a COCO
caption ~13 of ViT-B/32's 77, so most of the text tower's work is padding. Here a batch
runs cut to its longest row, and its shorter rows (a CS-CLIP batch's units beside its
captions) in a shorter call of their own where that saves enough (length_groups). A text
that repeats in the batch runs once, its feature shared by its rows: a CS-CLIP batch of
the world repeats ~20% of its 512 texts (an image foil's relation unit is often one of the
row's unit slots; entity units recur across rows), and its step takes less time. The
gradient of a shared feature is the sum over its rows, as the tower's would be over the
copies. The features and gradients equal the full-context ones up to float rounding (a
matrix of another shape sums in another order; tests/test_trimmed_text.py).

Only for the models whose text tower is open_clip's own causal transformer pooled at the
argmax token (CLIP, csclip's small configs); any other (a HuggingFace tower, SigLIP's
bias) runs its plain forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def can_trim(model: torch.nn.Module) -> bool:
    """True when `model`'s text tower is open_clip's causal transformer pooled at the
    end-of-text token (argmax), the case where cutting the padding changes nothing."""
    return (getattr(model, "text_pool_type", None) == "argmax"
            and getattr(model, "attn_mask", None) is not None
            and hasattr(model, "token_embedding")
            and getattr(model, "logit_bias", None) is None)


# A batch's rows are split into another length group only where that saves at least this
# share of the group's token positions: each group is one more call, and on CPU a call on
# a few rows costs more than it saves (caption-only batches ran slower when cut into
# groups every 8 positions; benchmarks/bench_step.py).
MIN_SAVING = 0.25


def length_groups(lengths: list[int], min_saving: float = MIN_SAVING) -> list[tuple[int, list[int]]]:
    """The rows (their indices) of each call and its length: starting from all rows at the
    longest, split off the shorter rows at the length that saves the most positions,
    while that saves at least `min_saving` of the group's."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups = []
    while order:
        longest = lengths[order[0]]
        best_saving, best_at = 0, None
        for position in range(1, len(order)):  # rows order[position:] in a shorter call
            if lengths[order[position]] < lengths[order[position - 1]]:
                saving = (len(order) - position) * (longest - lengths[order[position]])
                if saving > best_saving:
                    best_saving, best_at = saving, position
        if best_at is None or best_saving < min_saving * len(order) * longest:
            groups.append((longest, order))
            break
        groups.append((longest, order[:best_at]))
        order = order[best_at:]
    return groups


def encode_text_trimmed(model: torch.nn.Module, text: Tensor) -> Tensor:
    """model.encode_text(text, normalize=True), each distinct row run once, and only up
    to its end-of-text token. text: (N, context_length) token ids; returns (N, D)."""
    distinct, rows = torch.unique(text, dim=0, return_inverse=True)
    if distinct.shape[0] < text.shape[0]:
        return _encode_trimmed(model, distinct)[rows]   # backward sums the copies' gradients
    return _encode_trimmed(model, text)


def _encode_trimmed(model: torch.nn.Module, text: Tensor) -> Tensor:
    ends = text.argmax(dim=1)                           # each row's end-of-text position
    groups = length_groups((ends + 1).tolist())
    # One lookup for all groups: each call's backward fills a dense (vocabulary, width)
    # gradient (49408 x 64 floats, costly on a CPU), and the calls' gradients are added.
    embedded = model.token_embedding(text[:, :groups[0][0]]).to(model.transformer.get_cast_dtype())
    if len(groups) == 1:
        return F.normalize(_encode(model, embedded, ends), dim=-1)
    out: Tensor | None = None
    for length, rows in groups:
        index = torch.as_tensor(rows, device=text.device)
        features = _encode(model, embedded[index, :length], ends[index])
        if out is None:
            out = features.new_empty(text.shape[0], features.shape[1])
        out[index] = features
    assert out is not None
    return F.normalize(out, dim=-1)


def _encode(model: torch.nn.Module, embedded: Tensor, ends: Tensor) -> Tensor:
    # open_clip.model.CLIP.encode_text from the token embeddings (N, length, width), with
    # the positional embedding and causal mask cut to that length; pooled at `ends`, the
    # rows' end-of-text positions (its argmax).
    length = embedded.shape[1]
    x = embedded + model.positional_embedding[:length].to(embedded.dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    x = model.ln_final(x)
    x = x[torch.arange(x.shape[0], device=x.device), ends]
    projection = model.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection


class TrimmedTextForward(torch.nn.Module):
    """CLIP's forward (normalised image features, text features, logit_scale.exp()) with
    the text tower run without its padding: the step's runner (csclip.train.step), so
    DDP still sees one forward call. image_features: a locked tower's features kept per
    image (csclip.train.locked_images), or None to run the image tower every time."""

    wraps_model = True  # csclip.model.unwrap finds the model inside

    def __init__(self, model: torch.nn.Module, image_features: Callable | None = None):
        super().__init__()
        self.model = model
        self.image_features = image_features

    def forward(self, image: Tensor | None = None, text: Tensor | None = None):
        model = self.model
        if image is None:
            image_features = None
        elif self.image_features is not None:
            image_features = self.image_features(model, image)
        else:
            image_features = model.encode_image(image, normalize=True)
        text_features = encode_text_trimmed(model, text) if text is not None else None
        return image_features, text_features, model.logit_scale.exp()
