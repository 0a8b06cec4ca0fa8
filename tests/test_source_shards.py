"""A units table trained on as webdataset shards (csclip.train.source_shards): written once
per table and settings, its images as uint8 pixels (or their files where every epoch needs
the decoded image); the tensors a worker normalises from them equal the float path's bit
for bit, on real JPEGs made here; a changed table is written again, not reused; a missing
image stops the run naming it; two runs at once write it once."""

from __future__ import annotations

import io
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from csclip.config import load_config
from csclip.config.loss import LossConfig
from csclip.config.train import DataConfig, SamplingConfig, TrainConfig
from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.loss import objective_for
from csclip.preprocess import (
    OPENAI_MEAN,
    OPENAI_STD,
    image_normalize,
    image_pixels,
    image_transform,
    tokenizer,
)
from csclip.shards.read import iter_shard
from csclip.train.holdout import HeldOut
from csclip.train.prepared import ImageNormalizer, channel_lookup
from csclip.train.shards import pixel_rows, plan_shards, shard_datasets
from csclip.train.source_shards import source_shards, table_shards_parent, units_digest
from csclip.train.stream import decode_image, prepare_batch, preprocess_key, stack_rows
from csclip.units import Unit, UnitsRecord, write_units
from csclip.world import world_record

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


def _shard_epochs(data: DataConfig, cfg: dict, objective, num_epochs: int, seed: int = 3
                  ) -> list:
    """The epochs one worker reads from `data`'s shards (a table's, written)."""
    shards = plan_shards(data, seed)
    rows = sum(shard.rows for shard in shards)
    datasets = shard_datasets(shards, data=data, sampling=SamplingConfig(), preprocess_cfg=cfg,
                              model_name=MODEL, seed=seed, num_epochs=num_epochs,
                              steps_per_epoch=rows // data.batch_size, num_workers=1,
                              objective=objective,
                              dataset_name=lambda epoch, rank: f"train_epoch_{epoch}")
    return [datasets[f"train_epoch_{epoch}"] for epoch in range(num_epochs)]


def _epoch_rows(dataset, worker=lambda batch: batch, dtype=torch.float32) -> list[tuple]:
    """Every row the workers get from an epoch (iter_torch_batches, then what the worker
    does to the batch before its step)."""
    return _rows(dataset.iter_torch_batches(batch_size=5), worker, dtype)


def _float_path_rows(units: str, cfg: dict, objective, epoch: int, augment: bool = False,
                     model_name: str = MODEL) -> list[tuple]:
    """The rows of one epoch as the streamed path made them: its map function with the
    float32 transform (normalize on), in this process, on the whole table (what a row
    gets depends on (seed, sample_id, epoch), not on its batch or its order)."""
    out = prepare_batch(pq.read_table(units), sampling=SamplingConfig().model_dump(mode="json"),
                        preprocess=preprocess_key(cfg), model_name=model_name, seed=3,
                        epoch=epoch, columns=list(objective.columns), augment=augment)
    assert out["image"].dtype == np.float32
    return _rows([{name: torch.from_numpy(value) for name, value in out.items()}])


def test_worker_tensors_equal_the_float_path_bit_for_bit(ray_session, photos, tmp_path):
    """A units table's shards hold its images as uint8 pixels, decoded once; the step's
    tensors, normalised by the worker, equal the float32 tensors of decoding every epoch,
    row for row and bit for bit. The image that does not decode is a counted rejection."""
    broken = tmp_path / "images" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    units = _units(photos, tmp_path / "out" / "units.parquet", str(broken))
    objective = objective_for(LossConfig(), 2)  # CS-CLIP: image, caption, negatives, units
    data = DataConfig(units_uri=units, batch_size=4)
    written = source_shards(data, seed=3, preprocess_cfg=VIT_B_32, model_name=MODEL)
    assert not written.reused and written.rejected == {"undecodable_image": 1}
    assert written.uri.startswith(str(tmp_path / "out" / "train_shards"))
    rejects = pq.read_table(Path(written.uri) / "shards" / "rejects.parquet").to_pylist()
    assert [(r["sample_id"], r["reason"]) for r in rejects] == [("s99-0", "undecodable_image")]
    samples = list(iter_shard(str(Path(written.uri) / "shards" / "00000.tar")))
    assert {s.image_suffix for s in samples} == {"pixels.npy"} and len(samples) == 12
    epochs = _shard_epochs(written.data(data), VIT_B_32, objective, 2)
    worker = ImageNormalizer(VIT_B_32, "cpu")  # what loop.py does before the step
    for epoch in range(2):
        expected = _float_path_rows(units, VIT_B_32, objective, epoch)
        assert len(expected) == 12
        assert len(_epoch_rows(epochs[epoch], dtype=torch.uint8)) == 12  # shipped as uint8
        assert _epoch_rows(epochs[epoch], worker) == expected, epoch
    # The float path's images are open_clip's own eval transform of the JPEGs.
    reference = image_transform_v2(PreprocessCfg(**VIT_B_32), is_train=False)
    out = _float_path_rows(units, VIT_B_32, objective_for(LossConfig(method="clip"), 2), 0)
    images = {dict(row)["caption"]: dict(row)["image"] for row in out}
    assert len(images) == 12
    for index, photo in enumerate(photos):
        tokens = tokenizer(MODEL)([f"a photo number {index} caption 1"])[0].numpy()
        expected_image = reference(Image.open(photo).convert("RGB")).numpy()
        assert images[tokens.tobytes()] == expected_image.tobytes()
    again = source_shards(data, seed=3, preprocess_cfg=VIT_B_32, model_name=MODEL)
    assert again.reused and again.uri == written.uri and again.pattern == written.pattern


