"""The vLLM engine stage: `ray.data.llm` processor config, sampling
parameters with JSON-schema structured outputs, and the prompt columns it reads.

The engine is a function Dataset -> Dataset that adds `generated_text` and
`__inference_error__` to rows carrying `prompt_json` / `sampling_json`, so tests can swap
in a CPU stand-in. vLLM is an optional extra (`pip install csclip[vllm]`): importing this
module and building the config need only `ray[data]`; `build_engine` needs vLLM.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray

from csclip.config.extract import VllmConfig
from csclip.errors import ConfigError
from csclip.extract.prompts import UNITS_ANSWER_SCHEMA, extraction_messages, repair_messages

if TYPE_CHECKING:
    import ray.data
    from ray.data.llm import vLLMEngineProcessorConfig

log = logging.getLogger(__name__)

Engine = Callable[["ray.data.Dataset"], "ray.data.Dataset"]
ERROR_COLUMN = "__inference_error__"






def sampling_params(cfg: VllmConfig) -> dict[str, Any]:
    """vLLM SamplingParams kwargs; `structured_outputs.json` constrains decoding to
    UNITS_ANSWER_SCHEMA. Whether a finished answer then parses depends on the backend that
    enforces it (`structured_outputs_backend`: with guidance it does; a truncated answer
    never does, and goes to repair)."""
    return {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens,
            "structured_outputs": {"json": UNITS_ANSWER_SCHEMA}}


def processor_config(cfg: VllmConfig) -> vLLMEngineProcessorConfig:
    """The `ray.data.llm` processor config (needs only ray[data], not vLLM)."""
    from ray.data.llm import vLLMEngineProcessorConfig  # noqa: PLC0415  heavy (ray.llm); only when building the engine

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


def check_engine_resources(cfg: VllmConfig) -> None:
    """Say before the run when this Ray instance cannot hold the processor's actors at
    once (they then wait for each other until wait_for_min_actors_s)."""
    have, need = ray.cluster_resources().get("CPU", 0), logical_cpus_needed(cfg)
    if have < need:
        log.warning("extract: the vLLM processor needs %g logical CPUs at once (per engine: "
                    "%d for its ranks + %d stage actors x stage_num_cpus=%g; +1 for Ray Data); "
                    "this Ray instance has %g now. Unless nodes join, lower "
                    "backend.vllm.stage_num_cpus or start Ray with more CPUs.",
                    need, cfg.tensor_parallel_size, cpu_stages(cfg), cfg.stage_num_cpus, have)


# How Ray Data says an actor pool did not start within wait_for_min_actors_s (a
# GetTimeoutError): `engines_did_not_start` then says what the engines need instead.
ACTORS_TIMED_OUT = "Timed out while starting actors"


def engines_did_not_start(cfg: VllmConfig) -> ConfigError:
    """The error for engines that did not start in time: what they need, what Ray has."""
    resources = ray.cluster_resources()
    where = ("one GPU per tensor-parallel rank (a GPU node; device=cpu for vLLM's CPU build)"
             if cfg.device == "gpu" else "one logical CPU per tensor-parallel rank")
    return ConfigError(
        f"the vLLM processor's actors did not start within backend.vllm.wait_for_min_actors_s="
        f"{cfg.wait_for_min_actors_s} s: an engine with device={cfg.device} needs {where}, and "
        f"the processor {logical_cpus_needed(cfg):g} logical CPUs at once; this Ray instance "
        f"has {resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} GPUs")


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
    from ray.data.llm import build_processor  # noqa: PLC0415  heavy (ray.llm); only when building the engine

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
        import transformers  # noqa: PLC0415  heavy; only the in-process engine's length check
        from ray.llm._internal.common.utils.download_utils import (  # noqa: PLC0415  heavy (ray.llm)
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
    from ray.data.llm import HttpRequestProcessorConfig  # noqa: PLC0415  heavy (ray.llm); only for a server

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
