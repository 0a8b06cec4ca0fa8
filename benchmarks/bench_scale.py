"""Training from webdataset shards at 10, 100 and 1000 shards: the driver's memory and
time to the first batch, CPU per sample, and csclip against open_clip_train's own
webdataset pipeline over the same shards.

    python benchmarks/bench_scale.py --quick [--units-bytes] [--out rows.csv] [--write-docs]
    python benchmarks/bench_scale.py [--samples-per-shard 64] [--repeats 2] [--group-shards 1]

The synthetic world (csclip-tiny at 32 px: tiny PNGs, so that the per-sample and per-shard
overheads show, not the decoding) is written as 10, 100 and 1000 shards of the same
number of samples each (--quick: 32; --samples-per-shard), with the units output
`csclip extract --format webdataset` writes (tests/shard_helpers.write_world_shards, the
webdataset package's TarWriter). data.shard_buffer is --group-shards shards' samples:
by default a group is one shard, as LAION's 10,000-sample shards are under the default
shard_buffer of 10,000. Every set is written `repeats` times from different world seeds,
so that each timed epoch reads captions no process has tokenized yet, as every sample of
a LAION epoch is (csclip's tokenizer remembers the texts it has seen, and Ray keeps its
worker processes from one epoch to the next).

- Driver: in a fresh process per shard count (joining this run's Ray instance, so that
  the peaks do not mix), csclip.train.loop._shard_training plans the run (plan_shards
  reads every shard's _done marker) and builds the epoch's dataset, then the first batch
  of epoch 0 is pulled (`next(iter(dataset.iter_batches(...)))`). Reported: the peak RSS
  growth over the RSS after the imports and ray.init (the kernel's high-water mark,
  reset through /proc/self/clear_refs at that baseline), the growth after planning, and
  the seconds from the start of planning to the first batch. Separately, in this
  process, tracemalloc counts the Python bytes planning keeps per shard (the TrainShard
  list and one epoch's group items).
- CPU per sample: one epoch of every set through csclip's pipeline, consumed as a Train
  worker consumes it (iter_torch_batches with the training loop's batch_options, the
  uint8 images normalised on the CPU by ImageNormalizer, as on the GPU in training),
  with loss.method clip: image + caption tokens, the columns open_clip's pipeline makes.
  CPU is user + system seconds, read from /proc, of every process under this one (this
  driver, and Ray's GCS, raylet, agents and worker processes: the workers are the
  raylet's children), the open_clip process's tree left out; so Ray's own background
  work counts against csclip. Planning is left out (once per run, measured above).
- open_clip: open_clip_train.data.get_wds_dataset over the same shards and sample count
  (dataset_resampled False, seed 0, the same batch size; 0, 1 and 2 DataLoader workers),
  with open_clip's eval transform of csclip-tiny at 32 px and open_clip.get_tokenizer, in
  a process of its own without Ray (its DataLoader workers fork, which a Ray driver must
  not), measuring its own process tree the same way. The two alternate, set by set.
- Where the CPU goes, in this process on one core: each step per sample (PNG decode,
  either side's transform, tokenizing) and csclip's read task alone (read_group +
  sample_batch, no Ray) on three layouts, which give its fixed cost per group.
- --units-bytes: the units parquet's bytes per sample of real (COCO) captions, from
  `csclip extract --backend rules --format webdataset` (docs/cluster.md's LAION arithmetic).

The last line is `driver MB at 10/100/1000 shards: A/B/C; first batch s: D/E/F;
csclip/open_clip webdataset CPU ratio X`: X is samples per CPU-second of csclip's epoch
over open_clip's with its better DataLoader (1 or 2 workers: how it trains), on the
largest set, the median of the repeats.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import io
import json
import logging
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
# Ray reads RAY_AUTH_MODE at import; the tests' conftest sets the same two.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import open_clip  # noqa: E402
import open_clip_train.data as open_clip_data  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from bench_datapath import process_table  # noqa: E402
from open_clip.transform import PreprocessCfg, image_transform_v2  # noqa: E402
from perfdoc import publish  # noqa: E402
from PIL import Image  # noqa: E402
from ray.data import DataContext  # noqa: E402
from shard_helpers import write_world_shards  # noqa: E402

from csclip.config import load_config  # noqa: E402
from csclip.config.extract import InputConfig  # noqa: E402
from csclip.config.train import TrainConfig  # noqa: E402
from csclip.config.world import WorldConfig  # noqa: E402
from csclip.extract.captions import caption_table  # noqa: E402
from csclip.model import spec_from_config  # noqa: E402
from csclip.model_configs import register_small_models  # noqa: E402
from csclip.preprocess import image_normalize, image_pixels, tokenizer  # noqa: E402
from csclip.train.global_batch import shard_name  # noqa: E402
from csclip.train.loop import _shard_training, batch_options, step_options  # noqa: E402
from csclip.train.prepared import ImageNormalizer  # noqa: E402
from csclip.train.shards import (  # noqa: E402
    epoch_groups,
    group_items,
    plan_shards,
    read_group,
)
from csclip.train.stream import image_shape, preprocess_key, sample_batch  # noqa: E402
from csclip.world import iter_world  # noqa: E402

HEADING = "## Scale: shards (benchmarks/bench_scale.py)"
MODEL, IMAGE_SIZE = "csclip-tiny", 32
BATCH = 32
OPEN_CLIP_WORKERS = (0, 1, 2)
SUGARCREPE = ROOT.parent / "shared" / "data" / "sugarcrepe"
# Ray Data's summary line of the read operator (fused with sample_batch): its task count.
READ_TASKS = re.compile(r"MapBatches\(group_task\)\S*: (\d+) tasks executed")


@dataclass(frozen=True)
class ShardSet:
    """One written set: `count` shards of `per_shard` world samples, with its units."""

    count: int
    copy: int
    per_shard: int
    pattern: str
    units: str

    @property
    def samples(self) -> int:
        return self.count * self.per_shard


@dataclass(frozen=True)
class EpochCost:
    """One epoch of one pipeline: CPU and wall seconds, samples delivered, and (csclip)
    the read tasks Ray Data ran."""

    cpu_s: float
    wall_s: float
    samples: int
    read_tasks: int | None = None

    @property
    def cpu_ms_per_sample(self) -> float:
        return 1000 * self.cpu_s / self.samples


class TreeCpu:
    """CPU seconds (user + system, from /proc) of a process and all its descendants, the
    subtrees of `exclude` left out. A process that ends between two snapshots loses its
    share (none does here: Ray's workers and the DataLoader's live through a pass)."""

    def __init__(self, root: int | None = None, exclude: tuple[int, ...] = ()) -> None:
        self.root = root or os.getpid()
        self.exclude = set(exclude)

    def snapshot(self) -> dict[int, float]:
        parent, times = process_table()
        children: dict[int, list[int]] = {}
        for pid, ppid in parent.items():
            children.setdefault(ppid, []).append(pid)
        tree, frontier = {self.root}, [self.root]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in self.exclude:
                    tree.add(child)
                    frontier.append(child)
        return {pid: times[pid] for pid in tree if pid in times}

    def since(self, start: dict[int, float]) -> float:
        now = self.snapshot()
        return sum(t - start.get(pid, 0.0) for pid, t in now.items())


# ---------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------

def write_sets(root: Path, counts: list[int], per_shard: int, copies: int, first_seed: int = 1
               ) -> dict[tuple[int, int], ShardSet]:
    """Every (copy, count) set, each from a world seed of its own (no caption repeats
    across sets but by chance)."""
    sets = {}
    for copy in range(copies):
        for index, count in enumerate(counts):
            seed = first_seed + copy * len(counts) + index
            world = WorldConfig(seed=seed, num_train=count * per_shard, num_val=0, num_test=0,
                                image_size=IMAGE_SIZE)
            pattern, units = write_world_shards(root / f"seed{seed}-{count}", world, count)
            sets[copy, count] = ShardSet(count, copy, per_shard, pattern, units)
    return sets


def train_config(shard_set: ShardSet, group_shards: int) -> TrainConfig:
    """A plain-CLIP run on `shard_set` (image + caption tokens: open_clip's columns), one
    epoch, groups of `group_shards` shards."""
    return load_config(TrainConfig, None, [
        f"model.name={MODEL}", f"model.image_size={IMAGE_SIZE}", "loss.method=clip",
        f"data.shards={shard_set.pattern}", f"data.units_uri={shard_set.units}",
        f"data.shard_buffer={group_shards * shard_set.per_shard}", f"data.batch_size={BATCH}",
        "optim.epochs=1", "tracking.enabled=false"])


@functools.cache
def preprocess_cfg() -> dict:
    """csclip-tiny's eval transform at 32 px, as csclip.model gives it to both sides."""
    return spec_from_config(load_config(TrainConfig, None, [
        f"model.name={MODEL}", f"model.image_size={IMAGE_SIZE}"]).model).preprocess_cfg


@functools.cache
def open_clip_preprocess() -> tuple:
    """open_clip's eval transform of csclip-tiny at 32 px and its tokenizer."""
    register_small_models()
    return (image_transform_v2(PreprocessCfg(**preprocess_cfg()), is_train=False),
            open_clip.get_tokenizer(MODEL))


def quiet_ray_data() -> None:
    """Ray Data's INFO lines (each execution's start and end) off the console."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    DataContext.get_current().enable_progress_bars = False


# ---------------------------------------------------------------------------------------
# The driver: memory and time to the first batch (a process per shard count)
# ---------------------------------------------------------------------------------------

STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssShmem")


def _status_kb() -> dict[str, int]:
    """This process's STATUS_FIELDS (kB) from /proc/self/status."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in STATUS_FIELDS:
            found[name] = int(value.split()[0])
    return found


class PeakSampler:
    """/proc/self/status every 5 ms in a thread: the fields at the largest VmRSS seen
    (the kernel's VmHWM has the peak's size but not what it was made of)."""

    def __init__(self) -> None:
        self._peak = _status_kb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.005):
            now = _status_kb()
            if now["VmRSS"] > self._peak["VmRSS"]:
                self._peak = now

    def stop(self) -> dict[str, int]:
        self._done.set()
        self._thread.join()
        return self._peak


