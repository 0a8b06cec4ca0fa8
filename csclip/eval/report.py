"""Evaluation reports: the paper's Table 1 / 6 / 7, the image-side and suites tables
(markdown + CSV), Figure 3, per-item scores, and one MLflow run per comparison."""

from __future__ import annotations

import csv
import logging
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from csclip.eval.halftruth import (
    CONDITIONS,
    EXTRA_CONDITIONS,
    HalfTruthItem,
    ItemScores,
    PreparedBenchmark,
    items_to_table,
    save_benchmark,
)

log = logging.getLogger(__name__)


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
        # The layout conditions' win rates with their bootstrap 95% intervals: at 300
        # items an interval is about ±5.6 points, so whether a model separates "A left of
        # B" from its antonym or swap at all is read here, not from Table 7's point values.
        "table7_ci": Table(
            "Table 7, Ant and Swap: win rate s(A+) > s(A-) (%) with its bootstrap 95% CI",
            ("Model", *(f"{label}{part}" for label in ("Ant", "Swap")
                        for part in ("", " CI low", " CI high"))),
            tuple(_row(n, r.metrics, [f"winrate_{slug}{part}" for slug in ("ant", "swap")
                                      for part in ("", "_ci_low", "_ci_high")])
                  for n, r in reports.items()),
            ("", *["acc"] * 6),
        ),
        "image_side": Table(
            "Image-side half-truth: the text ranks its image above distractors",
            ("Model", "Top-1 (%)", "MRR", "Margin", "Items"),
            tuple(_row(n, r.metrics, side_keys) for n, r in reports.items()),
            ("", "acc", "float", "gap", "int"),
        ),
    }
    tables.update(benchmark_tables(reports))
    if any(k in r.metrics for r in reports.values() for k in SUITE_KEYS):
        tables["suites"] = Table(
            "Retrieval and compositional suites (%)",
            SUITE_HEADERS,
            tuple(_row(n, r.metrics, SUITE_KEYS) for n, r in reports.items()),
            ("", *["acc"] * len(SUITE_KEYS)),
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
    from csclip.eval.suites.core import SKIP_REASONS
    from csclip.eval.suites.registry import BENCHMARKS, CAPABILITIES, DIRECTIONS

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
            if any(v is not None for v in values):
                capability_rows.append((name, capability, *values))
    if not rows:
        return {}
    reason_headers = tuple(r.replace("_", " ").capitalize() for r in SKIP_REASONS)
    # Which scorers (suites.protocol) produced the numbers, so no table is read as the other.
    protocols = sorted({"paper" if r.metrics.get("suite_protocol_paper") else "official"
                        for r in reports.values()})
    scorers = f"{' / '.join(protocols)} scorers"
    return {
        "benchmarks": Table(f"Compositional benchmarks (%, {scorers}): I2T / T2I / Group per "
                            "subset; records read = scored + skipped",
                            ("Model", "Benchmark", "Subset", "I2T", "T2I", "Group", "Read",
                             "Scored", "Skipped", *reason_headers), tuple(rows),
                            ("", "", "", "acc", "acc", "acc", "int", "int", "int",
                             *["int"] * len(SKIP_REASONS))),
        "capabilities": Table(f"Compositional capabilities (%, {scorers}): mean over subsets; "
                              "suite = mean over benchmarks", ("Model", "Capability", "I2T", "T2I",
                                                       "Group"),
                              tuple(capability_rows), ("", "", "acc", "acc", "acc")),
    }


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
    bench = prepared.benchmark
    # Every half-truth table names the protocol and the benchmark's hash (docs/evaluation.md).
    tag = f" (protocol {bench.protocol}, benchmark {bench.content_hash[:19]})"
    for stem in ("table1", "table6", "table7", "table7_ci"):
        if stem in tables:
            tables[stem] = replace(tables[stem], title=tables[stem].title + tag)
    for stem, table in tables.items():
        files.update(table.write(out, stem))
    files["figure3.png"] = plot_figure3(reports, out / "figure3.png")
    files["benchmark.parquet"] = save_benchmark(prepared.benchmark.items, out / "benchmark.parquet")
    files["scores.parquet"] = write_item_scores(
        reports, prepared.benchmark.items, out / "scores.parquet"
    )
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


_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_prefix(name: str) -> str:
    """An MLflow-safe metric prefix for a model label ("ViT-B-32:openai" -> "ViT-B-32_openai")."""
    return _METRIC_CHARS.sub("_", name)


def log_comparison(
    reports: Mapping[str, HalfTruthReport],
    files: Mapping[str, Path],
    tracking_uri: str,
    experiment: str = "csclip-eval",
    params: Mapping[str, object] | None = None,
) -> str:
    """Log one MLflow run: params (models, config), `<model>/<metric>` metrics and the
    tables / figure as artifacts. Returns the run id."""
    from csclip import tracking

    mlflow_client = tracking.client(tracking_uri)
    run_id = mlflow_client.create_run(tracking.experiment_id(mlflow_client, experiment),
                                      run_name="halftruth-eval").info.run_id
    all_params = {"models": ",".join(reports), **(params or {})}
    for index, name in enumerate(reports):
        all_params[f"model_{index}"] = name
    tracking.log_params(mlflow_client, run_id, all_params)
    tracking.log_metrics(mlflow_client, run_id, {
        f"{metric_prefix(name)}/{key}": value
        for name, report in reports.items() for key, value in report.metrics.items()})
    for path in files.values():
        mlflow_client.log_artifact(run_id, str(path))
    mlflow_client.set_terminated(run_id)
    return run_id
