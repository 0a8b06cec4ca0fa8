"""The `loss` section: which objective and its weights (the equations: csclip.loss)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from csclip.config.base import StrictModel, refuse_renamed

__all__ = ["LossConfig"]


class LossConfig(StrictModel):
    """The `loss` section: which objective, and λ in L = L_full + λ·L_unit (SPEC §3).

    method `layout` (ours, not a retrieval objective): the image tower alone learns each
    object kind's grid cell on the synthetic world (`layout_loss`; the demo's warm start,
    csclip.train.warm_start)."""

    method: Literal["clip", "negclip", "csclip", "layout"] = "csclip"
    unit_loss_weight: float = Field(0.5, ge=0)
    # True: features are all-gathered with gradient, so negatives come from the global
    # batch (batch_size x workers; open_clip's --gather-with-grad). False: each worker's
    # loss sees only its local batch, and DDP averages the gradients, i.e. the gradient of
    # the mean of per-worker losses (what the authors' one-GPU launcher trains: 128
    # in-batch negatives per image whatever the number of GPUs).
    gather: bool = True
    # Ours, beyond the paper (off in every paper preset): image-side counterfactual foils.
    # Each sample's image with one relation made false (csclip.train.image_foils) joins the batch
    # with the unit true of it; a relation unit must prefer its own image over the foil,
    # and the image its unit over the foil's: L = L_full + λ·L_unit + μ·L_image_foil.
    # This one field turns them on, with its weight μ; None or 0: off.
    image_foil_weight: float | None = Field(None, ge=0)
    # The authors' ranking loss (alignment/losses.py@16276c7, `lambda_rank`, `rank_margin`),
    # which their swap-fraction runs trained with (weight 0.2; `--grid paper`'s swap rows):
    # L = L_full + λ·L_unit + λ_rank·L_rank, L_rank = hinge on s(I, u_k) + δ - s(I, c)
    # (`ranking_loss`). 0: off, as in the paper's main run and every preset.
    ranking_loss_weight: float = Field(0.0, ge=0)
    ranking_margin: float = Field(0.1, ge=0)  # δ, in cosine similarity (theirs: 0.1)

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data):
        return refuse_renamed(data, "loss", {
            "image_foils": "loss.image_foil_weight (a weight μ turns image foils on; null: off)"})

    @model_validator(mode="after")
    def _layout_has_no_foils(self) -> LossConfig:
        if self.method == "layout" and self.image_foil_weight:
            raise ValueError("loss.method layout asks the image tower alone; it has no "
                             "image foils: leave loss.image_foil_weight unset")
        if self.ranking_loss_weight and self.method != "csclip":
            raise ValueError(f"loss.ranking_loss_weight ranks the caption above its units; "
                             f"loss.method {self.method} has no units: use method csclip "
                             "or set the weight to 0")
        return self

    @property
    def image_foils(self) -> bool:
        """Whether the image-foil term is on (loss.image_foil_weight set and > 0)."""
        return bool(self.image_foil_weight)
