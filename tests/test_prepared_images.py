"""Images decoded once per run (csclip.train.prepared, data.prepare_images): the tensors an
epoch gives from the prepared uint8 pixels equal the streamed path's bit for bit, on real
JPEGs made here; a changed units table is prepared again, not reused; augment is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from csclip.config import load_config
from csclip.config.loss import LossConfig
from csclip.config.train import DataConfig, SamplingConfig
from csclip.errors import ConfigError
from csclip.loss import objective_for
from csclip.preprocess import (
    OPENAI_MEAN,
    OPENAI_STD,
    image_normalize,
    image_pixels,
    image_transform,
)
from csclip.train.stream import decode_image, epoch_datasets, plan_data, preprocess_key
from csclip.units import Unit, UnitsRecord, write_units

# ViT-B/32's eval transform (open_clip's preprocess cfg for it), the paper's 224 px.
VIT_B_32 = {"size": 224, "mode": "RGB", "mean": OPENAI_MEAN, "std": OPENAI_STD,
            "interpolation": "bicubic", "resize_mode": "shortest", "fill_color": 0}
LONGEST = {"size": 48, "resize_mode": "longest"}  # open_clip's own transform (the fallback)
MODEL = "csclip-tiny"  # its tokenizer; the image transform is VIT_B_32
# (width, height, mode): COCO's two shapes, odd sizes, a grayscale and a CMYK JPEG.
SHAPES = [(640, 480, "RGB"), (480, 640, "RGB"), (333, 250, "RGB"), (201, 57, "RGB"),
          (300, 300, "L"), (256, 320, "CMYK")]


def _photo(path, width: int, height: int, mode: str, seed: int) -> None:
    """A JPEG (quality 90) like a photograph: smooth gradients, a few shapes, fine noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([255 * (x / width) * rng.uniform(0.3, 1), 255 * (y / height),
                       128 + 100 * np.sin(x / rng.uniform(15, 40))], axis=-1)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(10, 80)
        pixels[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    pixels += rng.normal(0, 8, pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    image.convert(mode).save(path, "JPEG", quality=90)


@pytest.fixture
def photos(tmp_path) -> list[str]:
    paths = []
    for index, (width, height, mode) in enumerate(SHAPES):
        path = tmp_path / "images" / f"{index}.jpg"
        path.parent.mkdir(exist_ok=True)
        _photo(path, width, height, mode, index)
        paths.append(str(path))
    return paths


def _units(photos: list[str], path, broken: str | None = None) -> str:
    """Two captions per image (side by side, as COCO's units table has them), one unit each;
    `broken`: one more row whose image does not decode."""
    records = []
    for index, image in enumerate(photos):
        for caption in range(2):
            unit = Unit("entity", f"shape {index}")
            records.append(UnitsRecord(f"s{index:02d}-{caption}", f"img{index}",
                                       f"a photo number {index} caption {caption}", "train",
                                       entities=(unit,), image_path=image))
    if broken is not None:
        records.append(UnitsRecord("s99-0", "img99", "a broken file", "train", image_path=broken))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_units(records, str(path))
    return str(path)


@pytest.mark.parametrize("cfg", [VIT_B_32, LONGEST])
def test_normalised_pixels_are_the_eval_transform_bit_for_bit(photos, cfg):
    key = preprocess_key(cfg)
    images = [decode_image({"image_path": p}) for p in photos]
    reference = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
    pixels = np.stack([image_pixels(key)(image) for image in images])   # (n, 3, H, W) uint8
    assert pixels.dtype == np.uint8
    batch = image_normalize(key)(pixels)                                 # (n, 3, H, W) float32
    for image, one, normalised in zip(images, pixels, batch, strict=True):
        expected = image_transform(key)(image)  # today's streamed path
        assert np.array_equal(normalised, expected)
        assert np.array_equal(image_normalize(key)(one), expected)
        assert np.array_equal(expected, reference(image).numpy())  # open_clip's own


@pytest.mark.parametrize("cfg", [VIT_B_32, LONGEST])
def test_worker_normalises_uint8_pixels_bit_for_bit(cfg):
    from csclip.train.prepared import ImageNormalizer, channel_lookup

    key = preprocess_key(cfg)
    every = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, None, :, None], (2, 3, 256, 1))
    pixels = np.random.default_rng(0).integers(0, 256, (4, 3, 20, 30), dtype=np.uint8)
    normalise = ImageNormalizer(cfg, "cpu")
    # torchvision's ToTensor and Normalize on a uint8 image, as open_clip's transforms end.
    mean = torch.tensor(cfg.get("mean", OPENAI_MEAN), dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(cfg.get("std", OPENAI_STD), dtype=torch.float32).view(-1, 1, 1)
    for batch in (every, pixels):
        expected = torch.from_numpy(batch.copy()).to(torch.float32).div(255).sub(mean).div(std)
        assert np.array_equal(image_normalize(key)(batch), expected.numpy())
        assert np.array_equal(image_normalize(key)(batch[0]), expected[0].numpy())
        got = normalise({"image": torch.from_numpy(batch.copy()), "caption": torch.zeros(2),
                         "image_foil": torch.from_numpy(batch.copy())})
        assert got["image"].dtype == got["image_foil"].dtype == torch.float32
        assert np.array_equal(got["image"].numpy(), image_normalize(key)(batch))
        assert np.array_equal(got["image_foil"].numpy(), got["image"].numpy())
        # The accelerators' path (a table lookup), here on the CPU.
        looked_up = normalise.by_lookup(torch.from_numpy(batch.copy()))
        assert np.array_equal(looked_up.numpy(), image_normalize(key)(batch))
    assert channel_lookup(cfg).shape == (3, 256)
    floats = {"image": torch.ones(1, 3, 2, 2)}
    assert normalise(floats) is floats  # the streamed path's float32 images pass through


def test_stacked_rows_are_np_stack_in_c_order():
    """stack_rows equals np.stack, C-contiguous, also for the transform's transposed pixels
    (np.stack keeps their memory order) and for mixed dtypes (promoted as np.stack does)."""
    from csclip.train.stream import stack_rows

    images = np.random.default_rng(0).integers(0, 256, (5, 7, 6, 3), dtype=np.uint8)
    transposed = [image.transpose(2, 0, 1) for image in images]  # as image_pixels gives them
    assert not np.stack(transposed).flags.c_contiguous
    stacked = stack_rows(transposed)
    assert stacked.flags.c_contiguous and stacked.dtype == np.uint8
    assert np.array_equal(stacked, np.stack(transposed))
    mixed = [transposed[0], transposed[1].astype(np.float32)]
    assert stack_rows(mixed).dtype == np.stack(mixed).dtype == np.float32
    assert np.array_equal(stack_rows(mixed), np.stack(mixed))
    many = transposed * 40  # a block's worth: more arrays than numpy takes arguments (32)
    assert np.array_equal(stack_rows(many), np.stack(many))


def _rows(batches, worker=lambda batch: batch, dtype=torch.float32) -> list[tuple]:
    """Every row of `batches` (dicts of tensors) after what the worker does to a batch
    before its step, as comparable bytes, sorted; each image column has `dtype`."""
    rows = []
    for batch in map(worker, batches):
        assert batch["image"].dtype == dtype
        assert "image_foil" not in batch or batch["image_foil"].dtype == dtype
        names = sorted(batch)
        for index in range(len(batch["image"])):
            rows.append(tuple((name, batch[name][index].numpy().tobytes()) for name in names))
    return sorted(rows)


def _epoch_rows(dataset, worker=lambda batch: batch, dtype=torch.float32) -> list[tuple]:
    """Every row the workers get from an epoch (iter_torch_batches, then what the worker
    does to the batch before its step)."""
    return _rows(dataset.iter_torch_batches(batch_size=5), worker, dtype)


def _float_path_rows(units: str, cfg: dict, objective, epoch: int, augment: bool = False,
                     model_name: str = MODEL) -> list[tuple]:
    """The rows of one epoch as the streamed path made them before it shipped uint8: its
    map function with the float32 transform (normalize on), in this process, on the whole
    table (what a row gets depends on (seed, sample_id, epoch), not on its batch)."""
    from csclip.train.stream import prepare_batch

    out = prepare_batch(pq.read_table(units), sampling=SamplingConfig().model_dump(mode="json"),
                        preprocess=preprocess_key(cfg), model_name=model_name, seed=3,
                        epoch=epoch, columns=list(objective.columns), augment=augment)
    assert out["image"].dtype == np.float32
    return _rows([{name: torch.from_numpy(value) for name, value in out.items()}])


def test_worker_tensors_equal_the_float_path_bit_for_bit(ray_session, photos, tmp_path):
    """The step's tensors, streamed (uint8 pixels decoded in every epoch) and prepared
    (uint8 pixels read from the prepared table), each normalised by the worker, equal the
    float32 tensors the streamed path shipped before, row for row and bit for bit."""
    from csclip.train.prepared import ImageNormalizer, training_source

    broken = tmp_path / "images" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    units = _units(photos, tmp_path / "out" / "units.parquet", str(broken))
    objective = objective_for(LossConfig(), 2)  # CS-CLIP: image, caption, negatives, units
    streamed = DataConfig(units_uri=units, batch_size=4)
    prepared = streamed.model_copy(update={"prepare_images": True})
    epochs, plans = {}, {}
    for name, data in (("streamed", streamed), ("prepared", prepared)):
        rows, checked = training_source(data, VIT_B_32, MODEL, objective)
        plans[name] = plan_data(checked, data, 1, 2, None)
        epochs[name] = epoch_datasets(rows, sampling=SamplingConfig(), preprocess_cfg=VIT_B_32,
                                      model_name=MODEL, seed=3, num_epochs=2,
                                      objective=objective, prepared=data.prepare_images)
    assert plans["prepared"] == plans["streamed"]
    assert (plans["prepared"].num_rows, plans["prepared"].failed_ids) == (12, ("s99-0",))
    worker = ImageNormalizer(VIT_B_32, "cpu")  # what loop.py does before the step
    for epoch in range(2):
        expected = _float_path_rows(units, VIT_B_32, objective, epoch)
        assert len(expected) == 12
        # Both paths ship uint8 pixels (a quarter of float32's bytes) ...
        shipped = _epoch_rows(epochs["streamed"][epoch], dtype=torch.uint8)
        assert len(shipped) == 12
        # ... and the worker's normalised tensors are the float path's, bit for bit.
        for name in ("streamed", "prepared"):
            assert _epoch_rows(epochs[name][epoch], worker) == expected, (name, epoch)
    # The float path's images are open_clip's own eval transform of the JPEGs.
    reference = image_transform_v2(PreprocessCfg(**VIT_B_32), is_train=False)
    out = _float_path_rows(units, VIT_B_32, objective_for(LossConfig(method="clip"), 2), 0)
    images = {dict(row)["caption"]: dict(row)["image"] for row in out}
    assert len(images) == 12
    from csclip.preprocess import tokenizer

    for index, photo in enumerate(photos):
        tokens = tokenizer(MODEL)([f"a photo number {index} caption 1"])[0].numpy()
        expected_image = reference(Image.open(photo).convert("RGB")).numpy()
        assert images[tokens.tobytes()] == expected_image.tobytes()
    (folder,) = (tmp_path / "out" / "prepared_images").iterdir()
    manifest = json.loads((folder / "_prepared.json").read_text())
    assert (manifest["num_read"], manifest["failed_ids"]) == (13, ["s99-0"])


def test_augmented_stream_ships_pixels_bit_for_bit(ray_session, photos, tmp_path):
    """With data.augment the training transform's crop is drawn on the PIL image and
    quantised to uint8 before ToTensor, so the stream ships its pixels too: normalised by
    the worker they are the float path's augmented tensors, per (seed, sample, epoch)."""
    from csclip.train.prepared import ImageNormalizer, training_source

    units = _units(photos[:4], tmp_path / "out" / "units.parquet")
    objective = objective_for(LossConfig(method="clip"), 2)
    data = DataConfig(units_uri=units, batch_size=4, augment=True)
    rows, _ = training_source(data, VIT_B_32, MODEL, objective)
    epochs = epoch_datasets(rows, sampling=SamplingConfig(), preprocess_cfg=VIT_B_32,
                            model_name=MODEL, seed=3, num_epochs=2, objective=objective,
                            augment=True)
    worker = ImageNormalizer(VIT_B_32, "cpu")
    got = [_epoch_rows(epochs[epoch], worker) for epoch in range(2)]
    for epoch in range(2):
        assert got[epoch] == _float_path_rows(units, VIT_B_32, objective, epoch, augment=True)
    assert got[0] != got[1]  # a new crop every epoch
    eval_rows = _float_path_rows(units, VIT_B_32, objective, 0)
    assert len(eval_rows) == 8 and got[0] != eval_rows


def test_streamed_image_foils_are_pixels_bit_for_bit(ray_session, tmp_path):
    """loss.image_foil_weight: the foils (a rendered swap of the world's scene) ship as
    uint8 pixels beside the image, and the worker normalises both."""
    from csclip.config.world import WorldConfig
    from csclip.train.prepared import ImageNormalizer, training_source
    from csclip.world import world_record

    cfg = {"size": 48, "mean": OPENAI_MEAN, "std": OPENAI_STD}  # the world's 32 px, upscaled
    units = str(tmp_path / "out" / "units.parquet")
    (tmp_path / "out").mkdir()
    write_units([world_record(WorldConfig(image_size=32), "train", i) for i in range(10)], units)
    objective = objective_for(LossConfig(image_foil_weight=0.5), 2)
    data = DataConfig(units_uri=units, batch_size=4)
    rows, _ = training_source(data, cfg, MODEL, objective)
    (epoch,) = epoch_datasets(rows, sampling=SamplingConfig(), preprocess_cfg=cfg,
                              model_name=MODEL, seed=3, num_epochs=1, objective=objective)
    assert len(_epoch_rows(epoch, dtype=torch.uint8)) == 10
    got = _epoch_rows(epoch, ImageNormalizer(cfg, "cpu"))
    expected = _float_path_rows(units, cfg, objective, 0)
    assert got == expected
    foils = [dict(row) for row in expected]
    assert all(row["image_foil"] != row["image"] for row in foils)


def test_changed_units_table_is_prepared_again_not_reused(ray_session, photos, tmp_path):
    from csclip.train.prepared import prepare_images

    path = tmp_path / "coco" / "units"
    units = _units(photos[:3], path / "part-0.parquet")
    data = DataConfig(units_uri=str(path), prepare_images=True)
    first = prepare_images(data, VIT_B_32, MODEL)
    assert not first.reused and first.num_read == 6
    assert first.uri.startswith(str(tmp_path / "coco" / "prepared_images"))
    again = prepare_images(data, VIT_B_32, MODEL)
    assert again.reused and again.uri == first.uri
    # Stored uncompressed: every epoch reads the pixels, and zstd saved ~5% of them.
    parts = sorted(Path(first.rows_uri).glob("*.parquet"))
    assert parts
    for part in parts:
        metadata = pq.ParquetFile(part).metadata
        assert {metadata.row_group(g).column(c).compression for g in range(metadata.num_row_groups)
                for c in range(metadata.num_columns)} == {"UNCOMPRESSED"}
    # The first sample's image replaced by another: a new key, prepared again.
    table = pq.read_table(units)
    paths = table.column("image_path").to_pylist()
    paths[0] = photos[4]
    pq.write_table(table.set_column(table.schema.get_field_index("image_path"), "image_path",
                                    [paths]), units)
    changed = prepare_images(data, VIT_B_32, MODEL)
    assert not changed.reused and changed.key != first.key and changed.uri != first.uri
    rows = pq.read_table(changed.rows_uri).to_pylist()
    by_id = {row["sample_id"]: row["pixels"] for row in rows}
    expected = image_pixels(preprocess_key(VIT_B_32))(decode_image({"image_path": photos[4]}))
    assert by_id["s00-0"] == expected.tobytes() and by_id["s00-1"] != by_id["s00-0"]
    # Another transform is another table; a folder without its _prepared.json is redone.
    other = prepare_images(data, LONGEST, MODEL)
    assert other.key != changed.key
    (tmp_path / "coco" / "prepared_images" / other.key / "_prepared.json").unlink()
    assert not prepare_images(data, LONGEST, MODEL).reused


def test_prepare_images_with_augment_is_refused_in_one_line(tmp_path):
    from csclip.config.train import TrainConfig

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, overrides=[f"data.units_uri={tmp_path}", "data.augment=true",
                                            "data.prepare_images=true"])
    assert "data.augment" in str(err.value) and "\n" not in str(err.value).strip()
    with pytest.raises(ConfigError, match="needs data.units_uri"):
        load_config(TrainConfig, overrides=["data.prepare_images=true"])


