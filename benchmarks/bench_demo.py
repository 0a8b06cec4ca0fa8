"""The demo's training stages on its one data path: the world written once as shards of
uint8 pixels (with every sample's image-foil candidates), every epoch read from them.

    python benchmarks/bench_demo.py [--steps 60] [--rows 640] [--stages pretrain,CS-CLIP]
                                    [--threads 2] [--no-eval] [--write-docs]

First the data preparation alone, in this process: CPU time per sample of what writing
the shards does once (decode_batch: decode, transform, render and transform the image-foil
candidates, tokenize the caption) and per sample and epoch of what each epoch does on
those rows (sample_batch: draw the text slots and image foils, tokenize). Then the two
worlds' shards are written (the pretraining's and the fine-tunings', another seed;
csclip.train.source_shards, timed apart) and each training stage of the demo (pretraining
with the CLIP loss and image foils, CLIP-FT, CS-CLIP) runs through csclip.train.run on
one local Ray, reading them. `--rows` world rows make `--steps` steps
span several epochs, as the demo's 16-19 epochs do. Per stage: wall clock, the CPU
seconds of this process and all its descendants (the whole local Ray: GCS, raylet,
workers; read from /proc, so Linux only; robust to other jobs on a shared machine, unlike
wall clock), and the training worker's median samples/s and data wait (from MLflow). The
evaluation of the three models is timed once.

Until 97914b4 made training one shard path, this benchmark compared the streamed path
(every epoch decoding the world's PNGs) with the image cache; both are gone.
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

HEADING = "## The demo's stages on shards (benchmarks/bench_demo.py)"


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


@dataclass(frozen=True)
class PrepCost:
    """CPU microseconds per sample of one objective's data preparation."""

    objective: str
    once_us: float  # writing the shards: decode, transform, image-foil candidates
    per_epoch_us: float  # each epoch: text slots (and image foils) drawn, tokenized


def data_path_costs(stages: dict[str, list[str]], rows: int = 512, epochs: int = 3
                    ) -> list[PrepCost]:
    """CPU time per sample, in this process, of the shards' preparation (decode_batch of
    the world's PNG rows into uint8 pixels with their image-foil candidates, as the
    shards hold them) and per sample and epoch of sample_batch on those rows (uint8 out,
    as shard_datasets ships them), for each stage's columns (`stages`: label -> the
    Objective's columns)."""
    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import decode_batch, image_shape, preprocess_key, sample_batch
    from csclip.units import records_to_table
    from csclip.world import world_record

    spec = spec_of(create_bundle("csclip-tiny").model, "csclip-tiny")
    preprocess = preprocess_key(spec.preprocess_cfg)
    records = [world_record(WorldConfig(), "train", i) for i in range(rows)]
    tables = [records_to_table(records[i:i + 128]) for i in range(0, rows, 128)]
    started = time.process_time()
    decoded = [decode_batch(t, preprocess=preprocess, model_name="csclip-tiny", pixels=True,
                            image_foils=True) for t in tables]
    once_us = 1e6 * (time.process_time() - started) / rows
    sampling = SamplingConfig(relation_prob=0.5).model_dump(mode="json")
    costs = []
    for label, columns in stages.items():
        started = time.process_time()
        for epoch in range(epochs):
            for block in decoded:
                sample_batch(block, sampling=sampling, model_name="csclip-tiny", seed=0,
                             epoch=epoch, image_shape=image_shape(spec.preprocess_cfg),
                             columns=columns, preprocess=preprocess, normalize=False)
        per_epoch = 1e6 * (time.process_time() - started) / (rows * epochs)
        costs.append(PrepCost(label, once_us, per_epoch))
    return costs


@dataclass(frozen=True)
class StageRun:
    stage: str
    wall: float
    cpu: float
    steps: int | None = None
    batch: int | None = None
    samples_per_s: float | None = None
    data_wait: float | None = None


def stage_configs(steps: int, rows: int, storage: Path, uri: str, threads: int | None):
    """The demo's config and its three training configs at `steps` steps on `rows` world
    rows, in one storage folder (the world's shards are written there once) and with
    `threads` torch threads (None: the demo's)."""
    from csclip.config import apply_overrides, read_yaml, validate_config
    from csclip.config.demo import DemoConfig
    from csclip.demo import finetune_config, pretrain_config
    from csclip.entry.common import default_config_path

    overrides = [
        f"train.optim.max_steps={steps}", f"pretrain.optim.max_steps={steps}",
        "train.optim.warmup_steps=5", "pretrain.optim.warmup_steps=5",
        f"train.data.world.num_train={rows}", f"pretrain.data.world.num_train={rows}",
        f"train.tracking.uri={uri}", f"train.run.checkpoint_every={steps}",
        f"train.run.storage_path={storage}", f"pretrain.run.storage_path={storage}"]
    if threads is not None:
        overrides += [f"train.run.torch_threads={threads}", f"pretrain.run.torch_threads={threads}"]
    data = apply_overrides({"train": read_yaml(default_config_path("default.yaml"))}, overrides)
    demo = validate_config(DemoConfig, data)
    placeholder = str(storage / "pretrained")  # the fine-tunes start from the pretraining
    return demo, pretrain_config(demo), {
        label: finetune_config(demo, method, placeholder)
        for label, method in (("CLIP-FT", "clip"), ("CS-CLIP", "csclip"))}


