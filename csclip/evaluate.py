"""Half-truth evaluation: build the benchmark once, score models (in process or on Ray
Data), and write the paper's Table 1 / 6 / 7 (markdown + CSV), the image-side table and a
Figure-3 bar chart; log everything to MLflow."""

from __future__ import annotations

import csv
import logging
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, model_validator

from csclip.compositional import SuitesConfig, evaluate_suites
from csclip.config import StrictModel, flatten
from csclip.errors import ConfigError, DataError
from csclip.halftruth import (
    CONDITIONS,
    HalfTruthBenchmark,
    HalfTruthItem,
    ImageSideItem,
    ItemScores,
    build_half_truth_benchmark,
    build_image_side_benchmark,
    half_truth_metrics,
    image_side_metrics,
    items_to_table,
    load_benchmark,
    save_benchmark,
)
from csclip.model import ClipBundle, ModelConfig
from csclip.scoring import (
    BundleScorer,
    FeatureTables,
    ImageSource,
    Scorer,
    benchmark_texts,
    encode_features,
    encode_features_with_ray,
    image_sources,
    score_image_side,
    score_items,
)
from csclip.tracking import TrackingConfig, resolve_uri
from csclip.units import UnitsRecord
from csclip.world.config import WorldConfig

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------


class EvalDataConfig(StrictModel):
    """Where the evaluation records come from."""

    units_uri: str | None = None  # None: generate the synthetic world's split on the fly
    split: str = "val"  # SPEC §4: the benchmark is built from validation units
    world: WorldConfig = WorldConfig()


class BenchmarkConfig(StrictModel):
    seed: int = 0  # every choice of the builder is seeded from (seed, image_id)
    num_bootstrap: int = Field(1000, ge=0)  # SPEC §4: 1000 resamples
    image_side: bool = True
    min_distractors: int = Field(2, ge=1)
    max_distractors: int = Field(5, ge=1)
    # A saved benchmark table (.parquet / .csv from a previous run) to rescore instead of
    # building one; its images still come from the units table.
    table_uri: str | None = None

    @model_validator(mode="after")
    def _distractor_range(self) -> BenchmarkConfig:
        if self.max_distractors < self.min_distractors:
            raise ValueError(
                f"max_distractors ({self.max_distractors}) must be >= "
                f"min_distractors ({self.min_distractors})"
            )
        return self


class ScoringConfig(StrictModel):
    batch_size: int = Field(64, ge=1)
    device: str = "cpu"
    # Above this many images the encoders run on Ray Data actors; below, in process
    # (starting Ray costs seconds, which small sets never win back).
    ray_min_images: int = Field(5000, ge=0)
    ray_concurrency: int = Field(1, ge=1)  # model actors


class EvalTrackingConfig(TrackingConfig):
    """The training `tracking` section (uri None: $MLFLOW_TRACKING_URI, else
    sqlite:///mlflow.db; enabled), with the evaluation's own experiment."""

    experiment: str = "csclip-eval"


class EvalConfig(StrictModel):
    """The evaluation pipeline's config (pipelines/evaluate.py)."""

    model: ModelConfig = ModelConfig()
    checkpoint: str | None = None  # a csclip checkpoint directory; overrides model
    data: EvalDataConfig = EvalDataConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    scoring: ScoringConfig = ScoringConfig()
    tracking: EvalTrackingConfig = EvalTrackingConfig()
    # Retrieval and compositional suites next to the half-truth benchmark (Tables 16-17).
    suites: SuitesConfig = SuitesConfig()
    out_dir: str = "runs/eval"


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfTruthReport:
    """One model on one benchmark. metrics: see half_truth_metrics and image_side_metrics,
    plus num_images, num_skipped_<condition> and the suites' keys (ret_*, comp_*,
    sugarcrepe_*; csclip.compositional.evaluate_suites)."""

    name: str
    metrics: dict[str, float]
    items: tuple[HalfTruthItem, ...]
    scores: ItemScores
    skipped: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class ComparisonReport:
    """Several models on one benchmark: per-model reports, the tables as markdown, the
    files written and the MLflow run (or None)."""

    reports: dict[str, HalfTruthReport]
    markdown: str
    files: dict[str, Path]
    mlflow_run_id: str | None = None


@dataclass(frozen=True)
class PreparedBenchmark:
    """A benchmark with the image bytes it needs: built once, scored by many models."""

    benchmark: HalfTruthBenchmark
    image_side: tuple[ImageSideItem, ...]
    images: dict[str, ImageSource]  # bytes, or a URI read when encoded

    @property
    def texts(self) -> list[str]:
        return benchmark_texts(self.benchmark.items, self.image_side)


