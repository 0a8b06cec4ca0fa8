"""Evaluation reports: the paper's Table 1 / 6 / 7, the image-side and suites tables
(markdown + CSV), Figure 3, per-item scores, one CLIP_benchmark-shaped JSON per model and
benchmark, and one MLflow run per model."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import shutil
import textwrap
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from csclip import storage, tracking
from csclip.errors import ConfigError, DataError
from csclip.eval.halftruth import (
    CONDITIONS,
    EXTRA_CONDITIONS,
    HalfTruthItem,
    ItemScores,
    PreparedBenchmark,
    items_to_table,
    save_benchmark,
)
from csclip.eval.suites.core import SKIP_REASONS
from csclip.eval.suites.registry import BENCHMARKS, CAPABILITIES, DIRECTIONS
from csclip.eval.zeroshot_paper import PAPER_DATASETS, metric_slug

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelIdentity:
    """Which model a report is of, as open_clip and CLIP_benchmark name it: the model
    name, the pretrained tag / weights file / checkpoint path (None: random weights), and
    a checkpoint's training step (None: not a checkpoint, or not recorded)."""

    model: str
    pretrained: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class HalfTruthReport:
    """One model on one benchmark. metrics: see half_truth_metrics and image_side_metrics,
    plus num_images, num_skipped_<condition> and the suites' keys (ret_*, comp_*,
    sugarcrepe_*; csclip.compositional.evaluate_suites). identity: the model, where the
    caller knows it (compare_models)."""

    name: str
    metrics: dict[str, float]
    items: tuple[HalfTruthItem, ...]
    scores: ItemScores
    skipped: Mapping[tuple[str, str], int] = field(default_factory=dict)
    identity: ModelIdentity | None = None


@dataclass(frozen=True)
class ComparisonReport:
    """Several models on one benchmark: per-model reports, the tables as markdown, the
    files written and the MLflow run (or None)."""

    reports: dict[str, HalfTruthReport]
    markdown: str
    files: dict[str, Path]
    mlflow_run_id: str | None = None  # the model's run, or with several the parent run


@dataclass(frozen=True)
class Table:
    """A small table: markdown gets human headers and formatted numbers; CSV gets
    snake_case headers (`keys`: the metric key where a column is one), raw numbers, counts
    as integers, and after the first column (`label`, the model's name in the tables) the
    model's `model`, `pretrained` and checkpoint `step` (empty where not known)."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple, ...]
    formats: tuple[str, ...]  # per column: "" (as is), "acc", "gap", "float", "int"
    keys: tuple[str, ...]  # per column: the CSV header; the first is "label"

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

    def write(self, out_dir: Path, stem: str,
              identities: Mapping[str, ModelIdentity] | None = None) -> dict[str, Path]:
        """Write <stem>.md and <stem>.csv; `identities` (label -> ModelIdentity) fills the
        CSV's model / pretrained / step columns."""
        md, csv_path = out_dir / f"{stem}.md", out_dir / f"{stem}.csv"
        md.write_text(self.to_markdown())
        identities = identities or {}
        with csv_path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow((self.keys[0], *IDENTITY_KEYS, *self.keys[1:]))
            for row in self.rows:
                who = identities.get(row[0])
                ident = (who.model, who.pretrained, who.step) if who else (None, None, None)
                values = (row[0], *ident, *(_csv_value(v, f) for v, f in
                                            zip(row[1:], self.formats[1:], strict=True)))
                writer.writerow("" if v is None else v for v in values)
        return {f"{stem}.md": md, f"{stem}.csv": csv_path}


IDENTITY_KEYS = ("model", "pretrained", "step")  # the CSV columns after `label`


def _not_measured(value: object) -> bool:
    # None, or NaN: what a metric not measured holds (a CI with benchmark.num_bootstrap=0).
    return value is None or (isinstance(value, float) and math.isnan(value))


def _csv_value(value, kind: str):
    # A count is an integer in the CSV (4000, not 4000.0); the rest as measured; a value
    # not measured an empty cell, as in the JSON results (null), not "nan".
    if _not_measured(value):
        return None
    if kind == "int":
        return int(round(value))
    return value


