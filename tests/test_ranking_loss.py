"""The authors' ranking loss L_rank (kargibora/CS-CLIP alignment/losses.py@16276c7,
`_compute_ranking_loss`), which their swap-fraction runs added with weight 0.2:

    L_rank = 1/B Σ_i m_i · 1/N Σ_k max(0, δ + s(I_i, u_k,i) - s(I_i, c_i)),  δ = 0.1,

checked on values worked out by hand, and the `--grid paper` swap rows that carry it.
Pure torch, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from csclip.ablation import grid as grids
from csclip.config.loss import LossConfig
from csclip.loss import csclip_loss, objective_for, ranking_loss
from csclip.train.step import StepMetrics

REPO_ROOT = Path(__file__).resolve().parents[1]


def _example(requires_grad: bool = False):
    """B = 3 samples, N = 2 unit slots, D = 2, every vector of unit length, so each score
    s(I, t) = I · t is read off by hand:

    sample 0: I = (1, 0),  c = (0.8, 0.6) -> s(I, c) = 0.8
              u_1 = (0.6, 0.8) -> 0.6: max(0, 0.1 + 0.6 - 0.8) = max(0, -0.1) = 0
              u_2 = (1, 0)     -> 1.0: max(0, 0.1 + 1.0 - 0.8) = 0.3
              mean over the 2 slots: (0 + 0.3) / 2 = 0.15
    sample 1: I = (0, 1),  c = (0.6, 0.8) -> 0.8
              u_1 = (0.8, 0.6) -> 0.6: max(0, -0.1) = 0
              u_2 = (0.6, 0.8) -> 0.8: max(0, 0.1 + 0.8 - 0.8) = 0.1
              mean: (0 + 0.1) / 2 = 0.05
    sample 2: no units (mask False): its hinges (here 1.1 each) are left out, but it
              still counts in B, as in the authors' code (they divide by B).
    L_rank = (0.15 + 0.05 + 0) / 3 = 0.2 / 3
    """
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], requires_grad=requires_grad)
    caption = torch.tensor([[0.8, 0.6], [0.6, 0.8], [0.0, 1.0]], requires_grad=requires_grad)
    units = torch.tensor([[[0.6, 0.8], [0.8, 0.6], [1.0, 0.0]],       # slot 1, (B, D)
                          [[1.0, 0.0], [0.6, 0.8], [1.0, 0.0]]],      # slot 2
                         requires_grad=requires_grad)
    mask = torch.tensor([True, True, False])
    return image, caption, units, mask


def test_ranking_loss_equals_the_hand_computed_value():
    image, caption, units, mask = _example()
    assert ranking_loss(image, caption, units, mask, margin=0.1).item() == pytest.approx(
        0.2 / 3, abs=1e-7)
    # Every unit at least δ below its caption: no violation, L_rank = 0.
    far = torch.tensor([[0.0, -1.0], [-1.0, 0.0], [0.0, -1.0]]).expand(2, 3, 2)
    assert ranking_loss(image, caption, far, mask).item() == 0.0
    # With margin 0 only sample 0's slot 2 violates (1.0 > 0.8): (0.2 / 2) / 3.
    assert ranking_loss(image, caption, units, mask, margin=0.0).item() == pytest.approx(
        0.1 / 3, abs=1e-7)


def test_ranking_loss_gradient_by_hand():
    # Only active hinges pass a gradient: ∂/∂I_i of 1/(B·N)·(δ + I_i·u - I_i·c) is
    # (u - c) / 6. Sample 0, slot 2: ((1, 0) - (0.8, 0.6)) / 6 = (0.2, -0.6) / 6;
    # sample 1, slot 2: ((0.6, 0.8) - (0.6, 0.8)) / 6 = 0; sample 2 is masked: 0.
    # ∂/∂c_i = -I_i / 6 for each active hinge: c_0 (-1/6, 0), c_1 (0, -1/6), c_2 0.
    image, caption, units, mask = _example(requires_grad=True)
    ranking_loss(image, caption, units, mask).backward()
    expected_image = torch.tensor([[0.2 / 6, -0.6 / 6], [0.0, 0.0], [0.0, 0.0]])
    assert torch.allclose(image.grad, expected_image, atol=1e-7, rtol=0), image.grad
    expected_caption = torch.tensor([[-1 / 6, 0.0], [0.0, -1 / 6], [0.0, 0.0]])
    assert torch.allclose(caption.grad, expected_caption, atol=1e-7, rtol=0), caption.grad


def _csclip_total(weight: float, image, caption, units, mask):
    negative = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.6, 0.8]])
    foils = torch.flip(units.detach(), dims=(1,))
    return csclip_loss(image, caption, negative, units, foils, mask, torch.tensor(10.0),
                       unit_loss_weight=0.5, ranking_loss_weight=weight)


def test_ranking_term_is_absent_at_weight_0_and_adds_its_gradient_when_on():
    image, caption, units, mask = _example(requires_grad=True)
    off = _csclip_total(0.0, image, caption, units, mask)
    assert off.ranking is None
    # Off, the total is exactly L_full + λ·L_unit: no run without the loss changes.
    assert torch.equal(off.total, off.full + 0.5 * off.unit)
    (grad_off,) = torch.autograd.grad(off.total, image)

    on = _csclip_total(0.2, image, caption, units, mask)
    assert on.ranking.item() == pytest.approx(0.2 / 3, abs=1e-7)
    assert torch.equal(on.full, off.full) and torch.equal(on.unit, off.unit)
    assert on.total.item() == pytest.approx(off.total.item() + 0.2 * 0.2 / 3, abs=1e-6)
    (grad_on,) = torch.autograd.grad(on.total, image)
    # The gradient moves by λ_rank times the hand-computed one above.
    expected = torch.tensor([[0.2 / 6, -0.6 / 6], [0.0, 0.0], [0.0, 0.0]]) * 0.2
    assert not torch.equal(grad_on, grad_off)
    assert torch.allclose(grad_on - grad_off, expected, atol=1e-6, rtol=0), grad_on - grad_off


def test_the_config_field_reaches_the_objective_and_the_step_metrics():
    image, caption, units, mask = _example()
    texts = {"caption": caption, "caption_negative": caption.flip(0),
             "unit_0": units[0], "unit_1": units[1], "foil_0": units[1], "foil_1": units[0]}
    masks = {"unit_mask": mask, "negative_mask": torch.ones(3, dtype=torch.bool)}
    scale = torch.tensor(10.0)
    default = objective_for(LossConfig(), 2).loss(image, texts, masks, scale)
    assert LossConfig().ranking_loss_weight == 0 and default.ranking is None
    on = objective_for(LossConfig(ranking_loss_weight=0.2), 2).loss(image, texts, masks, scale)
    assert on.ranking.item() == pytest.approx(0.2 / 3, abs=1e-7)
    assert on.total.item() == pytest.approx(default.total.item() + 0.2 * 0.2 / 3, abs=1e-6)

    metrics = StepMetrics()
    metrics.add(1, default, torch.tensor(0.0), 1e-3)
    metrics.add(2, on, torch.tensor(0.0), 1e-3)
    first, second = metrics.take()
    assert "loss_ranking" not in first
    assert second["loss_ranking"] == pytest.approx(0.2 / 3, abs=1e-7)
    # The term ranks a caption above its units: a method without units refuses it.
    with pytest.raises(ValueError, match="has no units"):
        LossConfig(method="negclip", ranking_loss_weight=0.2)


def test_paper_grid_swap_rows_carry_the_authors_ranking_weight():
    from csclip.config import load_config
    from csclip.config.train import TrainConfig

    base = load_config(TrainConfig, REPO_ROOT / "configs" / "coco.yaml", [])
    assert base.loss.ranking_loss_weight == 0
    grid = grids.expand_paper_grid(base)
    swap = [r for r in grid.rows if r.axis == "swapfrac"]
    # The paper's swap rows {0, 0.5, 1}: 0 and 0.5 are the authors' 27-Dec runs with
    # LAMBDA_RANK 0.2 ("lc0.5_lr0.2" in their names), 1 is their base run, without it.
    assert [(r.label, r.is_base, r.unavailable) for r in swap] == [
        ("swap 0 rank 0.2", False, None), ("swap 0.5 rank 0.2", False, None),
        ("swap 1", True, None)]
    for row, swap_prob, weight in zip(swap, (0.0, 0.5, 1.0), (0.2, 0.2, 0.0), strict=True):
        config = grids.check_setting(base, row.setting)
        assert config.sampling.swap_prob == swap_prob
        assert config.loss.ranking_loss_weight == weight
        assert config.loss.ranking_margin == 0.1
    # No other row of theirs trained with it.
    others = [grids.check_setting(base, s) for s in grid.settings
              if not s.key.startswith("swapfrac")]
    assert all(c.loss.ranking_loss_weight == 0 for c in others)
