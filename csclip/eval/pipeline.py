"""The evaluation pipeline: build the half-truth benchmark once, encode each model once
(csclip.eval.encoder), score the benchmark and the suites, write the reports and log them
to MLflow. `run_evaluation(EvalConfig)` is pipelines/evaluate.py's one call."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from csclip.config import StrictModel, flatten
from csclip.errors import ConfigError
from csclip.eval.encoder import Encoder, ScoringConfig
from csclip.eval.halftruth import (
    CONDITIONS,
    BenchmarkConfig,
    PreparedBenchmark,
    half_truth_metrics,
    image_side_metrics,
    prepare_benchmark,
    score_image_side,
    score_items,
)
from csclip.eval.report import ComparisonReport, HalfTruthReport, log_comparison, write_outputs
from csclip.eval.suites import SuitesConfig, evaluate_suites
from csclip.model import ClipBundle, ModelSource
from csclip.tracking import TrackingConfig, resolve_uri
from csclip.units import UnitsRecord
from csclip.world.config import WorldConfig

log = logging.getLogger(__name__)


class EvalDataConfig(StrictModel):
    """Where the evaluation records come from."""

    units_uri: str | None = None  # None: generate the synthetic world's split on the fly
    split: str = "val"  # SPEC §4: the benchmark is built from validation units
    world: WorldConfig = WorldConfig()


class EvalTrackingConfig(TrackingConfig):
    """The training `tracking` section (uri None: $MLFLOW_TRACKING_URI, else
    sqlite:///mlflow.db; enabled), with the evaluation's own experiment."""

    experiment: str = "csclip-eval"


class EvalConfig(StrictModel):
    """The evaluation pipeline's config (pipelines/evaluate.py)."""

    model: ModelSource = ModelSource()  # only what evaluation reads: no training options
    checkpoint: str | None = None  # a csclip checkpoint directory; overrides model
    data: EvalDataConfig = EvalDataConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    scoring: ScoringConfig = ScoringConfig()
    tracking: EvalTrackingConfig = EvalTrackingConfig()
    # Retrieval and compositional suites next to the half-truth benchmark (Tables 16-17).
    suites: SuitesConfig = SuitesConfig()
    out_dir: str = "runs/eval"


def evaluate_encoder(
    name: str,
    encoder: Encoder,
    prepared: PreparedBenchmark,
    records: Sequence[UnitsRecord],
    benchmark: BenchmarkConfig,
    suites: SuitesConfig | None = None,
) -> HalfTruthReport:
    """One model's report: the half-truth (and image-side) metrics of `prepared`, plus the
    suites on `records`, all from `encoder` (each text and image encoded once)."""
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
        metrics.update(evaluate_suites(encoder, records, suites))
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


def model_label(bundle: ClipBundle) -> str:
    """ "ViT-B-32:openai", "csclip-tiny" or, for a checkpoint, "csclip-tiny:<directory name>"."""
    if not bundle.pretrained:
        return bundle.name
    return f"{bundle.name}:{Path(bundle.pretrained).name or bundle.pretrained}"


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
) -> ComparisonReport:
    """Evaluate several models on one benchmark built from `records` (or on `prepared`,
    e.g. a frozen benchmark file), plus the `suites` (retrieval, compositional); write
    table1/6/7 (.md/.csv), image_side (.md/.csv), suites (.md/.csv, when measured),
    figure3.png, benchmark.parquet, scores.parquet and halftruth.md to out_dir; log them to
    MLflow when tracking_uri is given."""
    if not bundles:
        raise ConfigError("compare_models: no models given; pass at least one ClipBundle")
    benchmark = benchmark or BenchmarkConfig()
    prepared = prepared or prepare_benchmark(records, benchmark)
    reports = {}
    for name, bundle in bundles.items():
        log.info("scoring %s", name)
        reports[name] = evaluate_encoder(name, Encoder.for_bundle(bundle, scoring), prepared,
                                         records, benchmark, suites or SuitesConfig())
    markdown, files = write_outputs(reports, prepared, out_dir)
    run_id = None
    if tracking_uri:
        run_params = {"seed": benchmark.seed, "benchmark_protocol": prepared.benchmark.protocol,
                      "benchmark_hash": prepared.benchmark.content_hash, **(params or {})}
        run_id = log_comparison(reports, files, tracking_uri, experiment, run_params)
    return ComparisonReport(reports, markdown, files, run_id)


def load_records(data: EvalDataConfig) -> list[UnitsRecord]:
    """The evaluation split (csclip.records.load_split)."""
    from csclip.errors import DataError
    from csclip.eval.benchmark_file import is_authors_unit_file
    from csclip.records import load_split

    if data.units_uri and is_authors_unit_file(data.units_uri):
        raise DataError(f"{data.units_uri} is a unit file in the authors' format, not a units "
                        "table: freeze it with `csclip benchmark build --units "
                        f"{data.units_uri} --out FILE`, then evaluate --benchmark FILE")

    return load_split(data.units_uri, data.split, data.world)


def run_evaluation(config: EvalConfig) -> ComparisonReport:
    """Load the model (checkpoint or name + pretrained) and the records, then compare_models."""
    from csclip.model import bundle_from_config, load_bundle
    from csclip.storage import resolve_output

    # Inside a Ray job a relative out_dir is the job's temporary copy: refused there.
    out_dir = resolve_output(config.out_dir, "out_dir")
    # First: a bad table or benchmark file fails before a model loads.
    prepared = None
    if config.benchmark.file:
        from csclip.eval.benchmark_file import prepare_frozen, read_benchmark_file

        frozen = read_benchmark_file(config.benchmark.file)
        if config.benchmark.protocol not in ("auto", frozen.benchmark.protocol):
            raise ConfigError(f"benchmark.protocol {config.benchmark.protocol!r}, but "
                              f"{config.benchmark.file} holds {frozen.benchmark.protocol!r} "
                              "items; drop --protocol or rebuild the file")
        # The units are read only when asked for (suites) or when the file holds no path
        # for some image (built from records that carried the bytes, e.g. the world).
        needs_units = config.data.units_uri is not None or None in frozen.images.values()
        records = load_records(config.data) if needs_units else []
        prepared = prepare_frozen(frozen, records, config.benchmark.image_root,
                                  config.benchmark.allow_outside_image_root)
    else:
        records = load_records(config.data)
    if config.checkpoint:
        bundle = load_bundle(config.checkpoint, device=config.scoring.device)
    else:
        bundle = bundle_from_config(config.model, device=config.scoring.device)
    tracking_uri = resolve_uri(config.tracking.uri) if config.tracking.enabled else None
    return compare_models(
        {model_label(bundle): bundle},
        records,
        out_dir,
        tracking_uri,
        benchmark=config.benchmark,
        experiment=config.tracking.experiment,
        scoring=config.scoring,
        params=flatten(config),
        suites=config.suites,
        prepared=prepared,
    )
