"""Known-answer and parity tests of csclip.loss on hand-made tensors (single process)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from csclip.gather import gather_features
from csclip.loss import LossParts, clip_loss, csclip_loss, negclip_loss, unit_loss

# log(1 + e^-1): cross-entropy of logits [1, 0] with label 0.
CE_ONE_VS_ZERO = math.log(1 + math.exp(-1))


def _eye(n: int, d: int | None = None) -> torch.Tensor:
    return torch.eye(n, d or n)


def _normalised(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=generator), dim=-1)


def test_clip_loss_on_orthogonal_features_has_known_value():
    # logits = I: each row is [1, 0], both directions.
    loss = clip_loss(_eye(2), _eye(2), torch.tensor(1.0))
    assert loss.item() == pytest.approx(CE_ONE_VS_ZERO, abs=1e-7)


def test_negclip_loss_counts_every_caption_negative_as_a_column():
    # Negatives are the other image's caption: image i sees logits [1, 0, 0, 1] (label i),
    # CE = log(2e + 2) - 1 = log 2 + log(1 + e^-1); text→image is plain [1, 0].
    image = caption = _eye(2)
    caption_negative = _eye(2).flip(0)
    loss = negclip_loss(image, caption, caption_negative, torch.tensor(1.0))
    assert loss.item() == pytest.approx(CE_ONE_VS_ZERO + math.log(2) / 2, abs=1e-6)


def test_sample_without_caption_negative_gives_no_negative_column():
    # Sample 1 has no caption negative: its placeholder is its own caption (e2). Masked, the
    # columns are [c0, c1, n0] = [e1, e2, e2]: image 0 sees [1, 0, 0], image 1 [0, 1, 1].
    # Unmasked, image 1 would also score its placeholder, i.e. its own caption, as a
    # "negative" ([0, 1, 1, 1]). Both images and captions stay in the loss.
    image = caption = _eye(2)
    caption_negative = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    mask = torch.tensor([True, False])
    loss = negclip_loss(image, caption, caption_negative, torch.tensor(1.0), mask)
    image_to_text = (math.log(math.e + 2) + math.log(2 * math.e + 1)) / 2 - 1
    assert loss.item() == pytest.approx((image_to_text + CE_ONE_VS_ZERO) / 2, abs=1e-6)
    everyone = negclip_loss(image, caption, caption_negative, torch.tensor(1.0))
    assert everyone.item() > loss.item() + 0.05
    # The placeholder's features do not matter.
    other = caption_negative.clone()
    other[1] = torch.tensor([0.6, 0.8])
    assert negclip_loss(image, caption, other, torch.tensor(1.0), mask).item() == loss.item()


def test_csclip_full_part_masks_caption_negatives_like_negclip():
    image, caption, negative = (_normalised(4, 8, seed=s) for s in (0, 1, 2))
    units, foils = _normalised(2, 4, 8, seed=3), _normalised(2, 4, 8, seed=4)
    mask, negative_mask = torch.ones(4, dtype=torch.bool), torch.tensor([True, False, False, True])
    parts = csclip_loss(image, caption, negative, units, foils, mask, torch.tensor(20.0),
                        negative_mask=negative_mask)
    torch.testing.assert_close(parts.full, negclip_loss(image, caption, negative, torch.tensor(20.0),
                                                        negative_mask))


def test_unit_loss_uses_only_the_samples_own_foil():
    # D = 3; units e1, e2 match their images; both foils are e3 (orthogonal to images).
    # Image→text row: [1, 0] over units plus [0] for its own foil only -> log(e + 2) - 1.
    image = units = _eye(2, 3)
    foils = torch.tensor([[0.0, 0.0, 1.0]] * 2)
    loss = unit_loss(image, units[None], foils[None], torch.tensor([True, True]), torch.tensor(1.0))
    expected = (math.log(math.e + 2) - 1 + CE_ONE_VS_ZERO) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_masked_sample_is_neither_row_nor_negative():
    image, units, foils = _eye(2, 3), _eye(2, 3)[None], torch.tensor([[[0.0, 0.0, 1.0]] * 2])
    units = units.clone().requires_grad_(True)
    mask = torch.tensor([True, False])
    loss = unit_loss(image, units, foils, mask, torch.tensor(1.0))
    # One valid sample: image→text [1, 0] (own unit, own foil), text→image a single logit.
    assert loss.item() == pytest.approx(CE_ONE_VS_ZERO / 2, abs=1e-6)
    loss.backward()
    assert torch.all(units.grad[0, 1] == 0)
    # Changing the masked sample's placeholder text features changes nothing.
    other = units.detach().clone()
    other[0, 1] = _normalised(3, seed=1)
    assert unit_loss(image, other, foils, mask, torch.tensor(1.0)).item() == loss.item()


def test_unit_loss_is_mean_over_slots():
    image = _normalised(4, 8, seed=0)
    units, foils = _normalised(3, 4, 8, seed=1), _normalised(3, 4, 8, seed=2)
    mask, scale = torch.ones(4, dtype=torch.bool), torch.tensor(10.0)
    per_slot = [unit_loss(image, units[k:k + 1], foils[k:k + 1], mask, scale) for k in range(3)]
    assert unit_loss(image, units, foils, mask, scale).item() == pytest.approx(
        torch.stack(per_slot).mean().item(), abs=1e-6)


def test_all_masked_batch_gives_zero_unit_loss_and_backward_works():
    image = _normalised(3, 8, seed=0).requires_grad_(True)
    units = _normalised(2, 3, 8, seed=1).requires_grad_(True)
    foils = _normalised(2, 3, 8, seed=2)
    scale = torch.tensor(14.0, requires_grad=True)
    loss = unit_loss(image, units, foils, torch.zeros(3, dtype=torch.bool), scale)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.all(image.grad == 0) and torch.all(units.grad == 0) and scale.grad == 0


@pytest.mark.parametrize("batch", [1, 5, 16])
def test_clip_loss_equals_open_clip_clip_loss(batch):
    # Imported here: open_clip costs seconds, and tests/test_mutations.py runs this module's
    # pure tests in a fresh process.
    from open_clip.loss import ClipLoss

    image, text = _normalised(batch, 32, seed=batch), _normalised(batch, 32, seed=batch + 100)
    logit_scale = torch.tensor(math.log(1 / 0.07), requires_grad=True)
    ours_image, ours_text = image.clone().requires_grad_(True), text.clone().requires_grad_(True)
    ref_image, ref_text = image.clone().requires_grad_(True), text.clone().requires_grad_(True)
    ours = clip_loss(ours_image, ours_text, logit_scale.exp())
    reference = ClipLoss()(ref_image, ref_text, logit_scale.exp())
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    ours.backward()
    reference.backward()
    torch.testing.assert_close(ours_image.grad, ref_image.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(ours_text.grad, ref_text.grad, atol=1e-6, rtol=0)


def test_csclip_loss_combines_full_and_weighted_unit_loss():
    image, caption, negative = (_normalised(4, 8, seed=s) for s in (0, 1, 2))
    units, foils = _normalised(2, 4, 8, seed=3), _normalised(2, 4, 8, seed=4)
    mask, scale = torch.tensor([True, False, True, True]), torch.tensor(20.0)
    parts = csclip_loss(image, caption, negative, units, foils, mask, scale, unit_loss_weight=0.5)
    assert isinstance(parts, LossParts)
    torch.testing.assert_close(parts.full, negclip_loss(image, caption, negative, scale))
    torch.testing.assert_close(parts.unit, unit_loss(image, units, foils, mask, scale))
    torch.testing.assert_close(parts.total, parts.full + 0.5 * parts.unit)


def test_a_perfect_model_has_lower_loss_than_one_preferring_the_foil():
    image = _eye(3, 4)
    good_units, bad_units = _eye(3, 4), torch.tensor([[0.0, 0.0, 0.0, 1.0]] * 3)
    mask, scale = torch.ones(3, dtype=torch.bool), torch.tensor(10.0)
    good = unit_loss(image, good_units[None], bad_units[None], mask, scale)
    bad = unit_loss(image, bad_units[None], good_units[None], mask, scale)
    assert good.item() < 0.01 < bad.item()


def test_wrong_unit_shape_is_rejected_by_name():
    with pytest.raises(ValueError, match="units and foils"):
        unit_loss(_eye(2), _eye(2), _eye(2), torch.ones(2, dtype=torch.bool), torch.tensor(1.0))


def test_gather_is_identity_without_distributed():
    x = torch.randn(3, 4)
    assert gather_features(x) is x


def test_pure_modules_do_not_import_ray():
    code = "import sys, csclip.loss, csclip.train.sampling; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------
# Precision: every loss runs in fp32 with autocast off
# ---------------------------------------------------------------------------------------

def _loss_inputs(batch: int = 64, dim: int = 128, slots: int = 2, gap: float = 7e-4):
    # CLIP-like features: units and their foils nearly identical, as in a real model.
    image = _normalised(batch, dim, seed=1)
    caption = _normalised(batch, dim, seed=2)
    negative = F.normalize(caption + 0.05 * _normalised(batch, dim, seed=3), dim=-1)
    units = _normalised(slots, batch, dim, seed=4)
    foils = F.normalize(units + gap * _normalised(slots, batch, dim, seed=5), dim=-1)
    mask = torch.ones(batch, dtype=torch.bool)
    mask[::7] = False
    return image, caption, negative, units, foils, mask, torch.tensor(100.0)


@pytest.mark.parametrize("name", ["clip", "negclip", "unit", "csclip"])
def test_losses_ignore_the_callers_bf16_autocast(name):
    def run(autocast: bool):
        leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in _loss_inputs()]
        image, caption, negative, units, foils, mask, scale = leaves
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = {"clip": lambda: clip_loss(image, caption, scale),
                    "negclip": lambda: negclip_loss(image, caption, negative, scale),
                    "unit": lambda: unit_loss(image, units, foils, mask, scale),
                    "csclip": lambda: csclip_loss(image, caption, negative, units, foils, mask,
                                                  scale).total}[name]()
        loss.backward()
        return loss.detach(), [t.grad for t in leaves if t.grad is not None]

    reference, reference_grads = run(autocast=False)
    loss, grads = run(autocast=True)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    for grad, expected in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-9)


def test_bf16_features_are_scored_in_fp32():
    # Features that arrive in bf16 (a bf16 model's output) are upcast before the logits.
    image, caption, *_ , scale = _loss_inputs()
    low = clip_loss(image.bfloat16(), caption.bfloat16(), scale)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, clip_loss(image.bfloat16().float(), caption.bfloat16().float(), scale))


def test_objectives_name_their_columns_and_compute_their_loss():
    from csclip.config.loss import LossConfig
    from csclip.loss import objective_for

    assert objective_for(LossConfig(method="clip"), 3).columns == ("caption",)
    assert objective_for(LossConfig(method="negclip"), 3).columns == ("caption", "caption_negative")
    objective = objective_for(LossConfig(method="csclip", unit_loss_weight=0.25), 2)
    assert objective.columns == ("caption", "caption_negative", "unit_0", "unit_1", "foil_0", "foil_1")
    assert objective.mask_columns == ("unit_mask", "negative_mask")
    assert objective_for(LossConfig(method="negclip"), 3).mask_columns == ("negative_mask",)
    assert objective_for(LossConfig(method="clip"), 3).mask_columns == ()
    image, caption, negative, units, foils, mask, scale = _loss_inputs(slots=2)
    negative_mask = ~mask.roll(1)
    texts = {"caption": caption, "caption_negative": negative, "unit_0": units[0],
             "unit_1": units[1], "foil_0": foils[0], "foil_1": foils[1]}
    parts = objective.loss(image, texts, {"unit_mask": mask, "negative_mask": negative_mask}, scale)
    torch.testing.assert_close(parts.total, csclip_loss(image, caption, negative, units, foils,
                                                        mask, scale, unit_loss_weight=0.25,
                                                        negative_mask=negative_mask).total)
    assert objective.gather and not objective_for(LossConfig(gather=False), 2).gather


def test_masked_losses_match_the_indexed_reference_and_never_sync():
    # The masked formulation (no boolean indexing, no host sync) equals the loss on the
    # valid samples alone, and an all-masked batch gives 0 with finite gradients.
    image, caption, negative, units, foils, mask, scale = _loss_inputs(batch=12, dim=16)
    reference = unit_loss(image[mask], units[:, mask], foils[:, mask],
                          torch.ones(int(mask.sum()), dtype=torch.bool), scale)
    torch.testing.assert_close(unit_loss(image, units, foils, mask, scale), reference,
                               rtol=1e-6, atol=0)
    keep = torch.ones(12, dtype=torch.bool)
    keep[[2, 5]] = False
    dropped = negclip_loss(image, caption, negative, scale, keep)
    columns = torch.cat([caption, negative[keep]])
    logits = scale * image @ columns.T
    labels = torch.arange(12)
    expected = (F.cross_entropy(logits, labels) + F.cross_entropy(logits[:, :12].T, labels)) / 2
    torch.testing.assert_close(dropped, expected, rtol=1e-6, atol=0)
    leaf = units.clone().requires_grad_(True)
    nothing = unit_loss(image, leaf, foils, torch.zeros(12, dtype=torch.bool), scale)
    nothing.backward()
    assert nothing.item() == 0.0 and torch.isfinite(leaf.grad).all()
