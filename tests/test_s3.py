"""s3:// input and output through a real S3 server (moto) bound to 127.0.0.1."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from csclip import storage
from csclip.config import load_config
from csclip.config.extract import ExtractConfig, InputConfig
from csclip.errors import DataError
from csclip.extract.captions import caption_table
from csclip.extract.pipeline import run_extraction
from csclip.units import read_units

BUCKET = "csclip-test"


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A fresh bucket; credentials and endpoint through the usual AWS variables."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def test_filesystem_for_local_and_s3(tmp_path, monkeypatch):
    fs, path = storage.filesystem_for(str(tmp_path / "a"))
    assert fs.type_name == "local" and path == str(tmp_path / "a")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    fs, path = storage.filesystem_for("s3://bucket/some/key/", endpoint_url="http://127.0.0.1:9")
    assert fs.type_name == "s3" and path == "bucket/some/key"
    with pytest.raises(Exception, match="unsupported URI scheme"):
        storage.filesystem_for("gs://bucket/key")


def test_readers_read_from_s3(s3, sugarcrepe_dir):
    s3.put_object(Bucket=BUCKET, Key="captions/swap_obj.json",
                  Body=(sugarcrepe_dir / "swap_obj.json").read_bytes())
    s3.put_object(Bucket=BUCKET, Key="pairs.jsonl",
                  Body=b'{"image": "s3://img/1.jpg", "caption": "A red bus."}\n')
    table = caption_table(InputConfig(format="sugarcrepe", uri=f"s3://{BUCKET}/captions"))
    assert table.num_rows == len(json.loads((sugarcrepe_dir / "swap_obj.json").read_text()))
    rows = caption_table(InputConfig(format="jsonl", uri=f"s3://{BUCKET}/pairs.jsonl")).to_pylist()
    assert [(r["caption"], r["image_path"]) for r in rows] == [("A red bus.", "s3://img/1.jpg")]
    with pytest.raises(DataError, match="not found.*captions_val2014.json"):
        caption_table(InputConfig(format="coco", uri=f"s3://{BUCKET}/captions_val2014.json"))


def test_pipeline_writes_units_and_rejects_to_s3_and_resumes(ray_session, s3, s3_endpoint):
    uri = f"s3://{BUCKET}/runs/world"
    config = load_config(ExtractConfig, None, [
        "input.world.num_train=5", "input.world.num_val=2", "input.world.num_test=0",
        "output.shard_size=3", f"output.uri={uri}", "tracking.enabled=false"])
    summary = run_extraction(config)
    assert (summary.read, summary.with_units, summary.num_shards) == (7, 7, 3)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert [k for k in keys if "/units/" in k] == [f"runs/world/units/part-{k:05d}.parquet" for k in range(3)]
    assert len([k for k in keys if "/_done/" in k]) == 3
    fs, path = storage.filesystem_for(uri, s3_endpoint)
    units = read_units(f"{path}/units", filesystem=fs)
    assert sorted(u.sample_id for u in units) == sorted(
        [f"world-train-{i:07d}" for i in range(5)] + [f"world-val-{i:07d}" for i in range(2)])
    assert pq.read_table(f"{path}/rejects", filesystem=fs).num_rows == 0
    again = run_extraction(config)
    assert (again.shards_written, again.shards_skipped, again.read) == (0, 3, 7)


def test_authors_unit_files_read_from_an_s3_glob(s3):
    from pathlib import Path

    from csclip.authors import expand_uri
    from csclip.extract.authors import authors_caption_table

    fixtures = Path(__file__).parent / "fixtures"
    for name in ("authors_train.json", "authors_older.json"):
        s3.put_object(Bucket=BUCKET, Key=f"authors/{name}", Body=(fixtures / name).read_bytes())
    s3.put_object(Bucket=BUCKET, Key="authors/readme.txt", Body=b"not units")
    assert expand_uri(f"s3://{BUCKET}/authors/*.json") == [
        f"{BUCKET}/authors/authors_older.json", f"{BUCKET}/authors/authors_train.json"]
    table = authors_caption_table(InputConfig(format="world", uri=f"s3://{BUCKET}/authors/authors_*.json",
                                              image_root=f"s3://{BUCKET}/images"))
    assert table.num_rows == 7 + 3  # loaded and rejected records alike
    paths = dict(zip(table.column("sample_id").to_pylist(), table.column("image_path").to_pylist(),
                     strict=True))
    assert paths["coco_391895_0"] == f"s3://{BUCKET}/images/val2014/COCO_val2014_000000391895.jpg"