def prepare_benchmark(
    records: Sequence[UnitsRecord], seed: int = 0, config: BenchmarkConfig | None = None
) -> PreparedBenchmark:
    """Build the half-truth (and image-side) benchmark, or load config.table_uri, and
    collect its image sources.

    Raises DataError for no records, no usable items, or an image missing from `records`.
    """
    config = config or BenchmarkConfig(seed=seed)
    if config.table_uri:
        items = tuple(load_benchmark(config.table_uri))
        num_images = len({item.image_id for item in items})
        benchmark = HalfTruthBenchmark(items, {}, num_images, len(records))
    else:
        benchmark = build_half_truth_benchmark(records, seed)
    if not benchmark.items:
        reasons = ", ".join(f"{c}/{r}: {n}" for (c, r), n in benchmark.skipped.items())
        raise DataError(
            f"half-truth benchmark: {benchmark.num_images} images gave no items "
            f"(skips: {reasons}); units need foils and images"
        )
    side: list[ImageSideItem] = []
    if config.image_side:
        side = build_image_side_benchmark(
            records, seed, config.min_distractors, config.max_distractors
        )
    image_ids = [i.image_id for i in benchmark.items]
    image_ids += [image_id for item in side for image_id in (item.image_id, *item.distractors)]
    images = image_sources(records, image_ids)
    log.info(
        "half-truth benchmark: %d images, %d items, %d image-side items, skips %s",
        benchmark.num_images,
        len(benchmark.items),
        len(side),
        dict(benchmark.skipped),
    )
    return PreparedBenchmark(benchmark, tuple(side), images)


def report_from_features(
    name: str,
    features: FeatureTables,
    prepared: PreparedBenchmark,
    num_bootstrap: int = 1000,
    seed: int = 0,
) -> HalfTruthReport:
    """Metrics of one model from its encoded features."""
    bench = prepared.benchmark
    scores = score_items(features, bench.items)
    metrics = half_truth_metrics(bench.items, scores, num_bootstrap=num_bootstrap, seed=seed)
    if prepared.image_side:
        metrics.update(image_side_metrics(*score_image_side(features, prepared.image_side)))
    metrics["num_images"] = float(bench.num_images)
    for condition in CONDITIONS:
        metrics[f"num_skipped_{condition.slug}"] = float(bench.num_skipped(condition.slug))
    return HalfTruthReport(name, metrics, bench.items, scores, bench.skipped)


def evaluate_scorer(
    scorer: Scorer,
    records: Sequence[UnitsRecord],
    seed: int = 0,
    *,
    name: str = "scorer",
    config: BenchmarkConfig | None = None,
) -> HalfTruthReport:
    """Evaluate any Scorer (e.g. CaptionLengthScorer) in process."""
    config = config or BenchmarkConfig(seed=seed)
    prepared = prepare_benchmark(records, seed, config)
    features = encode_features(scorer, prepared.texts, prepared.images)
    return report_from_features(name, features, prepared, config.num_bootstrap, seed)


def encode_bundle(
    bundle: ClipBundle, prepared: PreparedBenchmark, scoring: ScoringConfig | None = None
) -> FeatureTables:
    """Features of the benchmark's texts and images: on Ray Data above
    scoring.ray_min_images images, in process otherwise."""
    scoring = scoring or ScoringConfig()
    if len(prepared.images) > scoring.ray_min_images:
        return encode_features_with_ray(
            bundle,
            prepared.texts,
            prepared.images,
            batch_size=scoring.batch_size,
            concurrency=scoring.ray_concurrency,
            device=scoring.device,
        )
    scorer = BundleScorer(bundle, batch_size=scoring.batch_size, device=scoring.device)
    return encode_features(scorer, prepared.texts, prepared.images)


def evaluate_bundle(
    bundle: ClipBundle,
    records: Sequence[UnitsRecord],
    seed: int = 0,
    *,
    scoring: ScoringConfig | None = None,
    config: BenchmarkConfig | None = None,
    suites: SuitesConfig | None = None,
) -> HalfTruthReport:
    """Half-truth metrics of one open_clip model on `records` (the validation units), plus
    the retrieval and compositional suites (csclip.compositional.evaluate_suites)."""
    config = config or BenchmarkConfig(seed=seed)
    prepared = prepare_benchmark(records, seed, config)
    features = encode_bundle(bundle, prepared, scoring)
    report = report_from_features(
        model_label(bundle), features, prepared, config.num_bootstrap, seed
    )
    add_suite_metrics(report, bundle, records, features, scoring, suites)
    return report


