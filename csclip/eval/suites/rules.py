"""Scoring rules shared by the compositional suites: strict comparisons (a tie is a
failure, as in SugarCrepe's and Winoground's official code) and Winoground's text /
image / group scores."""

from __future__ import annotations

import numpy as np


def winoground_metrics(
    image_a_caption_a: np.ndarray,
    image_a_caption_b: np.ndarray,
    image_b_caption_a: np.ndarray,
    image_b_caption_b: np.ndarray,
) -> dict[str, float]:
    """Winoground's text / image / group scores in percent, from s(I_x, C_y) per pair.

    comp_i2t (text score): each image scores its own caption above the other caption.
    comp_t2i (image score): each caption scores its own image above the other image.
    comp_group: both hold. Strict: a tie is a failure.
    """
    text_ok = (image_a_caption_a > image_a_caption_b) & (image_b_caption_b > image_b_caption_a)
    image_ok = (image_a_caption_a > image_b_caption_a) & (image_b_caption_b > image_a_caption_b)
    if len(text_ok) == 0:
        return {"comp_num_pairs": 0.0}
    return {
        "comp_i2t": 100.0 * float(np.mean(text_ok)),
        "comp_t2i": 100.0 * float(np.mean(image_ok)),
        "comp_group": 100.0 * float(np.mean(text_ok & image_ok)),
        "comp_num_pairs": float(len(text_ok)),
    }


def strict_accuracy(positive: np.ndarray, negative: np.ndarray) -> float:
    """100 * mean[s(positive) > s(negative)]: a tie counts as wrong (as in SugarCrepe's
    official script)."""
    return 100.0 * float(np.mean(np.asarray(positive) > np.asarray(negative)))
