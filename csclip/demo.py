"""The embedded default (`make demo`): on the synthetic world, on CPU, pretrain a small CLIP
contrastively (cached: it stands in for zero-shot CLIP, since no weights can be
downloaded), fine-tune it with CS-CLIP and with CLIP-FT on the same budget, and compare
the three on the half-truth benchmark. Each stage is timed. Everything the demo writes goes
under `out_dir` (runs/demo/): its tables, figures, the results section and the stage
timings; `publish` (`csclip demo --publish`) copies the last two into docs/results.md and
docs/performance.md, on purpose, never as a side effect of a run."""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, model_validator

from csclip.config import StrictModel
from csclip.loss import LossConfig
from csclip.train import TrainConfig, TrainResult, finished_result, run
from csclip.train.optim import OptimConfig

logger = logging.getLogger(__name__)


class PretrainConfig(StrictModel):
    """The stand-in for web-scale pretraining: plain CLIP loss on world captions (which
    state relations, so the model can learn spatial layout) from scenes the fine-tuning
    never sees (another world seed)."""

    world_seed: int = 1000
    num_train: int = Field(4000, ge=1)
    batch_size: int = Field(64, ge=1)
    # `--set pretrain.optim.max_steps=300` keeps the other fields of this default
    # (csclip.config.with_section_defaults). 1000 steps (16 epochs): 1500 cost a third more
    # for no difference the benchmark resolves (docs/training.md, "The demo").
    optim: OptimConfig = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=50, max_steps=1000)
    storage_path: str = "runs/pretrain"
    # Ours: before pretraining, the image tower answers the world's layout
    # question (which object kind is in which grid cell; csclip.train.warm_start) for this
    # many steps, on the pretraining scenes; 0: CLIP pretraining from random weights.
    # 2000 steps put 74% of held-out objects in their cell (1000: 54%; chance ~11%).
    # Contrastive pretraining alone never makes the image tower encode layout, and then
    # no fine-tuning objective can teach "left of" (docs/training.md, spatial relations).
    layout_steps: int = Field(2000, ge=0)
    # Ours: image-side foils in the pretraining too (loss.image_foils with this
    # μ; 0: none), so the text tower starts fine-tuning already reading the locked image
    # tower's layout. Without them CS-CLIP's image foils did not take from one of two
    # pretrainings (docs/training.md, "Spatial relations"; docs/research/spatial.md, study C).
    image_foil_weight: float = Field(2.0, ge=0)


class DemoConfig(StrictModel):
    """`train` is the fine-tuning config (configs/default.yaml); the demo runs it twice,
    with loss.method csclip and clip, from the pretrained checkpoint."""

    train: TrainConfig = TrainConfig()
    pretrain: PretrainConfig = PretrainConfig()
    # Ours. With a layout warm start the image tower stays locked from then on:
    # the pretraining aligns the text tower to it (LiT, Zhai et al. 2022: a pretrained image
    # model, locked, and a text tower tuned to it), and both fine-tunings, CLIP-FT and
    # CS-CLIP alike, train the text tower only. Contrastive training on the world washes
    # the layout out of an unlocked image embedding (docs/training.md, "Spatial
    # relations"). Without a warm start (pretrain.layout_steps 0) nothing is locked.
    lock_image: bool = True
    # Ours: CS-CLIP's image-side counterfactual foils in the demo (the scene
    # re-rendered with a relation's two objects exchanged; csclip.train.image_foils), with this
    # weight μ; they override train.loss.image_foils / image_foil_weight for CS-CLIP.
    # null: train.loss decides. CLIP-FT, the paper's baseline, never has them.
    image_foil_weight: float | None = Field(2.0, ge=0)
    eval_seed: int = 0
    out_dir: str = "runs/demo"  # tables, figures, the results section, the stage timings

    @model_validator(mode="after")
    def _fields_the_demo_sets_itself(self) -> DemoConfig:
        # The demo names its runs, fine-tunes from its own pretraining and runs both
        # methods: these fields of `train` would be overwritten, so they are refused.
        train = self.train
        if train.run.name is not None:
            raise ValueError(f"train.run.name={train.run.name!r}: the demo names its runs "
                             "(by config hash, one per method); leave it unset")
        if train.model.pretrained is not None:
            raise ValueError(f"train.model.pretrained={train.model.pretrained!r}: the demo "
                             "fine-tunes from its own pretraining; leave it unset")
        if train.loss.method != "csclip":
            raise ValueError(f"train.loss.method={train.loss.method!r}: the demo fine-tunes "
                             "with both clip (CLIP-FT) and csclip; leave it at csclip")
        return self


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