def add_suite_metrics(
    report: HalfTruthReport,
    bundle: ClipBundle,
    records: Sequence[UnitsRecord],
    features: FeatureTables,
    scoring: ScoringConfig | None = None,
    suites: SuitesConfig | None = None,
) -> None:
    """Add the suites' metrics to `report.metrics`, reusing the benchmark's features."""
    scoring = scoring or ScoringConfig()
    scorer = BundleScorer(bundle, batch_size=scoring.batch_size, device=scoring.device)
    report.metrics.update(evaluate_suites(scorer, records, suites, features))


def model_label(bundle: ClipBundle) -> str:
    """ "ViT-B-32:openai", "csclip-tiny" or, for a checkpoint, "csclip-tiny:<directory name>"."""
    if not bundle.pretrained:
        return bundle.name
    return f"{bundle.name}:{Path(bundle.pretrained).name or bundle.pretrained}"


# ---------------------------------------------------------------------------------------
# Tables (paper layout) and Figure 3
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A small table: CSV gets raw numbers, markdown formatted ones."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple, ...]
    formats: tuple[str, ...]  # per column: "" (as is), "acc", "gap", "float", "int"

    def to_markdown(self) -> str:
        lines = [
            f"### {self.title}",
            "",
            "| " + " | ".join(self.headers) + " |",
            "|" + "|".join("---" for _ in self.headers) + "|",
        ]
        for row in self.rows:
            lines.append(
                "| " + " | ".join(_fmt(v, f) for v, f in zip(row, self.formats, strict=True)) + " |"
            )
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path, stem: str) -> dict[str, Path]:
        md, csv_path = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
        md.write_text(self.to_markdown())
        with csv_path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(self.headers)
            writer.writerows(["" if v is None else v for v in row] for row in self.rows)
        return {f"{stem}.md": md, f"{stem}.csv": csv_path}


def _fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "acc":
        return f"{value:.1f}"
    if kind == "gap":
        return f"{value:+.4f}"
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return f"{value:.3f}"
    return str(value)


def _row(name: str, metrics: Mapping[str, float], keys: Sequence[str]) -> tuple:
    return (name, *(metrics.get(k) for k in keys))


def paper_tables(reports: Mapping[str, HalfTruthReport]) -> dict[str, Table]:
    """Table 1 (entity / relation / overall Acc_HT and Δ), Table 6 (per condition),
    Table 7 (A+ vs A- win rate), the image-side table and, when any report has them, the
    retrieval and compositional suites table."""
    slugs = [c.slug for c in CONDITIONS]
    labels = tuple(c.label for c in CONDITIONS)
    t1_keys = [
        "ht_entity",
        "ht_relation",
        "ht_all",
        "ht_all_ci_low",
        "ht_all_ci_high",
        "ht_gap_entity",
        "ht_gap_relation",
        "ht_gap",
        "num_items_all",
    ]
    t7_keys = [
        "winrate_entity",
        "winrate_relation",
        "winrate_all",
        *[f"winrate_{s}" for s in slugs],
        "consistency_all",
    ]
    side_keys = ["image_side_top1", "image_side_mrr", "image_side_margin", "image_side_num_items"]
    tables = {
        "table1": Table(
            "Table 1: half-truth accuracy Acc_HT (%) and mean gap Δ",
            (
                "Model",
                "Entity",
                "Relation",
                "Overall",
                "Overall CI low",
                "Overall CI high",
                "Δ Entity",
                "Δ Relation",
                "Δ Overall",
                "Items",
            ),
            tuple(_row(n, r.metrics, t1_keys) for n, r in reports.items()),
            ("", "acc", "acc", "acc", "acc", "acc", "gap", "gap", "gap", "int"),
        ),
        "table6": Table(
            "Table 6: Acc_HT (%) per condition",
            ("Model", *labels),
            tuple(_row(n, r.metrics, [f"ht_{s}" for s in slugs]) for n, r in reports.items()),
            ("", *["acc"] * len(slugs)),
        ),
        "table7": Table(
            "Table 7: truthful completion vs half-truth, win rate s(A+) > s(A-) (%)",
            ("Model", "Entity", "Relation", "Overall", *labels, "Consistency s(A+) > s(A)"),
            tuple(_row(n, r.metrics, t7_keys) for n, r in reports.items()),
            ("", *["acc"] * (len(t7_keys))),
        ),
        "image_side": Table(
            "Image-side half-truth: the text ranks its image above distractors",
            ("Model", "Top-1 (%)", "MRR", "Margin", "Items"),
            tuple(_row(n, r.metrics, side_keys) for n, r in reports.items()),
            ("", "acc", "float", "gap", "int"),
        ),
    }
    if any(k in r.metrics for r in reports.values() for k in SUITE_KEYS):
        tables["suites"] = Table(
            "Retrieval and compositional suites (%)",
            SUITE_HEADERS,
            tuple(_row(n, r.metrics, SUITE_KEYS) for n, r in reports.items()),
            ("", *["acc"] * len(SUITE_KEYS)),
        )
    return tables


