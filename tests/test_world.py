"""The synthetic world: the scene is the truth, the generator is deterministic, bad
configs fail by name."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.config import validate_config
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.units import ChangeType, UnitsRecord, read_units, validate_record
from csclip.world import (
    PALETTE,
    Scene,
    SceneObject,
    WorldLanguageError,
    format_summary,
    iter_world,
    read_world_config,
    read_world_split,
    scene_from_record,
    summarize,
    world_record,
    write_world,
)

TINY = WorldConfig(seed=3, image_size=32, num_train=6, num_val=3, num_test=2)
SPLIT = st.sampled_from(["train", "val", "test"])


def _scene() -> Scene:
    # A hand-made scene, so oracle answers can be worked out by hand:
    #   row 0: large red circle (col 0)            small blue square (col 2)
    #   row 2:                     small red square (col 1)
    objects = (SceneObject("circle", "red", "large", row=0, col=0),
               SceneObject("square", "blue", "small", row=0, col=2),
               SceneObject("square", "red", "small", row=2, col=1))
    return Scene(objects, grid_size=3, image_size=64)


@pytest.mark.parametrize(("text", "expected"), [
    ("red circle", True),
    ("large red circle", True),
    ("a small red circle", False),
    ("circle", True),
    ("red square", True),
    ("large square", False),
    ("green circle", False),
    ("red circle is left of blue square", True),
    ("red circle is to the left of blue square", True),
    ("red circle is right of blue square", False),
    ("red circle is not left of blue square", False),
    ("blue square is not above red circle", True),  # same row: neither above nor below
    ("red square is below red circle", True),
    ("red circle is above square", True),  # some square (the red one) is lower
    ("square is left of square", True),  # small red square (col 1) vs blue square (col 2)
    ("red circle and blue square", True),
    ("red circle and green square", False),
    ("Red circle is above red square.", True),
])
def test_oracle_answers_known_cases(text, expected):
    assert _scene().holds(text) is expected


@pytest.mark.parametrize("text", ["", "red", "purple elephant", "red circle is near blue square",
                                  "red circle and", "red circle is left of", "red-circle"])
def test_oracle_rejects_text_outside_the_language(text):
    with pytest.raises(WorldLanguageError, match="expected|unknown predicate|empty clause"):
        _scene().holds(text)


def _check_truth(record: UnitsRecord) -> None:
    scene = scene_from_record(record)
    for unit in record.units:
        assert scene.holds(unit.text), (record.sample_id, unit.text)
        for foil in unit.foils:
            assert not scene.holds(foil.text), (record.sample_id, unit.text, foil)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), split=SPLIT, index=st.integers(0, 10**6))
def test_every_unit_holds_and_every_foil_does_not(seed, split, index):
    _check_truth(world_record(WorldConfig(seed=seed), split, index))


def _find(scene: Scene, mention: str) -> SceneObject | None:
    # Independent of the oracle: the last word is the shape, the one before the color,
    # an optional first word the size.
    *size, color, shape = mention.split()
    found = [o for o in scene.objects if o.shape == shape and o.color == color
             and (not size or o.size == size[0])]
    assert len(found) <= 1
    return found[0] if found else None


_GEOMETRY = {"is left of": lambda a, b: a.col < b.col, "is right of": lambda a, b: a.col > b.col,
             "is above": lambda a, b: a.row < b.row, "is below": lambda a, b: a.row > b.row}


def _triple_holds(scene: Scene, subject: str, predicate: str, object: str) -> bool:
    negated = " not " in predicate
    a, b = _find(scene, subject), _find(scene, object)
    positive = a is not None and b is not None and _GEOMETRY[predicate.replace(" not", "")](a, b)
    return positive != negated


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), index=st.integers(0, 10**5),
       change_type=st.sampled_from(list(ChangeType)))
def test_foils_of_each_change_type_edit_as_named_and_are_false(seed, index, change_type):
    # Checked against the scene's objects directly, without the oracle or the generator.
    record = world_record(WorldConfig(seed=seed, size_mention_prob=0.5), "train", index)
    scene = scene_from_record(record)
    for unit in record.units:
        for foil in unit.foils_of(change_type):
            if unit.kind == "entity":
                obj, words, foil_words = _find(scene, unit.text), unit.text.split(), foil.text.split()
                assert obj is not None and _find(scene, foil.text) is None
                assert len(words) == len(foil_words)
                changed = [i for i, (u, f) in enumerate(zip(words, foil_words, strict=True))
                           if u != f]
                last = len(words) - 1  # the shape; the words before it are size/color
                if change_type == ChangeType.OBJECT_CHANGE:
                    assert changed == [last]
                else:
                    assert len(changed) == 1 and changed[0] < last
                continue
            assert _triple_holds(scene, unit.subject, unit.predicate, unit.object)
            assert not _triple_holds(scene, foil.subject, foil.predicate, foil.object)
            same = (foil.subject == unit.subject, foil.predicate == unit.predicate,
                    foil.object == unit.object)
            expected = {ChangeType.ANTONYM: (True, False, True),
                        ChangeType.NEGATION: (True, False, True),
                        ChangeType.SUBJECT_REPLACE: (False, True, True),
                        ChangeType.OBJECT_REPLACE: (True, True, False),
                        ChangeType.SUBJECT_OBJECT_SWAP: (False, True, False)}[change_type]
            assert same == expected
            if change_type == ChangeType.SUBJECT_OBJECT_SWAP:
                assert (foil.subject, foil.object) == (unit.object, unit.subject)


def test_image_shows_each_object_in_its_cell():
    import io

    from PIL import Image

    config = WorldConfig(seed=2, image_size=64)
    for index in range(20):
        record = world_record(config, "train", index)
        image = Image.open(io.BytesIO(record.image_bytes)).convert("RGB")
        cell = 64 / 3
        for obj in scene_from_record(record).objects:
            x, y = (obj.col + 0.5) * cell + obj.dx, (obj.row + 0.5) * cell + obj.dy
            assert int(x // cell) == obj.col and int(y // cell) == obj.row
            assert image.getpixel((int(x), int(y))) == PALETTE[obj.color]


@st.composite
def world_configs(draw) -> WorldConfig:
    grid_size = draw(st.integers(2, 4))
    min_objects = draw(st.integers(2, 4))
    colors = draw(st.lists(st.sampled_from(sorted(PALETTE)), min_size=2, max_size=7, unique=True))
    shapes = draw(st.lists(st.sampled_from(["circle", "square", "triangle", "cross"]),
                           min_size=2, max_size=4, unique=True))
    max_objects = draw(st.integers(min_objects, 4))
    if max_objects > grid_size**2 or len(colors) * len(shapes) <= max_objects:
        max_objects = min_objects = 2
    return WorldConfig(seed=draw(st.integers(0, 999)), image_size=draw(st.integers(32, 96)),
                       grid_size=grid_size, min_objects=min_objects, max_objects=max_objects,
                       colors=tuple(colors), shapes=tuple(shapes),
                       size_mention_prob=draw(st.sampled_from([0.0, 0.5, 1.0])),
                       max_relations=draw(st.integers(1, 2)),
                       position_jitter=draw(st.sampled_from([0.0, 1.0])))


@settings(max_examples=40, deadline=None)
@given(config=world_configs(), index=st.integers(0, 1000))
def test_any_valid_config_gives_truthful_records(config, index):
    # Small palettes leave some entities without foils ("when possible"); truth must hold.
    record = world_record(config, "train", index)
    _check_truth(record)
    for entity in record.entities:
        assert entity.text in record.caption
    assert 1 <= len(record.relations) <= config.max_relations


def test_every_change_type_occurs_and_is_false_of_its_scene():
    # Count per change_type over a block of samples, checking each foil against the scene.
    seen: dict[ChangeType, int] = dict.fromkeys(ChangeType, 0)
    for index in range(150):
        record = world_record(WorldConfig(seed=11), "train", index)
        scene = scene_from_record(record)
        for unit in record.units:
            for foil in unit.foils:
                assert not scene.holds(foil.text)
                seen[foil.change_type] += 1
    assert all(count > 0 for count in seen.values()), seen


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), index=st.integers(0, 10**5))
def test_gold_units_fit_the_caption(seed, index):
    record = world_record(WorldConfig(seed=seed, size_mention_prob=0.5), "val", index)
    scene = scene_from_record(record)
    assert len(record.entities) == len(scene.objects)
    assert 1 <= len(record.relations) <= 2
    for entity in record.entities:
        assert entity.text in record.caption  # verbatim: training replaces it in place
        kinds = {f.change_type for f in entity.foils}
        assert kinds == {ChangeType.ATTRIBUTE_CHANGE, ChangeType.OBJECT_CHANGE}
    for relation in record.relations:
        assert relation.subject in record.caption and relation.object in record.caption
        assert {f.change_type for f in relation.foils} == {
            ChangeType.ANTONYM, ChangeType.NEGATION, ChangeType.SUBJECT_OBJECT_SWAP,
            ChangeType.SUBJECT_REPLACE, ChangeType.OBJECT_REPLACE}
    _, rejections = validate_record(record)
    assert rejections == []


def test_scene_has_unique_color_shape_pairs_and_cells():
    for record in iter_world(WorldConfig(seed=5, num_train=50, num_val=0, num_test=0)):
        objects = scene_from_record(record).objects
        assert 2 <= len(objects) <= 4
        assert len({(o.color, o.shape) for o in objects}) == len(objects)
        assert len({(o.row, o.col) for o in objects}) == len(objects)


def test_same_seed_same_bytes_and_any_index_alone():
    streamed = list(iter_world(TINY))
    assert [r.sample_id for r in streamed[:2]] == ["world-train-0000000", "world-train-0000001"]
    assert len(streamed) == 11
    alone = world_record(TINY, "val", 2)
    assert alone == streamed[6 + 2]
    assert alone.image_bytes == streamed[8].image_bytes
    other_seed = world_record(TINY.model_copy(update={"seed": 4}), "val", 2)
    assert other_seed.image_bytes != alone.image_bytes


def test_image_is_png_of_configured_size():
    import io

    from PIL import Image

    record = world_record(WorldConfig(image_size=48), "test", 0)
    image = Image.open(io.BytesIO(record.image_bytes))
    assert image.format == "PNG" and image.size == (48, 48)
    # Each object's color is visible in the picture.
    colors = {color for _, color in image.convert("RGB").getcolors(maxcolors=4096)}
    for obj in scene_from_record(record).objects:
        assert PALETTE[obj.color] in colors


@pytest.mark.parametrize(("data", "field"), [
    ({"image_size": 16}, "image_size"),
    ({"image_size": 128}, "image_size"),
    ({"min_objects": 1}, "min_objects"),
    ({"max_objects": 5}, "max_objects"),
    ({"num_train": -1}, "num_train"),
    ({"colors": ["red", "magenta"]}, "colors"),
    ({"shapes": ["circle"]}, "shapes"),
    ({"size_mention_prob": 1.5}, "size_mention_prob"),
    ({"min_objects": 4, "max_objects": 3}, "max_objects"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_config_names_the_field(data, field):
    with pytest.raises(ConfigError, match=field):
        validate_config(WorldConfig, data)


def test_unknown_split_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown world split 'dev'"):
        world_record(TINY, "dev", 0)


def test_scene_from_non_world_record_is_a_clear_error():
    record = UnitsRecord("x", "x", "a dog", "train")
    with pytest.raises(DataError, match="meta\\['scene'\\]"):
        scene_from_record(record)


def test_world_package_does_not_import_ray():
    code = "import sys, csclip.world; csclip.world.world_record; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------
# Writer and summary
# ---------------------------------------------------------------------------------------

def _file_hashes(root) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_write_world_is_byte_identical_for_the_same_config(tmp_path):
    first = write_world(TINY, str(tmp_path / "a"), rows_per_file=4, row_group_size=3)
    write_world(TINY, str(tmp_path / "b"), rows_per_file=4, row_group_size=3)
    hashes_a, hashes_b = _file_hashes(tmp_path / "a"), _file_hashes(tmp_path / "b")
    assert sorted(hashes_a) == ["_world_config.json", "test/part-00000.parquet",
                                "train/part-00000.parquet", "train/part-00001.parquet",
                                "val/part-00000.parquet"]
    assert hashes_a == hashes_b
    assert len(first.files) == 4
    write_world(TINY.model_copy(update={"seed": 99}), str(tmp_path / "c"), rows_per_file=4,
                row_group_size=3)
    assert _file_hashes(tmp_path / "c")["train/part-00000.parquet"] != \
        hashes_a["train/part-00000.parquet"]


def test_written_world_reads_back_as_generated(tmp_path):
    summary = write_world(TINY, str(tmp_path), rows_per_file=4, row_group_size=3)
    assert summary.split_counts == {"train": 6, "val": 3, "test": 2}
    assert read_world_split(str(tmp_path), "train") == list(iter_world(TINY, ["train"]))
    assert read_units(str(tmp_path / "val")) == list(iter_world(TINY, ["val"]))
    assert read_world_config(str(tmp_path)) == TINY
    # A smaller rerun into the same place leaves no stale shards behind.
    write_world(TINY.model_copy(update={"num_train": 2}), str(tmp_path), rows_per_file=4)
    assert len(read_world_split(str(tmp_path), "train")) == 2


def test_reading_a_missing_split_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="no world shards under .*train.*write_world"):
        read_world_split(str(tmp_path), "train")


def test_summary_counts_splits_and_every_change_type():
    summary = summarize(iter_world(TINY), num_examples=2)
    assert summary.num_records == 11
    assert summary.split_counts == {"train": 6, "val": 3, "test": 2}
    assert set(summary.change_type_counts) == {c.value for c in ChangeType}
    foils = sum(len(u.foils) for r in iter_world(TINY) for u in r.units)
    assert sum(summary.change_type_counts.values()) == foils
    assert len(summary.examples) == 2
    text = format_summary(summary)
    assert "| train | 6 |" in text and "| negation |" in text
    assert summary.examples[0].caption in text


@pytest.fixture
def s3_world_uri(s3_endpoint, monkeypatch):
    """A bucket on the local S3 server; yields an s3:// prefix in it."""
    from s3_helpers import fresh_bucket

    with fresh_bucket(s3_endpoint, monkeypatch, "world", AWS_REGION="us-east-1"):
        yield "s3://world/v1"