def pretrain_world(demo: DemoConfig):
    """The pretraining's scenes: the fine-tuning's world, another seed."""
    pre = demo.pretrain
    return demo.train.data.world.model_copy(update={"seed": pre.world_seed,
                                                    "num_train": pre.num_train})


def pretrain_config(demo: DemoConfig, warm_start: str | None = None) -> TrainConfig:
    """The CLIP pretraining run: same model and world, another seed, plain CLIP loss;
    from the layout warm start's checkpoint when there is one, else random weights."""
    base, pre = demo.train, demo.pretrain
    world = pretrain_world(demo)
    return base.model_copy(update={
        "model": base.model.model_copy(update={
            "pretrained": warm_start, "lock_image": bool(warm_start and demo.lock_image),
            "lock_image_unlocked_groups": 0}),
        "data": base.data.model_copy(update={"world": world, "batch_size": pre.batch_size}),
        # Its own loss section, so that fine-tuning settings (λ) do not change the
        # pretraining's config hash and invalidate its cache.
        # Without foils the weight stays LossConfig's default, so the config (and its
        # cached pretraining) is the one from before image_foil_weight existed.
        "loss": LossConfig(method="clip", image_foils=pre.image_foil_weight > 0,
                           image_foil_weight=pre.image_foil_weight or 1.0),
        "optim": pre.optim,
        "run": base.run.model_copy(update={"name": None, "storage_path": pre.storage_path}),
    })


def finetune_config(demo: DemoConfig, method: str, pretrained_uri: str) -> TrainConfig:
    """One fine-tuning from the pretrained checkpoint: `train` with loss.method `method`,
    the image tower locked after a warm start (`lock_image`), and for CS-CLIP the demo's
    image foils (`image_foil_weight`)."""
    base = demo.train
    lock = base.model.lock_image or (demo.lock_image and demo.pretrain.layout_steps > 0)
    if method == "clip":  # CLIP-FT is the paper's baseline: the CLIP loss alone, no foils
        foils = {"image_foils": False}
    elif demo.image_foil_weight is not None:
        foils = ({"image_foils": True, "image_foil_weight": demo.image_foil_weight}
                 if demo.image_foil_weight > 0 else {"image_foils": False})
    else:
        foils = {}
    return base.model_copy(update={
        "model": base.model.model_copy(update={"pretrained": pretrained_uri, "lock_image": lock}),
        "loss": base.loss.model_copy(update={"method": method, **foils}),
        "run": base.run.model_copy(update={"name": None}),
    })


METHODS = {"CLIP-FT": "clip", "CS-CLIP": "csclip"}


