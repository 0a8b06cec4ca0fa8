"""The training input at the paper's resolution (224 px, COCO-sized JPEGs): csclip's shards
of JPEGs decoded every epoch and its shards of pixels against the decode+transform limit
and open_clip's DataLoader.

    python benchmarks/bench_datapath.py [--images 1024] [--repeats 3] [--quick] [--write-docs]

Makes COCO-like JPEGs here (smooth gradients, shapes and fine texture like a photograph,
not noise; 640x480 and 480x640, quality 90), one caption per image with two entities and
a relation with foils, and measures, interleaved in one process after a warm-up of each,
the CPU seconds of the whole process tree (this process, its DataLoader workers, and Ray's
workers, raylet and GCS) and the wall time of one pass over every image:

- limit: one loop, PIL decode + open_clip's eval transform (ViT-B/32, 224 px) to a tensor;
- draft limit: the same after PIL's JPEG draft mode (decode at 1/2 size; another tensor);
- csclip JPEG shards: the units table written once as shards of its JPEG files
  (csclip.train.source_shards, encoding original: what data.augment trains on, read
  here without augment, so with the eval transform as the other paths), an epoch of
  csclip.train.shards.shard_datasets decoding and transforming every image, as a Train
  worker consumes it (Ray Data, its scheduling loop paced as in the worker
  (csclip.train.pace), iter_torch_batches of 64 with the default local shuffle buffer of
  512; CS-CLIP's columns: caption, caption negative, two unit slots with their foils), and
  the same with plain CLIP's columns (the caption's tokens only: open_clip's CsvDataset's
  work); the epoch ships the transform's uint8 pixels and the consumer normalises them
  (ImageNormalizer, on the CPU here, on the GPU in training), as for the pixel shards;
  and an epoch of 64 other images, whose cost against the full epoch's splits this path's
  CPU into a fixed part per epoch and a part per image (the at-scale ratio);
- open_clip 1w / 2w: open_clip_train's CsvDataset in a torch DataLoader (batch 64,
  shuffled, 1 or 2 workers); the class itself when open_clip_train.data imports (it needs
  webdataset and braceexpand), otherwise the same four lines here;
- csclip pixel shards: the table's shards of uint8 pixels (csclip.train.source_shards,
  encoding pixels: what training on a units table reads without data.augment), written
  once, read by every epoch and shipped to the consumer, which normalises them (on the CPU
  here, on the GPU in training), four epochs in a row per timed sample (its epoch is short
  and Ray's background ticks would make one epoch's figure a coin toss).

Writing each kind of shards is timed apart, once. The last line is `csclip/open_clip CPU
ratio X.XX, pixels/JPEG ratio Y.YY`: images per CPU-second of csclip's JPEG shards over
open_clip's better DataLoader, and of the pixel shards over the JPEG shards. Until 97914b4
made training one shard path, the first was csclip's streamed path (the units table
decoded every epoch, csclip.train.stream.epoch_datasets) and the second its `prepared`
path. The machine is shared: compare ratios, not absolute rates.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfdoc import publish  # noqa: E402

HEADING = "## The training input at 224 px (benchmarks/bench_datapath.py)"
# ViT-B/32's eval transform, as open_clip's get_model_preprocess_cfg gives it.
PREPROCESS = {"size": 224, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
              "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic",
              "resize_mode": "shortest", "fill_color": 0}
MODEL = "ViT-B-32"  # its tokenizer (context length 77)
BATCH = 64
PIXEL_EPOCHS = 4  # epochs per timed sample of the pixel shards (see main)
SMALL_EPOCH = 64  # images in the JPEG shards' small epoch (their fixed per-epoch cost)
JPEG, PIXELS = "csclip JPEG shards", "csclip pixel shards"


def photo(width: int, height: int, seed: int):
    """A PIL image like a photograph: smooth gradients and lighting, a few shapes with
    edges, fine texture (what a JPEG encoder and a bicubic resize see in COCO)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = _grid(height, width)
    tilt = rng.uniform(-1, 1, 3)
    pixels = np.stack([120 + 90 * tilt[c] * (x / width - 0.5) + 60 * np.sin(y / rng.uniform(40, 120))
                       for c in range(3)], axis=-1)
    for _ in range(int(rng.integers(4, 9))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(15, width / 4), rng.uniform(15, height / 4)
        top, bottom = int(max(0, cy - ry)), int(min(height, cy + ry + 1))
        left, right = int(max(0, cx - rx)), int(min(width, cx + rx + 1))
        box_y, box_x = y[top:bottom, left:right], x[top:bottom, left:right]
        inside = ((box_x - cx) / rx) ** 2 + ((box_y - cy) / ry) ** 2 < 1
        shade = 0.6 + 0.4 * (box_y - cy) / (2 * ry)
        pixels[top:bottom, left:right][inside] = rng.uniform(0, 255, 3) * shade[inside][:, None]
    # Fine detail (foliage, fabric, grain) at two scales, cut at a random place from one
    # field made once: COCO's JPEGs average ~160 KB.
    grain = _grain()
    dy, dx = rng.integers(0, grain.shape[0] - height), rng.integers(0, grain.shape[1] - width)
    pixels += grain[dy:dy + height, dx:dx + width]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


@functools.lru_cache(maxsize=2)
def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.mgrid[0:height, 0:width].astype(np.float32))


