"""CS-CLIP training objectives (SPEC §3): plain CLIP, L_full (NegCLIP) and L_unit (and the
authors' optional ranking loss L_rank, their swap runs' extra term), with
features all-gathered with gradient across workers (csclip.gather) so negatives come from
the global batch.

Every loss takes this worker's *local*, L2-normalised features and `scale =
logit_scale.exp()` (= 1/τ). Gathering happens inside, so every worker computes the same
global loss; outside torch.distributed the gather is the identity. With `gather=False`
(`loss.gather: false`) each worker's loss uses only its own batch as negatives, as the
authors' one-GPU run (SPEC §6, "Batch"). Every loss runs in fp32 with autocast disabled,
whatever the caller's context (SPEC §6, "Precision").

An `Objective` ties a method to the text columns it needs and its loss, so the trainer
never slices columns by position: `objective_for(LossConfig, num_unit_slots)`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from csclip.config.loss import LossConfig
from csclip.errors import ConfigError
from csclip.gather import gather_if, gather_mask
from csclip.units import unit_columns


@dataclass(frozen=True)
class LossParts:
    """The terms of L = L_full + λ·L_unit (+ λ_rank·L_rank) (+ μ·L_image_foil) (scalars
    with graphs attached). image_foil / ranking are None when the objective has no such
    term (ranking: loss.ranking_loss_weight 0)."""

    full: Tensor
    unit: Tensor
    total: Tensor
    image_foil: Tensor | None = None
    ranking: Tensor | None = None


# ---------------------------------------------------------------------------------------
# Losses on gathered features (B = global batch)
# ---------------------------------------------------------------------------------------

def _labels(num: int, device: torch.device) -> Tensor:
    return torch.arange(num, device=device, dtype=torch.long)


def _clip(image: Tensor, text: Tensor, scale: Tensor) -> Tensor:
    # Symmetric InfoNCE: image i matches text i (Radford et al. 2021, open_clip ClipLoss).
    logits_per_image = scale * image @ text.T                    # (B, B), label i
    logits_per_text = logits_per_image.T                         # (B, B), label i
    labels = _labels(image.shape[0], image.device)
    return (F.cross_entropy(logits_per_image, labels)
            + F.cross_entropy(logits_per_text, labels)) / 2


def _negclip(image: Tensor, caption: Tensor, caption_negative: Tensor, negative_mask: Tensor,
             scale: Tensor) -> Tensor:
    # L_full: image→text logits img @ [cap ; capneg]ᵀ / τ (B × 2B, label i), so every image
    # also has every caption-level negative of the batch as a distractor (NegCLIP);
    # text→image logits cap @ imgᵀ / τ (negatives are never positives of an image).
    # A sample without a caption negative (negative_mask False; its text is a placeholder)
    # gives no negative column; its image and caption stay in the loss. The authors drop
    # such a sample from L_full altogether (rows and caption columns); both keep the
    # placeholder out, which is what matters: paired with itself it would be a column
    # equal to the positive. The column is masked to -inf, not indexed away: indexing by a
    # mask would make the host wait for the GPU every step.
    batch = image.shape[0]
    texts = torch.cat([caption, caption_negative], dim=0)        # (2B, D)
    logits_per_image = scale * image @ texts.T                   # (B, 2B), label i
    keep = torch.cat([torch.ones_like(negative_mask), negative_mask])  # (2B,)
    logits_per_image = logits_per_image.masked_fill(~keep, _NEVER)
    logits_per_text = logits_per_image[:, :batch].T              # (B, B) = cap @ imgᵀ / τ
    labels = _labels(batch, image.device)
    return (F.cross_entropy(logits_per_image, labels)
            + F.cross_entropy(logits_per_text, labels)) / 2


# A masked logit: exp(_NEVER - max) is exactly 0 in fp32 next to any real logit (|logit| <=
# 100, the clamped scale), and unlike -inf a row of nothing but masked logits stays finite
# (its softmax is uniform), so the weight-0 rows give zero, not NaN, gradients.
_NEVER = -1e30


def _masked_mean_cross_entropy(logits: Tensor, labels: Tensor, rows: Tensor) -> Tensor:
    """Mean cross-entropy over the rows where `rows` is True (0 when none, with a graph).
    Other rows get a finite stand-in label and weight 0: no host sync on the mask."""
    safe_labels = torch.where(rows, labels, logits.shape[-1] - 1)
    per_row = F.cross_entropy(logits, safe_labels, reduction="none")
    per_row = torch.where(rows, per_row, torch.zeros_like(per_row))
    return per_row.sum() / rows.sum().clamp(min=1)


def _unit(image: Tensor, units: Tensor, foils: Tensor, mask: Tensor, scale: Tensor) -> Tensor:
    # Only the B_v valid samples take part: a masked sample's unit text is a placeholder, so
    # it is neither a row of the loss nor a column for anyone else (its scores are _NEVER,
    # its rows weigh 0; masking instead of indexing keeps the step free of host syncs).
    # With no valid sample in the global batch, L_unit = 0 (with a graph).
    num_slots, batch = units.shape[:2]
    # L_unit, slot k: image i scores every unit of slot k in the batch plus only its own
    # foil ũ_i (label i); text→image is u @ imgᵀ / τ. All K slots in one batched product.
    unit_scores = scale * torch.einsum("id,kjd->kij", image, units)        # (K, B, B)
    valid_pair = mask[:, None] & mask[None, :]                             # (B, B)
    unit_scores = unit_scores.masked_fill(~valid_pair, _NEVER)
    own_foil = scale * (image * foils).sum(-1, keepdim=True)               # (K, B, 1)
    logits_per_image = torch.cat([unit_scores, own_foil], dim=2)           # (K, B, B+1)
    logits_per_text = unit_scores.transpose(1, 2)                          # (K, B, B)
    labels = _labels(batch, image.device).repeat(num_slots)                # (K·B,), label i
    rows = mask.repeat(num_slots)                                          # (K·B,)
    # Every slot has B_v rows, so the mean over all K·B_v rows is the mean over slots of
    # each slot's mean: L_unit = mean_k (CE_i2t,k + CE_t2i,k) / 2.
    i2t = logits_per_image.reshape(num_slots * batch, batch + 1)
    t2i = logits_per_text.reshape(num_slots * batch, batch)
    return (_masked_mean_cross_entropy(i2t, labels, rows)
            + _masked_mean_cross_entropy(t2i, labels, rows)) / 2


def _image_foil(image: Tensor, foil_images: Tensor, units: Tensor, foil_texts: Tensor,
                mask: Tensor, scale: Tensor) -> Tensor:
    # L_image_foil (ours): a symmetric CLIP loss over the batch doubled by its
    # counterfactuals, images [I ; I'] against texts [u ; u'], where I' is I with the
    # relation of unit u made false and u' the unit true of I' ("B r A" for "A r B").
    # So u must prefer I over I' (the image tower must see layout) and I must prefer u
    # over u' (the text tower must read it), with every other sample as in-batch
    # negatives. Samples without a foil are neither rows nor columns (masked, no sync).
    images = torch.cat([image, foil_images])                               # (2B, D)
    texts = torch.cat([units, foil_texts])                                 # (2B, D)
    valid = torch.cat([mask, mask])                                        # (2B,)
    logits = scale * images @ texts.T                                      # (2B, 2B), label i
    logits = logits.masked_fill(~(valid[:, None] & valid[None, :]), _NEVER)
    labels = _labels(images.shape[0], image.device)
    return (_masked_mean_cross_entropy(logits, labels, valid)
            + _masked_mean_cross_entropy(logits.T, labels, valid)) / 2


def _ranking(image: Tensor, caption: Tensor, units: Tensor, mask: Tensor,
             margin: float) -> Tensor:
    # L_rank, the authors' `_compute_ranking_loss` (alignment/losses.py@16276c7, the same
    # at 98b40c0) with rank_reduction "mean", the only one their launchers ran:
    #   L_rank = 1/B Σ_i m_i · 1/N Σ_k max(0, δ + s(I_i, u_k,i) - s(I_i, c_i))
    # s: cosine similarity (no temperature), c_i the full caption, u_k,i the unit of slot k,
    # m_i the unit mask, B every sample of the (gathered) batch: a sample without units
    # adds 0 and still counts in B (theirs divides by B, each sample's hinges by its valid
    # slot count, which is N or none: their caption_valid_mask is all or nothing per
    # sample, as csclip's unit_mask). Foils take no part.
    caption_score = (image * caption).sum(-1)                              # (B,)
    unit_scores = torch.einsum("bd,kbd->kb", image, units)                 # (K, B)
    hinge = (margin + unit_scores - caption_score).clamp(min=0)            # (K, B)
    per_sample = torch.where(mask, hinge.mean(0), torch.zeros_like(caption_score))
    return per_sample.mean()


# ---------------------------------------------------------------------------------------
# Public losses (local features in, global loss out)
# ---------------------------------------------------------------------------------------

def fp32_loss(fn: Callable) -> Callable:
    """Run a loss in fp32 with autocast off. Inside a caller's bf16 autocast the logits
    matmuls would run in bf16 again even on fp32 inputs; unit and foil similarities differ
    by ~1e-3, below bf16's resolution, so L_unit's ordering would be mostly noise
    (the authors also compute the loss in fp32 with autocast off)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def up(value):
            return value.float() if isinstance(value, Tensor) and value.is_floating_point() else value

        device_types = {a.device.type for a in (*args, *kwargs.values()) if isinstance(a, Tensor)}
        with contextlib.ExitStack() as stack:
            for device_type in sorted(device_types | {"cpu"}):
                stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
            return fn(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()})

    return wrapper


