"""Zero-shot classification: the known answer on a tiny ImageFolder dataset, class names
and templates, and the world's zero-shot tasks checked against the scenes."""

from __future__ import annotations

import numpy as np
import pytest
from suites_helpers import FIXTURES, CaptionLengthScorer, ColorScorer

from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.zeroshot import (
    class_texts,
    classification_metrics,
    evaluate_world_zeroshot,
    evaluate_zeroshot_datasets,
    load_image_folder,
    world_zeroshot_tasks,
)
from csclip.world import iter_world
from csclip.world.scene import scene_from_record


def test_metrics_known_answer():
    labels = np.array([0, 0, 1, 2])
    predictions = np.array([0, 1, 1, 2])
    top1, recall = classification_metrics(labels, predictions, 3)
    assert top1 == 75.0 and recall == pytest.approx(100 * (0.5 + 1 + 1) / 3)


def test_image_folder_known_answer():
    task = load_image_folder(str(FIXTURES / "zeroshot" / "colors"))
    assert task.classnames == ("blue", "green", "red")  # sorted folders, as ImageFolder
    assert task.class_texts[0] == ("a photo of a blue thing.", "a blue object.")  # templates.txt
    metrics = evaluate_zeroshot_datasets(Encoder(ColorScorer()), str(FIXTURES / "zeroshot"))
    # blue/2.png is green: 3 of 4 right; recall blue 1/2, green 1, red 1.
    assert metrics["zs_colors"] == 75.0
    assert metrics["zs_colors_recall"] == pytest.approx(250 / 3)
    assert metrics["zs_avg"] == 75.0 and metrics["zs_colors_num_images"] == 4


def test_classnames_file_must_match_the_folders(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "zeroshot" / "colors", tmp_path / "colors")
    (tmp_path / "colors" / "classnames.txt").write_text("azure\nlime\n")
    with pytest.raises(DataError, match="2 names for 3 class folders"):
        load_image_folder(str(tmp_path / "colors"))
    (tmp_path / "colors" / "classnames.txt").write_text("azure\nlime\ncrimson\n")
    assert load_image_folder(str(tmp_path / "colors")).classnames == ("azure", "lime", "crimson")


def test_default_templates_are_openais():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    texts = class_texts(["dog"], OPENAI_IMAGENET_TEMPLATES)
    assert len(texts[0]) == 80 and texts[0][0] == "a bad photo of a dog."


@pytest.fixture(scope="module")
def world_val():
    return list(iter_world(WorldConfig(num_train=0, num_val=30, num_test=0), splits=("val",)))


def test_world_tasks_label_the_rendered_object(world_val):
    tasks = world_zeroshot_tasks(world_val, seed=0, max_items=30)
    assert set(tasks) == {"shape", "color", "shape_color", "count"}
    shape, color, pair = tasks["shape"], tasks["color"], tasks["shape_color"]
    for key, png in shape.images.items():
        record = next(r for r in world_val if f"zs/{r.image_id}" == key)
        scene = scene_from_record(record)
        name = f"{color.classnames[color.labels[key]]} {shape.classnames[shape.labels[key]]}"
        assert pair.classnames[pair.labels[key]] == name
        assert scene.holds(name)  # the labelled object is in the scene
        from csclip.eval.encoder import decode_image

        assert decode_image(png).size == (scene.image_size, scene.image_size)
    counts = tasks["count"]
    for record in world_val:
        expected = len(scene_from_record(record).objects)
        assert counts.classnames[counts.labels[record.image_id]] == \
            {2: "two", 3: "three", 4: "four"}[expected]


def test_world_zeroshot_keys_and_average(world_val):
    metrics = evaluate_world_zeroshot(Encoder(CaptionLengthScorer()), world_val, max_items=30)
    assert metrics["zs_world_num_items"] == 30
    assert metrics["zs_world_avg"] == pytest.approx(np.mean(
        [metrics["zs_world_shape"], metrics["zs_world_color"], metrics["zs_world_shape_color"]]))
    assert 0 <= metrics["zs_world_count"] <= 100
    assert evaluate_world_zeroshot(Encoder(CaptionLengthScorer()), []) == {}