def run_demo(demo: DemoConfig, command: str = "make demo",
             start_ray: Callable[[], object] = lambda: None) -> DemoResult:
    """Start Ray (`start_ray`: the entry point's; a no-op where Ray runs already),
    pretrain (or reuse the cached pretraining), fine-tune both ways, evaluate; write the
    tables, the results section (naming `command` as what produced them) and the stage
    timings under `out_dir`."""
    from csclip.tracking import resolve_uri

    started = time.perf_counter()
    tracking = demo.train.tracking
    uri = resolve_uri(tracking.uri) if tracking.enabled else None
    start_ray()
    stages = [StageTime("start Ray", time.perf_counter() - started)]
    layout = demo.pretrain.layout_steps
    _header(1, "pretraining a small CLIP: "
               + (f"the layout warm start ({layout} steps), then " if layout else "")
               + f"{demo.pretrain.optim.max_steps} steps x batch {demo.pretrain.batch_size} "
               f"on {demo.pretrain.num_train} world captions (cached after the first run)")
    warm_start = None
    if layout:
        warm_start, stage = _warm_start_stage(demo)
        stages.append(stage)
    pre = pretrain_config(demo, warm_start)
    pretrained, stage = _train_stage("pretrain", pre, uri)
    stages.append(stage)
    finetuned = {}
    for index, (label, method) in enumerate(METHODS.items(), start=2):
        config = finetune_config(demo, method, pretrained.checkpoint_uri)
        _header(index, f"fine-tuning {label}: {config.optim.max_steps} steps x batch "
                       f"{config.data.batch_size} on {config.data.world.num_train} scenes")
        finetuned[label], stage = _train_stage(label, config, uri)
        stages.append(stage)
    _header(4, f"half-truth evaluation on {demo.train.data.world.num_val} validation scenes")
    clock = time.perf_counter()
    markdown = evaluate(demo, pretrained, finetuned)
    stages.append(StageTime("evaluate", time.perf_counter() - clock))
    seconds = time.perf_counter() - started
    out = Path(demo.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS_SECTION).write_text(results_section(
        demo, pretrained, finetuned, markdown, command, seconds,
        reused=[stage.stage for stage in stages if stage.cached]))
    (out / STAGES_SECTION).write_text(stages_section(stages, seconds, command))
    written = (str(out / RESULTS_SECTION), str(out / STAGES_SECTION))
    return DemoResult(pretrained, finetuned, markdown, demo.out_dir, seconds, tuple(stages),
                      uri, written)


def publish(out_dir: str, root: str | Path = ".") -> list[Path]:
    """Copy the last demo's results section and stage timings from `out_dir` into their
    marked sections of docs/results.md and docs/performance.md under `root` (the other
    sections of those shared docs are kept). Raises DataError when `out_dir` holds no
    finished demo."""
    from csclip.errors import DataError
    from csclip.markdoc import update_marked_section

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


def _header(number: int, text: str) -> None:
    logger.info("==== [%d/4] %s ====", number, text)


