"""Caption shuffles as the authors had them: a units record's precomputed shuffles (their
`swap_negatives`) are the caption negatives of the swap rule, drawn as their sampler draws
them (utils/sampler.py@98b40c0); records without them get ours. Read from their files,
kept through every training path (streamed, cached, prepared), never the world's scenes."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pyarrow as pa
import pytest
from test_sampling import horse_record

from csclip.authors import read_authors_units
from csclip.config.train import SamplingConfig
from csclip.config.world import WorldConfig
from csclip.model import create_bundle, spec_of
from csclip.train.sampling import NegativeKind, draw_caption_negative, sample_rng
from csclip.train.stream import (
    decode_batch,
    image_shape,
    prepare_batch,
    preprocess_key,
    sample_batch,
    text_rows,
)
from csclip.units import SWAP_NEGATIVES_META, records_to_table, stored_shuffles
from csclip.world import world_record

SHUFFLES = ["a horse is riding a brown man next to a red car.",
            "a man is riding a red horse next to a brown car."]


def _with_shuffles(record, shuffles):
    return dataclasses.replace(record, meta={**record.meta,
                                             SWAP_NEGATIVES_META: json.dumps(shuffles)})


def test_their_swap_negatives_are_read_as_their_sampler_uses_them(tmp_path):
    entry = {"sample_id": "1", "original_caption": "a man rides a horse", "entities": ["man"],
             "negative_entities": {}, "relations": [], "image_path": "train2014/1.jpg",
             "swap_negatives": [{"negative": " a horse rides a man ", "change_type": "swap"},
                                {"negative": ""}, "a bare string", {"text": "no negative key"}]}
    path = tmp_path / "units.json"
    path.write_text(json.dumps([entry, {**entry, "sample_id": "2", "swap_negatives": []},
                                {**entry, "sample_id": "3", "swap_negatives": "not a list"}]))
    result = read_authors_units(path)
    by_id = {record.sample_id: record for record in result.records}
    # Only a dict with a non-empty "negative" is usable; the others stay as failed draws.
    assert stored_shuffles(by_id["1"]) == ["a horse rides a man", "", "", ""]
    assert stored_shuffles(by_id["2"]) == []
    assert "3" not in by_id and "'swap_negatives' must be list" in str(result.rejections)


def test_stored_shuffles_are_the_swap_rule_and_an_unusable_draw_falls_through():
    config = SamplingConfig(swap_prob=1.0, inplace_prob=1.0)
    record = _with_shuffles(horse_record(), SHUFFLES)
    drawn = Counter(draw_caption_negative(record, config, sample_rng(0, f"s{i}", 0)).text
                    for i in range(400))
    assert set(drawn) == set(SHUFFLES) and min(drawn.values()) > 150  # a uniform choice
    # Half the entries unusable: half the draws fall through to the in-place rule, as in
    # their sampler (never to a shuffle of ours).
    half = _with_shuffles(horse_record(), [SHUFFLES[0], ""])
    kinds = Counter(draw_caption_negative(half, config, sample_rng(0, f"s{i}", 0)).kind
                    for i in range(400))
    assert set(kinds) == {NegativeKind.SHUFFLE, NegativeKind.INPLACE}
    assert 150 < kinds[NegativeKind.SHUFFLE] < 250
    # Without stored shuffles: ours, drawn from the caption's words.
    ours = draw_caption_negative(horse_record(), config, sample_rng(0, "s0", 0))
    assert ours.kind == NegativeKind.SHUFFLE and ours.text not in SHUFFLES


def test_every_training_path_carries_the_shuffles_and_nothing_else_of_meta():
    world = WorldConfig(image_size=32)
    records = [world_record(world, "train", i) for i in range(3)]
    assert all("scene" in r.meta for r in records)
    records[1] = _with_shuffles(records[1], [SHUFFLES[0]])
    table = records_to_table(records)
    kept = text_rows(table).column("meta").to_pylist()
    assert kept == [[], [(SWAP_NEGATIVES_META, json.dumps([SHUFFLES[0]]))], []]  # no scenes

    bundle = create_bundle("csclip-tiny", image_size=32)
    spec = spec_of(bundle.model, "csclip-tiny")
    sampling = SamplingConfig(swap_prob=1.0).model_dump()
    common = {"sampling": sampling, "model_name": "csclip-tiny", "seed": 0, "epoch": 0}
    preprocess = preprocess_key(spec.preprocess_cfg)
    expected = bundle.tokenizer([SHUFFLES[0]])[0].numpy()
    streamed = prepare_batch(table, preprocess=preprocess, **common)
    cached = sample_batch(decode_batch(table, preprocess=preprocess, model_name="csclip-tiny"),
                          image_shape=image_shape(spec.preprocess_cfg), **common)
    for columns in (streamed, cached):
        assert (columns["caption_negative"][1] == expected).all()
        assert not (columns["caption_negative"][0] == expected).all()


@pytest.mark.parametrize("meta", [None, []])
def test_tables_without_meta_or_shuffles_read_as_before(meta):
    table = records_to_table([horse_record()])
    if meta is None:
        table = table.drop_columns(["meta"])
    rows = text_rows(table)
    assert rows.column_names[:6] == ["sample_id", "image_id", "caption", "split", "entities",
                                     "relations"]
    assert ("meta" in rows.column_names) == (meta is not None)
    assert isinstance(rows, pa.Table)