def _fmt(value, kind: str) -> str:
    if _not_measured(value):
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
    ci_keys = [f"winrate_{slug}{part}" for slug in ("ant", "swap")
               for part in ("", "_ci_low", "_ci_high")]
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
            ("label", *t1_keys),
        ),
        "table6": Table(
            "Table 6: Acc_HT (%) per condition",
            ("Model", *labels),
            tuple(_row(n, r.metrics, [f"ht_{s}" for s in slugs]) for n, r in reports.items()),
            ("", *["acc"] * len(slugs)),
            ("label", *[f"ht_{s}" for s in slugs]),
        ),
        "table7": Table(
            "Table 7: truthful completion vs half-truth, win rate s(A+) > s(A-) (%)",
            ("Model", "Entity", "Relation", "Overall", *labels, "Consistency s(A+) > s(A)"),
            tuple(_row(n, r.metrics, t7_keys) for n, r in reports.items()),
            ("", *["acc"] * (len(t7_keys))),
            ("label", *t7_keys),
        ),
        # The layout conditions' win rates with their bootstrap 95% intervals: at 300
        # items an interval is about ±5.6 points, so whether a model separates "A left of
        # B" from its antonym or swap at all is read here, not from Table 7's point values.
        "table7_ci": Table(
            "Table 7, Ant and Swap: win rate s(A+) > s(A-) (%) with its bootstrap 95% CI",
            ("Model", *(f"{label}{part}" for label in ("Ant", "Swap")
                        for part in ("", " CI low", " CI high"))),
            tuple(_row(n, r.metrics, ci_keys) for n, r in reports.items()),
            ("", *["acc"] * 6),
            ("label", *ci_keys),
        ),
        "image_side": Table(
            "Image-side half-truth: the text ranks its image above distractors",
            ("Model", "Top-1 (%)", "MRR", "Margin", "Items"),
            tuple(_row(n, r.metrics, side_keys) for n, r in reports.items()),
            ("", "acc", "float", "gap", "int"),
            ("label", *side_keys),
        ),
    }
    tables.update(benchmark_tables(reports))
    if any(k in r.metrics for r in reports.values() for k in SUITE_KEYS):
        partial = sorted({c for r in reports.values() if (c := suite_coverage(r.metrics))})
        tables["suites"] = Table(
            "Retrieval and compositional suites (%)"
            + (f"; Suite = mean over {' / '.join(partial)}" if partial else ""),
            SUITE_HEADERS,
            tuple(_row(n, r.metrics, SUITE_KEYS) for n, r in reports.items()),
            ("", *["acc"] * len(SUITE_KEYS)),
            ("label", *SUITE_KEYS),
        )
    return tables


# The suites table: the ablation's Table 16-17 columns (comp_*, suite_*, zs_*, ret_*) and
# the rest measured.
SUITE_KEYS: tuple[str, ...] = (
    "comp_i2t", "comp_t2i", "comp_group", "comp_i2t_replace", "sugarcrepe_i2t",
    "suite_i2t", "suite_t2i", "suite_group", "zs_world_avg", "zs_avg",
    "ret_i2t", "ret_i2t_r5", "ret_i2t_r10", "ret_t2i", "ret_t2i_r5", "ret_t2i_r10",
    "coco_ret_i2t", "coco_ret_t2i", "flickr30k_ret_i2t", "flickr30k_ret_t2i",
)  # fmt: skip


SUITE_HEADERS: tuple[str, ...] = (
    "Model", "Pairs I2T", "Pairs T2I", "Pairs Group", "Replace I2T", "SugarCrepe",
    "Suite I2T", "Suite T2I", "Suite Group", "World ZS", "ZS",
    "Ret I2T R@1", "Ret I2T R@5", "Ret I2T R@10", "Ret T2I R@1", "Ret T2I R@5", "Ret T2I R@10",
    "COCO I2T R@1", "COCO T2I R@1", "Flickr I2T R@1", "Flickr T2I R@1",
)  # fmt: skip


def benchmark_subsets(metrics: Mapping[str, float], benchmark: str,
                      benchmarks: Sequence[str]) -> list[str]:
    """The subsets of `benchmark` that have a `<benchmark>_<subset>_num` key, leaving out
    keys of a longer benchmark name that starts with this one (`sugarcrepe_pp_*` is
    SugarCrepe++'s, not a SugarCrepe subset `pp_*`)."""
    longer = [f"{b}_" for b in benchmarks if b != benchmark and b.startswith(f"{benchmark}_")]
    return sorted(k[len(benchmark) + 1:-len("_num")] for k in metrics
                  if k.startswith(f"{benchmark}_") and k.endswith("_num")
                  and not any(k.startswith(prefix) for prefix in longer))