def warm_start_dir(demo: DemoConfig) -> Path:
    """Where the layout warm start's checkpoint goes: under the pretraining's storage
    path (a local directory), named by a hash of everything that determines it."""
    import hashlib
    import json

    pre, model = demo.pretrain, demo.train.model
    key = {"model": model.name, "image_size": model.image_size, "steps": pre.layout_steps,
           "batch_size": pre.batch_size, "seed": demo.train.run.seed,
           "world": pretrain_world(demo).model_dump(mode="json")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(pre.storage_path) / f"layout-{digest}"


def _warm_start_stage(demo: DemoConfig) -> tuple[str, StageTime]:
    """The image tower's layout question (csclip.train.warm_start), in this process (a few
    minutes of CPU: no cluster needed), cached like the pretraining."""
    import json

    import torch

    from csclip.errors import ConfigError
    from csclip.model import create_bundle, save_checkpoint, spec_of
    from csclip.storage import is_s3
    from csclip.train.warm_start import image_layout_warm_start

    pre, model = demo.pretrain, demo.train.model
    if is_s3(pre.storage_path):
        raise ConfigError("pretrain.layout_steps needs a local pretrain.storage_path (the warm "
                          "start is written on this machine); set pretrain.layout_steps=0 or a "
                          "local pretrain.storage_path")
    directory = warm_start_dir(demo)
    summary = directory / "layout.json"
    started = time.perf_counter()
    if summary.is_file():
        logger.info("layout warm start: reusing %s", directory)
        return str(directory.resolve()), StageTime("layout warm start", 0.0, pre.layout_steps,
                                                    pre.batch_size, cached=True)
    bundle = create_bundle(model.name, image_size=model.image_size)
    device = "cuda" if demo.train.run.use_gpu and torch.cuda.is_available() else "cpu"
    result = image_layout_warm_start(bundle.model, bundle.preprocess, pretrain_world(demo),
                                     pre.layout_steps, batch_size=pre.batch_size,
                                     seed=demo.train.run.seed, device=device, log_every=500,
                                     log=logger.info)
    save_checkpoint(bundle.model.cpu(), spec_of(bundle.model, model.name), directory)
    summary.write_text(json.dumps(result.__dict__, indent=2))
    seconds = time.perf_counter() - started
    logger.info("layout warm start: %.1f%% of held-out objects in their cell (chance ~11%%), "
                "%.0f s", result.cell_accuracy, seconds)
    return str(directory.resolve()), StageTime("layout warm start", seconds, pre.layout_steps,
                                               pre.batch_size)


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


def _median_metric(uri: str, run_id: str, key: str) -> float | None:
    from csclip.tracking import run_metrics

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
    train, pre = demo.train, demo.pretrain
    world = train.data.world
    cs_clip = finetune_config(demo, "csclip", pretrained.checkpoint_uri)
    lines = [
        "## The demo: pretrained CLIP, CLIP-FT and CS-CLIP on the synthetic world", "",
        f"Produced by `{command}` (csclip.demo; {seconds / 60:.1f} min wall clock, "
        + (f"{', '.join(reused)} reused from an earlier run" if reused else "every stage run")
        + "). Models: the pretrained small CLIP (stands in for zero-shot CLIP), "
        "CLIP-FT and CS-CLIP fine-tuned from it on the same budget.", "",
        f"- model `{train.model.name}`, {world.image_size} px images",
        f"- pretraining: CLIP loss on {pre.num_train} world captions (world seed "
        f"{pre.world_seed}), {pre.optim.max_steps} steps x batch {pre.batch_size}, "
        f"lr {pre.optim.lr}"
        + (f", from an image tower warm-started on the layout question ({pre.layout_steps} "
           "steps on the same scenes; ours, docs/training.md)"
           + (", locked (LiT): only the text tower trains" if demo.lock_image else "")
           + (f", with image-side foils, μ = {pre.image_foil_weight} (ours)"
              if pre.image_foil_weight else "")
           if pre.layout_steps else ", from random weights"),
        f"- fine-tuning: {world.num_train} training scenes (seed {world.seed}), "
        f"{train.optim.max_steps} steps x batch {train.data.batch_size}, lr {train.optim.lr}, "
        f"N = {train.sampling.num_unit_slots}, relation_prob {train.sampling.relation_prob}, "
        f"λ = {train.loss.unit_loss_weight}"
        + (", the image tower locked in both (ours)" if cs_clip.model.lock_image else "")
        + (f"; CS-CLIP with image-side foils, μ = {cs_clip.loss.image_foil_weight} (ours; "
           "CLIP-FT never)" if cs_clip.loss.image_foils else ""),
        f"- evaluation: half-truth benchmark on the {world.num_val} validation scenes, seed "
        f"{demo.eval_seed}",
        "- runs (`<run.storage_path>/<run>/final`): pretrained "
        f"`{pretrained.run_name}`; "
        + "; ".join(f"{label} `{r.run_name}`" for label, r in finetuned.items()), "",
        markdown.strip(), ""]
    return "\n".join(lines)


def evaluate(demo: DemoConfig, pretrained: TrainResult, finetuned: dict[str, TrainResult]) -> str:
    """Compare the three models on the world's validation split; return the markdown."""
    from csclip.eval.halftruth import BenchmarkConfig
    from csclip.eval.pipeline import compare_models
    from csclip.model import load_bundle
    from csclip.records import load_split
    from csclip.tracking import resolve_uri

    records = load_split(None, "val", demo.train.data.world)
    bundles = {"CLIP (pretrained)": load_bundle(pretrained.checkpoint_uri)}
    bundles.update({label: load_bundle(result.checkpoint_uri) for label, result in finetuned.items()})
    uri = resolve_uri(demo.train.tracking.uri) if demo.train.tracking.enabled else None
    report = compare_models(bundles, records, demo.out_dir, uri,
                            benchmark=BenchmarkConfig(seed=demo.eval_seed),
                            experiment=demo.train.tracking.experiment + "-eval")
    Path(demo.out_dir).mkdir(parents=True, exist_ok=True)
    Path(demo.out_dir, "results.md").write_text(report.markdown)
    return report.markdown