def write_world_shards(label: str, config) -> StageRun:
    """The world's shards of `config` written (as csclip.train.run writes them first), timed."""
    from csclip.model import spec_from_config
    from csclip.train.finished import storage_root
    from csclip.train.loop import step_options
    from csclip.train.source_shards import source_shards

    objective = step_options(config).objective
    started = time.perf_counter()
    with TreeCPU() as cpu:
        written = source_shards(config.data, seed=config.run.seed,
                                preprocess_cfg=spec_from_config(config.model).preprocess_cfg,
                                model_name=config.model.name,
                                image_foils="image_foil" in objective.image_columns,
                                storage_root=storage_root(config))
    print(f"world shards: {written.uri} ({'reused' if written.reused else 'written'})",
          flush=True)
    return StageRun(f"write the {label} world's shards", time.perf_counter() - started,
                    cpu.seconds)


def timed_run(stage: str, config, uri: str) -> tuple[StageRun, object]:
    from csclip.tracking import run_metrics
    from csclip.train import run

    config = config.model_copy(update={"run": config.run.model_copy(
        update={"name": f"bench-{stage}"})})
    started = time.perf_counter()
    with TreeCPU() as cpu:
        result = run(config)
    wall = time.perf_counter() - started

    def median(key: str) -> float | None:
        values = [v for _, v in run_metrics(uri, result.mlflow_run_id, key)]
        return statistics.median(values) if values else None

    return StageRun(stage, wall, cpu.seconds, config.optim.max_steps, config.data.batch_size,
                    median("samples_per_s"), median("data_wait_frac")), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rows", type=int, default=640, help="world rows per training stage")
    parser.add_argument("--threads", type=int, default=None,
                        help="run.torch_threads (default: the demo's)")
    parser.add_argument("--stages", default="pretrain,CLIP-FT,CS-CLIP",
                        help="comma-separated subset of pretrain, CLIP-FT, CS-CLIP")
    parser.add_argument("--no-eval", action="store_true", help="skip timing the evaluation")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    from csclip.entry.common import setup_logging
    from csclip.entry.ray_init import init_ray
    from csclip.train.loop import step_options

    setup_logging()
    runs: list[StageRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        storage, uri = Path(tmp), f"sqlite:///{tmp}/mlflow.db"
        demo, pre, finetunes = stage_configs(args.steps, args.rows, storage, uri, args.threads)
        configs = {"pretrain": pre, **finetunes}
        costs = data_path_costs({label: list(step_options(config).objective.columns)
                                 for label, config in configs.items()})
        init_ray()
        stages = args.stages.split(",")
        # The pretraining's world and the fine-tunings' (another seed) are written once
        # each, before the stages that read them; both fine-tunings read the same shards.
        runs.append(write_world_shards("pretraining", pre))
        if any(label in stages for label in finetunes):
            runs.append(write_world_shards("fine-tuning", finetunes["CS-CLIP"]))
        # The fine-tunes start from a pretraining: it runs, and is reported when asked for.
        stage_run, result = timed_run("pretrain", pre, uri)
        if "pretrain" in stages:
            runs.append(stage_run)
        pretrained = result.checkpoint_uri
        for label, config in finetunes.items():
            if label in stages:
                config = config.model_copy(update={"model": config.model.model_copy(
                    update={"pretrained": pretrained})})
                runs.append(timed_run(label, config, uri)[0])
        evaluation = None if args.no_eval else time_evaluation(demo, pretrained, storage)
    section = report(runs, evaluation, costs, pre.run.torch_threads,
                     demo.train.data.world.num_val)
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


def _cell(value: float | None, form: str) -> str:
    return "" if value is None else format(value, form)


def report(runs: list[StageRun], evaluation: tuple[float, float] | None,
           costs: list[PrepCost], threads: int | None, num_val: int) -> str:
    from csclip.demo import load_note

    lines = [HEADING, "",
             f"Command: `python benchmarks/bench_demo.py {' '.join(sys.argv[1:])}`".replace(
                 " --write-docs", "") + " "
             f"({load_note()} at the end; torch_threads {threads or 'the default'}). The world is written "
             "once as shards of uint8 pixels with its image-foil candidates; every stage "
             "reads them. CPU s: this process and every descendant (the local Ray), from "
             "/proc. samples/s and data wait: medians over the worker's steps.", "",
             "**Data preparation per sample** (CPU time in this process; 512 world rows, "
             "3 epochs):", "",
             "| stage's columns | written once µs | per epoch µs |", "|---|---:|---:|",
             *[f"| {c.objective} | {c.once_us:.0f} | {c.per_epoch_us:.0f} |" for c in costs],
             "", "**The training stages on Ray** (one local instance):", "",
             "| stage | steps x batch | wall s | CPU s | samples/s | data wait |",
             "|---|---|---:|---:|---:|---:|"]
    for r in runs:
        shape = "" if r.steps is None else f"{r.steps} x {r.batch}"
        wait = None if r.data_wait is None else 100 * r.data_wait
        lines.append(f"| {r.stage} | {shape} | {r.wall:.0f} | {r.cpu:.0f} | "
                     f"{_cell(r.samples_per_s, '.0f')} | "
                     f"{'' if wait is None else f'{wait:.0f}%'} |")
    if evaluation is not None:
        lines += ["", f"Evaluation of three models on the {num_val} validation scenes: "
                  f"{evaluation[0]:.0f} s wall, {evaluation[1]:.0f} s CPU (in process)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