def test_augment_decodes_every_epoch_and_image_foils_are_rendered_once(ray_session, photos,
                                                                        tmp_path):
    """data.augment draws a new crop every epoch: its shards keep the image files (encoding
    original). Image foils are rendered once, with the pixels, as every sample's candidates,
    of which each epoch draws one. Either way the worker's tensors are the float path's
    (decoding and rendering every epoch), per (seed, sample, epoch)."""
    units = _units(photos[:4], tmp_path / "out" / "units.parquet")
    clip = objective_for(LossConfig(method="clip"), 2)
    data = DataConfig(units_uri=units, batch_size=4, augment=True)
    written = source_shards(data, seed=3, preprocess_cfg=VIT_B_32, model_name=MODEL)
    samples = list(iter_shard(str(Path(written.uri) / "shards" / "00000.tar")))
    assert {s.image_suffix for s in samples} == {"jpg"}
    assert samples[0].image == Path(photos[int(samples[0].key[1:3])]).read_bytes()
    epochs = _shard_epochs(written.data(data), VIT_B_32, clip, 2)
    worker = ImageNormalizer(VIT_B_32, "cpu")
    got = [_epoch_rows(epochs[epoch], worker) for epoch in range(2)]
    for epoch in range(2):
        assert got[epoch] == _float_path_rows(units, VIT_B_32, clip, epoch, augment=True)
    assert got[0] != got[1]  # a new crop every epoch
    # Image foils (a rendered swap of the world's scene) from a world units table.
    cfg = {"size": 48, "mean": OPENAI_MEAN, "std": OPENAI_STD}  # the world's 32 px, upscaled
    world_units = str(tmp_path / "world" / "units.parquet")
    (tmp_path / "world").mkdir()
    write_units([world_record(WorldConfig(image_size=32), "train", i) for i in range(10)],
                world_units)
    foils = objective_for(LossConfig(image_foil_weight=0.5), 2)
    data = DataConfig(units_uri=world_units, batch_size=5)
    written = source_shards(data, seed=3, preprocess_cfg=cfg, model_name=MODEL,
                            image_foils=True)
    samples = list(iter_shard(str(Path(written.uri) / "shards" / "00000.tar"),
                              members=("foils.npy", "foils.json")))
    assert {s.image_suffix for s in samples} == {"pixels.npy"}  # decoded once, foils too
    assert all(set(s.members) == {"foils.npy", "foils.json"} for s in samples)
    (epoch,) = _shard_epochs(written.data(data), cfg, foils, 1)
    assert len(_epoch_rows(epoch, dtype=torch.uint8)) == 10
    got = _epoch_rows(epoch, ImageNormalizer(cfg, "cpu"))
    expected = _float_path_rows(world_units, cfg, foils, 0)
    assert got == expected
    assert all(dict(row)["image_foil"] != dict(row)["image"] for row in expected)


