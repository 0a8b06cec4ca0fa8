"""S3 on every node: one S3 client per process; image reads that tell a missing
key, a corrupt image and a flaky store apart (item 8), also where a units table on S3 is
written as shards for training; s3:// checkpoints evaluated through a local cache (item
6). S3 is a real moto server on 127.0.0.1; the flaky store is a proxy in front of it that
answers 503 SlowDown."""

from __future__ import annotations

import http.client
import http.server
import io
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from s3_helpers import fresh_bucket

from csclip import storage
from csclip.config.train import DataConfig
from csclip.config.world import WorldConfig
from csclip.errors import CheckpointMismatch, DataError
from csclip.model import create_bundle, load_bundle, save_checkpoint, spec_of
from csclip.train.source_shards import source_shards
from csclip.train.stream import decode_image, read_image_bytes
from csclip.units import UNITS_SCHEMA, records_to_table
from csclip.world import world_record

BUCKET = "csclip-storage"
WORLD = WorldConfig(image_size=32, num_train=8, num_val=8, num_test=0)


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """A fresh bucket; credentials and endpoint through the usual AWS variables (as an
    instance profile gives every node), the cache in the test's directory."""
    with fresh_bucket(s3_endpoint, monkeypatch, BUCKET,
                      **{storage.CACHE_ENV: str(tmp_path / "cache")}) as client:
        yield client


# ---------------------------------------------------------------------------------------
# One client per process, and image reads
# ---------------------------------------------------------------------------------------

def test_one_s3_filesystem_per_process(s3, monkeypatch):
    first, _ = storage.filesystem_for(f"s3://{BUCKET}/a.png")
    second, path = storage.filesystem_for(f"s3://{BUCKET}/images/b.png")
    assert first is second and path == f"{BUCKET}/images/b.png"
    # Another endpoint (or other credentials) is another client.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert storage.filesystem_for(f"s3://{BUCKET}/a.png")[0] is not first


def _upload_images(s3, count: int) -> list[dict]:
    rows = records_to_table([world_record(WORLD, "train", i) for i in range(count)]).to_pylist()
    for row in rows:
        key = f"images/{row['image_id']}.png"
        s3.put_object(Bucket=BUCKET, Key=key, Body=row["image_bytes"])
        row["image_bytes"], row["image_path"] = None, f"s3://{BUCKET}/{key}"
    return rows


def _units_on_s3(s3, rows: list[dict], folder: str) -> str:
    """`rows` as a units table in s3://BUCKET/`folder`/units, one part file (put by boto3,
    not by csclip.storage)."""
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=UNITS_SCHEMA), sink)
    s3.put_object(Bucket=BUCKET, Key=f"{folder}/units/part-00000.parquet", Body=sink.getvalue())
    return f"s3://{BUCKET}/{folder}/units"


def test_a_units_table_on_s3_is_written_as_shards_with_one_client(s3):
    """Training writes a units table once as shards (csclip.train.source_shards): every
    image read from S3 with the process's one client, a corrupt image a counted rejection,
    and the shards beside the table on S3."""
    rows = _upload_images(s3, 6)
    s3.put_object(Bucket=BUCKET, Key="images/corrupt.png", Body=b"\x89PNG not really")
    rows[2]["image_path"] = f"s3://{BUCKET}/images/corrupt.png"
    units = _units_on_s3(s3, rows, "out")
    storage._s3_filesystem.cache_clear()
    written = source_shards(DataConfig(units_uri=units), seed=0, preprocess_cfg={"size": 32},
                            model_name="csclip-tiny")
    # The corrupt image is the only one that "does not decode"; one client for it all.
    assert written.rejected == {"undecodable_image": 1}
    assert storage._s3_filesystem.cache_info().misses == 1
    assert written.uri.startswith(f"s3://{BUCKET}/out/train_shards/")
    fs, path = storage.filesystem_for(f"{written.uri}/shards/rejects.parquet")
    rejects = pq.read_table(path, filesystem=fs).to_pylist()
    assert [(r["sample_id"], r["reason"]) for r in rejects] == [(rows[2]["sample_id"],
                                                                 "undecodable_image")]
    fs, path = storage.filesystem_for(f"{written.uri}/units/00000.parquet")
    assert pq.read_table(path, filesystem=fs).num_rows == 5
    # A missing key is not a decode failure: it stops the run, naming the image.
    rows[4]["image_path"] = f"s3://{BUCKET}/images/missing.png"
    units = _units_on_s3(s3, rows, "other")
    with pytest.raises(DataError, match=f"missing_image 1.*{BUCKET}/images/missing.png"):
        source_shards(DataConfig(units_uri=units), seed=0, preprocess_cfg={"size": 32},
                      model_name="csclip-tiny")