def probe_driver(shard_set: ShardSet, group_shards: int, address: str) -> dict:
    """Run in a fresh process: plan, build the epoch's dataset and pull epoch 0's first
    batch (rank 0) as a run's driver and worker do. The peak RSS growth (MB) over the RSS
    after the imports and ray.init, the growth after planning, and the seconds from the
    start of planning to the end of planning and to the first batch."""
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    quiet_ray_data()
    config = train_config(shard_set, group_shards)
    spec = spec_from_config(config.model)
    objective = step_options(config).objective
    gc.collect()
    baseline = _status_kb()
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
    sampler = PeakSampler()
    started = time.perf_counter()
    plan, datasets, _, _ = _shard_training(config, config.data, spec, objective)
    planned_s = time.perf_counter() - started
    planned_kb = _status_kb()["VmRSS"]
    dataset = datasets[shard_name(0, 0, config.data.batch_scope)]
    batch = next(iter(dataset.iter_batches(batch_size=BATCH)))
    first_batch_s = time.perf_counter() - started
    peak_kb = _status_kb()["VmHWM"]
    at_peak = sampler.stop()
    baseline_kb = baseline["VmRSS"]
    if len(batch["image"]) != BATCH:
        raise RuntimeError(f"the first batch holds {len(batch['image'])} rows, not {BATCH}")
    return {"shards": shard_set.count, "rows": plan.num_rows,
            "driver_peak_mb": (peak_kb - baseline_kb) / 1024,
            "driver_planned_mb": (planned_kb - baseline_kb) / 1024,
            "planning_s": planned_s, "first_batch_s": first_batch_s,
            "baseline_mb": baseline_kb / 1024,
            # Mapped object-store pages (the blocks this process read) vs its own heap.
            "shm_at_peak_mb": (at_peak["RssShmem"] - baseline["RssShmem"]) / 1024,
            "anon_at_peak_mb": (at_peak["RssAnon"] - baseline["RssAnon"]) / 1024}


