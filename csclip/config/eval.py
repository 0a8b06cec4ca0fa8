"""The evaluation config (`csclip evaluate`): the model, the records, the half-truth
benchmark, the suites, scoring and tracking; and the vocabulary they are validated
against (suite names, protocols, the paper's benchmark size)."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from csclip.config.base import StrictModel
from csclip.config.model import ModelSource
from csclip.config.tracking import TrackingConfig
from csclip.config.world import WorldConfig

__all__ = ["BENCHMARK_NAMES", "CHECKPOINT_SELECTIONS", "DEFAULT_RESULTS_TEMPLATE", "PAPER",
           "PAPER_NUM_SAMPLES", "PAPER_SEED", "PAPER_SUITE", "PROTOCOLS", "RETRIEVAL_SUITES",
           "SUITE_NAMES", "ZEROSHOT_PAPER_SUITE", "ZEROSHOT_SUITE", "BenchmarkConfig",
           "CheckpointSelection", "EvalConfig", "EvalDataConfig", "EvalTrackingConfig",
           "Protocol", "RetrievalCounting", "ScoringConfig", "SuitesConfig",
           "expand_paper_suite"]

# The real-data benchmarks by name (csclip.eval.suites.registry holds one loader each,
# checked against this list when it is imported).
BENCHMARK_NAMES: tuple[str, ...] = (
    "aro", "bla", "coco_cf", "cola", "colorfoil", "colorswap", "mmvp", "negbench", "spec",
    "sugarcrepe", "sugarcrepe_pp", "svo_probes", "valse", "vismin", "vl_checklist", "whatsup",
    "winoground",
)  # fmt: skip
# Suites that are not compositional benchmarks but are run by name the same way.
RETRIEVAL_SUITES = {"coco_retrieval": "coco", "flickr30k_retrieval": "flickr30k",
                    "flickr8k_retrieval": "flickr8k"}
# A retrieval dataset's name (suites.retrieval_shards), the prefix of its `<name>_ret_*`
# keys; not one that other keys start with.
SHARD_DATASET_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
RESERVED_DATASET_NAMES = frozenset({"ret", "paper", "zs", "comp", "suite", "cap", "world",
                                    "ht", "halftruth"})
ZEROSHOT_SUITE = "zeroshot"
# The paper's ZS column: seven CLIP_benchmark datasets (csclip.eval.zeroshot_paper).
ZEROSHOT_PAPER_SUITE = "zeroshot_paper"
SUITE_NAMES: tuple[str, ...] = (*BENCHMARK_NAMES, *RETRIEVAL_SUITES, ZEROSHOT_SUITE,
                                ZEROSHOT_PAPER_SUITE)


# `--select` of `csclip evaluate` and `csclip ablate`: which checkpoint of a training run is
# reported. final: the last one; paper: the authors' two rules (csclip.eval.selection).
CheckpointSelection = Literal["final", "paper"]
CHECKPOINT_SELECTIONS: tuple[str, ...] = get_args(CheckpointSelection)


class ScoringConfig(StrictModel):
    batch_size: int = Field(64, ge=1)
    device: str = "cpu"
    # Model actors, when a set is large enough to encode on Ray Data
    # (csclip.eval.encoder.RAY_MIN_IMAGES).
    ray_concurrency: int = Field(1, ge=1)


RetrievalCounting = Literal["strict", "clip_benchmark"]


# Images per pass (entity, relation): the paper's tables (34,675 items per model) come from
# run_half_truth_batch.sh, NUM_SAMPLES=5000, the default of half_truth_vulnerability.py's
# --num_samples too (kargibora/CS-CLIP@16276c7 and @2325a1c); run_half_truth.sh's 1000 is
# the single-model launcher's default, not the paper's run.
PAPER_NUM_SAMPLES = 5000


PAPER_SEED = 42  # run_half_truth.sh --seed: random.seed before the +Rand draws


class BenchmarkConfig(StrictModel):
    """How the half-truth benchmark is built and bootstrapped. The seeds live here only."""

    # paper: the authors' builder item for item; csclip: ours; auto: paper for real data,
    # csclip for the synthetic world (records with source "gold"). docs/evaluation.md.
    protocol: Literal["auto", "paper", "csclip"] = "auto"
    seed: int = 0  # csclip: every choice is seeded from (seed, image_id); also the bootstrap's
    # paper: images per pass (PAPER_NUM_SAMPLES, 5000 as the paper's run); null: every image
    num_samples: int | None = Field(PAPER_NUM_SAMPLES, ge=1)
    paper_seed: int = PAPER_SEED  # paper: their --seed, for the +Rand draws
    num_bootstrap: int = Field(1000, ge=0)  # SPEC §4: 1000 resamples
    image_side: bool = True  # with 2-5 distractor images per item (SPEC §4)
    # A saved benchmark table (.parquet / .csv from a previous run) to rescore instead of
    # building one; its images still come from the units table.
    table_uri: str | None = None
    # A frozen benchmark file (`csclip benchmark build`, csclip.eval.benchmark_file): score
    # exactly its items, its images from the paths it holds (relative ones under image_root).
    file: str | None = None
    image_root: str | None = None
    # A benchmark file's image paths must stay inside image_root (relative ones are joined
    # to it, the current directory without one; none may hold ".."): true reads absolute
    # paths and URIs elsewhere, and "../" paths, where the file says. Their bytes are
    # checked against the file's sha256 either way.
    allow_outside_image_root: bool = False

    @model_validator(mode="after")
    def _one_source_of_items(self) -> BenchmarkConfig:
        if self.file and self.table_uri:
            raise ValueError("set benchmark.file or benchmark.table_uri, not both")
        return self


Protocol = Literal["official", "paper"]


PROTOCOLS: tuple[str, ...] = ("official", "paper")


PAPER = "paper"  # the suite name that runs the paper's set


# The paper's compositional suite (SPEC §5): ARO's four parts are one benchmark.
PAPER_SUITE: tuple[str, ...] = (
    "aro", "sugarcrepe", "sugarcrepe_pp", "valse", "vl_checklist", "winoground", "whatsup",
    "spec", "vismin", "colorfoil", "colorswap", "coco_cf", "bla", "cola", "mmvp", "negbench",
)  # fmt: skip


def expand_paper_suite(values: object) -> object:
    """A SuitesConfig's raw values with the suite name "paper" replaced by PAPER_SUITE
    and, when the protocol is unset (None), protocol "paper"."""
    if not isinstance(values, dict):
        return values
    names = values.get("names")
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    asked = bool(names) and PAPER in names
    out = dict(values)
    if asked:
        expanded: list[str] = []
        for name in names:
            for item in (PAPER_SUITE if name == PAPER else (name,)):
                if item not in expanded:
                    expanded.append(item)
        out["names"] = tuple(expanded)
    if asked and out.get("protocol") is None:
        out["protocol"] = PAPER
    return out


class SuitesConfig(StrictModel):
    """Which suites run next to the half-truth benchmark, and how large they are."""

    retrieval: bool = True  # Recall@k over the records' images and captions
    # World records only, their draws seeded by benchmark.seed: at most this many mirrored
    # pairs and as many replace items, one of each per record; 0: neither.
    num_world_pairs: int = Field(200, ge=0)
    # zs_world_*: classify world objects, at most this many items, one per record; 0: none.
    num_zeroshot_items: int = Field(500, ge=0)
    sugarcrepe_dir: str | None = None  # the SugarCrepe JSON files; None: not run
    coco_images: str | None = None  # COCO val2017 images (local dir or s3:// URI)
    # Real-data suites by name (SUITE_NAMES, or "paper": the paper's sixteen,
    # protocol.PAPER_SUITE), each read from <data_root>/<name>/ in its published layout
    # (docs/evaluation.md); `csclip evaluate` refuses a named suite whose files are not
    # there (find_named_suites), before any model loads.
    names: tuple[str, ...] = ()
    data_root: str | None = None  # local folder or s3:// prefix
    # true: score the named suites that are there and skip the others (one line each);
    # the suite average then says "k of n benchmarks" (suite_benchmarks_found / _asked).
    allow_missing: bool = False
    max_items_per_subset: int | None = Field(None, ge=1)  # a quick look at large suites
    # A benchmark with a missing or unreadable image fails with one line naming its
    # layout; true scores the rest and counts those records as skipped (reported).
    allow_partial: bool = False
    # official: each benchmark's own scorer; paper: the CS-CLIP authors' (docs/evaluation.md).
    # Unset (None): "paper" with the suite "paper" (set on validation), else "official".
    protocol: Literal["official", "paper"] | None = None
    # How retrieval Recall@k counts (csclip.eval.retrieval): clip_benchmark (one query per
    # caption instance, ties as torch.topk) or strict (ours). Unset: clip_benchmark; strict
    # on request.
    retrieval_counting: RetrievalCounting | None = None
    # Retrieval over webdataset shards (csclip.eval.shards): dataset -> a shard pattern
    # (DIR/{00000..00009}.tar, local or s3://; captions grouped by the JSON's image_id) or a
    # CLIP_benchmark retrieval folder (wds_mscoco_captions/). The dataset is one of the
    # retrieval suites' (RETRIEVAL_SUITES: coco, flickr30k, flickr8k), whose columns and
    # result files report it, as if its --suite had run, or a name of its own
    # (laion_heldout: `<name>_ret_*` keys, a `<name>_retrieval` result file).
    retrieval_shards: dict[str, str] = {}

    @property
    def scoring_protocol(self) -> str:
        """The protocol the named suites are scored with."""
        return self.protocol or "official"

    @property
    def retrieval_rule(self) -> RetrievalCounting:
        """How retrieval counts: retrieval_counting, else CLIP_benchmark's rule."""
        return self.retrieval_counting or "clip_benchmark"

    @model_validator(mode="before")
    @classmethod
    def _paper_suite(cls, values):
        return expand_paper_suite(values)

    @field_validator("names", mode="before")
    @classmethod
    def _split_names(cls, value):
        if isinstance(value, str):  # --set suites.names=aro,winoground
            value = [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("retrieval_shards")
    @classmethod
    def _retrieval_datasets(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not SHARD_DATASET_NAME.fullmatch(name)
               or name in RESERVED_DATASET_NAMES]
        if bad:
            raise ValueError(f"retrieval dataset name {bad[0]!r}: give lowercase letters, digits "
                             f"and _ (not {', '.join(sorted(RESERVED_DATASET_NAMES))}); "
                             f"{', '.join(RETRIEVAL_SUITES.values())} report as their suite")
        empty = [name for name, source in value.items() if not source.strip()]
        if empty:
            raise ValueError(f"{empty[0]} has no source; give a shard pattern or a "
                             "CLIP_benchmark retrieval folder")
        return value

    @model_validator(mode="after")
    def _check(self) -> SuitesConfig:
        if self.sugarcrepe_dir and not self.coco_images:
            raise ValueError(
                "suites.sugarcrepe_dir is set but suites.coco_images is not; "
                "point coco_images at the COCO val2017 images"
            )
        unknown = [n for n in self.names if n not in SUITE_NAMES]
        if unknown:
            raise ValueError(f"unknown suites {unknown}; choose from {', '.join(SUITE_NAMES)} "
                             "or paper (the paper's sixteen)")
        both = [f"{suite} and retrieval_shards.{dataset}" for suite, dataset
                in RETRIEVAL_SUITES.items() if suite in self.names and dataset in self.retrieval_shards]
        if both:
            raise ValueError(f"suites.names and suites.retrieval_shards both measure "
                             f"{both[0]}, under the same keys; give one")
        if self.names and not self.data_root:
            raise ValueError("suites.names needs suites.data_root (--data-root): the folder "
                             "holding one sub-folder per suite")
        return self


# CLIP_benchmark's --output default, without {language} (our benchmarks are English).
DEFAULT_RESULTS_TEMPLATE = "{dataset}_{pretrained}_{model}_{task}.json"


class EvalDataConfig(StrictModel):
    """Where the evaluation records come from."""

    units_uri: str | None = None  # None: generate the synthetic world's split on the fly
    split: str = "val"  # SPEC §4: the benchmark is built from validation units
    world: WorldConfig = WorldConfig()
    # false (--no-world): no records at all, so no half-truth benchmark and no suite over
    # the records; only the suites asked by name run, as CLIP_benchmark evaluates one
    # dataset (EvalConfig checks that some are).
    use_world: bool = True


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
    # Seeds torch before the model is created: a model with random weights (no pretrained,
    # no checkpoint) is the same model, and scores the same, in every run of the command.
    seed: int = 0
    # One JSON per model and dataset as CLIP_benchmark's eval writes it (its build reads
    # them), named by this template (relative to out_dir; its --output with {model},
    # {pretrained}, {pretrained_full_path}, {dataset}, {task}: csclip.eval.report.result_name).
    results_template: str = DEFAULT_RESULTS_TEMPLATE

    @model_validator(mode="after")
    def _something_without_the_world(self) -> EvalConfig:
        if self.data.use_world:
            return self
        given = next((name for name, value in (
            ("data.units_uri (--units)", self.data.units_uri),
            ("benchmark.file (--benchmark)", self.benchmark.file),
            ("benchmark.table_uri", self.benchmark.table_uri)) if value), None)
        if given:
            raise ValueError(f"data.use_world=false (--no-world) drops the records, but "
                             f"{given} gives records to build the half-truth benchmark "
                             "from; drop one")
        suites = self.suites
        if not (suites.names or suites.sugarcrepe_dir or suites.retrieval_shards):
            raise ValueError("data.use_world=false (--no-world) leaves nothing to evaluate: "
                             "name a suite (--suite NAMES --data-root DIR, --sugarcrepe DIR "
                             "or --retrieval-shards NAME=PATTERN)")
        return self
