"""The demo's data path without the image cache (every epoch decodes and transforms the world's
PNGs again: `streamed`) against the image cache (`cached`), in one process.

    python benchmarks/bench_demo.py [--steps 60] [--rows 640] [--stages pretrain,CS-CLIP]
                                    [--threads 2] [--no-eval] [--write-docs]

First the data preparation alone: CPU time per sample and epoch of prepare_batch against
sample_batch on rows decode_batch made once. Then each training stage of the demo
(pretraining with the CLIP loss, CLIP-FT, CS-CLIP) runs twice on the same config through
csclip.train.run on one local Ray: streamed (data.image_cache_mb=0, Ray's default torch
threads) and cached (the image cache, `--threads` torch threads). `--rows` world rows
make `--steps` steps span several epochs, as the demo's 16-19 epochs do. Per stage and
path: wall clock, the CPU seconds of this process and all its descendants (the whole
local Ray: GCS, raylet, workers; read from /proc, so Linux only; robust to other jobs on
a shared machine, unlike wall clock), and the training worker's median samples/s and
data wait (from MLflow). The evaluation of the three models is timed once (it does not
depend on the data path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

HEADING = "## The demo's stages, streamed vs cached images (benchmarks/bench_demo.py)"


class TreeCPU:
    """CPU seconds (user + system) of this process and its descendants, sampled from /proc
    every `interval` s; a process that exits between samples keeps its last reading."""

    def __init__(self, interval: float = 0.5):
        self.interval, self._seen, self._stop = interval, {}, threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeCPU:
        self._sample()
        self._start = sum(self._seen.values())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.seconds = sum(self._seen.values()) - self._start

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        times: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
            parents[int(entry)] = int(fields[1])
            times[int(entry)] = (int(fields[11]) + int(fields[12])) / self._tick
        mine, frontier = {os.getpid()}, [os.getpid()]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in mine]
            mine.update(children)
            frontier.extend(children)
        for pid in mine:
            if pid in times:
                # Keyed by (pid, start) would be exact; pids are not reused within a run here.
                self._seen[pid] = max(self._seen.get(pid, 0.0), times[pid])


def data_path_costs(rows: int = 512, epochs: int = 3) -> list[tuple[str, float, float]]:
    """CPU microseconds per sample per epoch of the data preparation, in this process:
    (objective, streamed = prepare_batch on the PNG rows, cached = sample_batch on rows
    decode_batch made once), for the CLIP (pretraining, CLIP-FT) and CS-CLIP columns."""
    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import (
        decode_batch,
        image_shape,
        prepare_batch,
        preprocess_key,
        sample_batch,
    )
    from csclip.units import records_to_table
    from csclip.world import world_record

    spec = spec_of(create_bundle("csclip-tiny").model, "csclip-tiny")
    preprocess = preprocess_key(spec.preprocess_cfg)
    records = [world_record(WorldConfig(), "train", i) for i in range(rows)]
    tables = [records_to_table(records[i:i + 128]) for i in range(0, rows, 128)]
    decoded = [decode_batch(t, preprocess=preprocess, model_name="csclip-tiny") for t in tables]
    sampling = SamplingConfig(relation_prob=0.5).model_dump(mode="json")
    costs = []
    for objective, columns in (("clip", ["caption"]),
                               ("csclip", ["caption", "caption_negative", "unit_0", "foil_0",
                                           "unit_1", "foil_1"])):
        common = {"sampling": sampling, "model_name": "csclip-tiny", "seed": 0,
                  "columns": columns}
        started = time.process_time()
        for epoch in range(epochs):
            for table in tables:
                prepare_batch(table, preprocess=preprocess, epoch=epoch, **common)
        streamed = time.process_time() - started
        started = time.process_time()
        for epoch in range(epochs):
            for block in decoded:
                sample_batch(block, image_shape=image_shape(spec.preprocess_cfg), epoch=epoch,
                             **common)
        cached = time.process_time() - started
        costs.append((objective, 1e6 * streamed / (rows * epochs), 1e6 * cached / (rows * epochs)))
    return costs


@dataclass(frozen=True)
class StageRun:
    stage: str
    path: str
    wall: float
    cpu: float
    steps: int
    batch: int
    samples_per_s: float | None
    data_wait: float | None


def stage_configs(steps: int, rows: int, storage: Path, uri: str):
    """The demo's three training configs at `steps` steps on `rows` world rows."""
    from csclip.config import apply_overrides, read_yaml, validate_config
    from csclip.config.demo import DemoConfig
    from csclip.demo import finetune_config, pretrain_config
    from csclip.entry.common import default_config_path

    data = apply_overrides({"train": read_yaml(default_config_path("default.yaml"))}, [
        f"train.optim.max_steps={steps}", f"pretrain.optim.max_steps={steps}",
        "train.optim.warmup_steps=5", "pretrain.optim.warmup_steps=5",
        f"train.data.world.num_train={rows}", f"pretrain.data.world.num_train={rows}",
        f"train.tracking.uri={uri}", f"train.run.checkpoint_every={steps}",
        # The image cache's benchmark: without image foils (ours), which stream
        # every epoch by design; they would make both paths the streamed one.
        "pretrain.loss.image_foil_weight=null", "finetune.loss.image_foil_weight=null"])
    demo = validate_config(DemoConfig, data)
    pre = pretrain_config(demo)
    placeholder = str(storage / "pretrained")  # the fine-tunes start from the pretraining
    return demo, pre, {label: finetune_config(demo, method, placeholder)
                       for label, method in (("CLIP-FT", "clip"), ("CS-CLIP", "csclip"))}


