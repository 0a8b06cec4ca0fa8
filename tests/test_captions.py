"""Caption readers on real-format files: SugarCrepe's own files, hand-written COCO
Karpathy / COCO captions fixtures, CSV, JSONL and the synthetic world."""

from __future__ import annotations

import json

import pytest

from csclip.config import load_config
from csclip.config.extract import InputConfig
from csclip.errors import ConfigError, DataError
from csclip.extract.captions import CAPTION_SCHEMA, caption_table

KARPATHY = {
    "dataset": "coco",
    "images": [
        {"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg", "imgid": 0,
         "split": "test", "cocoid": 391895, "sentids": [770337, 771687],
         "sentences": [
             {"tokens": ["a", "man", "with", "a", "red", "helmet"], "raw": "A man with a red helmet on a small moped on a dirt road. ",
              "imgid": 0, "sentid": 770337},
             {"tokens": ["man", "riding", "a", "motor", "bike"], "raw": "Man riding a motor bike on a dirt road on the countryside.",
              "imgid": 0, "sentid": 771687}]},
        {"filepath": "val2014", "filename": "COCO_val2014_000000522418.jpg", "imgid": 1,
         "split": "restval", "cocoid": 522418, "sentids": [775150],
         "sentences": [{"tokens": ["a", "woman", "cutting", "cake"], "raw": "A woman wearing a net on her head cutting a cake. ",
                        "imgid": 1, "sentid": 775150}]},
        {"filepath": "train2014", "filename": "COCO_train2014_000000057870.jpg", "imgid": 2,
         "split": "train", "cocoid": 57870, "sentids": [787980],
         "sentences": [{"tokens": ["a", "restaurant"], "raw": "A restaurant has modern wooden tables and chairs.",
                        "imgid": 2, "sentid": 787980}]},
    ],
}
COCO_CAPTIONS = {
    "info": {"description": "COCO 2017 Dataset"},
    "images": [{"id": 179765, "file_name": "000000179765.jpg", "height": 480, "width": 640},
               {"id": 190236, "file_name": "000000190236.jpg", "height": 480, "width": 640}],
    "annotations": [
        {"image_id": 179765, "id": 38, "caption": "A black Honda motorcycle parked in front of a garage."},
        {"image_id": 179765, "id": 182, "caption": "A Honda motorcycle parked in a grass driveway"},
        {"image_id": 190236, "id": 401, "caption": "An office cubicle with four different types of computers."},
    ],
}


def _config(**fields) -> InputConfig:
    return InputConfig.model_validate(fields)


def test_karpathy_reads_every_sentence_with_its_split(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(KARPATHY))
    table = caption_table(_config(format="karpathy", uri=str(path), image_root="s3://coco/images"))
    assert table.schema == CAPTION_SCHEMA
    rows = {r["sample_id"]: r for r in table.to_pylist()}
    assert sorted(rows) == ["coco-391895-770337", "coco-391895-771687", "coco-522418-775150",
                            "coco-57870-787980"]
    first = rows["coco-391895-770337"]
    assert first["caption"] == "A man with a red helmet on a small moped on a dirt road. "
    assert first["image_path"] == "s3://coco/images/val2014/COCO_val2014_000000391895.jpg"
    assert (first["split"], first["image_id"]) == ("test", "391895")
    assert rows["coco-522418-775150"]["split"] == "train"  # restval is train
    only_test = caption_table(_config(format="karpathy", uri=str(path), splits=["test"]))
    assert only_test.num_rows == 2


def test_karpathy_restval_kept_when_asked(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(KARPATHY))
    table = caption_table(_config(format="karpathy", uri=str(path), restval_as_train=False))
    assert "restval" in table.column("split").to_pylist()


def test_coco_captions_infers_split_from_file_name(tmp_path):
    path = tmp_path / "captions_val2017.json"
    path.write_text(json.dumps(COCO_CAPTIONS))
    rows = caption_table(_config(format="coco", uri=str(path), image_root="/data/val2017")).to_pylist()
    assert [r["sample_id"] for r in rows] == ["coco-179765-182", "coco-179765-38", "coco-190236-401"]
    assert {r["split"] for r in rows} == {"val"}
    assert rows[1]["caption"] == "A black Honda motorcycle parked in front of a garage."
    assert rows[1]["image_path"] == "/data/val2017/000000179765.jpg"


def test_coco_captions_without_split_in_name_needs_input_split(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(COCO_CAPTIONS))
    with pytest.raises(DataError, match="input.split"):
        caption_table(_config(format="coco", uri=str(path)))
    assert caption_table(_config(format="coco", uri=str(path), split="train")).num_rows == 3