@functools.lru_cache(maxsize=1)
def _grain(size: int = 900) -> np.ndarray:
    rng = np.random.default_rng(12345)
    coarse = rng.normal(0, 1, (size // 2, size // 2, 3)).repeat(2, 0).repeat(2, 1)
    return (18 * coarse + rng.normal(0, 7, (size, size, 3))).astype(np.float32)


def make_data(folder: Path, num_images: int) -> tuple[str, str]:
    """JPEGs, a units table naming them and open_clip's CSV of the same: (units, csv)."""
    from csclip.units import ChangeType, Foil, Unit, UnitsRecord, write_units

    names = ["dog", "cat", "horse", "man", "woman", "bus", "car", "table", "pizza", "kite"]
    records, lines = [], ["filepath\ttitle"]
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for index in range(num_images):
        path = folder / "images" / f"{index:06d}.jpg"
        width, height = (640, 480) if index % 2 == 0 else (480, 640)
        photo(width, height, index).save(path, "JPEG", quality=90)
        a, b = names[index % 10], names[(index * 3 + 1) % 10]
        caption = f"a {a} next to a {b} in a photo number {index}"
        entities = (Unit("entity", f"a {a}", (Foil(f"a {b}", ChangeType.OBJECT_CHANGE),)),
                    Unit("entity", f"a {b}", (Foil(f"a {a}", ChangeType.OBJECT_CHANGE),)))
        relation = Unit("relation", f"a {a} next to a {b}",
                        (Foil(f"a {b} next to a {a}", ChangeType.SUBJECT_OBJECT_SWAP),), a, "next to", b)
        records.append(UnitsRecord(f"s{index:06d}", f"i{index:06d}", caption, "train",
                                   entities, (relation,), image_path=str(path)))
        lines.append(f"{path}\t{caption}")
    units = folder / "units" / "part-0.parquet"
    units.parent.mkdir(exist_ok=True)
    write_units(records, str(units))
    csv = folder / "train.csv"
    csv.write_text("\n".join(lines) + "\n")
    return str(units.parent), str(csv)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_table() -> tuple[dict[int, int], dict[int, float]]:
    """Every live process's parent and CPU seconds (user + system), from /proc."""
    parent, times = {}, {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while listed
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return parent, times


class ProcessTreeCpu:
    """CPU seconds (user + system) of this process and every descendant: live ones read
    from /proc (Ray's workers are the raylet's children), reaped children through
    getrusage (DataLoader workers that ended)."""

    def _live(self) -> dict[int, float]:
        parent, times = process_table()
        tree, frontier = {os.getpid()}, [os.getpid()]
        while frontier:
            current = frontier.pop()
            children = [pid for pid, ppid in parent.items() if ppid == current]
            tree.update(children)
            frontier.extend(children)
        return {pid: times[pid] for pid in tree if pid in times}

    def snapshot(self) -> tuple[dict[int, float], float]:
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        return self._live(), reaped.ru_utime + reaped.ru_stime

    def since(self, start: tuple[dict[int, float], float]) -> float:
        live, reaped = self.snapshot()
        before, reaped_before = start
        return sum(t - before.get(pid, 0.0) for pid, t in live.items()) + reaped - reaped_before


def limit_pass(paths: list[str], draft: bool) -> Callable[[], int]:
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from PIL import Image

    transform = image_transform_v2(PreprocessCfg(**PREPROCESS), is_train=False)

    def run() -> int:
        for path in paths:
            image = Image.open(path)
            if draft:
                image.draft("RGB", (image.size[0] // 2, image.size[1] // 2))
            transform(image.convert("RGB"))
        return len(paths)
    return run


def draft_difference(paths: list[str]) -> float:
    """The largest difference draft mode makes to a normalised tensor (first 16 images)."""
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from PIL import Image

    transform = image_transform_v2(PreprocessCfg(**PREPROCESS), is_train=False)
    worst = 0.0
    for path in paths[:16]:
        full = transform(Image.open(path).convert("RGB"))
        image = Image.open(path)
        image.draft("RGB", (image.size[0] // 2, image.size[1] // 2))
        worst = max(worst, float((transform(image.convert("RGB")) - full).abs().max()))
    return worst


class CsvDataset:
    """open_clip_train.data.CsvDataset, line for line (its module needs webdataset)."""

    def __init__(self, input_filename, transforms, img_key, caption_key, sep="\t",
                 tokenizer=None):
        import pandas as pd

        df = pd.read_csv(input_filename, sep=sep)
        self.images, self.captions = df[img_key].tolist(), df[caption_key].tolist()
        self.transforms, self.tokenize = transforms, tokenizer

    def __len__(self):
        return len(self.captions)

    def __getitem__(self, idx):
        from PIL import Image

        images = self.transforms(Image.open(str(self.images[idx])))
        texts = self.tokenize([str(self.captions[idx])])[0]
        return images, texts


def open_clip_loader(csv: str, workers: int):
    """open_clip_train's get_csv_dataset DataLoader (shuffled, drop_last, batch 64); the
    workers persist across passes and start by spawn (this process runs Ray's threads)."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2
    from torch.utils.data import DataLoader

    try:
        from open_clip_train.data import CsvDataset as Dataset
        source = "open_clip_train.data.CsvDataset"
    except ImportError:
        Dataset, source = CsvDataset, "its CsvDataset's four lines (open_clip_train.data " \
            "needs webdataset)"
    transform = image_transform_v2(PreprocessCfg(**PREPROCESS), is_train=False)
    dataset = Dataset(csv, transform, img_key="filepath", caption_key="title",
                      tokenizer=open_clip.get_tokenizer(MODEL))
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                        drop_last=True, persistent_workers=True,
                        multiprocessing_context="spawn")

    def run() -> int:
        return sum(len(images) for images, _ in loader)
    return run, source


def shard_data(units: str, encoding: str):
    """The units table written once as shards (csclip.train.source_shards) of its JPEG
    files (encoding original, as data.augment writes them) or of uint8 pixels, and the
    DataConfig reading them without augment (so with the eval transform)."""
    from csclip.config.train import DataConfig
    from csclip.train.source_shards import source_shards

    data = DataConfig(units_uri=units, batch_size=BATCH)
    written = source_shards(data.model_copy(update={"augment": encoding == "original"}),
                            seed=0, preprocess_cfg=PREPROCESS, model_name=MODEL)
    return written.data(data)


def csclip_pass(data, method: str = "csclip") -> Callable[[], int]:
    """One epoch of csclip's training data read from `data`'s shards (shard_data),
    consumed as a worker does; `method` clip makes only the caption's tokens (open_clip's
    CsvDataset's work), csclip all of CS-CLIP's. Shards of JPEGs are decoded and
    transformed every epoch, shards of pixels only read."""
    from csclip.config.loss import LossConfig
    from csclip.config.train import SamplingConfig
    from csclip.loss import objective_for
    from csclip.train.prepared import ImageNormalizer
    from csclip.train.shards import plan_shards, shard_datasets

    objective = objective_for(LossConfig(method=method), 2)
    epoch = {"count": 0}
    worker = ImageNormalizer(PREPROCESS, "cpu")  # the epochs' uint8 pixels, as loop.py does
    shards = plan_shards(data)
    num_rows = sum(shard.rows for shard in shards)

    def run() -> int:
        dataset = shard_datasets(shards, data=data, sampling=SamplingConfig(),
                                 preprocess_cfg=PREPROCESS, model_name=MODEL,
                                 seed=epoch["count"], num_epochs=1,
                                 steps_per_epoch=num_rows // BATCH, num_workers=1,
                                 objective=objective,
                                 dataset_name=lambda epoch, rank: "epoch")["epoch"]
        epoch["count"] += 1
        return sum(len(worker(batch)["image"]) for batch in dataset.iter_torch_batches(
            batch_size=BATCH, local_shuffle_buffer_size=512))
    return run


def timed_write(cpu: ProcessTreeCpu, units: str, encoding: str) -> tuple[object, float, float]:
    """shard_data, with its CPU seconds (the process tree's) and wall seconds."""
    mark, wall = cpu.snapshot(), time.perf_counter()
    data = shard_data(units, encoding)
    seconds, cpu_seconds = time.perf_counter() - wall, cpu.since(mark)
    print(f"written once as shards ({encoding}): {cpu_seconds:.1f} CPU-s, {seconds:.1f} s wall",
          flush=True)
    return data, cpu_seconds, seconds


def _epochs(run: Callable[[], int], epochs: int) -> Callable[[], int]:
    """`run` `epochs` times in a row, as one sample: the images of all of them."""
    return lambda: sum(run() for _ in range(epochs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="512 images, 3 repeats (< 5 min)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 512, 3
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    import torch

    torch.set_num_threads(1)  # a data task's transform runs on one thread, as in Ray Data
    folder = Path(tempfile.mkdtemp(prefix="csclip-bench-datapath-"))
    started = time.perf_counter()
    units, csv = make_data(folder, args.images)
    small_units, _ = make_data(folder / "small", SMALL_EPOCH)
    paths = sorted(str(p) for p in (folder / "images").glob("*.jpg"))
    jpeg_kb = statistics.mean(Path(p).stat().st_size for p in paths) / 1024
    print(f"{args.images} JPEGs ({jpeg_kb:.0f} KB each) made in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=600 * 1024**2, log_to_driver=False, configure_logging=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    from csclip.train.pace import pace_ray_data

    pace_ray_data()  # this process consumes the stream as a Train worker, which paces Ray Data
    cpu = ProcessTreeCpu()
    jpeg_data, jpeg_cpu, jpeg_wall = timed_write(cpu, units, "original")
    pixel_data, pixel_cpu, pixel_wall = timed_write(cpu, units, "pixels")
    small_data = shard_data(small_units, "original")
    open_clip_1, loader_source = open_clip_loader(csv, 1)
    open_clip_2, _ = open_clip_loader(csv, 2)
    variants: dict[str, Callable[[], int]] = {
        "limit": limit_pass(paths, draft=False), "draft limit": limit_pass(paths, draft=True),
        JPEG: csclip_pass(jpeg_data),
        f"{JPEG}, CLIP columns": csclip_pass(jpeg_data, method="clip"),
        f"{JPEG}, {SMALL_EPOCH}-image epoch": csclip_pass(small_data),
        "open_clip 1w": open_clip_1, "open_clip 2w": open_clip_2,
        PIXELS: csclip_pass(pixel_data)}
    # An epoch of pixels takes a quarter of a decoded one's wall time. Ray's background work
    # (its stats and autoscaler actors' ticks, the dashboard agent: ~0.07 CPU-s a second
    # here) comes in bursts of up to 0.4 CPU-s, which a 0.5 s window either catches or
    # not (an epoch of pixels measured 1.0 to 2.4 CPU ms per image in one session). So a
    # sample of the pixel shards is PIXEL_EPOCHS epochs in a row, as training reads
    # them, and every rate below is per image-epoch.
    variants[PIXELS] = _epochs(variants[PIXELS], PIXEL_EPOCHS)
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
    for name, run in variants.items():  # warm-up: workers started, caches filled
        if "limit" not in name:
            run()
    for repeat in range(args.repeats):
        for name, run in variants.items():
            mark, wall = cpu.snapshot(), time.perf_counter()
            count = run()
            results[name].append((cpu.since(mark), time.perf_counter() - wall, count))
            assert count >= (SMALL_EPOCH if "image epoch" in name else args.images - BATCH), \
                (name, count)
        print(f"repeat {repeat + 1}/{args.repeats} done, load {os.getloadavg()[0]:.1f}; CPU ms "
              "per image: " + ", ".join(f"{name} {1000 * c / n:.1f}" for name, (c, _, n) in
                                        ((k, r[-1]) for k, r in results.items())), flush=True)
    ray.shutdown()
    load = os.getloadavg()
    # Images per CPU-second (and per second): the median sample's, each over its own
    # count (a DataLoader drops its last partial batch, a pixel sample is 4 epochs).
    per_cpu = {n: statistics.median(k / c for c, _, k in r) for n, r in results.items()}
    per_wall = {n: statistics.median(k / w for _, w, k in r) for n, r in results.items()}
    best_open_clip = max(per_cpu["open_clip 1w"], per_cpu["open_clip 2w"])
    csclip_ratio = per_cpu[JPEG] / best_open_clip
    pixels_ratio = per_cpu[PIXELS] / per_cpu[JPEG]
    same_work_ratio = per_cpu[f"{JPEG}, CLIP columns"] / best_open_clip
    # An epoch of the JPEG shards costs fixed + n * marginal CPU-s: two epoch sizes give both.
    # At COCO's 590k rows an epoch's fixed part is nothing; the marginal cost is what a
    # node's CPUs pay per image there (docs/cluster.md).
    full_epoch = statistics.median(c for c, _, _ in results[JPEG])
    small_epoch = statistics.median(c for c, _, _ in
                                    results[f"{JPEG}, {SMALL_EPOCH}-image epoch"])
    marginal = (full_epoch - small_epoch) / (args.images - SMALL_EPOCH)
    fixed = small_epoch - SMALL_EPOCH * marginal
    at_scale_ratio = 1 / marginal / best_open_clip
    rows = "".join(
        f"| {name} | {per_cpu[name]:.0f} | {per_wall[name]:.0f} | "
        f"{per_cpu[name] / per_cpu['limit']:.2f} | {1000 / per_cpu[name]:.1f} |\n"
        for name in variants)
    section = (
        f"{HEADING}\n\n"
        f"Command: `python benchmarks/bench_datapath.py --images {args.images} --repeats "
        f"{args.repeats}{' --quick' if args.quick else ''} --write-docs` ({platform.machine()}, "
        f"{os.cpu_count()} cores shared with other work: load average {load[0]:.1f} / "
        f"{load[1]:.1f} at the end; {args.images} JPEGs of {jpeg_kb:.0f} KB, 640x480 and "
        "480x640, quality 90; ViT-B/32's eval transform, 224 px; one Ray session with "
        f"2 CPUs; median of {args.repeats} interleaved samples after a warm-up, a sample one "
        f"epoch, the pixel shards' {PIXEL_EPOCHS} in a row).\n\n"
        "| path | images / CPU-s | images / s (wall) | vs the limit (CPU) | CPU ms / image |\n"
        "|---|---:|---:|---:|---:|\n" + rows +
        f"\nCPU is the whole process tree's (Ray's workers, raylet and GCS included). "
        f"With the same text work as open_clip's loader (CLIP columns), csclip/open_clip "
        f"is {same_work_ratio:.2f}; the ratio below is CS-CLIP's columns. "
        f"An epoch of the JPEG shards costs {fixed:.2f} CPU-s of its own (the datasets, the "
        f"units' read, the tasks: from the {SMALL_EPOCH}-image epoch) and "
        f"{1000 * marginal:.1f} CPU ms per image beyond it: at scale, where the epoch's own "
        f"cost is spread over every image, csclip/open_clip is {at_scale_ratio:.2f}. "
        f"open_clip: {loader_source}. Draft mode changes the tensor (up to "
        f"{draft_difference(paths):.2f} after normalisation), so csclip does not use it. "
        "Writing the table once as shards (csclip.train.source_shards) took, of its JPEG "
        f"files, {jpeg_cpu:.1f} CPU-s ({1000 * jpeg_cpu / args.images:.1f} CPU ms per "
        f"image), {jpeg_wall:.1f} s wall; of pixels, {pixel_cpu:.1f} CPU-s "
        f"({1000 * pixel_cpu / args.images:.1f} CPU ms per image), {pixel_wall:.1f} s wall; "
        "every epoch after it reads the pixels.\n\n"
        f"csclip/open_clip CPU ratio {csclip_ratio:.2f}, pixels/JPEG ratio "
        f"{pixels_ratio:.2f}\n")
    publish(HEADING, section, args.write_docs)
    print(f"csclip/open_clip CPU ratio {csclip_ratio:.2f}, pixels/JPEG ratio "
          f"{pixels_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
