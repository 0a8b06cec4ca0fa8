"""A non-neural scorer with known answers for the benchmark fixtures
(tests/fixtures/suites): an image is its solid color, a text is its first color word, and
their similarity is 1 when the two agree, 0 otherwise (a text without a color word scores
0 with every image, so two such texts tie)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

FIXTURES = Path(__file__).parent / "fixtures" / "suites"
COLORS = ("red", "green", "blue", "yellow")
RGB = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220),
       "yellow": (230, 230, 20)}


class ColorScorer:
    def __init__(self) -> None:
        self.encoded_images = 0

    def encode_texts(self, texts):
        rows = np.zeros((len(texts), len(COLORS) + 1))
        for row, text in enumerate(texts):
            words = [w.strip(".,").lower() for w in text.split()]
            first = next((w for w in words if w in COLORS), None)
            if first is None:
                rows[row, -1] = 1.0  # orthogonal to every image
            else:
                rows[row, COLORS.index(first)] = 1.0
        return rows

    def encode_images(self, images):
        self.encoded_images += len(images)
        rows = np.zeros((len(images), len(COLORS) + 1))
        for row, data in enumerate(images):
            pixel = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).reshape(-1, 3).mean(0)
            nearest = min(COLORS, key=lambda c: np.sum((pixel - np.array(RGB[c])) ** 2))
            rows[row, COLORS.index(nearest)] = 1.0
        return rows


class CaptionLengthScorer:
    """A non-neural scorer for known-answer tests: the similarity of an image with a text
    is an increasing (or, with prefer_short, decreasing) function of the text's length in
    characters, the same for every image."""

    def __init__(self, prefer_short: bool = False) -> None:
        self.sign = -1.0 if prefer_short else 1.0

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        # cos([1, x], [0, 1]) = x / sqrt(1 + x^2) is strictly increasing in x.
        lengths = np.array([len(t) for t in texts], dtype=np.float64).reshape(-1, 1)
        return np.hstack([np.ones_like(lengths), self.sign * lengths / 100.0])

    def encode_images(self, images: Sequence[bytes]) -> np.ndarray:
        return np.tile(np.array([[0.0, 1.0]]), (len(images), 1))