def run_probe(shard_set: ShardSet, group_shards: int, address: str) -> dict:
    """probe_driver in a fresh Python process: its result."""
    request = {"set": {name: getattr(shard_set, name)
                       for name in ("count", "copy", "per_shard", "pattern", "units")},
               "group_shards": group_shards, "address": address}
    done = subprocess.run([sys.executable, __file__, "--probe", json.dumps(request)],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"the driver probe failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def planning_bytes(shard_set: ShardSet, group_shards: int) -> float:
    """Python bytes planning keeps per shard: the TrainShard list (plan_shards) and one
    epoch's group items (what shard_datasets hands Ray Data, for every epoch)."""
    data = train_config(shard_set, group_shards).data
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    shards = plan_shards(data)
    items = group_items(epoch_groups(shards, 0, 0, data.shard_buffer))
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    if len(shards) != shard_set.count or not items:
        raise RuntimeError(f"planned {len(shards)} shards of {shard_set.count}")
    return kept / shard_set.count


# ---------------------------------------------------------------------------------------
# CPU per sample: csclip in this process, open_clip in a process of its own
# ---------------------------------------------------------------------------------------

def csclip_epoch(shard_set: ShardSet, group_shards: int, cpu: TreeCpu) -> EpochCost:
    """One epoch of `shard_set` through csclip's pipeline, consumed as a Train worker
    consumes it; planning is left out (once per run)."""
    config = train_config(shard_set, group_shards)
    spec = spec_from_config(config.model)
    _, datasets, _, _ = _shard_training(config, config.data, spec, step_options(config).objective)
    dataset = datasets[shard_name(0, 0, config.data.batch_scope)]
    normalize = ImageNormalizer(spec.preprocess_cfg, "cpu")
    options = batch_options(config.data, torch.device("cpu"), config.run.seed)
    mark, started = cpu.snapshot(), time.perf_counter()
    samples = 0
    for batch in dataset.iter_torch_batches(**options):
        samples += len(normalize(batch)["image"])
    cpu_s, wall_s = cpu.since(mark), time.perf_counter() - started
    found = READ_TASKS.search(dataset.stats())
    return EpochCost(cpu_s, wall_s, samples, int(found[1]) if found else None)


def open_clip_epoch(request: dict) -> dict:
    """One epoch of open_clip_train's webdataset pipeline over request["pattern"]: its CPU
    seconds (this process and its DataLoader workers), wall seconds and samples."""
    transform, tokenize = open_clip_preprocess()
    args = argparse.Namespace(
        train_data=request["pattern"], val_data=None, dataset_resampled=False,
        train_num_samples=request["samples"], train_data_upsampling_factors=None, seed=0,
        workers=request["workers"], world_size=1, batch_size=BATCH)
    cpu = TreeCpu()
    mark, started = cpu.snapshot(), time.perf_counter()
    info = open_clip_data.get_wds_dataset(args, transform, is_train=True, epoch=0,
                                          tokenizer=tokenize)
    samples = sum(len(images) for images, _ in info.dataloader)
    result = {"cpu_s": cpu.since(mark), "wall_s": time.perf_counter() - started,
              "samples": samples}
    del info  # its persistent workers end with it
    return result


def serve_open_clip() -> None:
    """The open_clip process: an epoch per JSON line read, its cost as a JSON line."""
    # webdataset >= 0.2.96 ends each tar's files with an end-of-shard marker ({}) that
    # open_clip_train 3.3's group_by_keys_nothrow takes for a file and fails on (KeyError
    # 'fname'); eof_value=None is the webdataset maintainers' answer and gives open_clip
    # the stream it was written for. Only this process (no Ray) is patched.
    open_clip_data.tar_file_expander = functools.partial(open_clip_data.tar_file_expander,
                                                         eof_value=None)
    torch.set_num_threads(1)
    for line in sys.stdin:
        print(json.dumps(open_clip_epoch(json.loads(line))), flush=True)


class OpenClipProcess:
    """A Python process without Ray that runs open_clip epochs on request, so that the
    two sides can alternate."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--open-clip-server"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, cwd=ROOT)

    def epoch(self, shard_set: ShardSet, workers: int) -> EpochCost:
        request = {"pattern": shard_set.pattern, "samples": shard_set.samples,
                   "workers": workers}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the open_clip process ended (exit {self.process.wait()})")
        answer = json.loads(line)
        if not answer["samples"]:
            raise RuntimeError(f"open_clip gave no batch of {shard_set.pattern} with "
                               f"{workers} workers (each drops its last partial batch)")
        return EpochCost(answer["cpu_s"], answer["wall_s"], answer["samples"])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def stage_costs(limit: int = 1000) -> dict[str, float]:
    """CPU µs per sample of each step, on one core in this process, over `limit` world
    samples: PNG decode, each side's transform, tokenizing."""
    world = WorldConfig(seed=0, num_train=limit, num_val=0, num_test=0, image_size=IMAGE_SIZE)
    records = list(iter_world(world, splits=("train",)))
    captions = [r.caption for r in records]
    key = preprocess_key(preprocess_cfg())
    open_clip_transform, open_clip_tokenize = open_clip_preprocess()
    pixels, normalize = image_pixels(key), image_normalize(key)

    def timed(work) -> float:
        started = time.process_time()
        work()
        return 1e6 * (time.process_time() - started) / len(records)

    images, arrays = [], []
    costs = {"PNG decode (both)": timed(lambda: images.extend(
        Image.open(io.BytesIO(r.image_bytes)).convert("RGB") for r in records))}
    costs["open_clip transform, to normalised float"] = timed(
        lambda: [open_clip_transform(image) for image in images])
    costs["csclip transform, to uint8"] = timed(
        lambda: arrays.extend(pixels(image) for image in images))
    batch = np.stack(arrays)
    costs["csclip normalise, uint8 to float (the consumer)"] = timed(lambda: normalize(batch))
    costs["open_clip tokenize, a caption a call"] = timed(
        lambda: [open_clip_tokenize(caption)[0] for caption in captions])
    fresh = tokenizer.__wrapped__(MODEL)  # a cache of its own, empty: a new epoch's texts
    costs["csclip tokenize, new texts, a batch a call"] = timed(lambda: fresh(captions))
    costs["csclip tokenize, texts seen before"] = timed(lambda: fresh(captions))
    return costs


def group_costs(root: Path, per_shard: int) -> dict[str, float]:
    """CPU ms per sample of csclip's read task alone, on one core in this process
    (read_group, then sample_batch, as csclip.train.shards.group_task runs them;
    no Ray, no consumer), over 100 x per_shard world samples laid out three ways: shards
    of per_shard samples a shard a group, ten a group, and shards ten times larger a
    shard a group. Also the fixed CPU ms of a group of one shard that the first and the
    last imply (per sample: m + F / per_shard against m + F / (10 x per_shard))."""
    key = preprocess_key(preprocess_cfg())
    layouts = {f"groups of 1 shard of {per_shard}": (per_shard, 1),
               f"groups of 10 shards of {per_shard}": (per_shard, 10),
               f"groups of 1 shard of {10 * per_shard}": (10 * per_shard, 1)}
    costs = {}
    for index, (label, (shard_samples, group_shards)) in enumerate(
            {"warm-up": (per_shard, 1), **layouts}.items()):
        world = WorldConfig(seed=900 + index, num_train=100 * per_shard, num_val=0,
                            num_test=0, image_size=IMAGE_SIZE)
        count = 100 * per_shard // shard_samples
        pattern, units = write_world_shards(root / f"group-costs-{index}", world, count)
        config = train_config(ShardSet(count, 0, shard_samples, pattern, units), group_shards)
        items = group_items(epoch_groups(plan_shards(config.data), 0, 0,
                                         config.data.shard_buffer))
        sample_kwargs = {"sampling": config.sampling.model_dump(mode="json"),
                         "model_name": MODEL, "seed": 0, "epoch": 0, "columns": ["caption"],
                         "image_shape": image_shape(preprocess_cfg()), "preprocess": key,
                         "normalize": False}
        started, samples = time.process_time(), 0
        for item in items:
            rows = read_group(item, seed=0, epoch=0, rank=None,
                              worker_batch=BATCH, num_workers=1, kept_rows=100 * per_shard,
                              preprocess=key, model_name=MODEL)
            for start in range(0, rows.num_rows, 128):
                samples += len(sample_batch(rows.slice(start, 128), **sample_kwargs)["image"])
        costs[label] = 1000 * (time.process_time() - started) / samples
    del costs["warm-up"]  # imports, the tokenizer's vocabulary, pyarrow's first calls
    first, last = costs[f"groups of 1 shard of {per_shard}"], costs[
        f"groups of 1 shard of {10 * per_shard}"]
    costs["fixed CPU ms per group of one shard"] = (first - last) * per_shard * 10 / 9
    return costs


# ---------------------------------------------------------------------------------------
# Units on S3: bytes per sample of a units shard of real captions
# ---------------------------------------------------------------------------------------

def units_bytes(folder: Path) -> dict[str, float]:
    """The distinct SugarCrepe captions (COCO's) as one webdataset shard with a tiny PNG
    each, extracted by `csclip extract --backend rules --format webdataset` (its own local
    Ray): the units parquet's bytes per sample with units."""
    captions = sorted(set(caption_table(InputConfig(format="sugarcrepe", uri=str(SUGARCREPE)))
                          .column("caption").to_pylist()))
    buffer = io.BytesIO()
    Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (200, 30, 30)).save(buffer, "PNG")
    (folder / "shards").mkdir(parents=True)
    with wds.TarWriter(str(folder / "shards" / "00000.tar")) as sink:
        for index, caption in enumerate(captions):
            sink.write({"__key__": f"{index:09d}", "txt": caption, "png": buffer.getvalue()})
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run([str(Path(sys.executable).parent / "csclip"), "extract", "--backend",
                    "rules", "--format", "webdataset", "--input",
                    str(folder / "shards" / "{00000..00000}.tar"),
                    "--out", str(folder / "units_out"), "--no-tracking"],
                   check=True, capture_output=True, env=env, cwd=ROOT)
    marker = folder / "units_out" / "_done" / "00000.json"
    with_units = json.loads(marker.read_text())["with_units"]
    size = (folder / "units_out" / "units" / "00000.parquet").stat().st_size
    return {"captions": len(captions), "with_units": with_units,
            "mean_caption_chars": statistics.mean(len(c) for c in captions),
            "units_bytes": size, "bytes_per_sample": size / with_units,
            "done_marker_bytes": marker.stat().st_size}


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def last_line(counts: list[int], probes: dict[int, dict], ratio: float) -> str:
    """The benchmark's last line (its numbers as docs/performance.md quotes them)."""
    label = "/".join(str(c) for c in counts)
    mb = "/".join(f"{probes[c]['driver_peak_mb']:.1f}" for c in counts)
    seconds = "/".join(f"{probes[c]['first_batch_s']:.1f}" for c in counts)
    return (f"driver MB at {label} shards: {mb}; first batch s: {seconds}; "
            f"csclip/open_clip webdataset CPU ratio {ratio:.2f}")