def test_objectives_that_read_the_decoded_image_are_refused(tmp_path):
    from csclip.train.prepared import training_source

    data = DataConfig(units_uri=str(tmp_path), prepare_images=True)
    foils = objective_for(LossConfig(image_foil_weight=0.5), 2)
    with pytest.raises(ConfigError, match="turn data.prepare_images off"):
        training_source(data, VIT_B_32, MODEL, foils)


def test_the_worlds_rows_are_rendered_and_checked_once_per_driver(ray_session):
    """The demo's warm start and pretraining read one world: the second run gets the same
    materialized rows and the check's answer without rendering or checking again; another
    world (or split) is its own."""
    from csclip.config.world import WorldConfig
    from csclip.train.prepared import training_source

    clip = objective_for(LossConfig(method="clip"), 2)
    data = DataConfig(world=WorldConfig(num_train=96, num_val=8, num_test=8, image_size=32))
    first, _ = training_source(data, VIT_B_32, MODEL, clip)
    again, _ = training_source(data.model_copy(), VIT_B_32, MODEL, clip)
    assert again is first and first.count() == 96
    plan = plan_data(first, data, 1, 1, None)
    from csclip.train import stream

    kept = stream._CHECKED[id(first)][1]
    assert plan_data(again, data, 1, 1, None) == plan and stream._CHECKED[id(first)][1] is kept
    other = data.model_copy(update={"world": data.world.model_copy(update={"seed": 7})})
    assert training_source(other, VIT_B_32, MODEL, clip)[0] is not first
    val = data.model_copy(update={"split": "val"})
    assert training_source(val, VIT_B_32, MODEL, clip)[0].count() == 8