@fp32_loss
def clip_loss(image: Tensor, text: Tensor, scale: Tensor, gather: bool = True) -> Tensor:
    """Plain CLIP loss: mean of image→text and text→image cross-entropies.

    image, text: (B, D) local L2-normalised features; scale: scalar logit_scale.exp();
    gather: negatives from every worker's batch (True) or this worker's only.
    Equals open_clip's `ClipLoss(gather_with_grad=True)` on the same features.
    """
    return _clip(gather_if(image, gather), gather_if(text, gather), scale)


@fp32_loss
def negclip_loss(image: Tensor, caption: Tensor, caption_negative: Tensor, scale: Tensor,
                 negative_mask: Tensor | None = None, gather: bool = True) -> Tensor:
    """L_full (NegCLIP, SPEC §3): captions with caption-level negatives as extra columns.

    image, caption, caption_negative: (B, D) local features; scale: scalar;
    negative_mask: (B,) bool, False where the sample has no caption negative (its column
    is left out); None: every sample has one. gather: as in clip_loss.
    """
    negative_mask = _full_mask(negative_mask, image)
    return _negclip(gather_if(image, gather), gather_if(caption, gather),
                    gather_if(caption_negative, gather), gather_mask(negative_mask, gather), scale)


@fp32_loss
def unit_loss(image: Tensor, units: Tensor, foils: Tensor, mask: Tensor,
              scale: Tensor, gather: bool = True) -> Tensor:
    """L_unit (SPEC §3), the mean over the K unit slots.

    image: (B, D); units, foils: (K, B, D) unit and foil features of slots 1..K;
    mask: (B,) bool, False for samples without units (left out entirely); scale: scalar.
    Returns 0 (with a graph) when no sample of the (gathered) batch is valid.
    """
    _check_unit_shapes(image, units, foils, mask)
    return _unit(gather_if(image, gather), gather_if(units, gather, dim=1),
                 gather_if(foils, gather, dim=1), gather_mask(mask, gather), scale)


