"""The swap_negatives extraction stage makes the authors' caption shuffles: the same four
TextShuffler perturbations, character for character, as their own code on the same captions.

tests/fixtures/swap_negatives.json is the OUTPUT of the authors' generate_swap_negatives_batch
(kargibora/CS-CLIP@16276c7 scripts/add_swap_negatives.py, with TextShuffler from
utils/perturbations.py), run once by a throwaway script on 35 SugarCrepe COCO captions
(/work/shared/data/sugarcrepe) and two of ours, one caption per call after
random.seed(<the seed our caption_rng uses>). en_core_web_sm and NLTK's Punkt tables cannot
be downloaded here, so BOTH that run and these tests use stand-ins
(tests/swap_negatives_helpers.py): spacy.blank("en") with an attribute_ruler setting POS
from the word table stored in the fixture, and empty Punkt tables. The comparison is of the
shuffling code on the same tags and tokens; with the real model only the tags differ.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("spacy")
pytest.importorskip("nltk")

import nltk  # noqa: E402  after the skips: both come with the csclip[shuffles] extra
from swap_negatives_helpers import load_fixture, tagged_pipeline, untrained_punkt  # noqa: E402
from test_sampling import horse_record  # noqa: E402

from csclip.config.extract import SwapNegativesConfig  # noqa: E402
from csclip.errors import ConfigError  # noqa: E402
from csclip.extract.swap_negatives import (  # noqa: E402
    caption_rng,
    load_pipeline,
    shuffles_of,
    with_swap_negatives,
)
from csclip.units import SWAP_NEGATIVES_META, UnitsRecord, stored_shuffles  # noqa: E402

FIXTURE = load_fixture()


def _fresh_punkt() -> None:
    # NLTK keeps the Punkt tables it loaded (an lru_cache): forget them around each test.
    nltk.tokenize._get_punkt_tokenizer.cache_clear()


@pytest.fixture
def punkt(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", [str(untrained_punkt(tmp_path / "nltk_data"))])
    _fresh_punkt()
    yield
    _fresh_punkt()


@pytest.fixture(scope="module")
def nlp():
    return tagged_pipeline(FIXTURE["pos"])


def _record(case: dict) -> UnitsRecord:
    return UnitsRecord(case["sample_id"], case["sample_id"], case["caption"], "train", (), ())


def test_shuffles_equal_the_authors_code_on_the_same_captions(punkt, nlp):
    assert len(FIXTURE["cases"]) >= 30
    for case in FIXTURE["cases"]:
        made = shuffles_of(case["caption"], nlp(case["caption"]),
                           caption_rng(FIXTURE["seed"], case["sample_id"]))
        assert [{"swap_type": s.swap_type, "negative": s.negative} for s in made] == \
            case["swap_negatives"], case["caption"]


def test_stage_writes_them_into_the_units_meta_for_the_sampler(punkt, nlp):
    config = SwapNegativesConfig(enabled=True, seed=FIXTURE["seed"])
    records = with_swap_negatives([_record(c) for c in FIXTURE["cases"]], config, nlp, batch_size=7)
    for record, case in zip(records, FIXTURE["cases"], strict=True):
        assert stored_shuffles(record) == [n["negative"] for n in case["swap_negatives"]]


def test_records_that_carry_the_authors_swap_negatives_keep_them(punkt, nlp):
    theirs = horse_record("theirs")
    theirs = UnitsRecord(**{**theirs.__dict__, "meta": {SWAP_NEGATIVES_META: json.dumps(["x y"])}})
    ours, kept = with_swap_negatives([horse_record("ours"), theirs], SwapNegativesConfig(), nlp)
    assert stored_shuffles(kept) == ["x y"]
    assert len(stored_shuffles(ours)) == 4


def test_shuffles_are_seeded_by_seed_and_sample_not_by_batch(punkt, nlp):
    records = [_record(c) for c in FIXTURE["cases"]]
    one = with_swap_negatives(records, SwapNegativesConfig(), nlp, batch_size=1)
    reversed_ = with_swap_negatives(records[::-1], SwapNegativesConfig(), nlp, batch_size=1000)
    assert [r.meta for r in one] == [r.meta for r in reversed_[::-1]]
    other_seed = with_swap_negatives(records, SwapNegativesConfig(seed=1), nlp)
    assert [r.meta for r in one] != [r.meta for r in other_seed]


def test_a_missing_spacy_model_is_a_config_error_naming_the_download(punkt):
    with pytest.raises(ConfigError, match="python -m spacy download no_such_model"):
        load_pipeline("no_such_model")


def test_missing_punkt_tables_are_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    _fresh_punkt()
    with pytest.raises(ConfigError, match="nltk.downloader punkt_tab"):
        load_pipeline("en_core_web_sm")


def test_an_extraction_with_the_stage_stores_the_shuffles_the_sampler_draws(
        tmp_path, punkt, ray_session):
    """The stage inside a real extraction (world captions, gold units): every record with
    two or more nouns and adjectives carries its shuffles in the units table, as the
    sampler reads them (stored_shuffles)."""
    import pyarrow.parquet as pq  # noqa: PLC0415  as the module's other imports, after the skips

    from csclip.config import load_config  # noqa: PLC0415
    from csclip.config.extract import ExtractConfig  # noqa: PLC0415
    from csclip.config.world import PALETTE, SHAPES, SIZES  # noqa: PLC0415
    from csclip.extract.pipeline import run_extraction  # noqa: PLC0415
    from csclip.units import table_to_records  # noqa: PLC0415

    model = tmp_path / "tagger"
    tagged_pipeline({"NOUN": list(SHAPES), "ADJ": [*PALETTE, *SIZES]}).to_disk(model)
    config = load_config(ExtractConfig, None, [
        f"output.uri={tmp_path / 'units'}", "tracking.enabled=false",
        "input.world.num_train=6", "input.world.num_val=0", "input.world.num_test=0",
        "swap_negatives.enabled=true", f"swap_negatives.spacy_model={model}"])
    summary = run_extraction(config)
    assert summary.read == 6 and summary.with_units == 6
    records = table_to_records(pq.read_table(tmp_path / "units" / "units"))
    stored = {r.sample_id: stored_shuffles(r) for r in records}
    assert all(stored.values()), stored
    assert all(s != r.caption for r in records for s in stored[r.sample_id])
