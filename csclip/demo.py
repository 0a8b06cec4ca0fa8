"""The embedded default (`make demo`): on the synthetic world, on CPU, pretrain a small CLIP
contrastively (cached: it stands in for zero-shot CLIP, since no weights can be
downloaded), fine-tune it with CS-CLIP and with CLIP-FT on the same budget, and compare
the three on the half-truth benchmark. Each stage is timed. Everything the demo writes goes
under `out_dir` (runs/demo/): its tables, figures, the results section and the stage
timings; `publish` (`csclip demo --publish`) copies the last two into docs/results.md and
docs/performance.md, on purpose, never as a side effect of a run."""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import ray
import torch

from csclip.config.demo import DemoConfig
from csclip.config.eval import SuitesConfig
from csclip.config.train import TrainConfig
from csclip.errors import DataError
from csclip.eval.halftruth import BenchmarkConfig
from csclip.eval.pipeline import compare_models
from csclip.eval.report import check_evaluation
from csclip.markdoc import update_marked_section
from csclip.model import load_bundle
from csclip.records import load_split
from csclip.storage import write_local_atomic
from csclip.tracking import resolve_uri, run_metrics
from csclip.train import TrainResult, finished_result, run
from csclip.train.warm_start import measure_checkpoint

logger = logging.getLogger(__name__)














@dataclass(frozen=True)
class StageTime:
    """One stage of the demo: wall clock from its start to its end (Ray Train's startup,
    the data checks and checkpoints included); for a training stage its steps and the
    median over steps of the worker's samples/s and of the share of a step spent
    waiting for data (None when the stage was cached or not tracked)."""

    stage: str
    seconds: float
    steps: int | None = None
    batch_size: int | None = None
    samples_per_s: float | None = None
    data_wait: float | None = None
    cached: bool = False


@dataclass(frozen=True)
class DemoResult:
    pretrained: TrainResult
    finetuned: dict[str, TrainResult]
    markdown: str
    out_dir: str
    seconds: float
    stages: tuple[StageTime, ...] = ()
    tracking_uri: str | None = None
    written: tuple[str, ...] = ()  # the sections `publish` copies into docs/


# The demo's two sections, under out_dir, and where `publish` puts them (marked sections
# of shared docs: the ablation and the benchmarks write their own).
RESULTS_SECTION = "demo_results.md"
STAGES_SECTION = "demo_stages.md"
PUBLISHED = {RESULTS_SECTION: ("docs/results.md", "demo", "# Results"),
             STAGES_SECTION: ("docs/performance.md", "demo-stages", "# Performance")}


def pretrain_config(demo: DemoConfig, warm_start: str | None = None) -> TrainConfig:
    """DemoConfig.pretrain_config."""
    return demo.pretrain_config(warm_start)


def finetune_config(demo: DemoConfig, method: str, pretrained_uri: str) -> TrainConfig:
    """DemoConfig.finetune_config."""
    return demo.finetune_config(method, pretrained_uri)


METHODS = {"CLIP-FT": "clip", "CS-CLIP": "csclip"}