@fp32_loss
def csclip_loss(image: Tensor, caption: Tensor, caption_negative: Tensor, units: Tensor,
                foils: Tensor, mask: Tensor, scale: Tensor, unit_loss_weight: float = 0.5,
                negative_mask: Tensor | None = None, gather: bool = True,
                ranking_loss_weight: float = 0.0, ranking_margin: float = 0.1) -> LossParts:
    """L = L_full + λ·L_unit (SPEC §3) (+ λ_rank·L_rank), gathering each feature tensor once.

    image, caption, caption_negative: (B, D); units, foils: (K, B, D); mask: (B,) bool
    (samples with units); scale: scalar logit_scale.exp(); unit_loss_weight: λ (paper:
    0.5); negative_mask: (B,) bool (samples with a caption negative; None: all);
    gather: as in clip_loss; ranking_loss_weight: λ_rank (0: no L_rank term, and
    LossParts.ranking is None), ranking_margin: its δ (see ranking_loss).
    """
    _check_unit_shapes(image, units, foils, mask)
    negative_mask = _full_mask(negative_mask, image)
    all_image = gather_if(image, gather)                           # (B_global, D)
    all_caption = gather_if(caption, gather)
    all_units = gather_if(units, gather, dim=1)                    # (K, B_global, D)
    all_mask = gather_mask(mask, gather)
    loss_full = _negclip(all_image, all_caption, gather_if(caption_negative, gather),
                         gather_mask(negative_mask, gather), scale)
    loss_unit = _unit(all_image, all_units, gather_if(foils, gather, dim=1), all_mask, scale)
    total = loss_full + unit_loss_weight * loss_unit
    if not ranking_loss_weight:  # off: the total is exactly the paper's L
        return LossParts(full=loss_full, unit=loss_unit, total=total)
    loss_ranking = _ranking(all_image, all_caption, all_units, all_mask, ranking_margin)
    return LossParts(full=loss_full, unit=loss_unit,
                     total=total + ranking_loss_weight * loss_ranking, ranking=loss_ranking)


