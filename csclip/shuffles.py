"""Word-order shuffles of a caption (NegCLIP / ARO, Yuksekgonul et al. 2023): permute the
words at some positions, shuffle within trigrams, shuffle the trigrams. Training's caption
negatives (csclip.train.sampling) and ARO's order foils (csclip.eval.suites.aro) both use
them; each decides which words count as nouns and adjectives."""

from __future__ import annotations

import random


def permute_positions(tokens: list[str], positions: list[int], rng: random.Random) -> list[str]:
    """`tokens` with the words at `positions` permuted among themselves."""
    values = [tokens[i] for i in positions]
    rng.shuffle(values)
    out = list(tokens)
    for i, value in zip(positions, values, strict=True):
        out[i] = value
    return out


def trigrams(tokens: list[str]) -> list[list[str]]:
    """Consecutive groups of three words (the last may be shorter)."""
    return [tokens[i:i + 3] for i in range(0, len(tokens), 3)]


def shuffle_within_trigrams(tokens: list[str], rng: random.Random) -> list[str]:
    return [t for tri in trigrams(tokens) for t in rng.sample(tri, len(tri))]


def shuffle_trigrams(tokens: list[str], rng: random.Random) -> list[str]:
    groups = trigrams(tokens)
    rng.shuffle(groups)
    return [t for tri in groups for t in tri]