@dataclass(frozen=True)
class Results:
    """Everything measured, for the table, the CSV and the last line."""

    probes: dict[int, dict]
    epochs: dict[tuple[int, str], list[EpochCost]]
    planning_bytes_per_shard: float
    stages: dict[str, float]
    groups: dict[str, float]
    units: dict | None
    written_s: float
    num_sets: int

    def cpu_ms(self, count: int, variant: str) -> float:
        """The median over the repeats of CPU ms per sample."""
        return statistics.median(e.cpu_ms_per_sample for e in self.epochs[count, variant])

    def ratio(self, count: int, workers: tuple[int, ...] = (1, 2)) -> float:
        """csclip/open_clip in samples per CPU-second, against open_clip's best of
        `workers`."""
        best = min(self.cpu_ms(count, f"open_clip {w}w") for w in workers)
        return best / self.cpu_ms(count, "csclip")

    def rows(self) -> list[dict]:
        rows = [{"measure": name, "shards": count, "variant": "csclip driver", "repeat": 0,
                 "value": probe[name]} for count, probe in self.probes.items()
                for name in ("driver_peak_mb", "driver_planned_mb", "planning_s",
                             "first_batch_s")]
        rows.append({"measure": "planning_bytes_per_shard", "shards": max(self.probes),
                     "variant": "csclip driver", "repeat": 0,
                     "value": self.planning_bytes_per_shard})
        for (count, variant), epochs in self.epochs.items():
            for repeat, epoch in enumerate(epochs):
                for name, value in (("cpu_ms_per_sample", epoch.cpu_ms_per_sample),
                                    ("samples", epoch.samples), ("wall_s", epoch.wall_s),
                                    ("read_tasks", epoch.read_tasks)):
                    if value is not None:
                        rows.append({"measure": name, "shards": count, "variant": variant,
                                     "repeat": repeat, "value": value})
        return rows