@fp32_loss
def ranking_loss(image: Tensor, caption: Tensor, units: Tensor, mask: Tensor,
                 margin: float = 0.1, gather: bool = True) -> Tensor:
    """L_rank, the authors' ranking loss (kargibora/CS-CLIP alignment/losses.py@16276c7,
    `_compute_ranking_loss`): each image must score its full caption at least δ above each
    of its units, in cosine similarity,

        L_rank = 1/B Σ_i m_i · 1/N Σ_k max(0, δ + s(I_i, u_k,i) - s(I_i, c_i)).

    image, caption: (B, D) local L2-normalised features; units: (K, B, D) unit features of
    slots 1..K; mask: (B,) bool, False for samples without units (they add 0 but count
    in B, as theirs); margin: δ (theirs: 0.1); gather: as in clip_loss.
    """
    if caption.shape != image.shape:
        raise ValueError(f"caption must be {tuple(image.shape)}; got {tuple(caption.shape)}")
    _check_unit_shapes(image, units, units, mask)
    return _ranking(gather_if(image, gather), gather_if(caption, gather),
                    gather_if(units, gather, dim=1), gather_mask(mask, gather), margin)


@fp32_loss
def image_foil_loss(image: Tensor, foil_images: Tensor, units: Tensor, foil_texts: Tensor,
                    mask: Tensor, scale: Tensor, gather: bool = True) -> Tensor:
    """L_image_foil (ours, beyond the paper): symmetric CLIP over images [I ; I'] and texts
    [u ; u'], I' each sample's image foil (its relation made false), u the relation unit,
    u' the unit true of the foil.

    image, foil_images, units, foil_texts: (B, D); mask: (B,) bool (samples with an
    image foil); scale: scalar; gather: as in clip_loss.
    """
    for name, tensor in (("foil_images", foil_images), ("units", units),
                         ("foil_texts", foil_texts)):
        if tensor.shape != image.shape:
            raise ValueError(f"{name} must be {tuple(image.shape)}; got {tuple(tensor.shape)}")
    return _image_foil(gather_if(image, gather), gather_if(foil_images, gather),
                       gather_if(units, gather), gather_if(foil_texts, gather),
                       gather_mask(mask, gather), scale)