def benchmark_tables(reports: Mapping[str, HalfTruthReport]) -> dict[str, Table]:
    """When real-data suites ran: `benchmarks` (one row per model, benchmark and subset:
    I2T / T2I / Group, and its accounting: records read = scored + skipped, with the
    skips by reason) and `capabilities` (per capability and the suite averages). {}
    otherwise."""
    rows, capability_rows = [], []
    for name, report in reports.items():
        metrics = report.metrics
        for benchmark in BENCHMARKS:
            subsets = benchmark_subsets(metrics, benchmark, list(BENCHMARKS))
            for subset in subsets:
                key = f"{benchmark}_{subset}"
                num, skipped = metrics.get(f"{key}_num"), metrics.get(f"{key}_skipped", 0.0)
                rows.append((name, benchmark, subset,
                             *(metrics.get(f"{key}_{d}") for d in DIRECTIONS),
                             metrics.get(f"{key}_read", (num or 0.0) + skipped), num, skipped,
                             *(metrics.get(f"{key}_skipped_{r}", 0.0) for r in SKIP_REASONS)))
            if subsets:
                rows.append((name, benchmark, "(benchmark)",
                             *(metrics.get(f"{benchmark}_{d}") for d in DIRECTIONS),
                             *[None] * (3 + len(SKIP_REASONS))))
        for capability in (*CAPABILITIES, "suite"):
            prefix = "suite" if capability == "suite" else f"cap_{capability}"
            values = tuple(metrics.get(f"{prefix}_{d}") for d in DIRECTIONS)
            coverage = suite_coverage(metrics) if capability == "suite" else None
            if any(v is not None for v in values) or coverage:
                label = f"suite ({coverage})" if coverage else capability
                capability_rows.append((name, label, *values))
    if not rows and not capability_rows:
        return {}
    reason_headers = tuple(r.replace("_", " ").capitalize() for r in SKIP_REASONS)
    # Which scorers (suites.protocol) produced the numbers, so no table is read as the other.
    protocols = sorted({"paper" if r.metrics.get("suite_protocol_paper") else "official"
                        for r in reports.values()})
    scorers = f"{' / '.join(protocols)} scorers"
    tables = {
        "benchmarks": Table(f"Compositional benchmarks (%, {scorers}): I2T / T2I / Group per "
                            "subset; records read = scored + skipped",
                            ("Model", "Benchmark", "Subset", "I2T", "T2I", "Group", "Read",
                             "Scored", "Skipped", *reason_headers), tuple(rows),
                            ("", "", "", "acc", "acc", "acc", "int", "int", "int",
                             *["int"] * len(SKIP_REASONS)),
                            ("label", "benchmark", "subset", *DIRECTIONS, "num_read",
                             "num_scored", "num_skipped",
                             *(f"num_skipped_{r}" for r in SKIP_REASONS))),
        "capabilities": Table(f"Compositional capabilities (%, {scorers}): mean over subsets; "
                              "suite = mean over benchmarks", ("Model", "Capability", "I2T", "T2I",
                                                       "Group"),
                              tuple(capability_rows), ("", "", "acc", "acc", "acc"),
                              ("label", "capability", *DIRECTIONS)),
    }
    if not rows:  # none of the named benchmarks was found (suites.allow_missing)
        del tables["benchmarks"]
    return tables


def suite_coverage(metrics: Mapping[str, float]) -> str | None:
    """ "k of n benchmarks" when the suite average is over part of the benchmarks named
    (suites.allow_missing skipped the others), else None."""
    asked, found = metrics.get("suite_benchmarks_asked"), metrics.get("suite_benchmarks_found")
    if not asked or found is None or found >= asked:
        return None
    return f"{int(found)} of {int(asked)} benchmarks"


def plot_figure3(reports: Mapping[str, HalfTruthReport], path: Path) -> Path:
    """Figure 3: entity vs relation Acc_HT per model, with 95% CIs and the chance line."""
    import matplotlib  # noqa: PLC0415  pyplot loads only for a plot, its Agg backend set first

    matplotlib.use("Agg")  # headless: no display on workers or CI
    import matplotlib.pyplot as plt  # noqa: PLC0415  after the backend is set
    import numpy as np  # noqa: PLC0415  only the plot needs it

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


# ---------------------------------------------------------------------------------------
# Results as CLIP_benchmark writes them: one JSON per model and benchmark
# ---------------------------------------------------------------------------------------

HALF_TRUTH = ("halftruth", "half_truth")  # (dataset, task) of the half-truth benchmark
# The pretrained tag of a model with random weights (no --pretrained, no checkpoint):
# CLIP_benchmark's build joins model and pretrained into a string, so it is never null.
RANDOM_WEIGHTS = "random"
LANGUAGE = "en"  # CLIP_benchmark's --language; our benchmarks are English