@pytest.mark.parametrize("prepare", [True, False])
def test_training_runs_on_prepared_and_streamed_images(ray_session, tmp_path, prepare):
    """A run on the prepared table, and one streaming the units' images (both ship uint8
    pixels that the worker normalises before its step)."""
    from csclip.config.train import TrainConfig
    from csclip.config.world import WorldConfig
    from csclip.train.loop import run
    from csclip.world import world_record

    world = WorldConfig(image_size=32)
    units = tmp_path / "out" / "units.parquet"
    units.parent.mkdir()
    write_units([world_record(world, "train", i) for i in range(16)], str(units))
    config = load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", f"data.units_uri={units}",
        f"data.prepare_images={str(prepare).lower()}", "data.batch_size=8",
        "data.shuffle_buffer=0",
        "optim.max_steps=3", "optim.warmup_steps=1", "run.checkpoint_every=3",
        f"run.storage_path={tmp_path / 'runs'}", "tracking.enabled=false"])
    result = run(config)
    assert result.metrics["step"] == 3 and result.metrics["num_rows"] == 16
    assert np.isfinite(result.metrics["loss"])
    if not prepare:
        assert not (tmp_path / "out" / "prepared_images").exists()
        return
    (prepared,) = (tmp_path / "out" / "prepared_images").iterdir()
    assert json.loads((prepared / "_prepared.json").read_text())["num_read"] == 16


