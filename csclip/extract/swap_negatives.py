"""The authors' caption shuffles (their `swap_negatives`): four ARO TextShuffler word-order
perturbations per caption, made once at extraction with spaCy's part-of-speech tags, stored
in the units table's `meta` (csclip.units.SWAP_NEGATIVES_META) for training's swap rule."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from csclip.config.extract import SwapNegativesConfig
from csclip.errors import ConfigError
from csclip.units import SWAP_NEGATIVES_META, UnitsRecord

# Their four perturbations, in the order their script makes them
# (scripts/add_swap_negatives.py@16276c7, generate_swap_negatives_batch).
SWAP_TYPES = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj",
              "shuffle_within_trigrams", "shuffle_trigrams")
# Their batch path, which made their files, tests token.pos_ (TextShuffler's own methods,
# their fallback, test the Penn tags NN*/JJ* instead).
CONTENT_POS = frozenset({"NOUN", "ADJ", "PROPN"})
# Captions per nlp.pipe batch, theirs (generate_swap_negatives_batch's 1000): it sets the
# memory and speed of the parse, never the shuffles (each is seeded by its caption).
NLP_BATCH_SIZE = 1000


@dataclass(frozen=True)
class SwapNegative:
    """One perturbation of a caption that differs from it: which one, and its text."""

    swap_type: str
    negative: str


def load_pipeline(model: str) -> Any:
    """spaCy's pipeline `model` (e.g. en_core_web_sm), after checking that NLTK's Punkt
    tables, which the trigram shuffles tokenize with, are installed.
    Raises ConfigError naming the missing package or model and how to install it."""
    try:
        import spacy  # noqa: PLC0415  optional (csclip[shuffles]); only this stage loads it
    except ImportError as err:
        raise ConfigError("swap_negatives needs spaCy and NLTK: pip install 'csclip[shuffles]'"
                          ) from err
    word_tokenize("A check.")
    try:
        return spacy.load(model)
    except OSError as err:
        raise ConfigError(f"swap_negatives.spacy_model {model!r} is not installed: "
                          f"python -m spacy download {model}") from err


def word_tokenize(text: str) -> list[str]:
    """NLTK's word_tokenize, as TextShuffler's trigram shuffles split a caption (Punkt
    sentences, then Treebank words). Raises ConfigError when NLTK or Punkt is missing."""
    try:
        import nltk  # noqa: PLC0415  optional (csclip[shuffles]); only this stage loads it
    except ImportError as err:
        raise ConfigError("swap_negatives needs spaCy and NLTK: pip install 'csclip[shuffles]'"
                          ) from err
    try:
        return nltk.word_tokenize(text)
    except LookupError as err:
        # Theirs catches every exception, so without Punkt their files would silently lack
        # the two trigram shuffles; we refuse instead.
        raise ConfigError("swap_negatives needs NLTK's Punkt tables: "
                          "python -m nltk.downloader punkt_tab") from err


def caption_rng(seed: int, sample_id: str) -> random.Random:
    """A Random seeded from a stable hash of (seed, sample_id), so a caption's shuffles do
    not depend on its shard or worker. Theirs draw from the process's unseeded global
    `random` (the same Mersenne Twister and the same calls, in the same order)."""
    key = f"{seed}\x1f{sample_id}".encode()
    return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))


def _permute_where(tokens: Sequence[Any], keep: Sequence[bool], rng: random.Random) -> str | None:
    # Their methods 1-2: the tokens where `keep` holds, rng.sample'd among their positions
    # when there are at least two; words joined by single spaces.
    positions = [i for i, k in enumerate(keep) if k]
    if len(positions) <= 1:
        return None
    words = [t.text for t in tokens]
    for position, token in zip(positions, rng.sample([tokens[i] for i in positions],
                                                     len(positions)), strict=True):
        words[position] = token.text
    return " ".join(words)


def _trigrams(words: list[str]) -> list[list[str]]:
    return [words[i:i + 3] for i in range(0, len(words), 3)]


def shuffles_of(caption: str, doc: Iterable[Any], rng: random.Random) -> list[SwapNegative]:
    """The four perturbations of `caption` (a spaCy Doc of it in `doc`), those that differ
    from the caption, as their generate_swap_negatives_batch makes them: nouns, adjectives
    and proper nouns permuted among their positions; all the other tokens likewise; NLTK's
    words shuffled within consecutive trigrams; the trigrams shuffled. Note theirs compares
    the spaCy tokens joined by spaces with the caption, so "a dog." tokenized "a dog ."
    differs from it even when no word moved; we keep that."""
    tokens = list(doc)
    is_content = [t.pos_ in CONTENT_POS for t in tokens]
    texts = [_permute_where(tokens, is_content, rng),
             _permute_where(tokens, [not c for c in is_content], rng)]
    groups = _trigrams(word_tokenize(caption))
    for group in groups:
        rng.shuffle(group)
    texts.append(" ".join(" ".join(group) for group in groups))
    groups = _trigrams(word_tokenize(caption))
    rng.shuffle(groups)
    texts.append(" ".join(" ".join(group) for group in groups))
    return [SwapNegative(swap_type, text) for swap_type, text in zip(SWAP_TYPES, texts, strict=True)
            if text is not None and text != caption]


def with_swap_negatives(records: Sequence[UnitsRecord], config: SwapNegativesConfig,
                        nlp: Any, batch_size: int = NLP_BATCH_SIZE) -> list[UnitsRecord]:
    """`records` with their shuffles in meta[SWAP_NEGATIVES_META] (a JSON list of texts, as
    csclip.authors reads theirs). A record that carries some already (the authors' files)
    keeps them; one with none that differ from its caption gets no entry. nlp:
    load_pipeline(config.spacy_model)."""
    todo = [r for r in records if SWAP_NEGATIVES_META not in r.meta]
    docs = nlp.pipe([r.caption for r in todo], batch_size=batch_size)
    made = {}
    for record, doc in zip(todo, docs, strict=True):
        shuffles = shuffles_of(record.caption, doc, caption_rng(config.seed, record.sample_id))
        if shuffles:  # none (a one-word caption): no entry, as csclip.authors reads theirs
            made[record.sample_id] = replace(record, meta={
                **record.meta, SWAP_NEGATIVES_META: json.dumps([s.negative for s in shuffles])})
    return [made.get(r.sample_id, r) for r in records]
