"""A training run's identity: which config fields say what is trained (and so name the
run, its storage and its resume), and which only say how it runs."""

from __future__ import annotations

import hashlib
import json

from csclip.config.train import TrainConfig
from csclip.model import effective_quick_gelu

# A run's identity: the fields that say what is trained. The run name is
# "<loss.method>-<12 hex digits of their hash>", so rerunning a config resumes its run and
# reuses its checkpoints; a field added here renames every earlier run (and loses their
# cache and resume): tests/test_run_identity.py pins a few names on purpose. A path names
# a field or a whole section (data.world: every field of the world, so a field added to
# WorldConfig renames runs too, and the pinned names say so).
IDENTITY_FIELDS: tuple[str, ...] = (
    "model.name", "model.pretrained", "model.quick_gelu", "model.image_size",
    "data.world", "data.units_uri", "data.split", "data.batch_size", "data.shuffle_buffer",
    "sampling.num_unit_slots", "sampling.relation_prob", "sampling.swap_prob",
    "sampling.inplace_prob", "sampling.relation_negative_prob",
    "sampling.entity_context_prob", "sampling.use_negation", "sampling.relation_foil_weights",
    "loss.method", "loss.unit_loss_weight", "loss.gather", "loss.image_foil_weight",
    "optim.lr", "optim.weight_decay", "optim.decay_all_params", "optim.betas", "optim.eps",
    "optim.warmup_steps", "optim.warmup_epochs", "optim.warmup_start_ratio",
    "optim.min_lr_ratio", "optim.epochs", "optim.max_steps", "optim.grad_clip",
    "optim.schedule",
    "run.num_workers", "run.use_gpu", "run.precision", "run.seed",
)
# Identity fields added after runs were named: part of the hash only when not at their
# default, so the runs named before them keep their names (and resume).
IDENTITY_FIELDS_WHEN_SET: tuple[str, ...] = ("model.lock", "data.augment", "data.batch_scope",
                                              "data.shards", "data.shard_buffer",
                                              "data.image_root",
                                              "run.resume_from",
                                              "loss.ranking_loss_weight", "loss.ranking_margin",
                                              "optim.logit_scale_max", "data.val_ratio")
# How a run runs, not what it trains: never in its name (a run restarted with compilation
# or accumulation on, or moved to other storage, resumes the same run). Every TrainConfig
# field is in exactly one of these three lists (tests/test_run_identity.py).
HOW_IT_RUNS_FIELDS: tuple[str, ...] = (
    "model.grad_checkpointing",
    "data.prefetch_batches", "data.pin_memory",
    "optim.accum_freq", "optim.fused",
    "run.name", "run.storage_path", "run.checkpoint_every", "run.num_to_keep",
    "run.cpus_per_worker", "run.torch_threads", "run.compile", "run.trim_text",
    "run.locked_image_cache_mb", "run.data_loop_period_s", "run.channels_last",
    "run.log_every", "run.max_failures", "run.worker_resources", "run.eval_every",
    "run.eval_max_images", "run.best_metric",
    "tracking",
)


def run_name(config: TrainConfig) -> str:
    """`run.name`, or "<method>-<12 hex digits of the hash of its identity>" (run_identity)."""
    return config.run.name or run_identity(config)


def run_identity(config: TrainConfig) -> str:
    """What a run trains, whatever its name: "<loss.method>-<12 hex digits>" of the JSON of
    its IDENTITY_FIELDS (and IDENTITY_FIELDS_WHEN_SET away from their defaults), nested as
    in the config."""
    data, default = config.model_dump(mode="json"), type(config)().model_dump(mode="json")
    if data["model"]["quick_gelu"] is None:  # unset: named by what the model is built with
        data["model"]["quick_gelu"] = effective_quick_gelu(config.model)
    identity: dict = {}
    for path in IDENTITY_FIELDS + IDENTITY_FIELDS_WHEN_SET:
        *sections, key = path.split(".")
        source, fallback, target = data, default, identity
        for section in sections:
            source, fallback = source[section], fallback[section]
            target = target.setdefault(section, {})
        if path in IDENTITY_FIELDS or source[key] != fallback[key]:
            target[key] = source[key]
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return f"{config.loss.method}-{digest}"