def benchmark_results(metrics: Mapping[str, float]) -> dict[str, tuple[str, dict[str, float]]]:
    """Split one model's metrics by the benchmark that measured them: dataset -> (task,
    metrics under plain keys, the benchmark's prefix dropped). Datasets: each real-data
    suite by its --suite name (task image_caption_selection), coco_retrieval /
    flickr30k_retrieval and retrieval (over the evaluation records; zeroshot_retrieval),
    zeroshot and world_zeroshot (zeroshot_classification), world_pairs and suite (the
    capability and suite averages; image_caption_selection), and halftruth (half_truth):
    every key no other benchmark claims, so no metric is left out."""
    groups: list[tuple[str, str, tuple[str, ...]]] = [
        (name, "image_caption_selection", (f"{name}_",))
        # a longer name first: sugarcrepe_pp_* is SugarCrepe++'s, not SugarCrepe's
        for name in sorted(BENCHMARKS, key=len, reverse=True)]
    groups += [
        ("coco_retrieval", "zeroshot_retrieval", ("coco_ret_",)),
        ("flickr30k_retrieval", "zeroshot_retrieval", ("flickr30k_ret_",)),
        ("flickr8k_retrieval", "zeroshot_retrieval", ("flickr8k_ret_",)),
        ("paper_retrieval", "zeroshot_retrieval", ("ret_paper_",)),  # COCO + Flickr8k mean
        ("retrieval", "zeroshot_retrieval", ("ret_",)),
        ("world_zeroshot", "zeroshot_classification", ("zs_world_",)),
        ("zeroshot_paper", "zeroshot_classification", ("zs_paper_",)),
        ("zeroshot", "zeroshot_classification", ("zs_",)),
        ("world_pairs", "image_caption_selection", ("comp_",)),
        ("suite", "image_caption_selection", ("suite_", "cap_")),
    ]
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for key, value in metrics.items():
        dataset, task, plain = *HALF_TRUTH, key
        for name, group_task, prefixes in groups:
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if prefix is not None:
                dataset, task, plain = name, group_task, key[len(prefix):]
                break
        else:  # retrieval over shards under a name of its own (suites.retrieval_shards)
            named = SHARD_RETRIEVAL_KEY.match(key)
            if named is not None:
                dataset, task = f"{named['name']}_retrieval", "zeroshot_retrieval"
                plain = key[named.end():]
        out.setdefault(dataset, (task, {}))[1][plain] = value
    return dict(sorted(out.items()))


SHARD_RETRIEVAL_KEY = re.compile(r"(?P<name>[a-z][a-z0-9_]*?)_ret_")


def result_name(template: str, identity: ModelIdentity, dataset: str, task: str) -> str:
    """The file name of one result, from an --output template as CLIP_benchmark formats it:
    {model}, {pretrained} (a path's last part), {pretrained_full_path} (a path's / as _),
    {dataset}, {task}; "/" in a model name becomes "_". ConfigError for another field, or
    a name outside the output folder."""
    pretrained = identity.pretrained or RANDOM_WEIGHTS
    is_path = "/" in pretrained or "\\" in pretrained
    fields = {"model": identity.model.replace("/", "_"),
              "pretrained": Path(pretrained.rstrip("/")).name if is_path else pretrained,
              "pretrained_full_path": pretrained.replace("/", "_"),
              "dataset": dataset.replace("/", "_"), "task": task}
    try:
        name = template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        known = ", ".join(f"{{{name}}}" for name in fields)
        raise ConfigError(f"--output {template!r}: {err} is not a field of it; use "
                          f"{known}") from None
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ConfigError(f"--output {template!r} gives {name!r}: give a file name relative "
                          "to --out")
    return name


def check_results_template(template: str, identities: Sequence[ModelIdentity]) -> None:
    """Refuse, before anything is scored, a template that would give two results of
    these models (or two benchmarks of one) the same file name: it needs {dataset} and
    what tells the models apart (e.g. {pretrained_full_path} for two checkpoints that are
    both .../final)."""
    seen: dict[str, ModelIdentity] = {}
    for identity in identities:
        for dataset in ("a", "b"):
            name = result_name(template, identity, dataset, "task")
            if name in seen:
                raise ConfigError(f"--output {template!r} names two results {name!r} "
                                  f"({identity.model} {identity.pretrained} and "
                                  f"{seen[name].model} {seen[name].pretrained}); put "
                                  "{dataset} and {pretrained_full_path} in it")
            seen[name] = identity


# Our suite names where CLIP_benchmark has the same data under another name (the retrieval
# suites are the Karpathy test splits its mscoco_captions / flickr30k / flickr8k read).
CLIP_BENCHMARK_DATASETS = {"sugarcrepe": "sugar_crepe", "coco_retrieval": "mscoco_captions",
                           "flickr30k_retrieval": "flickr30k", "flickr8k_retrieval": "flickr8k"}
# Means over datasets (zs_avg), subsets (<benchmark>_i2t), benchmarks (suite_*, cap_*) and
# COCO + Flickr8k (ret_paper_*), and how many datasets a suite found, stay in our tables
# (suites.csv, capabilities.csv, benchmarks.csv): a result is one dataset's measurement.
_AVERAGED_DATASETS = ("suite", "paper_retrieval")