def test_changed_units_table_is_written_again_not_reused(ray_session, photos, tmp_path):
    path = tmp_path / "coco" / "units"
    units = _units(photos[:3], path / "part-0.parquet")
    data = DataConfig(units_uri=str(path))
    first = source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL)
    assert not first.reused and first.rejected == {}
    done = Path(first.units_uri) / "_done" / "00000.json"
    assert json.loads(done.read_text())["with_units"] == 6
    assert source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL).reused
    # The first sample's image replaced by another: a new key, written again.
    table = pq.read_table(units)
    paths = table.column("image_path").to_pylist()
    paths[0] = photos[4]
    pq.write_table(table.set_column(table.schema.get_field_index("image_path"), "image_path",
                                    [paths]), units)
    changed = source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL)
    assert not changed.reused and changed.uri != first.uri
    pixels = {s.key: np.load(io.BytesIO(s.image)) for s in
              iter_shard(str(Path(changed.uri) / "shards" / "00000.tar"))}
    expected = image_pixels(preprocess_key(VIT_B_32))(decode_image({"image_path": photos[4]}))
    assert np.array_equal(pixels["s00-0"], expected)
    assert not np.array_equal(pixels["s00-1"], pixels["s00-0"])
    # Another transform, or another seed, is another folder; one without its units'
    # _complete.json (a killed write) is written again.
    other = source_shards(data, seed=0, preprocess_cfg=LONGEST, model_name=MODEL)
    assert other.uri != changed.uri
    assert source_shards(data, seed=1, preprocess_cfg=LONGEST, model_name=MODEL).uri != other.uri
    (Path(other.units_uri) / "_complete.json").unlink()
    assert not source_shards(data, seed=0, preprocess_cfg=LONGEST, model_name=MODEL).reused


def test_a_missing_image_stops_the_run_naming_it(ray_session, photos, tmp_path, caplog):
    """A wrong image root must not shrink the data: a missing image is a DataError naming
    it, every time; a path that leaves data.image_root is a counted rejection, logged."""
    relative = [Path(p).name for p in photos[:3]] + ["../outside.jpg"]
    (tmp_path / "outside.jpg").write_bytes(Path(photos[3]).read_bytes())
    units = _units(relative, tmp_path / "coco" / "units" / "part-0.parquet")
    data = DataConfig(units_uri=units, image_root=str(tmp_path / "images"), batch_size=2)
    with caplog.at_level(logging.WARNING):
        written = source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL)
    assert written.rejected == {"outside_image_root": 2}
    assert "2 rows of the units table are left out" in caplog.text
    assert sum(shard.rows for shard in plan_shards(written.data(data))) == 6
    wrong = data.model_copy(update={"image_root": str(tmp_path / "nowhere")})
    for _ in range(2):  # the second finds the written folder and refuses again
        with pytest.raises(DataError) as err:
            source_shards(wrong, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL)
        assert "cannot be read (missing_image 6)" in str(err.value)
        assert "data.image_root" in str(err.value) and "\n" not in str(err.value)


def test_two_runs_at_once_write_the_shards_once(ray_session, photos, tmp_path):
    # Two runs that need the same table at the same time (Tune's trials): one writes it
    # under the folder's lease, the other waits for it and reads it.
    path = tmp_path / "coco" / "units"
    _units(photos[:3], path / "part-0.parquet")
    data = DataConfig(units_uri=str(path))
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: source_shards(data, seed=0, preprocess_cfg=VIT_B_32,
                                                    model_name=MODEL), range(2)))
    assert sorted(p.reused for p in both) == [False, True]
    assert both[0].uri == both[1].uri
    units = pq.read_table(Path(both[0].units_uri) / "units" / "00000.parquet")
    assert units.num_rows == 6 and len(set(units.column("sample_id").to_pylist())) == 6


def test_s3_units_are_written_as_shards_beside_them(s3_endpoint, monkeypatch, tmp_path):
    from s3_helpers import fresh_bucket

    records = [world_record(WorldConfig(image_size=32), "train", i) for i in range(4)]
    (tmp_path / "units").mkdir()
    write_units(records, str(tmp_path / "units" / "part-0.parquet"))
    with fresh_bucket(s3_endpoint, monkeypatch, "csclip-tables") as client:
        client.put_object(Bucket="csclip-tables", Key="coco/units/part-0.parquet",
                          Body=(tmp_path / "units" / "part-0.parquet").read_bytes())
        assert units_digest("s3://csclip-tables/coco/units") == \
            units_digest(str(tmp_path / "units"))
        assert table_shards_parent("s3://csclip-tables/coco/units") == "s3://csclip-tables/coco"
        data = DataConfig(units_uri="s3://csclip-tables/coco/units")
        written = source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL)
        assert written.uri.startswith("s3://csclip-tables/coco/train_shards/")
        assert [shard.rows for shard in plan_shards(written.data(data))] == [4]
        assert source_shards(data, seed=0, preprocess_cfg=VIT_B_32, model_name=MODEL).reused