@fp32_loss
def layout_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """L_layout (ours, the demo's warm start): for each of K object kinds, cross entropy of
    its class (its grid cell, or "absent" after the cells) over the head's logits.

    logits: (B, K * classes) from a linear head on the image embedding; targets: (B, K)
    int64 class indices. The mean over the B x K (sample, kind) pairs.
    """
    batch, kinds = targets.shape
    return F.cross_entropy(logits.reshape(batch, kinds, -1).flatten(0, 1), targets.flatten())


def _full_mask(mask: Tensor | None, image: Tensor) -> Tensor:
    if mask is None:
        return torch.ones(image.shape[0], dtype=torch.bool, device=image.device)
    if mask.shape != (image.shape[0],):
        raise ValueError(f"negative_mask must be ({image.shape[0]},); got {tuple(mask.shape)}")
    return mask


def _check_unit_shapes(image: Tensor, units: Tensor, foils: Tensor, mask: Tensor) -> None:
    # Programming errors (the caller built the tensors), hence ValueError, not CsclipError.
    batch, dim = image.shape
    if units.dim() != 3 or units.shape[1:] != (batch, dim) or foils.shape != units.shape:
        raise ValueError(f"units and foils must be (K, {batch}, {dim}); got "
                         f"{tuple(units.shape)} and {tuple(foils.shape)}")
    if mask.shape != (batch,):
        raise ValueError(f"mask must be ({batch},); got {tuple(mask.shape)}")


# ---------------------------------------------------------------------------------------
# Objectives: a method's text columns and its loss, in one place
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayoutQuestion:
    """What loss.method layout asks of each image: for every object kind (a world's colors x
    shapes, kind index color * len(shapes) + shape), which of the grid_size² cells holds
    it, or "absent" (class grid_size², the last)."""

    colors: tuple[str, ...]
    shapes: tuple[str, ...]
    grid_size: int

    @property
    def num_kinds(self) -> int:
        return len(self.colors) * len(self.shapes)

    @property
    def num_classes(self) -> int:  # the cells and "absent"
        return self.grid_size ** 2 + 1

    def kind(self, color: str | None, shape: str) -> int | None:
        if color not in self.colors or shape not in self.shapes:
            return None
        return self.colors.index(color) * len(self.shapes) + self.shapes.index(shape)


