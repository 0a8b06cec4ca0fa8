"""The evaluation pipeline: build the half-truth benchmark once, encode each model once
(csclip.eval.encoder), score the benchmark and the suites, write the reports and log them
to MLflow. `run_evaluation(EvalConfig)` is pipelines/evaluate.py's one call."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import open_clip
import torch

from csclip.config import flatten
from csclip.config.eval import (
    EvalConfig,
    EvalDataConfig,
    ScoringConfig,
    SuitesConfig,
)
from csclip.config.model import ModelSource
from csclip.errors import ConfigError, DataError
from csclip.eval.benchmark_file import (
    is_authors_unit_file,
    prepare_frozen,
    read_benchmark_file,
    records_under_root,
)
from csclip.eval.encoder import Encoder
from csclip.eval.halftruth import (
    CONDITIONS,
    BenchmarkConfig,
    ItemScores,
    PreparedBenchmark,
    half_truth_metrics,
    image_side_metrics,
    prepare_benchmark,
    score_image_side,
    score_items,
)
from csclip.eval.report import (
    ComparisonReport,
    HalfTruthReport,
    ModelIdentity,
    begin_outputs,
    check_results_template,
    log_comparison,
    write_outputs,
)
from csclip.eval.suites import NamedSuites, evaluate_suites, find_named_suites
from csclip.model import ClipBundle, bundle_from_config, load_bundle
from csclip.model_configs import SMALL_MODEL_CONFIGS, register_small_models
from csclip.pretrained import resolve_tag_weights
from csclip.records import load_split
from csclip.storage import exists, filesystem_for, read_bytes, resolve_output
from csclip.tracking import resolve_uri
from csclip.units import UnitsRecord, units_table_uri

log = logging.getLogger(__name__)


def evaluate_encoder(
    name: str,
    encoder: Encoder,
    prepared: PreparedBenchmark | None,
    records: Sequence[UnitsRecord],
    benchmark: BenchmarkConfig,
    suites: SuitesConfig | None = None,
    found: NamedSuites | None = None,
) -> HalfTruthReport:
    """One model's report: the half-truth (and image-side) metrics of `prepared` (None: no
    half-truth benchmark, --no-world), plus the suites on `records` (the named ones as
    `found` before any model loaded), all from `encoder` (each text and image encoded
    once)."""
    if prepared is None:
        metrics = evaluate_suites(encoder, records, suites or SuitesConfig(), found)
        return HalfTruthReport(name, metrics, (), ItemScores(*[np.zeros(0)] * 3))
    features = encoder.features(prepared.texts, prepared.images)
    bench = prepared.benchmark
    scores = score_items(features, bench.items)
    metrics = half_truth_metrics(bench.items, scores, num_bootstrap=benchmark.num_bootstrap,
                                 seed=benchmark.seed)
    if prepared.image_side:
        metrics.update(image_side_metrics(*score_image_side(features, prepared.image_side)))
    metrics["num_images"] = float(bench.num_images)
    for condition in CONDITIONS:
        metrics[f"num_skipped_{condition.slug}"] = float(bench.num_skipped(condition.slug))
    if suites is not None:
        metrics.update(evaluate_suites(encoder, records, suites, found, seed=benchmark.seed))
    return HalfTruthReport(name, metrics, bench.items, scores, bench.skipped)


def evaluate_bundle(
    bundle: ClipBundle,
    records: Sequence[UnitsRecord],
    *,
    benchmark: BenchmarkConfig | None = None,
    scoring: ScoringConfig | None = None,
    suites: SuitesConfig | None = None,
) -> HalfTruthReport:
    """Half-truth metrics of one open_clip model on `records` (the validation units), plus
    the retrieval and compositional suites (csclip.eval.suites.evaluate_suites)."""
    benchmark = benchmark or BenchmarkConfig()
    prepared = prepare_benchmark(records, benchmark)
    return evaluate_encoder(model_label(bundle), Encoder.for_bundle(bundle, scoring), prepared,
                            records, benchmark, suites or SuitesConfig())


# The directory names every run's checkpoints share (csclip.train): a label of one names
# its run too, as "final" alone says nothing of which model it is.
RUN_CHECKPOINT_NAME = re.compile(r"final|best|checkpoint_\d+")


def model_label(bundle: ClipBundle | ModelSource) -> str:
    """ "ViT-B-32:openai", "csclip-tiny", "csclip-tiny:weights.pt" or, for a run's
    checkpoint, "csclip-tiny:<run>/final" (or <run>/checkpoint_000123)."""
    if not bundle.pretrained:
        return bundle.name
    parts = [part for part in bundle.pretrained.replace("\\", "/").split("/") if part]
    if not parts:
        return f"{bundle.name}:{bundle.pretrained}"
    keep = 2 if len(parts) > 1 and RUN_CHECKPOINT_NAME.fullmatch(parts[-1]) else 1
    return f"{bundle.name}:{'/'.join(parts[-keep:])}"


_CHECKPOINT_DIR = re.compile(r"checkpoint_0*(\d+)")
STEP_FILE = "metrics.json"  # each checkpoint's metrics (csclip.train), with its step


def checkpoint_step(pretrained: str | None) -> int | None:
    """The training step of a checkpoint (its metrics.json, as csclip.train writes it, else
    a `checkpoint_000123` directory name); None for a tag, a weights file or random
    weights."""
    if not pretrained or not ("/" in pretrained or Path(pretrained).exists()):
        return None
    fs, path = filesystem_for(pretrained)
    path = path.rstrip("/")
    if exists(fs, f"{path}/{STEP_FILE}"):
        try:
            step = json.loads(read_bytes(fs, f"{path}/{STEP_FILE}")).get("step")
        except (ValueError, AttributeError):  # not the JSON object csclip.train writes
            step = None
        if isinstance(step, int):
            return step
    match = _CHECKPOINT_DIR.fullmatch(path.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def model_identity(bundle: ClipBundle) -> ModelIdentity:
    """The bundle's model name, pretrained (tag, file or checkpoint) and checkpoint step."""
    return ModelIdentity(bundle.name, bundle.pretrained, checkpoint_step(bundle.pretrained))