def test_missing_key_is_a_data_error_naming_the_uri_not_a_decode_failure(s3):
    [row] = _upload_images(s3, 1)
    row["image_path"] = f"s3://{BUCKET}/images/missing.png"
    with pytest.raises(DataError, match=f"image s3://{BUCKET}/images/missing.png not found"):
        decode_image(row)


def test_corrupt_image_does_not_decode(s3):
    s3.put_object(Bucket=BUCKET, Key="images/truncated.png",
                  Body=world_record(WORLD, "train", 0).image_bytes[:60])
    assert decode_image({"sample_id": "x", "image_path": f"s3://{BUCKET}/images/truncated.png"}) is None


class FlakyS3Proxy:
    """An HTTP proxy in front of the S3 server that answers `503 SlowDown` (S3's
    throttling reply) to the first `failures` GETs of each object under `prefix`."""

    def __init__(self, upstream: str, prefix: str, failures: int):
        self.upstream = upstream.removeprefix("http://")
        self.prefix, self.failures = prefix, failures
        self.gets: Counter[str] = Counter()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path.startswith(proxy.prefix):
                    proxy.gets[path] += 1
                    if proxy.gets[path] <= proxy.failures:
                        self._reply(503, [], b"<Error><Code>SlowDown</Code></Error>")
                        return
                self.forward()

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                connection = http.client.HTTPConnection(proxy.upstream, timeout=30)
                connection.request(self.command, self.path,
                                   body=self.rfile.read(length) if length else None,
                                   headers=dict(self.headers.items()))
                response = connection.getresponse()
                self._reply(response.status, response.getheaders(), response.read())
                connection.close()

            do_HEAD = do_PUT = do_POST = do_DELETE = forward

            def _reply(self, status: int, headers: list, body: bytes) -> None:
                self.send_response(status)
                # A HEAD reply has no body but the object's own Content-Length.
                dropped = ("transfer-encoding", "connection") + (
                    () if self.command == "HEAD" else ("content-length",))
                for key, value in headers:
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        return Handler

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_throttled_reads_are_retried_until_they_succeed(s3, s3_endpoint, monkeypatch):
    image = world_record(WORLD, "train", 1).image_bytes
    s3.put_object(Bucket=BUCKET, Key="flaky/1.png", Body=image)
    # More failures than the S3 client's own retries (3 attempts): ours must help, and the
    # image decodes instead of being counted as undecodable and dropped.
    flaky = FlakyS3Proxy(s3_endpoint, f"/{BUCKET}/flaky/", failures=4)
    with flaky as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        decoded = decode_image({"sample_id": "s", "image_path": f"s3://{BUCKET}/flaky/1.png"})
        assert decoded is not None and decoded.size == (32, 32)
        assert read_image_bytes(f"s3://{BUCKET}/flaky/1.png") == image
    assert flaky.gets[f"/{BUCKET}/flaky/1.png"] == 4 + 2  # refused 4 times, then served twice


def test_throttled_reads_are_retried_when_the_training_shards_are_written(s3, s3_endpoint,
                                                                          monkeypatch, tmp_path):
    # The images of a units table are read once, when its shards are written: a store
    # that throttles more often than the S3 client retries must not shrink the data.
    rows = records_to_table([world_record(WORLD, "train", i) for i in range(3)]).to_pylist()
    for index, row in enumerate(rows):
        s3.put_object(Bucket=BUCKET, Key=f"flaky/{index}.png", Body=row["image_bytes"])
        row["image_bytes"], row["image_path"] = None, f"s3://{BUCKET}/flaky/{index}.png"
    (tmp_path / "out").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=UNITS_SCHEMA),
                   tmp_path / "out" / "units.parquet")
    flaky = FlakyS3Proxy(s3_endpoint, f"/{BUCKET}/flaky/", failures=4)
    with flaky as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        storage._s3_filesystem.cache_clear()
        written = source_shards(DataConfig(units_uri=str(tmp_path / "out" / "units.parquet")),
                                seed=0, preprocess_cfg={"size": 32}, model_name="csclip-tiny")
    storage._s3_filesystem.cache_clear()
    assert written.rejected == {}
    assert all(flaky.gets[f"/{BUCKET}/flaky/{index}.png"] == 4 + 1 for index in range(3))