@dataclass(frozen=True)
class ClipBenchmarkResult:
    """One model on one dataset as CLIP_benchmark's `eval` dumps it: `dataset` its name
    (CLIP_benchmark's where it knows the data, e.g. sugar_crepe/add_att), `task` and
    `metrics` under its names and scales (fractions in [0, 1], counts as ints)."""

    dataset: str
    task: str
    metrics: dict[str, float | int | str | None]


def _fraction(value: float | None) -> float | None:
    # Ours are percentages; CLIP_benchmark's accuracies and recalls are fractions.
    return None if value is None or not math.isfinite(value) else value / 100


def _count(value: float) -> int:
    return int(round(value))


def _selection(dataset: str, metrics: Mapping[str, float]) -> ClipBenchmarkResult:
    """An image_caption_selection result from plain i2t / t2i / group keys (percent) and
    num / skipped / read counts, named as CLIP_benchmark's image_caption_selection.evaluate:
    text_acc (an image picks its caption: our I2T), image_acc (a caption picks its image:
    T2I), acc (both right: Group). Where only I2T is measured an item has one image, whose
    captions always pick it, so CLIP_benchmark's acc equals its text_acc (its image_acc is
    1.0 by construction and is left out here)."""
    out: dict[str, float | int | str | None] = {}
    for ours, theirs in (("i2t", "text_acc"), ("t2i", "image_acc"), ("group", "acc")):
        if ours in metrics:
            out[theirs] = _fraction(metrics[ours])
    if "acc" not in out and "image_acc" not in out and "text_acc" in out:
        out["acc"] = out["text_acc"]
    counts = {"num": "num_scored", "read": "num_read", "skipped": "num_skipped"}
    for key, value in metrics.items():
        if key in counts or key.startswith(("num_", "skipped_")):
            out[counts.get(key, key if key.startswith("num_") else f"num_{key}")] = _count(value)
    return ClipBenchmarkResult(dataset, "image_caption_selection", out)


def _benchmark_results(name: str, metrics: Mapping[str, float]) -> list[ClipBenchmarkResult]:
    """One result per subset of a real-data benchmark (<name>/<subset>); its own i2t / t2i
    / group are the mean over subsets (the benchmarks table has them)."""
    subsets = benchmark_subsets({f"{name}_{k}": v for k, v in metrics.items()}, name, [name])
    if not subsets:
        return [_selection(CLIP_BENCHMARK_DATASETS.get(name, name), metrics)]
    results = []
    for subset in sorted(subsets, key=len, reverse=True):  # "a_b_*" before "a_*"
        prefix = f"{subset}_"
        own = {k[len(prefix):]: metrics[k] for k in metrics if k.startswith(prefix)}
        metrics = {k: v for k, v in metrics.items() if not k.startswith(prefix)}
        results.append(_selection(f"{CLIP_BENCHMARK_DATASETS.get(name, name)}/{subset}", own))
    return sorted(results, key=lambda r: r.dataset)


def _zeroshot_results(name: str, metrics: Mapping[str, float]) -> list[ClipBenchmarkResult]:
    """One result per zero-shot dataset (`<d>`: top-1, `<d>_recall`, `<d>_num_images`;
    world_zeroshot: one per attribute, `num_items` shared): acc1 and mean_per_class_recall
    as CLIP_benchmark's zeroshot_classification.evaluate, fractions; acc5 is not measured."""
    datasets = [k[:-len("_recall")] for k in metrics if k.endswith("_recall")]
    names = {metric_slug(d): d for d in PAPER_DATASETS} if name == "zeroshot_paper" else {}
    results = []
    for dataset in datasets:
        num = metrics.get(f"{dataset}_num_images", metrics.get("num_items"))
        values: dict[str, float | int | str | None] = {
            "acc1": _fraction(metrics[dataset]),
            "mean_per_class_recall": _fraction(metrics[f"{dataset}_recall"])}
        if num is not None:
            values["num_images"] = _count(num)
        label = f"world_zeroshot/{dataset}" if name == "world_zeroshot" else names.get(
            dataset, dataset)
        results.append(ClipBenchmarkResult(label, "zeroshot_classification", values))
    return results