def run_demo(demo: DemoConfig, command: str = "make demo",
             start_ray: Callable[[], object] = lambda: None) -> DemoResult:
    """Start Ray (`start_ray`: the entry point's; a no-op where Ray runs already),
    pretrain (or reuse the cached pretraining), fine-tune both ways, evaluate; write the
    tables, the results section (naming `command` as what produced them) and the stage
    timings under `out_dir`."""
    started = time.perf_counter()
    tracking = demo.train.tracking
    uri = resolve_uri(tracking.uri) if tracking.enabled else None
    # This run's sections replace the last run's: until they are written, publish finds none
    # (a demo killed mid-way never publishes the previous run's results as its own).
    for name in PUBLISHED:
        Path(demo.out_dir, name).unlink(missing_ok=True)
    start_ray()
    stages = [StageTime("start Ray", time.perf_counter() - started)]
    pre_plan = demo.pretrain_config()
    warm = demo.warm_start_config() if demo.warm_start is not None else None
    _header(1, "pretraining a small CLIP: "
               + (f"the layout warm start ({warm.optim.max_steps} steps), then " if warm else "")
               + f"{pre_plan.optim.max_steps} steps x batch {pre_plan.data.batch_size} "
               f"on {pre_plan.data.world.num_train} world captions (cached after the first run)")
    warm_start = None
    if warm is not None:
        warmed, stage = _warm_start_stage(demo, uri)
        warm_start = warmed.checkpoint_uri
        stages.append(stage)
    pre = pretrain_config(demo, warm_start)
    pretrained, stage = _train_stage("pretrain", pre, uri)
    stages.append(stage)
    configs = {label: finetune_config(demo, method, pretrained.checkpoint_uri)
               for label, method in METHODS.items()}
    together = side_by_side(configs, _ray_cpus()) if demo.finetune_together else None
    for index, (label, config) in enumerate(configs.items(), start=2):
        _header(index, f"fine-tuning {label}: {config.optim.max_steps} steps x batch "
                       f"{config.data.batch_size} on {config.data.world.num_train} scenes"
                       + (" (both fine-tunings at once)" if together else ""))
    if together:
        finetuned, finetune_stages = _train_together(together, uri)
    else:
        finetuned, finetune_stages = {}, []
        for label, config in configs.items():
            finetuned[label], stage = _train_stage(label, config, uri)
            finetune_stages.append(stage)
    stages.extend(finetune_stages)
    _header(4, f"half-truth evaluation on {demo.train.data.world.num_val} validation scenes")
    clock = time.perf_counter()
    markdown = evaluate(demo, pretrained, finetuned)
    stages.append(StageTime("evaluate", time.perf_counter() - clock))
    seconds = time.perf_counter() - started
    out = Path(demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_text_atomic(out / STAGES_SECTION, stages_section(stages, seconds, command))
    _write_text_atomic(out / RESULTS_SECTION, results_section(
        demo, pretrained, finetuned, markdown, command, seconds,
        reused=[stage.stage for stage in stages if stage.cached]))
    written = (str(out / RESULTS_SECTION), str(out / STAGES_SECTION))
    return DemoResult(pretrained, finetuned, markdown, demo.out_dir, seconds, tuple(stages),
                      uri, written)


def publish(out_dir: str, root: str | Path = ".") -> list[Path]:
    """Copy the last demo's results section and stage timings from `out_dir` into their
    marked sections of docs/results.md and docs/performance.md under `root` (the other
    sections of those shared docs are kept). Raises DataError when `out_dir` holds no
    finished demo."""
    if all(Path(out_dir, name).is_file() for name in PUBLISHED):
        check_evaluation(out_dir)  # its tables are the ones the results section quotes
    written = []
    for name, (doc, marker, title) in PUBLISHED.items():
        section = Path(out_dir, name)
        if not section.is_file():
            raise DataError(f"{section} not found: run the demo first (`csclip demo --out "
                            f"{out_dir}`), then publish its results")
        path = Path(root, doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        written.append(update_marked_section(path, marker, section.read_text().rstrip("\n"),
                                             title=title))
    return written


def _write_text_atomic(path: Path, text: str) -> None:
    write_local_atomic(path, text.encode())


def _header(number: int, text: str) -> None:
    logger.info("==== [%d/4] %s ====", number, text)


def _warm_start_stage(demo: DemoConfig, uri: str | None) -> tuple[TrainResult, StageTime]:
    """The layout warm start, a training run like the others (csclip.train.run: cached by
    its name, resumed when cut short), then what its held-out scenes say of the image
    tower (csclip.train.warm_start.measure_checkpoint), logged and written to
    out_dir/warm_start.json."""

    config = demo.warm_start_config()
    result, stage = _train_stage("layout warm start", config, uri)
    quality = measure_checkpoint(result.checkpoint_uri, config.model, config.data.world)
    logger.info("layout warm start: %.1f%% of held-out objects in their cell (chance ~11%%), "
                "presence %.1f%% (always \"absent\": %.1f%%), held-out loss %.4f",
                quality.cell_accuracy, quality.presence_accuracy, quality.absent_share,
                quality.held_out_loss)
    out = Path(demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "warm_start.json").write_text(json.dumps(
        {**quality.__dict__, "run": result.run_name, "steps": config.optim.max_steps,
         "last_loss": result.metrics.get("loss")}, indent=2) + "\n")
    return result, stage


def _train_stage(stage: str, config: TrainConfig, uri: str | None
                 ) -> tuple[TrainResult, StageTime]:
    """run(config), timed; with the worker's median rates from MLflow."""
    cached = finished_result(config) is not None
    started = time.perf_counter()
    result = run(config)
    seconds = time.perf_counter() - started
    rate = wait = None
    if result.mlflow_run_id and uri:
        rate = _median_metric(uri, result.mlflow_run_id, "samples_per_s")
        wait = _median_metric(uri, result.mlflow_run_id, "data_wait_frac")
    logger.info("%s: %.0f s%s", stage, seconds, " (cached)" if cached else "")
    return result, StageTime(stage, seconds, config.optim.max_steps, config.data.batch_size,
                             rate, wait, cached)


DATA_CPUS = 1.5  # left to Ray Data when the fine-tunings train at once (side_by_side)


def side_by_side(configs: dict[str, TrainConfig], cpus: float
                 ) -> dict[str, TrainConfig] | None:
    """`configs` set to train at the same time on a Ray instance of `cpus` CPUs, or None
    where they should train one after the other (a GPU each, or too few CPUs).

    Each worker's CPU reservation is cut, down to a quarter CPU, so that all of them fit
    with one and a half CPUs left to Ray Data: its tasks take one CPU each (none free,
    the streams would never run), and a dataset the driver starts while one runs needs a
    CPU free (Ray Data warns that it will hang when none is). The torch threads stay
    what each run had, so its numbers do not change; both fields are how a run runs, not
    what it is (csclip.train.identity): the run names, caches and resumption are the
    same as one after the other."""
    if len(configs) < 2 or any(config.run.use_gpu for config in configs.values()):
        return None
    workers = sum(config.run.num_workers for config in configs.values())
    share = min(min(config.run.cpus_per_worker for config in configs.values()),
                (cpus - DATA_CPUS) / workers)
    if share < 0.25:
        return None
    together = {}
    for label, config in configs.items():
        threads = config.run.torch_threads or max(1, int(config.run.cpus_per_worker))
        together[label] = config.model_copy(update={"run": config.run.model_copy(
            update={"cpus_per_worker": share, "torch_threads": threads})})
    return together


def _ray_cpus() -> float:
    return float(ray.cluster_resources().get("CPU", 0))


def _train_together(configs: dict[str, TrainConfig], uri: str | None
                    ) -> tuple[dict[str, TrainResult], list[StageTime]]:
    """_train_stage for each of `configs` at the same time, each in a thread of its own.
    An error of either is raised once both ended; Ctrl-C ends this driver's Ray work
    (both trainings) and is raised."""
    with ThreadPoolExecutor(len(configs), thread_name_prefix="csclip-finetune") as pool:
        futures = {label: pool.submit(_train_stage, label, config, uri)
                   for label, config in configs.items()}
        try:
            wait(futures.values())
        except KeyboardInterrupt:
            logger.warning("interrupted: stopping both fine-tunings")
            ray.shutdown()
            raise
    results = {label: future.result() for label, future in futures.items()}
    return ({label: result for label, (result, _) in results.items()},
            [replace(stage, stage=f"{label} (at once with "
                                  f"{', '.join(sorted(set(configs) - {label}))})")
             for label, (_, stage) in results.items()])


def _median_metric(uri: str, run_id: str, key: str) -> float | None:
    values = [value for _, value in run_metrics(uri, run_id, key)]
    return statistics.median(values) if values else None


def stage_table(stages: tuple[StageTime, ...] | list[StageTime], total: float) -> str:
    """The stage timings as a markdown table; `total` is the demo's wall clock (the stages
    plus what runs between them: writing the docs)."""
    lines = ["| stage | wall s | steps | batch | samples/s (median) | data wait (median) |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in stages:
        steps = "" if s.steps is None else ("cached" if s.cached else str(s.steps))
        lines.append(f"| {s.stage} | {s.seconds:.0f} | {steps} | {s.batch_size or ''} | "
                     f"{'' if s.samples_per_s is None else f'{s.samples_per_s:.0f}'} | "
                     f"{'' if s.data_wait is None else f'{100 * s.data_wait:.0f}%'} |")
    lines.append(f"| **total** | {total:.0f} | | | | |")
    return "\n".join(lines)


def load_note() -> str:
    """The machine's load average (1, 5, 15 min) against its core count."""
    one, five, fifteen = os.getloadavg()
    return (f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min) on "
            f"{os.cpu_count()} cores")


def compute_note(use_gpu: bool) -> str:
    """What the numbers were computed with. The same code on the same versions and
    kernels gives the same tables to the digit; other CPU kernels (AVX2 against AVX512)
    or versions round differently, which moves the last digits of a long run."""

    where = (torch.cuda.get_device_name(0) if use_gpu and torch.cuda.is_available()
             else f"{torch.backends.cpu.get_cpu_capability()} CPU kernels")
    return f"torch {torch.__version__}, Python {platform.python_version()}, {where}"


def stages_section(stages: Sequence[StageTime], seconds: float, command: str) -> str:
    """The demo's section of docs/performance.md: the stage table of this run."""
    return "\n".join([
        "## The demo, stage by stage (csclip demo)", "",
        f"Written by `{command}` at its end ({seconds / 60:.1f} min in all; "
        f"{load_note()} at the end; a loaded machine stretches every stage). Wall clock "
        "per stage includes Ray Train's startup, the data check and checkpoints; samples/s "
        "and data wait are medians over the steps of the training worker's own "
        "measurements (data wait: the share of a step spent waiting for the batch).", "",
        stage_table(stages, seconds), ""])


def demo_summary(result: DemoResult) -> str:
    """What the demo prints at its end: results, stage timings, where everything went."""
    lines = [result.markdown.strip(), "", "### Stages", "",
             stage_table(result.stages, result.seconds), "",
             f"demo finished in {result.seconds / 60:.1f} min ({load_note()})", "",
             f"tables and figures (figure3.png, ...): {result.out_dir}/"]
    lines += [f"written: {doc}" for doc in result.written]
    if result.written:
        lines.append("publish them to docs/results.md and docs/performance.md: "
                     f"csclip demo --publish --out {result.out_dir}")
    if result.tracking_uri:
        lines.append(f"MLflow: mlflow ui --backend-store-uri {result.tracking_uri}  "
                     "(then http://127.0.0.1:5000)")
    return "\n".join(lines)


def results_section(demo: DemoConfig, pretrained: TrainResult, finetuned: dict[str, TrainResult],
                    markdown: str, command: str, seconds: float,
                    reused: Sequence[str] = ()) -> str:
    """The demo's section of docs/results.md: the comparison table and how it was made.
    reused: the stages found finished from an earlier run (not timed here). Runs are
    named, not located: the section is published, and a path would be this machine's."""
    pre = demo.pretrain_config()
    warm = demo.warm_start_config() if demo.warm_start is not None else None
    cs_clip = train = finetune_config(demo, "csclip", pretrained.checkpoint_uri)
    world = train.data.world
    lines = [
        "## The demo: pretrained CLIP, CLIP-FT and CS-CLIP on the synthetic world", "",
        f"Produced by `{command}` (csclip.demo; {seconds / 60:.1f} min wall clock, "
        + (f"{', '.join(reused)} reused from an earlier run" if reused else "every stage run")
        + "). Models: the pretrained small CLIP (stands in for zero-shot CLIP), "
        "CLIP-FT and CS-CLIP fine-tuned from it on the same budget.", "",
        f"- model `{train.model.name}`, {world.image_size} px images",
        f"- pretraining: CLIP loss on {pre.data.world.num_train} world captions (world seed "
        f"{pre.data.world.seed}), {pre.optim.max_steps} steps x batch {pre.data.batch_size}, "
        f"lr {pre.optim.lr}"
        + (f", from an image tower warm-started on the layout question ({warm.optim.max_steps} "
           "steps on the same scenes; ours, docs/training.md)" if warm else ", from random weights")
        + (", locked (LiT): only the text tower trains" if pre.model.lock.image else "")
        + (f", with image-side foils, μ = {pre.loss.image_foil_weight} (ours)"
           if pre.loss.image_foils else ""),
        f"- fine-tuning: {world.num_train} training scenes (seed {world.seed}), "
        f"{train.optim.max_steps} steps x batch {train.data.batch_size}, lr {train.optim.lr}, "
        f"N = {train.sampling.num_unit_slots}, relation_prob {train.sampling.relation_prob}, "
        f"λ = {train.loss.unit_loss_weight}"
        + (", the image tower locked in both (ours)" if cs_clip.model.lock.image else "")
        + (f"; CS-CLIP with image-side foils, μ = {cs_clip.loss.image_foil_weight} (ours; "
           "CLIP-FT never)" if cs_clip.loss.image_foils else ""),
        f"- evaluation: half-truth benchmark on the {world.num_val} validation scenes, seed "
        f"{demo.eval_seed}",
        f"- computed with {compute_note(train.run.use_gpu)}",
        "- runs (`<run.storage_path>/<run>/final`): pretrained "
        f"`{pretrained.run_name}`; "
        + "; ".join(f"{label} `{r.run_name}`" for label, r in finetuned.items()), "",
        markdown.strip(), ""]
    return "\n".join(lines)


def evaluate(demo: DemoConfig, pretrained: TrainResult, finetuned: dict[str, TrainResult]) -> str:
    """Compare the three models on the world's validation split; return the markdown."""
    records = load_split(None, "val", demo.train.data.world)
    bundles = {"CLIP (pretrained)": load_bundle(pretrained.checkpoint_uri)}
    bundles.update({label: load_bundle(result.checkpoint_uri) for label, result in finetuned.items()})
    uri = resolve_uri(demo.train.tracking.uri) if demo.train.tracking.enabled else None
    report = compare_models(bundles, records, demo.out_dir, uri,
                            # the world suites' draws (mirrored pairs, zero-shot) too
                            benchmark=BenchmarkConfig(seed=demo.eval_seed),
                            suites=SuitesConfig(),
                            experiment=demo.train.tracking.experiment + "-eval")
    _write_text_atomic(Path(demo.out_dir, "results.md"), report.markdown)
    return report.markdown