class LazyBundles(Mapping[str, ClipBundle]):
    """label -> ClipBundle, each built when looked up (compare_models looks each up once):
    with several models only the one being scored is in memory."""

    def __init__(self, makers: Mapping[str, Callable[[], ClipBundle]]):
        self._makers = dict(makers)

    def __getitem__(self, label: str) -> ClipBundle:
        return self._makers[label]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def compare_models(
    bundles: Mapping[str, ClipBundle],
    records: Sequence[UnitsRecord],
    out_dir: str | Path,
    tracking_uri: str | None = None,
    *,
    benchmark: BenchmarkConfig | None = None,
    experiment: str = "csclip-eval",
    scoring: ScoringConfig | None = None,
    params: Mapping[str, object] | None = None,
    suites: SuitesConfig | None = None,
    prepared: PreparedBenchmark | None = None,
    found: NamedSuites | None = None,
    results_template: str | None = None,
    half_truth: bool = True,
) -> ComparisonReport:
    """Evaluate several models on one benchmark built from `records` (or on `prepared`,
    e.g. a frozen benchmark file), plus the `suites` (retrieval, compositional); write
    table1/6/7 (.md/.csv), image_side (.md/.csv), suites (.md/.csv, when measured),
    figure3.png, benchmark.parquet, scores.parquet, halftruth.md and one CLIP_benchmark
    JSON per model and benchmark (named by results_template, e.g.
    DEFAULT_RESULTS_TEMPLATE; None: none) to out_dir; log
    them to MLflow when tracking_uri is given (csclip.eval.report.log_comparison).
    `bundles` may be a LazyBundles: each model is built when its turn comes. half_truth
    False: no half-truth benchmark (--no-world), only the suites and their tables."""
    if not bundles:
        raise ConfigError("compare_models: no models given; pass at least one ClipBundle")
    benchmark = benchmark or BenchmarkConfig()
    if half_truth:
        prepared = prepared or prepare_benchmark(records, benchmark)
    # The folder stops reading as finished now, not when the new tables land.
    begin_outputs(out_dir)
    reports = {}
    for name, bundle in bundles.items():
        log.info("scoring %s", name)
        report = evaluate_encoder(name, Encoder.for_bundle(bundle, scoring), prepared,
                                  records, benchmark, suites or SuitesConfig(), found)
        reports[name] = replace(report, identity=model_identity(bundle))
        del bundle  # before the next one is built (LazyBundles): one model in memory
    markdown, files = write_outputs(reports, prepared, out_dir,
                                    results_template=results_template)
    run_id = None
    if tracking_uri:
        run_params = {"seed": benchmark.seed, **({
            "benchmark_protocol": prepared.benchmark.protocol,
            "benchmark_hash": prepared.benchmark.content_hash} if prepared else {}),
            **(params or {})}
        run_id = log_comparison(reports, files, tracking_uri, experiment, run_params)
    return ComparisonReport(reports, markdown, files, run_id)


def load_records(data: EvalDataConfig, image_root: str | None = None) -> list[UnitsRecord]:
    """The evaluation split (csclip.records.load_split), relative image paths joined to
    image_root (--image-root)."""
    # An extraction's --out folder holds JSON markers beside units/: a units table.
    units_uri = units_table_uri(data.units_uri) if data.units_uri else None
    if units_uri and is_authors_unit_file(units_uri):
        raise DataError(f"{data.units_uri} is a unit file in the authors' format, not a units "
                        "table: freeze it with `csclip benchmark build --units "
                        f"{data.units_uri} --out FILE`, then evaluate --benchmark FILE")

    return records_under_root(load_split(units_uri, data.split, data.world), image_root)