def with_path(config, stage: str, path: str, storage: Path, threads: int | None):
    """`config` on the streamed or the cached data path, in its own storage and MLflow run
    (the run name does not depend on the path: it names what is trained)."""
    data = config.data.model_copy(update={"image_cache_mb": 0} if path == "streamed" else {})
    run = config.run.model_copy(update={
        "name": f"bench-{stage}-{path}", "storage_path": str(storage / path),
        "torch_threads": threads if path == "cached" else None})
    return config.model_copy(update={"data": data, "run": run})


def timed_run(stage: str, path: str, config, uri: str) -> tuple[StageRun, object]:
    from csclip.tracking import run_metrics
    from csclip.train import run

    started = time.perf_counter()
    with TreeCPU() as cpu:
        result = run(config)
    wall = time.perf_counter() - started

    def median(key: str) -> float | None:
        values = [v for _, v in run_metrics(uri, result.mlflow_run_id, key)]
        return statistics.median(values) if values else None

    return StageRun(stage, path, wall, cpu.seconds, config.optim.max_steps,
                    config.data.batch_size, median("samples_per_s"),
                    median("data_wait_frac")), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rows", type=int, default=640, help="world rows per training stage")
    parser.add_argument("--threads", type=int, default=None,
                        help="run.torch_threads of the cached path (default: the demo's)")
    parser.add_argument("--stages", default="pretrain,CLIP-FT,CS-CLIP",
                        help="comma-separated subset of pretrain, CLIP-FT, CS-CLIP")
    parser.add_argument("--no-eval", action="store_true", help="skip timing the evaluation")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    from csclip.entry.common import setup_logging
    from csclip.entry.ray_init import init_ray

    setup_logging()
    costs = data_path_costs()
    init_ray()
    runs: list[StageRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        storage, uri = Path(tmp), f"sqlite:///{tmp}/mlflow.db"
        demo, pre, finetunes = stage_configs(args.steps, args.rows, storage, uri)
        threads = args.threads if args.threads is not None else demo.train.run.torch_threads
        stages = args.stages.split(",")
        # The fine-tunes start from a pretraining; without the pretrain stage only the
        # cached path pretrains (for the checkpoint) and the report leaves it out.
        pretrain_paths = ("streamed", "cached") if "pretrain" in stages else ("cached",)
        pretrained = None
        for path in pretrain_paths:
            stage_run, result = timed_run(
                "pretrain", path, with_path(pre, "pretrain", path, storage, threads), uri)
            if "pretrain" in stages:
                runs.append(stage_run)
            pretrained = result.checkpoint_uri
        for label, config in finetunes.items():
            if label not in stages:
                continue
            config = config.model_copy(update={"model": config.model.model_copy(
                update={"pretrained": pretrained})})
            for path in ("streamed", "cached"):
                runs.append(timed_run(
                    label, path, with_path(config, label, path, storage, threads), uri)[0])
        evaluation = None if args.no_eval else time_evaluation(demo, pretrained, storage)
    section = report(runs, evaluation, costs, args, threads, demo.train.data.world.num_val)
    from perfdoc import publish

    publish(HEADING, section, args.write_docs)
    return 0


def time_evaluation(demo, pretrained_uri: str, storage: Path) -> tuple[float, float]:
    """Wall and CPU seconds of the demo's evaluation (three models; here the pretrained
    checkpoint three times: the cost does not depend on the weights)."""
    from csclip.eval.halftruth import BenchmarkConfig
    from csclip.eval.pipeline import compare_models
    from csclip.model import load_bundle
    from csclip.records import load_split

    records = load_split(None, "val", demo.train.data.world)
    bundles = {name: load_bundle(pretrained_uri) for name in ("a", "b", "c")}
    started, cpu = time.perf_counter(), time.process_time()
    compare_models(bundles, records, storage / "eval", None, benchmark=BenchmarkConfig())
    return time.perf_counter() - started, time.process_time() - cpu


def report(runs: list[StageRun], evaluation: tuple[float, float] | None,
           costs: list[tuple[str, float, float]], args, threads, num_val: int) -> str:
    from csclip.demo import load_note

    lines = [HEADING, "",
             f"Command: `python benchmarks/bench_demo.py {' '.join(sys.argv[1:])}`".replace(
                 " --write-docs", "") + " "
             f"({load_note()} at the end). streamed: every epoch decodes and transforms the "
             "images again (data.image_cache_mb=0); cached: decoded "
             f"once, torch_threads {threads}. CPU s: this process and every descendant (the "
             "local Ray), from /proc. samples/s and data wait: medians over the worker's "
             "steps.", "",
             "**Data preparation per sample and epoch** (CPU time in this process; 512 world "
             "rows, 3 epochs):", "",
             "| objective | streamed µs | cached µs | streamed / cached |",
             "|---|---:|---:|---:|",
             *[f"| {name} | {streamed:.0f} | {cached:.0f} | {streamed / cached:.1f}x |"
               for name, streamed, cached in costs], "",
             "**The training stages on Ray** (one local instance):", "",
             "| stage | path | steps x batch | wall s | CPU s | samples/s | data wait | "
             "CPU s vs streamed |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    base = {r.stage: r for r in runs if r.path == "streamed"}
    for r in runs:
        ratio = r.cpu / base[r.stage].cpu if base[r.stage].cpu else float("nan")
        lines.append(
            f"| {r.stage} | {r.path} | {r.steps} x {r.batch} | {r.wall:.0f} | {r.cpu:.0f} | "
            f"{'' if r.samples_per_s is None else f'{r.samples_per_s:.0f}'} | "
            f"{'' if r.data_wait is None else f'{100 * r.data_wait:.0f}%'} | {ratio:.2f} |")
    if evaluation is not None:
        lines += ["", f"Evaluation of three models on the {num_val} validation scenes: "
                  f"{evaluation[0]:.0f} s wall, {evaluation[1]:.0f} s CPU (in process)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