def test_a_read_that_keeps_failing_is_a_data_error_naming_the_uri(s3, s3_endpoint, monkeypatch):
    s3.put_object(Bucket=BUCKET, Key="flaky/2.png", Body=b"png")
    with FlakyS3Proxy(s3_endpoint, f"/{BUCKET}/flaky/", failures=10**6) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        with pytest.raises(DataError, match=f"cannot read image s3://{BUCKET}/flaky/2.png: "
                                            "3 attempts failed"):
            read_image_bytes(f"s3://{BUCKET}/flaky/2.png", attempts=3, backoff_s=0.01)


# ---------------------------------------------------------------------------------------
# Checkpoints on s3://
# ---------------------------------------------------------------------------------------

def _upload_dir(s3, directory: Path, prefix: str) -> None:
    for file in directory.iterdir():
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{file.name}", Body=file.read_bytes())


@pytest.fixture
def s3_checkpoint(s3, tmp_path) -> tuple[str, torch.nn.Module]:
    torch.manual_seed(3)
    model = create_bundle("csclip-tiny", image_size=32).model
    local = save_checkpoint(model, spec_of(model, "csclip-tiny"), tmp_path / "ckpt",
                            train_state={"step": 4})
    _upload_dir(s3, local, "runs/r/final")
    return f"s3://{BUCKET}/runs/r/final", model


def test_load_bundle_reads_an_s3_checkpoint_through_the_cache(s3, s3_checkpoint, tmp_path):
    uri, model = s3_checkpoint
    bundle = load_bundle(uri)
    assert bundle.pretrained == uri and bundle.name == "csclip-tiny"
    for key, value in model.state_dict().items():
        assert torch.equal(bundle.model.state_dict()[key], value), key
    [cached] = (tmp_path / "cache" / "checkpoints").iterdir()
    assert sorted(p.name for p in cached.iterdir()) == sorted(
        [".csclip-source.json", "manifest.json", "model.pt", "model_spec.json", "train_state.pt"])
    # Loaded again: no download (the copy is reused) ...
    before = (cached / "model.pt").stat().st_mtime_ns
    load_bundle(uri)
    assert (cached / "model.pt").stat().st_mtime_ns == before
    # ... until the checkpoint at that URI changes.
    torch.manual_seed(4)
    other = create_bundle("csclip-tiny", image_size=32).model
    _upload_dir(s3, save_checkpoint(other, spec_of(other, "csclip-tiny"), tmp_path / "other"),
                "runs/r/final")
    reloaded = load_bundle(uri)
    key = "text_projection"
    assert torch.equal(reloaded.model.state_dict()[key], other.state_dict()[key])


def test_s3_location_without_a_checkpoint_is_refused(s3):
    s3.put_object(Bucket=BUCKET, Key="runs/x/final/model.pt", Body=b"")
    with pytest.raises(CheckpointMismatch, match=f"s3://{BUCKET}/runs/x/final has no model_spec"):
        load_bundle(f"s3://{BUCKET}/runs/x/final")
    with pytest.raises(DataError, match="no files there"):
        load_bundle(f"s3://{BUCKET}/runs/nothing")


def test_evaluate_entry_point_and_ablation_trial_evaluate_an_s3_checkpoint(
        s3, s3_checkpoint, tmp_path, mlflow_uri, monkeypatch):
    import sys

    from csclip.ablation.trial import evaluate_trial
    from csclip.config import load_config
    from csclip.config.train import TrainConfig

    uri, _ = s3_checkpoint
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "pipelines"))
    sys.modules.pop("evaluate", None)
    import evaluate as evaluate_entry

    assert evaluate_entry.main([
        "--checkpoint", uri, "--out", str(tmp_path / "eval"), "--set", "data.world.num_val=8",
        "--set", "data.world.image_size=32", "--set", "benchmark.num_bootstrap=10",
        "--set", "suites.num_world_pairs=4",
        "--set", f"tracking.uri={mlflow_uri}"]) == 0
    assert (tmp_path / "eval" / "table1.md").is_file()
    config = load_config(TrainConfig, None, ["data.world.num_val=8", "data.world.image_size=32"])
    report = evaluate_trial(config, uri, seed=0)
    assert 0 <= report.metrics["ht_all"] <= 100
