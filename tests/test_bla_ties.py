"""BLA ties fall as the official scorer leaves them: csclip's per-sentence credit equals the
official rank_captions + get_accuracy on tie probes (tests/fixtures/official_outputs/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import SuiteData, TextChoice
from csclip.eval.suites.probes import bla_sentence_credit

PROBES = json.loads((Path(__file__).parent / "fixtures" / "official_outputs" / "bla_ties.json")
                    .read_text())["probes"]
TEXTS = ("True1", "True2", "False1", "False2")


def _features(cosines: list[float]) -> FeatureTables:
    # Image e0; sentence i at cosine c_i: c_i e0 + sqrt(1 - c_i^2) e_(i+1), as the probes'.
    text = np.zeros((len(cosines), 8), dtype=np.float32)
    for i, c in enumerate(cosines):
        text[i, 0], text[i, 1 + i] = c, np.sqrt(1 - c * c)
    image = np.zeros((1, 8), dtype=np.float32)
    image[0, 0] = 1.0
    return FeatureTables({t: i for i, t in enumerate(TEXTS)}, text, {"img": 0}, image)


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: str(p["cosine"]))
def test_credit_equals_the_official_scorer_on_ties(probe):
    data = SuiteData("bla", scorer=bla_sentence_credit)
    data.text_choices.append(TextChoice("active_passive", "img", TEXTS, (0, 1)))
    scores = bla_sentence_credit(_features(probe["cosine"]), data)
    assert scores["active_passive"].i2t == pytest.approx(100.0 * probe["accuracy"], abs=1e-9)


def test_the_probes_hold_a_tie_that_ranks_a_false_sentence_first():
    all_zero = next(p for p in PROBES if all(c <= 0 for c in p["cosine"]))
    assert all_zero["rank"][2] == 1 and all_zero["accuracy"] == 0.0