def _retrieval_result(name: str, metrics: Mapping[str, float]) -> ClipBenchmarkResult:
    """Recall@k as CLIP_benchmark's zeroshot_retrieval.evaluate names it, fractions: I2T
    (an image finds a caption) is its text_retrieval_recall@k, T2I its
    image_retrieval_recall@k; counts as ints, the counting rule by name."""
    out: dict[str, float | int | str | None] = {}
    for key, value in metrics.items():
        direction, _, k = key.partition("_r")
        if direction in ("i2t", "t2i") and (not k or k.isdigit()):
            kind = "text" if direction == "i2t" else "image"
            out[f"{kind}_retrieval_recall@{k or 1}"] = _fraction(value)
        elif key == "counting_clip_benchmark":
            out["counting"] = "clip_benchmark" if value else "strict"
        elif key.startswith("num_") or key.startswith("skipped_"):
            out[key if key.startswith("num_") else f"num_{key}"] = _count(value)
        else:
            out[key] = value
    return ClipBenchmarkResult(CLIP_BENCHMARK_DATASETS.get(name, name), "zeroshot_retrieval",
                               out)


def _plain_result(name: str, task: str, metrics: Mapping[str, float]) -> ClipBenchmarkResult:
    # Our own benchmarks (half-truth) keep our names and scales; counts are ints.
    return ClipBenchmarkResult(name, task, {
        k: _count(v) if k.startswith("num_") and math.isfinite(v) else v
        for k, v in metrics.items()})


def clip_benchmark_results(metrics: Mapping[str, float]) -> list[ClipBenchmarkResult]:
    """One model's metrics as CLIP_benchmark's results, one per dataset (SugarCrepe: one
    per subset, sugar_crepe/<subset>), sorted by dataset. The grouping is
    benchmark_results'; means stay in our tables (_AVERAGED_DATASETS)."""
    results: list[ClipBenchmarkResult] = []
    for name, (task, plain) in benchmark_results(metrics).items():
        if name in _AVERAGED_DATASETS:
            continue
        if name in BENCHMARKS:
            results += _benchmark_results(name, plain)
        elif name == "world_pairs":  # mirrored pairs; replace items (one image each)
            pairs = {k: v for k, v in plain.items() if k in ("i2t", "t2i", "group")}
            pairs.update({"num_items": plain["num_pairs"]} if "num_pairs" in plain else {})
            results.append(_selection("world_pairs", pairs))
            if "i2t_replace" in plain:
                replace_items = {"i2t": plain["i2t_replace"]}
                if "num_replace_items" in plain:
                    replace_items["num_items"] = plain["num_replace_items"]
                results.append(_selection("world_replace", replace_items))
        elif task == "zeroshot_classification":
            results += _zeroshot_results(name, plain)
        elif task == "zeroshot_retrieval":
            results.append(_retrieval_result(name, plain))
        else:
            results.append(_plain_result(name, task, plain))
    return sorted(results, key=lambda r: r.dataset)


def result_files(reports: Mapping[str, HalfTruthReport], template: str) -> dict[str, str]:
    """One JSON per model and dataset that measured anything, as CLIP_benchmark's `eval`
    writes it and its `build` reads it: {"dataset", "model", "pretrained", "task",
    "metrics", "language"} (clip_benchmark_results), named by `template` (result_name).
    A report without an identity is its label; random weights are RANDOM_WEIGHTS."""
    files: dict[str, str] = {}
    for name, report in reports.items():
        identity = report.identity or ModelIdentity(name)
        pretrained = identity.pretrained or RANDOM_WEIGHTS
        for result in clip_benchmark_results(report.metrics):
            path = result_name(template, identity, result.dataset, result.task)
            if path in files:
                raise ConfigError(f"--output {template!r} names two results {path!r}; put "
                                  "{dataset} and {pretrained_full_path} in it")
            # Strict JSON: a value not measured (NaN, e.g. a CI without bootstrap) is null.
            plain = {k: v if not isinstance(v, float) or math.isfinite(v) else None
                     for k, v in result.metrics.items()}
            files[path] = json.dumps({"dataset": result.dataset, "model": identity.model,
                                      "pretrained": pretrained, "task": result.task,
                                      "metrics": plain, "language": LANGUAGE},
                                     indent=1, allow_nan=False)
    return files


# ---------------------------------------------------------------------------------------
# An evaluation's folder: finished when its marker is there
# ---------------------------------------------------------------------------------------

# Written last, listing every file of the evaluation (size, sha256); removed when the next
# evaluation into the same folder starts. A folder without it is an evaluation that was
# killed or is still running: its tables may mix two evaluations. A dot-file without the
# .json suffix: CLIP_benchmark's build reads every *.json of the folder as a result.
EVALUATION_COMPLETE = ".evaluation_complete"
# The marker's name before, which build failed on: removed with the marker.
_OLD_EVALUATION_COMPLETE = "_complete.json"
_STAGING_PREFIX = ".partial-"