def test_cached_tokenizer_gives_the_tokenizers_own_tokens():
    import open_clip
    import torch

    from csclip.preprocess import CachedTokenizer

    texts = ["a man riding a horse", "a horse riding a man", "a man riding a horse",
             "Café déjà vu, l'été " * 12, "a man riding a horse"]
    expected = open_clip.get_tokenizer("ViT-B-32")(texts)
    cached = CachedTokenizer(open_clip.get_tokenizer("ViT-B-32"))
    first, again = cached(texts), cached(list(reversed(texts)))  # the second from the cache
    assert first.dtype == torch.int64 and torch.equal(first, expected)
    assert torch.equal(again, expected.flip(0)) and cached.context_length == 77
    full = CachedTokenizer(open_clip.get_tokenizer("ViT-B-32"))
    full.MAX_TEXTS = 2  # full after the first call: later texts are tokenized, not kept
    full(texts[:2])
    assert torch.equal(full(texts), expected) and len(full._tokens) == 2


def test_s3_units_are_keyed_by_their_bytes_and_prepared_beside_them(s3_endpoint, monkeypatch,
                                                                      tmp_path):
    # The Ray Data write itself needs the nodes' S3 credentials (the session's workers
    # started without the test server's), so this checks what the driver does on S3.
    from s3_helpers import fresh_bucket

    from csclip.config.world import WorldConfig
    from csclip.storage import filesystem_for
    from csclip.train.prepared import prepared_uri, units_digest
    from csclip.world import world_record

    records = [world_record(WorldConfig(image_size=32), "train", i) for i in range(4)]
    (tmp_path / "units").mkdir()
    write_units(records, str(tmp_path / "units" / "part-0.parquet"))
    with fresh_bucket(s3_endpoint, monkeypatch, "csclip-prepared") as client:
        client.put_object(Bucket="csclip-prepared", Key="coco/units/part-0.parquet",
                          Body=(tmp_path / "units" / "part-0.parquet").read_bytes())
        assert units_digest("s3://csclip-prepared/coco/units") == \
            units_digest(str(tmp_path / "units"))
        assert prepared_uri("s3://csclip-prepared/coco/units", "k1") == \
            "s3://csclip-prepared/coco/prepared_images/k1"
        assert filesystem_for("s3://csclip-prepared/coco/units")[0].type_name == "s3"