@dataclass(frozen=True)
class Objective:
    """One training method: the token columns it encodes (in order) and its loss.

    `loss(image, texts, masks, scale)` takes image features (B, D), the features of each
    text column by name ((B, D) each), the batch's boolean mask columns by name ((B,)) and
    scale = logit_scale.exp(); it returns LossParts. With `layout` (loss.method layout)
    there are no text columns: `image` is the layout head's logits (B, K * classes) and
    the batch's `layout_target` (B, K) is read like a mask column.
    """

    method: str
    columns: tuple[str, ...]
    num_unit_slots: int = 0
    unit_loss_weight: float = 0.0
    gather: bool = True  # LossConfig.gather
    image_foil_weight: float | None = None  # μ; None: no image-foil term
    layout: LayoutQuestion | None = None  # method layout only
    ranking_loss_weight: float = 0.0  # λ_rank (csclip only); 0: no L_rank term
    ranking_margin: float = 0.1  # δ of L_rank

    @property
    def mask_columns(self) -> tuple[str, ...]:
        """The columns besides images and tokens the loss reads from the batch:
        `negative_mask` (samples with a caption negative) for negclip and csclip,
        `unit_mask` (samples with units) for csclip, `image_foil_mask` (samples with an
        image foil) with image foils, `layout_target` (B, K) for layout."""
        masks = {"clip": (), "negclip": ("negative_mask",), "layout": ("layout_target",),
                 "csclip": ("unit_mask", "negative_mask")}[self.method]
        return masks + (("image_foil_mask",) if self.image_foil_weight is not None else ())

    @property
    def image_columns(self) -> tuple[str, ...]:
        """The image columns the model encodes, in order: `image`, and `image_foil` (each
        sample's counterfactual image) with image foils."""
        return ("image", "image_foil") if self.image_foil_weight is not None else ("image",)

    def loss(self, image: Tensor, texts: Mapping[str, Tensor], masks: Mapping[str, Tensor],
             scale: Tensor, images: Mapping[str, Tensor] | None = None) -> LossParts:
        """images: features of image_columns beyond `image` by name ((B, D) each)."""
        if self.method == "layout":
            term = layout_loss(image, masks["layout_target"])
            return LossParts(term, torch.zeros_like(term), term)
        parts = self._paper_loss(image, texts, masks, scale)
        if self.image_foil_weight is None:
            return parts
        term = image_foil_loss(image, (images or {})["image_foil"], texts["image_foil_unit"],
                               texts["image_foil_text"], masks["image_foil_mask"], scale,
                               gather=self.gather)
        return LossParts(parts.full, parts.unit, parts.total + self.image_foil_weight * term,
                         term, parts.ranking)

    def _paper_loss(self, image: Tensor, texts: Mapping[str, Tensor],
                    masks: Mapping[str, Tensor], scale: Tensor) -> LossParts:
        if self.method == "clip":
            full = clip_loss(image, texts["caption"], scale, gather=self.gather)
            return LossParts(full, torch.zeros_like(full), full)
        if self.method == "negclip":
            full = negclip_loss(image, texts["caption"], texts["caption_negative"], scale,
                                masks["negative_mask"], gather=self.gather)
            return LossParts(full, torch.zeros_like(full), full)
        n = self.num_unit_slots
        units = torch.stack([texts[f"unit_{k}"] for k in range(n)])          # (N, B, D)
        foils = torch.stack([texts[f"foil_{k}"] for k in range(n)])          # (N, B, D)
        return csclip_loss(image, texts["caption"], texts["caption_negative"], units, foils,
                           masks["unit_mask"], scale, self.unit_loss_weight,
                           masks["negative_mask"], gather=self.gather,
                           ranking_loss_weight=self.ranking_loss_weight,
                           ranking_margin=self.ranking_margin)


def objective_for(config: LossConfig, num_unit_slots: int,
                  layout: LayoutQuestion | None = None) -> Objective:
    """The Objective of `config.method` with N = num_unit_slots unit slots (and, with
    loss.image_foil_weight, the image-foil term's `image_foil_unit` column). layout: the
    question of method layout (the training world's; None where there is no world).

    Raises ConfigError for method layout without a question."""
    if config.method == "layout":
        if layout is None:
            raise ConfigError("loss.method layout needs the synthetic world (data.units_uri "
                             "unset): its targets are the scenes' object cells")
        return Objective("layout", (), gather=config.gather, layout=layout)
    foil = ((("image_foil_unit", "image_foil_text"), config.image_foil_weight)
            if config.image_foils else ((), None))
    if config.method == "clip":
        return Objective("clip", ("caption", *foil[0]), gather=config.gather,
                         image_foil_weight=foil[1])
    if config.method == "negclip":
        return Objective("negclip", ("caption", "caption_negative", *foil[0]),
                         gather=config.gather, image_foil_weight=foil[1])
    return Objective("csclip", ("caption", "caption_negative", *unit_columns(num_unit_slots),
                                *foil[0]),
                     num_unit_slots, config.unit_loss_weight, config.gather, foil[1],
                     ranking_loss_weight=config.ranking_loss_weight,
                     ranking_margin=config.ranking_margin)
