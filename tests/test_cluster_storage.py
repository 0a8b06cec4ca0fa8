"""S3 on every node: one S3 client per process; image reads that tell a missing
key, a corrupt image and a flaky store apart (item 8); s3:// checkpoints evaluated through
a local cache (item 6); a global, seeded shuffle every epoch (item 9). S3 is a real moto
server on 127.0.0.1; the flaky store is a proxy in front of it that answers 503 SlowDown."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from s3_helpers import fresh_bucket

from csclip import storage
from csclip.config.world import WorldConfig
from csclip.errors import CheckpointMismatch, DataError
from csclip.model import create_bundle, load_bundle, save_checkpoint, spec_of
from csclip.train.stream import decode_image, epoch_order, image_status, read_image_bytes
from csclip.units import records_to_table
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


def test_check_pass_reads_every_image_with_one_client(s3):
    import pyarrow as pa

    rows = _upload_images(s3, 6)
    s3.put_object(Bucket=BUCKET, Key="images/corrupt.png", Body=b"\x89PNG not really")
    rows[2]["image_path"] = f"s3://{BUCKET}/images/corrupt.png"
    storage._s3_filesystem.cache_clear()
    status = image_status(pa.Table.from_pylist(rows))
    # The corrupt image is the only one that "does not decode"; six reads, one client.
    assert status["ok"].tolist() == [True, True, False, True, True, True]
    assert storage._s3_filesystem.cache_info().misses == 1


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


# ---------------------------------------------------------------------------------------
# Global shuffle
# ---------------------------------------------------------------------------------------

def _coco_like(ray_session, num_images: int = 60, captions: int = 5):
    # Sorted by sample_id like a units table: an image's captions are neighbours.
    rows = [{"sample_id": f"coco-{i:05d}-{k}", "image_id": str(i)}
            for i in range(num_images) for k in range(captions)]
    return ray_session.data.from_items(rows, override_num_blocks=4), rows


def _distinct_images_per_batch(order: list[dict], batch: int) -> float:
    sizes = [len({r["image_id"] for r in order[i:i + batch]}) for i in range(0, len(order), batch)]
    return sum(sizes) / len(sizes)


def test_every_epoch_is_a_new_seeded_global_order(ray_session):
    source, rows = _coco_like(ray_session)
    first = epoch_order(source, seed=7, epoch=0).take_all()
    assert sorted(r["sample_id"] for r in first) == [r["sample_id"] for r in rows]  # all, once
    assert epoch_order(source, seed=7, epoch=0).take_all() == first  # seeded: reruns agree
    assert epoch_order(source, seed=7, epoch=1).take_all() != first  # every epoch differs
    assert epoch_order(source, seed=8, epoch=0).take_all() != first


def test_captions_of_one_image_spread_across_batches(ray_session):
    source, rows = _coco_like(ray_session)
    batch = 30
    # In table order a batch of 30 holds 6 images; shuffled, ~24 of 60 (≈ 30 - the
    # expected number of same-image pairs, C(30,2) * 4/299 ≈ 5.8).
    assert _distinct_images_per_batch(rows, batch) == 6
    shuffled = epoch_order(source, seed=0, epoch=0).take_all()
    assert _distinct_images_per_batch(shuffled, batch) > 20


def test_each_epoch_is_its_own_shuffled_dataset(ray_session):
    from csclip.config.loss import LossConfig
    from csclip.config.train import SamplingConfig
    from csclip.loss import objective_for
    from csclip.model import spec_of as spec
    from csclip.train.stream import epoch_datasets

    table = records_to_table([world_record(WORLD, "train", i) for i in range(4)])
    source = ray_session.data.from_arrow(table)
    model = create_bundle("csclip-tiny", image_size=32).model
    epochs = epoch_datasets(source, sampling=SamplingConfig(), model_name="csclip-tiny",
                            preprocess_cfg=spec(model, "csclip-tiny").preprocess_cfg, seed=0,
                            num_epochs=2, objective=objective_for(LossConfig(method="clip"), 2))
    assert len(epochs) == 2
    for epoch in epochs:
        plan = str(epoch)  # the logical plan; nothing executes
        assert plan.count("RandomShuffle") == 1, plan
        assert plan.count("MapBatches(prepare_batch)") == 1, plan


def test_a_units_table_streams_without_a_pool_of_footer_readers(ray_session, tmp_path):
    """Ray 2.60's default Parquet reader lists files on 32 FooterReader actors, started
    again at every execution (each epoch, each restart): 64 worker processes for a table
    of three part files read twice. The training source reads with the first reader."""
    import pyarrow.parquet as pq
    import ray._private.state

    from csclip.config.train import DataConfig
    from csclip.train.stream import source_dataset

    units = tmp_path / "units"
    units.mkdir()
    for part in range(3):
        records = [world_record(WORLD, "train", 4 * part + i) for i in range(4)]
        pq.write_table(records_to_table(records), units / f"part-{part:05d}.parquet")

    def footer_readers() -> int:
        return sum(a["ActorClassName"] == "FooterReader"
                   for a in ray._private.state.actors().values())

    before = footer_readers()
    source = source_dataset(DataConfig(units_uri=str(units)))
    assert source.count() == 12 and source.count() == 12  # two executions, every row
    assert footer_readers() == before
    assert ray_session.data.DataContext.get_current().use_datasource_v2  # left as it was