# The suites table: tune.py's Table 16-17 columns (comp_*, ret_*) and the rest measured.
SUITE_KEYS: tuple[str, ...] = (
    "comp_i2t", "comp_t2i", "comp_group", "comp_i2t_replace", "sugarcrepe_avg",
    "ret_i2t", "ret_i2t_r5", "ret_i2t_r10", "ret_t2i", "ret_t2i_r5", "ret_t2i_r10",
)  # fmt: skip
SUITE_HEADERS: tuple[str, ...] = (
    "Model", "Pairs I2T", "Pairs T2I", "Pairs Group", "Replace I2T", "SugarCrepe",
    "Ret I2T R@1", "Ret I2T R@5", "Ret I2T R@10", "Ret T2I R@1", "Ret T2I R@5", "Ret T2I R@10",
)  # fmt: skip


def plot_figure3(reports: Mapping[str, HalfTruthReport], path: Path) -> Path:
    """Figure 3: entity vs relation Acc_HT per model, with 95% CIs and the chance line."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on workers or CI
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(reports)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(names) + 2), 3.6))
    for offset, group, color in ((-0.2, "entity", "#4c72b0"), (0.2, "relation", "#dd8452")):
        values = [reports[n].metrics.get(f"ht_{group}", np.nan) for n in names]
        low = [reports[n].metrics.get(f"ht_{group}_ci_low", np.nan) for n in names]
        high = [reports[n].metrics.get(f"ht_{group}_ci_high", np.nan) for n in names]
        errors = np.array([np.subtract(values, low), np.subtract(high, values)])
        ax.bar(x + offset, values, width=0.4, color=color, label=group, yerr=errors, capsize=3)
    # Chance: a model with no preference between A and A- wins half the time.
    ax.axhline(50, color="black", linestyle="--", linewidth=1, label="chance")
    # Checkpoint labels carry paths: wrap them so the axes keep their room.
    ax.set_xticks(x, [textwrap.fill(n, 22) for n in names], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("Acc_HT (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Half-truth accuracy: entity vs relation additions")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(
    reports: Mapping[str, HalfTruthReport], prepared: PreparedBenchmark, out_dir: str | Path
) -> tuple[str, dict[str, Path]]:
    """Write the tables, Figure 3, the benchmark table and per-item scores; return
    (markdown, files)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    tables = paper_tables(reports)
    for stem, table in tables.items():
        files.update(table.write(out, stem))
    files["figure3.png"] = plot_figure3(reports, out / "figure3.png")
    files["benchmark.parquet"] = save_benchmark(prepared.benchmark.items, out / "benchmark.parquet")
    files["scores.parquet"] = write_item_scores(
        reports, prepared.benchmark.items, out / "scores.parquet"
    )
    bench = prepared.benchmark
    skips = "".join(f"| {c} | {r} | {n} |\n" for (c, r), n in bench.skipped.items())
    markdown = "\n".join(t.to_markdown() for t in tables.values())
    markdown += (
        f"\nBenchmark: {bench.num_images} images, {len(bench.items)} items, "
        f"{len(prepared.image_side)} image-side items.\n"
    )
    if skips:
        markdown += "\n| Condition | Skip reason | Images |\n|---|---|---|\n" + skips
    (out / "halftruth.md").write_text(markdown)
    files["halftruth.md"] = out / "halftruth.md"
    return markdown, files