def test_a_data_pass_waits_a_moment_for_a_cpu_ray_frees(monkeypatch):
    """Ray's resource view frees a finished task's CPU a moment late: the next driver pass
    waits for it (no "will hang" warning), and where every CPU stays taken it goes on."""
    import ray

    from csclip.train.stream import wait_for_a_free_cpu

    views = iter([{}, {"CPU": 0.0}, {"CPU": 1.0}])
    monkeypatch.setattr(ray, "available_resources", lambda: next(views))
    assert wait_for_a_free_cpu(timeout_s=5, poll_s=0.001)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.0})
    assert not wait_for_a_free_cpu(timeout_s=0.05, poll_s=0.001)


def test_two_preparations_at_once_write_the_table_once(ray_session, photos, tmp_path):
    # Two runs that need the same table at the same time: one prepares it under the
    # folder's lease, the other waits for its manifest and reads it (unguarded, both wrote
    # every row: 128 rows for 64 units).
    from concurrent.futures import ThreadPoolExecutor

    from csclip.train.prepared import prepare_images

    path = tmp_path / "coco" / "units"
    _units(photos[:3], path / "part-0.parquet")
    data = DataConfig(units_uri=str(path), prepare_images=True)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: prepare_images(data, VIT_B_32, MODEL), range(2)))
    assert sorted(p.reused for p in both) == [False, True]
    assert both[0].uri == both[1].uri
    rows = pq.read_table(both[0].rows_uri)
    assert rows.num_rows == 6 and len(set(rows.column("sample_id").to_pylist())) == 6


def test_a_units_table_of_relative_paths_reads_its_images_under_data_image_root(
        ray_session, photos, tmp_path):
    # train --image-root: the relative paths joined to it; one that leaves the folder is
    # not read, and the check pass counts it with the images that do not decode.
    from csclip.train.stream import plan_data, source_dataset

    relative = [Path(p).name for p in photos[:3]] + ["../outside.jpg"]
    (tmp_path / "outside.jpg").write_bytes(Path(photos[3]).read_bytes())
    units = _units(relative, tmp_path / "coco" / "units" / "part-0.parquet")
    data = DataConfig(units_uri=units, image_root=str(tmp_path / "images"), batch_size=2)
    plan = plan_data(source_dataset(data), data, 1, 1, None)
    assert (plan.num_rows, plan.num_decode_failures) == (6, 2)
    assert set(plan.failed_ids) == {"s03-0", "s03-1"}