def test_held_out_rows_from_pixels_score_as_from_their_files(photos, tmp_path):
    """data.val_ratio on a table's shards of pixels: the held-out rows come as uint8 pixels
    and caption tokens, and HeldOut reads them into the tensors it made from the files."""
    units = _units(photos[:3], tmp_path / "units.parquet")
    table = pq.read_table(units)
    sampling = SamplingConfig().model_dump(mode="json")
    from_files = HeldOut(table, sampling=sampling, preprocess_cfg=VIT_B_32, model_name=MODEL,
                         seed=5)
    arrays = []
    for path in table.column("image_path").to_pylist():
        buffer = io.BytesIO()
        np.save(buffer, image_pixels(preprocess_key(VIT_B_32))(decode_image({"image_path": path})))
        arrays.append(buffer.getvalue())
    rows = table.drop_columns(["image_path", "image_bytes"])
    from_pixels = HeldOut(pixel_rows(rows, arrays, preprocess_key(VIT_B_32), MODEL, "test"),
                          sampling=sampling, preprocess_cfg=VIT_B_32, model_name=MODEL, seed=5)
    for name in ("image", "caption", "negatives", "valid"):
        assert np.array_equal(getattr(from_pixels, name), getattr(from_files, name)), name
    assert from_pixels.image.dtype == np.float32 and len(from_pixels) == 6


def test_the_world_is_written_once_per_storage_root_and_config(ray_session, tmp_path):
    """The demo's warm start (layout) and pretraining (image foils) read one world: one
    folder, with the foil candidates, written by the first and read by the second; another
    world, split or storage root is its own."""
    data = DataConfig(world=WorldConfig(num_train=24, num_val=8, num_test=8, image_size=32))
    cfg = {"size": 32, "mean": OPENAI_MEAN, "std": OPENAI_STD}
    common = {"seed": 0, "preprocess_cfg": cfg, "model_name": MODEL,
              "storage_root": str(tmp_path / "runs")}
    first = source_shards(data, **common)
    again = source_shards(data.model_copy(), image_foils=True, **common)
    assert not first.reused and again.reused and again.uri == first.uri
    assert first.uri.startswith(str(tmp_path / "runs" / "world_shards"))
    assert [shard.rows for shard in plan_shards(first.data(data))] == [24]
    other = data.model_copy(update={"world": data.world.model_copy(update={"seed": 7})})
    assert source_shards(other, **common).uri != first.uri
    val = source_shards(data.model_copy(update={"split": "val"}), **common)
    assert val.uri != first.uri and sum(s.rows for s in plan_shards(val.data(data))) == 8
    elsewhere = source_shards(data, **{**common, "storage_root": str(tmp_path / "other")})
    assert not elsewhere.reused


@pytest.mark.parametrize("val_ratio", [0.0, 0.25])
def test_training_runs_on_a_units_table_through_its_shards(ray_session, tmp_path, val_ratio):
    """A run on a units table: written once as shards beside it, trained on as shards (no
    global shuffle), with held-out rows scored from the shards' pixels."""
    from csclip.train.loop import run

    world = WorldConfig(image_size=32)
    units = tmp_path / "out" / "units.parquet"
    units.parent.mkdir()
    write_units([world_record(world, "train", i) for i in range(16)], str(units))
    config = load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", f"data.units_uri={units}",
        "data.batch_size=4", "data.shuffle_buffer=0", f"data.val_ratio={val_ratio}",
        "optim.max_steps=3", "optim.warmup_steps=1", "run.checkpoint_every=3",
        *(["run.best_metric=contrastive_accuracy"] if val_ratio else []),
        f"run.storage_path={tmp_path / 'runs'}", "tracking.enabled=false"])
    result = run(config)
    assert result.metrics["step"] == 3 and np.isfinite(result.metrics["loss"])
    assert result.metrics["num_rows"] == (16 if not val_ratio else 12)
    (folder,) = (tmp_path / "out" / "train_shards").iterdir()
    assert (folder / "_complete.json").exists()
    if val_ratio:  # the 4 held-out rows scored from the shards' pixels
        best = json.loads((tmp_path / "runs" / result.run_name / "best" / "metrics.json"
                           ).read_text())
        assert best["metric"] == "contrastive_accuracy" and 0.0 <= best["value"] <= 100.0


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
