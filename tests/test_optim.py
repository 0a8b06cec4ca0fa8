"""The optimizer and the learning-rate schedule (csclip.train.optim): open_clip's per-step
cosine, and the authors' run reproduced step for step against torch's schedulers built
the way their code builds them (SPEC §6)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, SequentialLR

from csclip.config import load_config
from csclip.config.train import OptimConfig, TrainConfig
from csclip.model import create_bundle
from csclip.train.optim import build_optimizer, lr_at, warmup_steps_of


def test_lr_warms_up_then_decays_to_zero_every_step():
    optim = OptimConfig(lr=1.0, warmup_steps=4)
    assert [lr_at(s, optim, 12, 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(8, optim, 12, 3) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(12, optim, 12, 3) == pytest.approx(0.0)


def test_authors_run_stays_near_a_tenth_of_lr_throughout():
    # SPEC §6: the authors' warmup lasts 3 epochs of steps and starts at 0.1 x lr, but the
    # scheduler is stepped once per epoch, so in epoch e the lr is 0.1 + 0.9 e / (3 S):
    # with COCO's ~4,600 steps per epoch, 0.1000 .. 0.1003 x lr over 5 epochs (not the
    # 0.02 .. 0.10 x lr of a 50-step open_clip warmup evaluated per epoch).
    optim = OptimConfig(lr=1.0, schedule="authors_per_epoch")
    steps_per_epoch = 4600
    total = 5 * steps_per_epoch
    for epoch in range(5):
        for step in (epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch - 1):
            assert lr_at(step, optim, total, steps_per_epoch) == pytest.approx(
                0.1 + 0.9 * epoch / (3 * steps_per_epoch), abs=1e-12)
    assert 0.1 <= min(lr_at(s, optim, total, steps_per_epoch) for s in range(0, total, 97)) \
        <= max(lr_at(s, optim, total, steps_per_epoch) for s in range(0, total, 97)) < 0.1003


def _authors_scheduler(steps_per_epoch: int, epochs: int, lr: float):
    """torch's schedulers as the authors' utils/optimizer_factory.py builds them for
    configs/optimizer/adamw_ft.yaml (step_based: warmup_epochs 3, warmup_start_lr_ratio
    0.1, min_lr_ratio 0.01 with eta_min read from the already warmed-up lr)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=lr)
    warmup, total = 3 * steps_per_epoch, epochs * steps_per_epoch
    warm = LambdaLR(optimizer, lambda s: 0.1 + 0.9 * s / max(1, warmup) if s < warmup else 1.0)
    eta_min = optimizer.param_groups[0]["lr"] * 0.01
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total - warmup), eta_min=eta_min)
    return optimizer, SequentialLR(optimizer, [warm, cosine], milestones=[warmup])


@pytest.mark.parametrize("steps_per_epoch", [1, 2, 4])
def test_authors_curve_matches_their_torch_schedulers_stepped_per_step(steps_per_epoch):
    epochs, lr = 5, 5e-6
    optimizer, scheduler = _authors_scheduler(steps_per_epoch, epochs, lr)
    # Their curve stepped every step: our cosine with their warmup start, length and floor.
    optim = OptimConfig(lr=lr, warmup_epochs=3, warmup_start_ratio=0.1, min_lr_ratio=0.001)
    total = epochs * steps_per_epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about SequentialLR internals
        for step in range(total):
            assert lr_at(step, optim, total, steps_per_epoch) == pytest.approx(
                optimizer.param_groups[0]["lr"], rel=1e-9, abs=0)
            scheduler.step()


@pytest.mark.parametrize("steps_per_epoch", [1, 2, 4, 1000])
def test_authors_per_epoch_matches_their_torch_schedulers_stepped_per_epoch(steps_per_epoch):
    epochs, lr = 5, 5e-6
    optimizer, scheduler = _authors_scheduler(steps_per_epoch, epochs, lr)
    optim = OptimConfig(lr=lr, schedule="authors_per_epoch")
    total = epochs * steps_per_epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for epoch in range(epochs):
            expected = optimizer.param_groups[0]["lr"]
            for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
                assert lr_at(step, optim, total, steps_per_epoch) == pytest.approx(expected, rel=1e-9)
            scheduler.step()


def test_authors_schedule_values_fill_only_unset_fields():
    optim = OptimConfig(schedule="authors_per_epoch")
    assert (optim.warmup_epochs, optim.warmup_start_ratio, optim.min_lr_ratio) == (3.0, 0.1, 0.001)
    assert warmup_steps_of(optim, 10) == 30
    assert OptimConfig(schedule="authors_per_epoch", min_lr_ratio=0.01).min_lr_ratio == 0.01
    assert OptimConfig().warmup_start_ratio is None and warmup_steps_of(OptimConfig(), 10) == 50
    # Through --set on a partly given section (section defaults merged first).
    config = load_config(TrainConfig, None, ["optim.schedule=authors_per_epoch", "optim.lr=1e-5"])
    assert config.optim.warmup_epochs == 3.0 and config.optim.lr == 1e-5


def test_weight_decay_skips_gains_biases_and_logit_scale():
    model = create_bundle("csclip-tiny").model
    groups = build_optimizer(model, OptimConfig(weight_decay=0.3)).param_groups
    no_decay = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.0 and groups[1]["weight_decay"] == 0.3
    assert id(model.logit_scale) in no_decay
    assert id(model.visual.conv1.weight) not in no_decay


def test_decay_all_params_decays_every_parameter_as_the_authors_do():
    model = create_bundle("csclip-tiny").model
    groups = build_optimizer(model, OptimConfig(weight_decay=0.3, decay_all_params=True)).param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.3 for p in g["params"]}
    assert decayed == {id(p) for p in model.parameters() if p.requires_grad}
    assert id(model.logit_scale) in decayed
