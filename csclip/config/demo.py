"""The demo's config (`make demo`, `csclip demo`): the fine-tuning config and the deltas
of its pretraining, layout warm start and fine-tunings."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from pydantic import Field, model_validator

from csclip.config.base import (
    StrictModel,
    deep_merge,
    read_yaml,
    refuse_given,
    refuse_renamed,
    validate_config,
)
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError

__all__ = ["DELTAS_FILE", "DemoConfig", "apply_delta", "default_delta"]


# The demo's runs, each a delta (a partial TrainConfig, merged field by field) on top of
# another: the pretraining on top of `train` (configs/default.yaml, the fine-tuning
# config), the layout warm start on top of the pretraining, both fine-tunings on top of
# `train`. The deltas, and why each field is what it is, are configs/demo.yaml: DemoConfig's
# defaults. `--set pretrain.optim.max_steps=300` changes that one field of the delta
# (csclip.config.with_section_defaults keeps the others).
DELTAS_FILE = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@functools.cache
def _deltas() -> dict:
    return read_yaml(DELTAS_FILE)


def default_delta(name: str) -> dict | None:
    """The demo's `name` delta (pretrain, warm_start, finetune) as configs/demo.yaml gives it."""
    return copy.deepcopy(_deltas()[name])


# Fields the demo sets itself in each run, refused when given: `section: {field: why}`,
# with the value the demo uses anyway (accepted) in _ACCEPTED.
_SET_BY_THE_DEMO = {
    "train": {"run.name": "the demo names its runs (by config hash, one per method)",
              "model.pretrained": "the demo fine-tunes from its own pretraining",
              "loss.method": "the demo fine-tunes with both clip (CLIP-FT) and csclip"},
    "pretrain": {"run.name": "the demo names its runs (by config hash)",
                 "model.pretrained": "the pretraining starts from the warm start (or random "
                                     "weights without one)"},
    "warm_start": {"run.name": "the demo names its runs (by config hash)"},
    "finetune": {"run.name": "the demo names its runs (by config hash, one per method)",
                 "model.pretrained": "the demo fine-tunes from its own pretraining",
                 "loss.method": "the demo fine-tunes with both clip (CLIP-FT) and csclip"},
}


# `train` is a whole TrainConfig (its defaults filled in): these values are its defaults.
_ACCEPTED = {"train": {"run.name": None, "model.pretrained": None, "loss.method": "csclip"}}


class DemoConfig(StrictModel):
    """`train` is the fine-tuning config (configs/default.yaml); `pretrain`, `warm_start`
    and `finetune` are the demo's deltas (partial TrainConfigs) on top of it, by default
    configs/demo.yaml's. The fine-tuning runs twice, with loss.method csclip and clip,
    from the pretrained checkpoint."""

    train: TrainConfig = TrainConfig()
    pretrain: dict = Field(default_factory=lambda: default_delta("pretrain"))
    warm_start: dict | None = Field(default_factory=lambda: default_delta("warm_start"))
    finetune: dict = Field(default_factory=lambda: default_delta("finetune"))
    eval_seed: int = 0
    out_dir: str = "runs/demo"  # tables, figures, the results section, the stage timings
    # CLIP-FT and CS-CLIP at the same time where the CPUs allow (csclip.demo.side_by_side):
    # they share only the pretraining, and one CPU training leaves most of a second core
    # idle. Each run's batches and numbers are the same either way.
    finetune_together: bool = True

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data):
        if isinstance(data, dict):  # the pretraining's own fields, before it was a delta
            refuse_renamed(data.get("pretrain"), "pretrain", {
                "layout_steps": "warm_start.optim.max_steps (warm_start=null: none)",
                "image_foil_weight": "pretrain.loss.image_foil_weight",
                "world_seed": "pretrain.data.world.seed",
                "num_train": "pretrain.data.world.num_train",
                "batch_size": "pretrain.data.batch_size",
                "storage_path": "pretrain.run.storage_path"})
        refuse_renamed(data, "demo", {
            "lock_image": "finetune.model.lock.image (and pretrain.model.lock.image)",
            "image_foil_weight": "finetune.loss.image_foil_weight (CS-CLIP's μ)"})
        if isinstance(data, dict):
            # The demo names its runs, fine-tunes from its own pretraining and runs both
            # methods: these fields would be overwritten, so they are refused.
            for section, fields in _SET_BY_THE_DEMO.items():
                given = data.get(section)
                if isinstance(given, TrainConfig):
                    given = given.model_dump(mode="json")
                try:
                    refuse_given(given, fields, prefix=f"{section}.",
                                 accepted=_ACCEPTED.get(section))
                except ConfigError as err:
                    raise ValueError(str(err)) from None
        return data

    @model_validator(mode="after")
    def _deltas_are_training_configs(self) -> DemoConfig:
        pre = self.pretrain_config()  # each delta validates as a TrainConfig
        if self.warm_start is None and pre.model.lock.image:
            raise ValueError("warm_start is null but pretrain.model.lock.image is true: the "
                             "image tower would stay random; set pretrain.model.lock.image="
                             "false and finetune.model.lock.image=false")
        if self.warm_start is not None:
            self.warm_start_config()
        self.finetune_config("csclip", "pretrained")
        return self

    def warm_start_config(self) -> TrainConfig:
        """The layout warm start: the pretraining's scenes and model, loss.method layout."""
        if self.warm_start is None:
            raise ValueError("this demo has no warm start (warm_start is null)")
        return apply_delta(self.pretrain_config(), self.warm_start, "warm_start")

    def pretrain_config(self, warm_start: str | None = None) -> TrainConfig:
        """The CLIP pretraining run: `train` with the `pretrain` delta, from the layout warm
        start's checkpoint when there is one, else random weights."""
        config = apply_delta(self.train, self.pretrain, "pretrain")
        return config.model_copy(update={
            "model": config.model.model_copy(update={"pretrained": warm_start})})

    def finetune_config(self, method: str, pretrained_uri: str) -> TrainConfig:
        """One fine-tuning from the pretrained checkpoint: `train` with the `finetune`
        delta and loss.method `method`; CLIP-FT (clip) without image foils."""
        config = apply_delta(self.train, self.finetune, "finetune")
        loss = {"method": method, **({"image_foil_weight": None} if method == "clip" else {})}
        return config.model_copy(update={
            "model": config.model.model_copy(update={"pretrained": pretrained_uri}),
            "loss": config.loss.model_copy(update=loss)})


def apply_delta(base: TrainConfig, delta: dict, name: str) -> TrainConfig:
    """`base` with `delta` (a partial TrainConfig) merged over it, field by field.
    Raises ValueError naming the delta's bad fields (`<name>.loss.method: ...`)."""
    data = deep_merge(base.model_dump(mode="json"), delta)
    try:
        return validate_config(TrainConfig, data, origin=name, prefix=f"{name}.")
    except ConfigError as err:
        raise ValueError(str(err)) from None