def measure(args, root: Path) -> Results:
    counts, per_shard, repeats = args.counts, args.samples_per_shard, args.repeats
    started = time.perf_counter()
    sets = write_sets(root, counts, per_shard, repeats)
    warm_count = max(min(counts), -(-2 * BATCH // per_shard))  # two batches at least
    warm = write_sets(root / "warm-up", [warm_count], per_shard, 1,
                      first_seed=1 + len(sets))[0, warm_count]
    written_s = time.perf_counter() - started
    print(f"{len(sets)} sets ({sum(s.count for s in sets.values())} shards of {per_shard} "
          f"samples) written in {written_s:.0f} s", flush=True)
    units = units_bytes(root / "units-bytes") if args.units_bytes else None
    context = ray.init(address="local", num_cpus=2, include_dashboard=False,
                       object_store_memory=600 * 1024**2, log_to_driver=False,
                       configure_logging=False)
    quiet_ray_data()
    torch.set_num_threads(1)  # a data task's transform runs on one thread, as in Ray Data
    address = context.address_info["gcs_address"]
    run_probe(warm, args.group_shards, address)  # the files' first reader pays the page cache
    probes = {}
    for count in counts:
        probes[count] = run_probe(sets[0, count], args.group_shards, address)
        print(f"driver, {count} shards: {json.dumps(probes[count])}", flush=True)
    per_shard_bytes = planning_bytes(sets[0, max(counts)], args.group_shards)
    open_clip_process = OpenClipProcess()
    cpu = TreeCpu(exclude=(open_clip_process.process.pid,))
    variants = ["csclip", *(f"open_clip {w}w" for w in OPEN_CLIP_WORKERS)]
    epochs: dict[tuple[int, str], list[EpochCost]] = {}
    try:
        csclip_epoch(warm, args.group_shards, cpu)  # Ray's task workers started, imports done
        for workers in OPEN_CLIP_WORKERS:
            open_clip_process.epoch(warm, workers)
        for repeat in range(repeats):
            for count in counts:
                for variant in variants:
                    shard_set = sets[repeat, count]
                    epochs.setdefault((count, variant), []).append(
                        csclip_epoch(shard_set, args.group_shards, cpu) if variant == "csclip"
                        else open_clip_process.epoch(shard_set, int(variant[10:-1])))
                print(f"repeat {repeat + 1}/{repeats}, {count} shards, CPU ms per sample: "
                      + ", ".join(f"{v} {epochs[count, v][-1].cpu_ms_per_sample:.3f}"
                                  for v in variants), flush=True)
    finally:
        open_clip_process.close()
    ray.shutdown()
    return Results(probes, epochs, per_shard_bytes, stage_costs(),
                   group_costs(root / "group-costs", per_shard), units, written_s, len(sets) + 1)


def doc_section(args, results: Results) -> str:
    """docs/performance.md's section: the command, the tables, the ratio."""
    counts, per_shard = args.counts, args.samples_per_shard
    load = os.getloadavg()
    flags = " --quick" if args.quick else (
        f" --samples-per-shard {per_shard} --repeats {args.repeats}")
    if args.group_shards != 1:
        flags += f" --group-shards {args.group_shards}"
    if counts != [10, 100, 1000]:
        flags += " --counts " + " ".join(map(str, counts))
    if args.units_bytes:
        flags += " --units-bytes"
    largest = max(counts)
    probes = results.probes
    table = "".join(
        f"| {c} | {c * per_shard:,} | {results.epochs[c, 'csclip'][0].read_tasks} | "
        f"{probes[c]['driver_peak_mb']:.1f} | {probes[c]['shm_at_peak_mb']:.1f} | "
        f"{probes[c]['driver_planned_mb']:.1f} | "
        f"{probes[c]['planning_s']:.2f} | {probes[c]['first_batch_s']:.1f} | "
        f"{results.cpu_ms(c, 'csclip'):.3f} | "
        + " | ".join(f"{results.cpu_ms(c, f'open_clip {w}w'):.3f}" for w in OPEN_CLIP_WORKERS)
        + f" | {results.ratio(c):.2f} | {results.ratio(c, (0,)):.2f} |\n" for c in counts)
    stages = "".join(f"| {name} | {value:.1f} |\n" for name, value in results.stages.items())
    groups = "".join(f"| {name} | {value:.3f} |\n" for name, value in results.groups.items())
    units = results.units
    units_text = "" if units is None else (
        f"\nUnits on S3 (`--units-bytes`): the {units['captions']:,} distinct SugarCrepe "
        f"captions (COCO's, {units['mean_caption_chars']:.0f} characters on average) as one "
        f"shard through `csclip extract --backend rules --format webdataset`: "
        f"{units['with_units']:,} samples with units in a {units['units_bytes'] / 1024:.0f} KB "
        f"parquet, **{units['bytes_per_sample']:.0f} bytes per sample**, and a "
        f"{units['done_marker_bytes']}-byte _done marker per shard.\n")
    wall = {v: statistics.median(e.samples / e.wall_s for e in results.epochs[largest, v])
            for v in ("csclip", "open_clip 1w")}
    return (
        f"{HEADING}\n\n"
        f"Command: `python benchmarks/bench_scale.py{flags} --write-docs` ({platform.machine()}, "
        f"{os.cpu_count()} cores shared with other work, load average {load[0]:.1f} / "
        f"{load[1]:.1f} at the end; {MODEL} at {IMAGE_SIZE} px, {per_shard} world samples "
        f"(PNGs of ~250 bytes) per shard; data.shard_buffer {args.group_shards * per_shard}: "
        f"a group of {args.group_shards} shard(s); batch {BATCH}; loss.method clip; one "
        f"local Ray with 2 CPUs; {results.num_sets} sets written in {results.written_s:.0f} s; "
        f"CPU: the median of {args.repeats} epochs, each over a set of its own, csclip and "
        "open_clip alternating).\n\n"
        "| shards | samples | csclip read tasks | driver peak MB | of it object store "
        "pages | driver MB after planning | planning s | first batch s | csclip CPU ms / sample | " + " | ".join(
            f"open_clip {w}w" for w in OPEN_CLIP_WORKERS) +
        " | csclip/open_clip (1-2w) | csclip/open_clip (0w) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(OPEN_CLIP_WORKERS)
        + "---:|---:|\n" + table +
        "\nDriver: a fresh driver process's peak RSS growth over its RSS after the imports "
        "and ray.init, from planning (csclip.train.loop._shard_training) to the first "
        f"batch of epoch 0. Planning keeps {results.planning_bytes_per_shard:.0f} Python "
        f"bytes per shard (tracemalloc, {largest} shards: the TrainShard list and one "
        "epoch's group items). CPU: the whole process tree of each side (csclip: the driver, "
        "which consumes as a Train worker does and normalises the uint8 images, and all of "
        "Ray's processes; open_clip: its process and its DataLoader workers), per sample "
        "delivered. open_clip Nw: open_clip_train.data.get_wds_dataset with N DataLoader "
        f"workers (0: decoding in the training process). Wall rate on {largest} shards: "
        f"csclip {wall['csclip']:.0f} samples/s, open_clip 1w {wall['open_clip 1w']:.0f}/s.\n\n"
        "Per sample on one core (in-process, 1,000 world samples):\n\n"
        "| step | CPU µs / sample |\n|---|---:|\n" + stages +
        f"\ncsclip's read task alone (read_group + sample_batch, one core, no Ray, "
        f"{100 * per_shard:,} samples):\n\n| layout | CPU ms / sample |\n|---|---:|\n"
        + groups + units_text +
        f"\ncsclip/open_clip webdataset CPU ratio {results.ratio(largest):.2f}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="32 samples per shard, 2 repeats (the docs' setting, ~6-8 min)")
    parser.add_argument("--samples-per-shard", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--group-shards", type=int, default=1,
                        help="shards per group (data.shard_buffer in shards' samples)")
    parser.add_argument("--units-bytes", action="store_true",
                        help="also measure a units shard of real captions (csclip extract)")
    parser.add_argument("--out", type=Path, help="CSV of every measurement")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--open-clip-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        request = json.loads(args.probe)
        print(json.dumps(probe_driver(ShardSet(**request["set"]), request["group_shards"],
                                      request["address"])), flush=True)
        return 0
    if args.open_clip_server:
        serve_open_clip()
        return 0
    if args.quick:
        args.samples_per_shard, args.repeats = 32, 2
    if min(args.counts) < 2 or min(args.counts) * args.samples_per_shard < 2 * BATCH:
        parser.error(f"every set needs 2 shards and 2 batches ({2 * BATCH} samples): "
                     "open_clip's two DataLoader workers each drop their last partial batch")
    root = Path(tempfile.mkdtemp(prefix="csclip-bench-scale-"))
    try:
        results = measure(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.out:
        with args.out.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=["measure", "shards", "variant", "repeat",
                                                     "value"])
            writer.writeheader()
            writer.writerows(results.rows())
    publish(HEADING, doc_section(args, results), args.write_docs)
    print(last_line(args.counts, results.probes, results.ratio(max(args.counts))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
