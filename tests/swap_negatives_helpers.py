"""The stand-ins for en_core_web_sm and NLTK's Punkt tables that the swap_negatives tests
(and the script that recorded tests/fixtures/swap_negatives.json from the authors' code)
run on: neither can be downloaded here. Both runs use these same two, so the comparison
is of the shuffling code, not of the taggers."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "swap_negatives.json"
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


def load_fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def tagged_pipeline(pos_words: dict[str, list[str]]):
    """spacy.blank("en") (the English tokenizer of en_core_web_sm) with an attribute_ruler
    setting token.pos_ from a word table {"NOUN": [...], "ADJ": [...], "PROPN": [...]}
    matched lowercase; every other token keeps an empty pos_ (not a noun or adjective)."""
    import spacy  # noqa: PLC0415  optional extra (csclip[shuffles]); the tests skip without it

    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("attribute_ruler")
    for pos, words in pos_words.items():
        ruler.add([[{"LOWER": {"IN": sorted(words)}}]], {"POS": pos})
    return nlp


def untrained_punkt(root: Path) -> Path:
    """An NLTK data folder whose English Punkt tables are empty (no abbreviations, no
    collocations): sentences split at every '.', '?' or '!' followed by a space."""
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True, exist_ok=True)
    for name in PUNKT_FILES:
        (folder / name).write_text("")
    return root
