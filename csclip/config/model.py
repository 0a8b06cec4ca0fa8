"""The `model` section: which model, with which weights, and how it is trained."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from csclip.config.base import StrictModel, refuse_renamed

__all__ = ["LockConfig", "ModelConfig", "ModelSource"]

_RENAMED_LOCK_FIELDS = {
    "lock_image": "model.lock.image", "lock_image_unlocked_groups": "model.lock.image_unlocked_groups",
    "lock_text": "model.lock.text", "lock_text_unlocked_layers": "model.lock.text_unlocked_layers"}


class ModelSource(StrictModel):
    """Which model, with which weights: what evaluation reads (`csclip evaluate`'s `model`
    section) and what every training config starts from."""

    name: str = "csclip-tiny"  # open_clip model name (ViT-B-32, csclip-tiny, ...)
    # A pretrained tag (`openai`), a state-dict file, or a csclip checkpoint directory.
    pretrained: str | None = None
    # OpenAI's ViT-B/32 weights were trained with QuickGELU (SPEC §6). None: as the
    # pretrained tag was trained (csclip.pretrained), as a checkpoint was saved, else False;
    # a value that contradicts the tag is refused.
    quick_gelu: bool | None = None
    image_size: int | None = Field(None, ge=16)  # None: the model config's own size

    @field_validator("pretrained")
    @classmethod
    def _absolute_local_path(cls, value: str | None) -> str | None:
        # Ray workers run in their own working directory: a relative path that exists
        # here would not be found there, so it travels as an absolute one.
        if value and "://" not in value and Path(value).exists() and not Path(value).is_absolute():
            return str(Path(value).resolve())
        return value


class LockConfig(StrictModel):
    """The `model.lock` section: LiT-style locking, a tower frozen except its last N layer
    groups (open_clip's lock_image_tower / lock_text_tower). Groups, first to last:
    embeddings, each residual block but the last, the last block with its final
    LayerNorm, the projection. Locked weights get no gradient and no AdamW slot."""

    image: bool = False
    image_unlocked_groups: int = Field(0, ge=0)
    text: bool = False
    text_unlocked_layers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _unlocked_needs_lock(self) -> LockConfig:
        if self.image_unlocked_groups and not self.image:
            raise ValueError("model.lock.image_unlocked_groups is set but model.lock.image is "
                             "false; set model.lock.image=true (or drop the unlocked groups)")
        if self.text_unlocked_layers and not self.text:
            raise ValueError("model.lock.text_unlocked_layers is set but model.lock.text is "
                             "false; set model.lock.text=true (or drop the unlocked layers)")
        return self


class ModelConfig(ModelSource):
    """The `model` section of a training config: the model and how it is trained."""

    # Training-time options, as open_clip_train's flags (apply_training_options); they do
    # not change what a checkpoint holds. grad_checkpointing recomputes each residual
    # block in the backward: less activation memory, ~1/3 more compute, same gradients.
    grad_checkpointing: bool = False
    lock: LockConfig = LockConfig()

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data):
        return refuse_renamed(data, "model", _RENAMED_LOCK_FIELDS)