def begin_outputs(out_dir: str | Path) -> Path:
    """Mark `out_dir` as being written before anything is scored: the previous
    evaluation's marker goes, and so do the staging folders of evaluations killed there."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # The previous evaluation's files go with its marker: a result JSON of a model not
    # evaluated now would otherwise sit beside the new ones, read by CLIP_benchmark's build.
    _remove_listed(out)
    (out / EVALUATION_COMPLETE).unlink(missing_ok=True)
    (out / _OLD_EVALUATION_COMPLETE).unlink(missing_ok=True)
    for stale in out.glob(f"{_STAGING_PREFIX}*"):  # one writer per folder: output_lease
        shutil.rmtree(stale, ignore_errors=True)
    return out


def _remove_listed(out: Path) -> None:
    """Remove the files a finished evaluation in `out` listed in its marker (only names
    that stay inside `out`); nothing without a readable marker."""
    try:
        listed = json.loads((out / EVALUATION_COMPLETE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # none, or not ours
        return
    for name in listed if isinstance(listed, dict) else ():
        if isinstance(name, str) and storage.inside_folder(name) and (out / name).is_file():
            (out / name).unlink()


def evaluation_problem(out_dir: str | Path) -> str | None:
    """Why `out_dir` holds no finished evaluation (None when it does): no marker, or a file
    it lists missing or changed since."""
    fs, path = storage.filesystem_for(str(Path(out_dir).absolute()))
    return storage.export_problem(fs, path, check_hashes=True, manifest=EVALUATION_COMPLETE)


def check_evaluation(out_dir: str | Path, shown_as: str | None = None) -> None:
    """Raise DataError when `out_dir` holds no finished evaluation; the message names it
    `shown_as` (e.g. the s3:// URI a local copy was made from) when given."""
    problem = evaluation_problem(out_dir)
    if problem is not None:
        raise DataError(f"the evaluation in {shown_as or out_dir} did not finish (killed, or "
                        f"still running?): rerun the same command ({problem})")


def _publish_outputs(staging: Path, out: Path) -> dict[str, Path]:
    """Move the staged files into `out`, then write the marker listing them (last)."""
    listing = storage.manifest_of(staging)
    listing["finished"] = datetime.now().astimezone().isoformat()
    names = sorted(listing["files"])
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).replace(out / name)
    shutil.rmtree(staging, ignore_errors=True)
    storage.write_local_atomic(out / EVALUATION_COMPLETE,
                               json.dumps(listing, indent=1, sort_keys=True).encode())
    return {name: out / name for name in names}


def write_outputs(
    reports: Mapping[str, HalfTruthReport], prepared: PreparedBenchmark | None,
    out_dir: str | Path,
    extra_files: Mapping[str, str] | None = None, results_template: str | None = None,
) -> tuple[str, dict[str, Path]]:
    """Write the tables, Figure 3, the benchmark table, per-item scores, `extra_files`
    (name -> text) and, with `results_template`, one CLIP_benchmark-shaped JSON per model
    and benchmark (result_files); return (markdown, files). Without `prepared` (--no-world:
    no half-truth benchmark) only the suites' tables and results. The files are written to a
    staging folder, moved into `out_dir`, and the marker (EVALUATION_COMPLETE) is written
    last: a reader never takes a half-written evaluation for a finished one
    (check_evaluation)."""
    begin_outputs(out_dir)
    out = Path(out_dir)
    staging = out / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"
    staging.mkdir()
    markdown = _write_staged(reports, prepared, staging)
    extra = dict(extra_files or {})
    if results_template is not None:
        extra.update(result_files(reports, results_template))
    for name, text in extra.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text(text)
    return markdown, _publish_outputs(staging, out)


# The tables of the half-truth benchmark (paper_tables), absent without one (--no-world).
HALF_TRUTH_TABLES = ("table1", "table6", "table7", "table7_ci", "image_side")