def run_evaluation(config: EvalConfig, models: Sequence[ModelSource] = ()) -> ComparisonReport:
    """Load the records, then compare_models on the model (checkpoint, or name +
    pretrained) or on each of `models` (several in one command: CLIP_benchmark's
    --model/--pretrained product), each built when its turn comes."""
    # Inside a Ray job a relative out_dir is the job's temporary copy: refused there.
    out_dir = resolve_output(config.out_dir, "out_dir")
    if models and config.checkpoint:
        raise ConfigError("give several models (--model/--pretrained) or one checkpoint "
                          "(--checkpoint), not both")
    sources = list(models) or ([] if config.checkpoint else [config.model])
    labels = unique_labels(sources)
    # Every model's weights (a tag neither cached nor downloadable, a missing file) and
    # the results' file names, before any data.
    identities = [ModelIdentity(s.name, s.pretrained, checkpoint_step(s.pretrained))
                  for s in sources]
    check_results_template(config.results_template, identities or
                           [ModelIdentity("model", config.checkpoint)])
    for source in sources:
        check_weights(source)
    # First: a named suite not under suites.data_root, a bad table or benchmark file fails
    # before a model loads (the suites found are read once, here).
    found = find_named_suites(config.suites, refuse_missing=True) if config.suites.names else None
    prepared = None
    if config.benchmark.file:
        frozen = read_benchmark_file(config.benchmark.file)
        if config.benchmark.protocol not in ("auto", frozen.benchmark.protocol):
            raise ConfigError(f"benchmark.protocol {config.benchmark.protocol!r}, but "
                              f"{config.benchmark.file} holds {frozen.benchmark.protocol!r} "
                              "items; drop --protocol or rebuild the file")
        # The units are read only when asked for (suites) or when the file holds no path
        # for some image (built from records that carried the bytes, e.g. the world).
        needs_units = config.data.units_uri is not None or None in frozen.images.values()
        records = load_records(config.data, config.benchmark.image_root) if needs_units else []
        prepared = prepare_frozen(frozen, records, config.benchmark.image_root,
                                  config.benchmark.allow_outside_image_root)
    elif config.data.use_world:
        records = load_records(config.data, config.benchmark.image_root)
    else:  # --no-world: the named suites only
        records = []

    def seeded(make: Callable[[], ClipBundle]) -> Callable[[], ClipBundle]:
        def build() -> ClipBundle:
            # open_clip draws random initial weights from torch's RNG: each model from the
            # same state, whatever its place in the list.
            torch.manual_seed(config.seed)
            return make()
        return build

    params = flatten(config)
    if config.checkpoint:
        bundle = seeded(lambda: load_bundle(config.checkpoint, device=config.scoring.device))()
        bundles: Mapping[str, ClipBundle] = {model_label(bundle): bundle}
    else:
        # The bundle names its pretrained as given (a checkpoint directory, not the
        # weights file in it): the tables, results and runs say what the user typed.
        bundles = LazyBundles({label: seeded(lambda s=source: replace(bundle_from_config(
            s, device=config.scoring.device), pretrained=s.pretrained))
            for label, source in zip(labels, sources, strict=True)})
        if len(bundles) == 1:  # one model: built now, before out_dir is touched, as ever
            bundles = {label: bundles[label] for label in bundles}
        if models:  # each model's run gets its own model and pretrained (log_comparison)
            params = {k: v for k, v in params.items() if not k.startswith("model.")}
    tracking_uri = resolve_uri(config.tracking.uri) if config.tracking.enabled else None
    return compare_models(
        bundles,
        records,
        out_dir,
        tracking_uri,
        benchmark=config.benchmark,
        experiment=config.tracking.experiment,
        scoring=config.scoring,
        params=params,
        suites=config.suites,
        prepared=prepared,
        found=found,
        results_template=config.results_template,
        half_truth=config.data.use_world,
    )


def unique_labels(sources: Sequence[ModelSource]) -> list[str]:
    """Each model's name in the tables (model_label); where two would be the same (two
    checkpoints both .../final), the full pretrained path. A model given twice is refused."""
    labels = [model_label(s) for s in sources]
    out = [f"{s.name}:{s.pretrained}" if labels.count(label) > 1 else label
           for s, label in zip(sources, labels, strict=True)]
    repeated = sorted({label for label in out if out.count(label) > 1})
    if repeated:
        raise ConfigError(f"model {', '.join(repeated)} is given twice; give each model once")
    return out


def check_weights(source: ModelSource) -> None:
    """Refuse, before any data is read, an unknown model name, a pretrained tag whose
    weights are neither cached nor downloadable, and a pretrained path that is not there."""
    register_small_models()
    if open_clip.get_model_config(source.name) is None and not source.name.startswith(
            ("hf-hub:", "local-dir:")):
        raise ConfigError(f"model.name: unknown open_clip model {source.name!r}; choose one "
                          f"of {sorted(SMALL_MODEL_CONFIGS)} or open_clip.list_models()")
    resolve_tag_weights(source.name, source.pretrained)
    pretrained = source.pretrained
    if pretrained and "://" not in pretrained and ("/" in pretrained or pretrained.endswith(
            ".pt")) and not Path(pretrained).expanduser().exists():
        raise ConfigError(f"model.pretrained: {pretrained} does not exist; give a pretrained "
                          "tag, a weights file or a checkpoint directory")
