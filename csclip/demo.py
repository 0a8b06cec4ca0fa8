"""The embedded default (`make demo`): on the synthetic world, on CPU, pretrain a small CLIP
contrastively (cached: it stands in for zero-shot CLIP, since no weights can be
downloaded), fine-tune it with CS-CLIP and with CLIP-FT on the same budget, and compare
the three on the half-truth benchmark."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from csclip.config import StrictModel
from csclip.loss import LossConfig
from csclip.optim import OptimConfig
from csclip.train import TrainConfig, TrainResult, run

logger = logging.getLogger(__name__)


class PretrainConfig(StrictModel):
    """The stand-in for web-scale pretraining: plain CLIP loss on world captions (which
    state relations, so the model can learn spatial layout) from scenes the fine-tuning
    never sees (another world seed)."""

    world_seed: int = 1000
    num_train: int = Field(4000, ge=1)
    batch_size: int = Field(64, ge=1)
    # `--set pretrain.optim.max_steps=300` keeps the other fields of this default
    # (csclip.config.with_section_defaults).
    optim: OptimConfig = OptimConfig(lr=1e-3, weight_decay=0.1, warmup_steps=50, max_steps=1500)
    storage_path: str = "runs/pretrain"


class DemoConfig(StrictModel):
    """`train` is the fine-tuning config (configs/default.yaml); the demo runs it twice,
    with loss.method csclip and clip, from the pretrained checkpoint."""

    train: TrainConfig = TrainConfig()
    pretrain: PretrainConfig = PretrainConfig()
    eval_seed: int = 0
    out_dir: str = "runs/demo"
    results_doc: str | None = "docs/results.md"  # where the demo writes its table (None: skip)


@dataclass(frozen=True)
class DemoResult:
    pretrained: TrainResult
    finetuned: dict[str, TrainResult]
    markdown: str
    out_dir: str
    seconds: float


def pretrain_config(demo: DemoConfig) -> TrainConfig:
    """The CLIP pretraining run: same model and world, another seed, plain CLIP loss."""
    base, pre = demo.train, demo.pretrain
    world = base.data.world.model_copy(update={"seed": pre.world_seed, "num_train": pre.num_train})
    return base.model_copy(update={
        "model": base.model.model_copy(update={"pretrained": None}),
        "data": base.data.model_copy(update={"world": world, "batch_size": pre.batch_size}),
        # Its own loss section, so that fine-tuning settings (λ) do not change the
        # pretraining's config hash and invalidate its cache.
        "loss": LossConfig(method="clip"),
        "optim": pre.optim,
        "run": base.run.model_copy(update={"name": None, "storage_path": pre.storage_path}),
    })


def finetune_config(demo: DemoConfig, method: str, pretrained_uri: str) -> TrainConfig:
    base = demo.train
    return base.model_copy(update={
        "model": base.model.model_copy(update={"pretrained": pretrained_uri}),
        "loss": base.loss.model_copy(update={"method": method}),
        "run": base.run.model_copy(update={"name": None}),
    })


METHODS = {"CLIP-FT": "clip", "CS-CLIP": "csclip"}


def run_demo(demo: DemoConfig, command: str = "make demo") -> DemoResult:
    """Pretrain (or reuse the cached pretraining), fine-tune both ways, evaluate; write
    the tables to `out_dir` and `results_doc` (naming `command` as what produced them)."""
    started = time.perf_counter()
    logger.info("demo 1/3: pretraining a small CLIP (cached after the first run)")
    pretrained = run(pretrain_config(demo))
    finetuned = {}
    for label, method in METHODS.items():
        logger.info("demo 2/3: fine-tuning %s", label)
        finetuned[label] = run(finetune_config(demo, method, pretrained.checkpoint_uri))
    logger.info("demo 3/3: half-truth evaluation")
    markdown = evaluate(demo, pretrained, finetuned)
    seconds = time.perf_counter() - started
    logger.info("demo finished in %.0f s", seconds)
    if demo.results_doc:
        write_results_doc(demo, pretrained, finetuned, markdown, command, seconds)
    return DemoResult(pretrained, finetuned, markdown, demo.out_dir, seconds)


def write_results_doc(demo: DemoConfig, pretrained: TrainResult, finetuned: dict[str, TrainResult],
                      markdown: str, command: str, seconds: float) -> Path:
    """The demo's section of docs/results.md: the comparison table and how it was made."""
    train, pre = demo.train, demo.pretrain
    world = train.data.world
    lines = [
        "## The demo: pretrained CLIP, CLIP-FT and CS-CLIP on the synthetic world", "",
        f"Produced by `{command}` (csclip.demo; {seconds / 60:.1f} min wall clock including "
        "cached stages). Models: the pretrained small CLIP (stands in for zero-shot CLIP), "
        "CLIP-FT and CS-CLIP fine-tuned from it on the same budget.", "",
        f"- model `{train.model.name}`, {world.image_size} px images",
        f"- pretraining: CLIP loss on {pre.num_train} world captions (world seed "
        f"{pre.world_seed}), {pre.optim.max_steps} steps x batch {pre.batch_size}, "
        f"lr {pre.optim.lr}",
        f"- fine-tuning: {world.num_train} training scenes (seed {world.seed}), "
        f"{train.optim.max_steps} steps x batch {train.data.batch_size}, lr {train.optim.lr}, "
        f"N = {train.sampling.num_unit_slots}, relation_prob {train.sampling.relation_prob}, "
        f"λ = {train.loss.unit_loss_weight}",
        f"- evaluation: half-truth benchmark on the {world.num_val} validation scenes, seed "
        f"{demo.eval_seed}",
        f"- checkpoints: pretrained `{pretrained.checkpoint_uri}`; "
        + "; ".join(f"{label} `{r.checkpoint_uri}`" for label, r in finetuned.items()), "",
        markdown.strip(), ""]
    from csclip.markdoc import update_marked_section

    # docs/results.md is shared (the ablation sweep writes its own section): replace only
    # the text between our markers.
    Path(demo.results_doc).parent.mkdir(parents=True, exist_ok=True)
    return update_marked_section(demo.results_doc, "demo", "\n".join(lines))


def evaluate(demo: DemoConfig, pretrained: TrainResult, finetuned: dict[str, TrainResult]) -> str:
    """Compare the three models on the world's validation split; return the markdown."""
    from csclip.data import load_split
    from csclip.eval.halftruth import BenchmarkConfig
    from csclip.eval.pipeline import compare_models
    from csclip.model import load_bundle
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