def test_sugarcrepe_reads_the_real_files(sugarcrepe_dir):
    table = caption_table(_config(format="sugarcrepe", uri=str(sugarcrepe_dir)))
    expected = sum(len(json.loads(p.read_text())) for p in sugarcrepe_dir.glob("*.json"))
    assert table.num_rows == expected > 0
    ids = table.column("sample_id").to_pylist()
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    first = table.slice(0, 1).to_pylist()[0]
    assert first["sample_id"] == "sugarcrepe-add_att-000000"
    assert first["caption"] == "A drawing of a young woman with many facial piercings."
    assert (first["image_id"], first["image_path"], first["split"]) == (
        "000000085329", "000000085329.jpg", "test")


def test_sugarcrepe_single_file_and_limit(sugarcrepe_dir):
    table = caption_table(_config(format="sugarcrepe", uri=str(sugarcrepe_dir / "swap_obj.json"),
                                  limit=5, split="val"))
    assert table.num_rows == 5
    assert set(table.column("split").to_pylist()) == {"val"}
    assert all(s.startswith("sugarcrepe-swap_obj-") for s in table.column("sample_id").to_pylist())


def test_csv_and_jsonl_read_image_caption_rows(tmp_path):
    (tmp_path / "pairs.csv").write_text(
        "\ufeffimage,caption,split\nimgs/a.jpg,\"A dog, brown, on grass.\",val\nimgs/b.jpg,A cat.,\n")
    rows = caption_table(_config(format="csv", uri=str(tmp_path / "pairs.csv"), csv_img_key="image",
                                 csv_caption_key="caption", csv_separator=",")).to_pylist()
    assert [(r["sample_id"], r["image_id"], r["caption"], r["split"]) for r in rows] == [
        ("pairs-00000000", "a", "A dog, brown, on grass.", "val"),
        ("pairs-00000001", "b", "A cat.", "train")]
    (tmp_path / "pairs.jsonl").write_text(
        '{"image": "x/1.png", "caption": "Two birds.", "sample_id": "b-1"}\n\n'
        '{"image": "x/2.png", "caption": "A bird.", "sample_id": "b-2", "image_id": "two"}\n')
    rows = caption_table(_config(format="jsonl", uri=str(tmp_path / "pairs.jsonl"))).to_pylist()
    assert [(r["sample_id"], r["image_id"], r["image_path"]) for r in rows] == [
        ("b-1", "1", "x/1.png"), ("b-2", "two", "x/2.png")]


def test_bad_inputs_raise_data_errors_naming_the_file(tmp_path, sugarcrepe_dir):
    (tmp_path / "dup.jsonl").write_text('{"image": "a", "caption": "x", "sample_id": "s"}\n'
                                        '{"image": "b", "caption": "y", "sample_id": "s"}\n')
    with pytest.raises(DataError, match="occurs twice"):
        caption_table(_config(format="jsonl", uri=str(tmp_path / "dup.jsonl")))
    (tmp_path / "nocap.csv").write_text("filepath\ttext\na.jpg\thello\n")
    with pytest.raises(DataError, match="nocap.csv.*'title'"):
        caption_table(_config(format="csv", uri=str(tmp_path / "nocap.csv")))
    with pytest.raises(DataError, match="not a Karpathy file"):
        caption_table(_config(format="karpathy", uri=str(sugarcrepe_dir / "add_att.json")))
    with pytest.raises(DataError, match="not found"):
        caption_table(_config(format="coco", uri=str(tmp_path / "captions_val2014.json")))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="no captions"):
        caption_table(_config(format="jsonl", uri=str(tmp_path / "empty.jsonl")))


def test_file_formats_need_a_uri():
    with pytest.raises(ConfigError, match="input.uri is required"):
        load_config(InputConfig, None, ["format=karpathy"])


def test_world_rows_carry_image_and_gold_units():
    table = caption_table(_config(format="world", splits=["val"],
                                  world={"num_train": 0, "num_val": 3, "num_test": 0}))
    rows = table.to_pylist()
    assert [r["sample_id"] for r in rows] == [f"world-val-{i:07d}" for i in range(3)]
    for row in rows:
        assert row["image_bytes"].startswith(b"\x89PNG")
        gold = json.loads(row["gold_json"])
        assert gold["caption"] == row["caption"] and gold["entities"]
        assert all(u["text"].lower() in row["caption"].lower() for u in gold["entities"])


def test_caption_dataset_is_a_ray_dataset_of_captions(ray_session, sugarcrepe_dir):
    from csclip.extract.captions import caption_dataset

    ds = caption_dataset(_config(format="sugarcrepe", uri=str(sugarcrepe_dir / "swap_obj.json")),
                         num_blocks=3)
    rows = ds.take_all()
    assert len(rows) == 245
    assert {"sample_id", "image_id", "image_path", "caption", "split"} <= set(rows[0])