def test_write_world_to_s3_reads_back(s3_world_uri):
    summary = write_world(TINY, s3_world_uri, rows_per_file=5, splits=["train"])
    assert summary.files == ("world/v1/train/part-00000.parquet",
                             "world/v1/train/part-00001.parquet")
    assert read_world_split(s3_world_uri, "train") == list(iter_world(TINY, ["train"]))


def test_cli_prints_summary_and_rejects_bad_fields(capsys):
    from csclip.world.__main__ import main

    assert main(["--set", "num_train=3", "--set", "num_val=1", "--set", "num_test=0"]) == 0
    assert "| train | 3 |" in capsys.readouterr().out
    assert main(["--set", "max_objects=9"]) == 2
    assert "max_objects" in capsys.readouterr().err


def test_captions_fit_the_text_context_exactly_as_clip_tokenizes_them():
    open_clip = pytest.importorskip("open_clip")
    from csclip.world.captions import count_tokens

    tokenizer = open_clip.get_tokenizer("ViT-B-32")  # the BPE every open_clip model shares
    config = WorldConfig(seed=1, size_mention_prob=1.0, max_objects=4, min_objects=4)
    for index in range(40):
        caption = world_record(config, "train", index).caption
        assert count_tokens(caption) == len(tokenizer.encode(caption)) + 2  # + start/end
        assert count_tokens(caption) <= config.max_caption_tokens