def _write_staged(
    reports: Mapping[str, HalfTruthReport], prepared: PreparedBenchmark | None, out: Path
) -> str:
    """Write every file of write_outputs into `out` (the staging folder); return the
    markdown."""
    tables = paper_tables(reports)
    if prepared is None:
        identities = {name: r.identity for name, r in reports.items() if r.identity is not None}
        kept = {stem: table for stem, table in tables.items() if stem not in HALF_TRUTH_TABLES}
        for stem, table in kept.items():
            table.write(out, stem, identities)
        return "\n".join(table.to_markdown() for table in kept.values())
    bench = prepared.benchmark
    # Every half-truth table names the protocol and the benchmark's hash (docs/evaluation.md).
    tag = f" (protocol {bench.protocol}, benchmark {bench.content_hash[:19]})"
    for stem in ("table1", "table6", "table7", "table7_ci"):
        if stem in tables:
            tables[stem] = replace(tables[stem], title=tables[stem].title + tag)
    identities = {name: r.identity for name, r in reports.items() if r.identity is not None}
    for stem, table in tables.items():
        table.write(out, stem, identities)
    plot_figure3(reports, out / "figure3.png")
    save_benchmark(prepared.benchmark.items, out / "benchmark.parquet")
    write_item_scores(reports, prepared.benchmark.items, out / "scores.parquet")
    skips = "".join(f"| {c} | {r} | {n} |\n" for (c, r), n in bench.skipped.items())
    markdown = "\n".join(t.to_markdown() for t in tables.values())
    markdown += (
        f"\nBenchmark: protocol {bench.protocol}, {bench.content_hash}; {bench.num_images} "
        f"images, {len(bench.items)} items, {len(prepared.image_side)} image-side items.\n"
    )
    for condition in EXTRA_CONDITIONS:  # built, but outside the paper's tables and averages
        for name, report in reports.items():
            if report.metrics.get(f"num_items_{condition.slug}"):
                markdown += (
                    f"{condition.label} (not in the paper's tables), {name}: Acc_HT "
                    f"{report.metrics[f'ht_{condition.slug}']:.1f} over "
                    f"{int(report.metrics[f'num_items_{condition.slug}'])} items.\n"
                )
    if skips:
        markdown += "\n| Condition | Skip reason | Images |\n|---|---|---|\n" + skips
    (out / "halftruth.md").write_text(markdown)
    return markdown


def write_item_scores(
    reports: Mapping[str, HalfTruthReport], items: Sequence[HalfTruthItem], path: Path
) -> Path:
    """The benchmark table plus s(I, A), s(I, A+), s(I, A-) per model: one row per item,
    columns `<model>/anchor`, `<model>/completion`, `<model>/half_truth`."""
    table = items_to_table(items)
    for name, report in reports.items():
        for part in ("anchor", "completion", "half_truth"):
            table = table.append_column(f"{name}/{part}", pa.array(getattr(report.scores, part)))
    pq.write_table(table, path)
    return path


def log_comparison(
    reports: Mapping[str, HalfTruthReport],
    files: Mapping[str, Path],
    tracking_uri: str,
    experiment: str = "csclip-eval",
    params: Mapping[str, object] | None = None,
) -> str:
    """Log one MLflow run per model (run name "<label> on <benchmarks>"; tags `model`,
    `pretrained`, `step` where known; `params`; the report's metrics under their own keys,
    the same for every model, so MLflow's Compare lines the runs up). One model: its run
    also holds the tables and figure (`files`) and is returned. Several: the files go once
    on a parent run (params `models`, the labels), which the model runs are nested under
    and which is returned: the tables compare the models, so they belong to neither."""
    mlflow_client = tracking.client(tracking_uri)
    experiment_id = tracking.experiment_id(mlflow_client, experiment)
    params = dict(params or {})
    parent_id = None
    if len(reports) > 1:
        benchmarks = sorted({b for r in reports.values() for b in benchmark_results(r.metrics)})
        parent_id = mlflow_client.create_run(
            experiment_id, run_name=f"{len(reports)} models on {', '.join(benchmarks)}",
            tags={"csclip_role": "comparison"}).info.run_id
        tracking.log_params(mlflow_client, parent_id, {"models": ",".join(reports), **params})
        _log_files(mlflow_client, parent_id, files)
    run_id = ""
    for name, report in reports.items():
        identity = report.identity or ModelIdentity(name)
        tags = {"model": identity.model, "pretrained": identity.pretrained or "none",
                "csclip_label": name, "csclip_role": "model"}
        if identity.step is not None:
            tags["step"] = str(identity.step)
        if parent_id is not None:
            tags[tracking.PARENT_TAG] = parent_id
        benchmarks = ", ".join(benchmark_results(report.metrics))
        run_id = mlflow_client.create_run(experiment_id, run_name=f"{name} on {benchmarks}",
                                          tags=tags).info.run_id
        tracking.log_params(mlflow_client, run_id, {**params, "model": identity.model,
                                                    "pretrained": identity.pretrained or "none"})
        tracking.log_metrics(mlflow_client, run_id, report.metrics)
        if parent_id is None:
            _log_files(mlflow_client, run_id, files)
        mlflow_client.set_terminated(run_id)
    if parent_id is not None:
        mlflow_client.set_terminated(parent_id)
    return parent_id or run_id


def _log_files(mlflow_client, run_id: str, files: Mapping[str, Path]) -> None:
    for name, path in files.items():
        folder = str(Path(name).parent)  # a result JSON in a sub-folder of --out keeps it
        mlflow_client.log_artifact(run_id, str(path), None if folder == "." else folder)