def write_item_scores(
    reports: Mapping[str, HalfTruthReport], items: Sequence[HalfTruthItem], path: Path
) -> Path:
    """The benchmark table plus s(I, A), s(I, A+), s(I, A-) per model: one row per item,
    columns `<model>/anchor`, `<model>/completion`, `<model>/half_truth`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = items_to_table(items)
    for name, report in reports.items():
        for part in ("anchor", "completion", "half_truth"):
            table = table.append_column(f"{name}/{part}", pa.array(getattr(report.scores, part)))
    pq.write_table(table, path)
    return path


# ---------------------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------------------

_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_prefix(name: str) -> str:
    """An MLflow-safe metric prefix for a model label ("ViT-B-32:openai" -> "ViT-B-32_openai")."""
    return _METRIC_CHARS.sub("_", name)


def _experiment_id(client, tracking_uri: str, experiment: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    # A sqlite store keeps artifacts next to the database, not in the caller's cwd.
    location = None
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri[len("sqlite:///") :]).absolute()
        location = database.parent.joinpath("mlartifacts").as_uri()
    try:
        return client.create_experiment(experiment, artifact_location=location)
    except MlflowException:
        # Another process (a parallel trial) created it between our get and create.
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise
        return found.experiment_id


def log_comparison(
    reports: Mapping[str, HalfTruthReport],
    files: Mapping[str, Path],
    tracking_uri: str,
    experiment: str = "csclip-eval",
    params: Mapping[str, object] | None = None,
) -> str:
    """Log one MLflow run: params (models, config), `<model>/<metric>` metrics and the
    tables / figure as artifacts. Returns the run id."""
    import math

    import mlflow
    from mlflow.entities import Metric, Param

    client = mlflow.MlflowClient(tracking_uri)
    experiment_id = _experiment_id(client, tracking_uri, experiment)
    run = client.create_run(experiment_id, run_name="halftruth-eval")
    run_id = run.info.run_id
    all_params = {"models": ",".join(reports), **(params or {})}
    for index, name in enumerate(reports):
        all_params[f"model_{index}"] = name
    param_list = [Param(k, str(v)[:6000]) for k, v in all_params.items()]
    metric_list = [
        Metric(f"{metric_prefix(name)}/{key}", value, 0, 0)
        for name, report in reports.items()
        for key, value in report.metrics.items()
        if not math.isnan(value)
    ]
    for start in range(0, max(len(param_list), len(metric_list)), 100):  # MLflow's batch limit
        client.log_batch(
            run_id, metrics=metric_list[start : start + 100], params=param_list[start : start + 100]
        )
    for path in files.values():
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    return run_id


def compare_models(
    bundles: Mapping[str, ClipBundle],
    records: Sequence[UnitsRecord],
    out_dir: str | Path,
    tracking_uri: str | None = None,
    *,
    seed: int = 0,
    experiment: str = "csclip-eval",
    scoring: ScoringConfig | None = None,
    config: BenchmarkConfig | None = None,
    params: Mapping[str, object] | None = None,
    suites: SuitesConfig | None = None,
) -> ComparisonReport:
    """Evaluate several models on one benchmark built from `records`, plus the `suites`
    (retrieval, compositional); write table1/6/7 (.md/.csv), image_side (.md/.csv), suites
    (.md/.csv, when measured), figure3.png, benchmark.parquet, scores.parquet and
    halftruth.md to out_dir; log them to MLflow when tracking_uri is given."""
    if not bundles:
        raise ConfigError("compare_models: no models given; pass at least one ClipBundle")
    config = config or BenchmarkConfig(seed=seed)
    prepared = prepare_benchmark(records, seed, config)
    reports = {}
    for name, bundle in bundles.items():
        log.info("scoring %s", name)
        features = encode_bundle(bundle, prepared, scoring)
        reports[name] = report_from_features(name, features, prepared, config.num_bootstrap, seed)
        add_suite_metrics(reports[name], bundle, records, features, scoring, suites)
    markdown, files = write_outputs(reports, prepared, out_dir)
    run_id = None
    if tracking_uri:
        run_params = {"seed": seed, **(params or {})}
        run_id = log_comparison(reports, files, tracking_uri, experiment, run_params)
    return ComparisonReport(reports, markdown, files, run_id)


# ---------------------------------------------------------------------------------------
# The pipeline's one call
# ---------------------------------------------------------------------------------------


def load_records(data: EvalDataConfig) -> list[UnitsRecord]:
    """The evaluation split (csclip.data.load_split)."""
    from csclip.data import load_split

    return load_split(data.units_uri, data.split, data.world)


def run_evaluation(config: EvalConfig) -> ComparisonReport:
    """Load the model (checkpoint or name + pretrained) and the records, then compare_models."""
    from csclip.model import bundle_from_config, load_bundle

    records = load_records(config.data)  # first: a bad table fails before a model loads
    if config.checkpoint:
        bundle = load_bundle(config.checkpoint, device=config.scoring.device)
    else:
        bundle = bundle_from_config(config.model, device=config.scoring.device)
    tracking_uri = resolve_uri(config.tracking.uri) if config.tracking.enabled else None
    return compare_models(
        {model_label(bundle): bundle},
        records,
        config.out_dir,
        tracking_uri,
        seed=config.benchmark.seed,
        experiment=config.tracking.experiment,
        scoring=config.scoring,
        config=config.benchmark,
        params=flatten(config),
        suites=config.suites,
    )
