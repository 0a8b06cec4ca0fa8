"""The vLLM engine config, prompts and answer parsing, without vLLM installed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.config import load_config
from csclip.config.extract import VllmConfig
from csclip.errors import ConfigError
from csclip.extract import backends, prompts
from csclip.extract.vllm import add_prompt_columns, processor_config, sampling_params
from csclip.units import ChangeType, RejectReason, validate_record

ROW = {"sample_id": "s-0", "image_id": "img", "caption": "A man riding a brown horse on a beach.",
       "split": "val", "image_path": "img.jpg", "image_bytes": None, "shard": 0}


def test_processor_config_has_paper_settings():
    config = processor_config(VllmConfig(num_engines=4))
    assert config.model_source == "Qwen/Qwen3-8B-AWQ"
    assert config.batch_size == 256
    assert config.concurrency == (4, 4)  # a fixed pool, not autoscaling 1..4
    assert config.should_continue_on_error is True
    assert config.engine_kwargs["enable_prefix_caching"] is True
    assert config.chat_template_stage == {"enabled": True,
                                          "chat_template_kwargs": {"enable_thinking": False}}


def test_processor_config_accepts_s3_model_and_overrides():
    from csclip.config.extract import BackendConfig

    cfg = load_config(BackendConfig, None, ["vllm.model_source=s3://models/qwen3-14b-awq",
                                            "vllm.batch_size=64", "vllm.accelerator_type=L4"])
    config = processor_config(cfg.vllm)
    assert (config.model_source, config.batch_size, config.accelerator_type) == (
        "s3://models/qwen3-14b-awq", 64, "L4")


def test_bad_vllm_field_is_a_config_error_naming_it():
    from csclip.config.extract import BackendConfig

    with pytest.raises(ConfigError, match="vllm.top_p"):
        load_config(BackendConfig, None, ["vllm.top_p=0"])
    with pytest.raises(ConfigError, match="vllm.max_tokns"):
        load_config(BackendConfig, None, ["vllm.max_tokns=10"])


def test_sampling_params_request_structured_json_output():
    params = sampling_params(VllmConfig())
    assert params["structured_outputs"] == {"json": prompts.UNITS_ANSWER_SCHEMA}
    assert (params["temperature"], params["top_p"]) == (0.3, 0.95)
    assert "guided_decoding" not in params and "guided_json" not in params  # removed in vLLM
    json.dumps(params)  # must survive the trip to the engine actors


def test_building_the_config_does_not_need_vllm():
    code = ("import sys; from csclip.extract.vllm import VllmConfig, processor_config; "
            "processor_config(VllmConfig()); assert 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_backends_and_prompts_do_not_import_ray():
    code = ("import sys, csclip.extract.backends, csclip.extract.prompts, csclip.extract.captions; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)



def caption_from_messages(messages: list[dict[str, str]]) -> str:
    """The caption a message list asks about: its user message is `Caption: <JSON
    string>\nAnswer:` (csclip.extract.prompts.user_prompt)."""
    content = next(m["content"] for m in messages if m["role"] == "user")
    return json.loads(content[len("Caption: "): content.rindex("\n")])

def test_prompt_columns_carry_messages_and_sampling():
    batch = pa.Table.from_pylist([ROW | {"caption": 'A sign saying "stop" on a pole.'}])
    out = add_prompt_columns(batch, cfg_json=VllmConfig(max_tokens=99).model_dump_json())
    messages = json.loads(out.column("prompt_json")[0].as_py())
    assert [m["role"] for m in messages] == ["system", "user"]
    assert caption_from_messages(messages) == 'A sign saying "stop" on a pole.'
    assert json.loads(out.column("sampling_json")[0].as_py())["max_tokens"] == 99


def test_repair_prompt_shows_the_answer_and_the_error():
    batch = pa.Table.from_pylist([ROW | {"raw_answer": '{"entities": [', "detail": "not JSON: x"}])
    out = add_prompt_columns(batch, cfg_json=VllmConfig().model_dump_json(), repair=True)
    messages = json.loads(out.column("prompt_json")[0].as_py())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == '{"entities": ['
    assert "not JSON: x" in messages[3]["content"]
    assert caption_from_messages(messages) == ROW["caption"]


def test_few_shot_examples_are_valid_answers():
    # The examples teach the format: each must pass our own parser and validator whole.
    examples = re.findall(r'Example caption: "(.*)"\nExample answer: (.*)\n', prompts.SYSTEM_PROMPT)
    assert len(examples) == 2
    for caption, answer in examples:
        outcome = backends.llm_outcome(ROW | {"caption": caption}, answer, None)
        assert outcome.record is not None, outcome
        assert outcome.item_rejections == [], outcome.item_rejections
        assert outcome.record.relations


def test_malformed_and_schema_violating_answers_are_rejected_with_reason():
    cut = backends.llm_outcome(ROW, '{"entities": [{"entity": "man"', None)
    assert (cut.reason, cut.stage) == (RejectReason.MALFORMED_JSON, "parse")
    wrong = backends.llm_outcome(
        ROW, json.dumps({"entities": [{"entity": "man", "foils": [
            {"foil": "woman", "change_type": "gender_change"}]}], "relations": []}), None)
    assert (wrong.reason, wrong.stage) == (RejectReason.SCHEMA_VIOLATION, "schema")
    assert "entities/0/foils/0/change_type" in wrong.detail
    assert backends.is_repairable(cut) and backends.is_repairable(wrong)


def test_inference_error_is_accounted_not_repaired():
    outcome = backends.llm_outcome(ROW, None, "CUDA out of memory")
    assert outcome.reason == RejectReason.INFERENCE_ERROR and not backends.is_repairable(outcome)


def test_think_block_and_fences_are_tolerated():
    answer = {"entities": [{"entity": "brown horse", "foils": [
        {"foil": "white horse", "change_type": "attribute_change"}]}], "relations": []}
    text = "<think>\n\n</think>\n\n```json\n" + json.dumps(answer) + "\n```"
    outcome = backends.llm_outcome(ROW, text, None)
    assert [u.text for u in outcome.record.entities] == ["brown horse"]


def test_semantically_bad_units_and_foils_are_dropped_with_reasons():
    answer = {
        "entities": [
            {"entity": "man", "foils": [{"foil": "man", "change_type": "object_change"},
                                        {"foil": "woman", "change_type": "object_change"}]},
            {"entity": "brown horse", "foils": [{"foil": "beach", "change_type": "object_change"}]},
            {"entity": "beach", "foils": []},
        ],
        "relations": [
            {"subject": "man", "predicate": "is riding", "object": "brown horse", "foils": [
                {"subject": "man", "predicate": "is not riding", "object": "brown horse",
                 "change_type": "negation"}]},
            {"subject": "cowboy", "predicate": "is on", "object": "beach", "foils": []},
        ],
    }
    outcome = backends.llm_outcome(ROW, json.dumps(answer), None)
    reasons = sorted(r.reason.value for r in outcome.item_rejections)
    assert reasons == ["foil_equals_unit", "foil_in_caption", "relation_argument_not_entity"]
    man = outcome.record.entities[0]
    assert [(f.text, f.change_type) for f in man.foils] == [("woman", ChangeType.OBJECT_CHANGE)]
    assert [r.text for r in outcome.record.relations] == ["man is riding brown horse"]


def test_answer_with_only_placeholders_rejects_the_caption():
    answer = {"entities": [{"entity": "entity_1", "foils": []}, {"entity": "N/A", "foils": []}],
              "relations": []}
    outcome = backends.llm_outcome(ROW, json.dumps(answer), None)
    assert outcome.record is None and outcome.reason == RejectReason.PLACEHOLDER
    assert backends.is_repairable(outcome)
    empty = backends.llm_outcome(ROW, '{"entities": [], "relations": []}', None)
    assert empty.reason == RejectReason.EMPTY_EXTRACTION


def test_engine_rows_round_trip_through_processor_columns():
    from csclip.extract.vllm import _from_engine_row, _to_engine_row, drop_engine_columns

    batch = add_prompt_columns(pa.Table.from_pylist([ROW]), cfg_json=VllmConfig().model_dump_json())
    row = _to_engine_row(batch.to_pylist()[0])
    assert row["messages"][1]["content"].startswith("Caption: ")
    assert row["sampling_params"]["structured_outputs"]["json"] == prompts.UNITS_ANSWER_SCHEMA
    # What the processor hands back: a success row through our postprocess, and an error
    # row that bypassed it; both keep the engine's working columns until we drop them.
    engine_cols = {"prompt": "<|im_start|>...", "num_input_tokens": 1040, "request_id": 3,
                   "params": "SamplingParams(...)", "time_taken_llm": 1.5, "batch_uuid": "ab"}
    ok = _from_engine_row({**row, **engine_cols, "generated_text": "{}", "__inference_error__": ""})
    failed = {**row, **engine_cols, "generated_text": None, "__inference_error__": "ValueError: x"}
    table = drop_engine_columns(pa.Table.from_pylist([ok, failed]))
    assert set(table.column_names) == set(ROW) | {"prompt_json", "sampling_json", "generated_text",
                                                   "__inference_error__"}
    assert table.column("__inference_error__").to_pylist() == ["", "ValueError: x"]


_WORDS = st.sampled_from(["man", "horse", "brown horse", "beach", " ", "N/A", "thing", "is on",
                          "is not on", "woman", "entity_1", "two dogs", "", "caption", "Man"])
_ENTITY_CHANGE = st.sampled_from(["attribute_change", "object_change", "antonym"])
_RELATION_CHANGE = st.sampled_from(["antonym", "negation", "subject_object_swap", "object_change"])
_ANSWERS = st.fixed_dictionaries({
    "entities": st.lists(st.fixed_dictionaries({
        "entity": _WORDS, "foils": st.lists(st.fixed_dictionaries(
            {"foil": _WORDS, "change_type": _ENTITY_CHANGE}), max_size=3)}), max_size=4),
    "relations": st.lists(st.fixed_dictionaries({
        "subject": _WORDS, "predicate": _WORDS, "object": _WORDS,
        "foils": st.lists(st.fixed_dictionaries({"subject": _WORDS, "predicate": _WORDS,
                                                  "object": _WORDS, "change_type": _RELATION_CHANGE}),
                          max_size=3)}), max_size=3)})


@settings(max_examples=150, deadline=None)
@given(answer=_ANSWERS, cut=st.integers(0, 400), caption=st.sampled_from(["", ROW["caption"]]))
def test_any_answer_ends_as_a_record_or_a_reason(answer, cut, caption):
    # Whatever the model writes (valid, schema-breaking, cut off), the answer stage decides;
    # it never raises, and a kept record has only valid units.
    text = json.dumps(answer)
    for candidate in (text, text[:cut]):
        outcome = backends.llm_outcome(ROW | {"caption": caption}, candidate, None)
        assert (outcome.record is None) != (outcome.reason is None)
        if outcome.record is not None:
            assert outcome.record.units
            again, dropped = validate_record(outcome.record)
            assert again == outcome.record and dropped == []


def test_entities_the_caption_does_not_say_are_dropped_with_their_relations():
    answer = {"entities": [_entity("man"), _entity("brown horses"), _entity("saddle")],
              "relations": [{"subject": "man", "predicate": "is on", "object": "saddle", "foils": []}]}
    outcome = backends.llm_outcome(ROW, json.dumps(answer), None)
    assert [e.text for e in outcome.record.entities] == ["man", "brown horses"]  # plural ok
    assert outcome.record.relations == ()
    assert sorted(r.reason.value for r in outcome.item_rejections) == [
        "entity_not_in_caption", "relation_argument_not_entity"]
    invented = backends.llm_outcome(ROW, json.dumps({"entities": [_entity("saddle")], "relations": []}), None)
    assert invented.reason == RejectReason.ENTITY_NOT_IN_CAPTION and backends.is_repairable(invented)


def _entity(text):
    return {"entity": text, "foils": []}


def test_http_processor_config_and_request_for_a_chat_server():
    from csclip.extract.vllm import _from_http_row, chat_request, http_processor_config

    cfg = VllmConfig(server_url="http://127.0.0.1:8000/v1/chat/completions", num_engines=3)
    config = http_processor_config(cfg)
    assert (config.url, config.batch_size, config.concurrency) == (cfg.server_url, 256, 3)
    request = chat_request([{"role": "user", "content": "x"}], sampling_params(cfg), "m")
    assert request["response_format"]["json_schema"]["schema"] == prompts.UNITS_ANSWER_SCHEMA
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    ok = _from_http_row({"sample_id": "a", "payload": request, "http_response": {
        "choices": [{"message": {"content": "{}"}}]}})
    assert ok == {"sample_id": "a", "generated_text": "{}", "__inference_error__": ""}
    failed = _from_http_row({"sample_id": "b", "http_response": {"error": {"message": "boom"}}})
    assert failed["generated_text"] == "" and "boom" in failed["__inference_error__"]


# ---------------------------------------------------------------------------------------
# Where the engine runs, engine arguments, and the checks before a row is sent
# ---------------------------------------------------------------------------------------

def test_engine_placement_follows_the_device():
    from csclip.extract.vllm import engine_placement

    gpu = processor_config(VllmConfig())
    assert gpu.placement_group_config is None  # Ray's vLLM stage: one GPU per rank
    def bundle(cfg):  # Ray normalises the placement (adds GPU 0.0, bundles, strategy)
        placement = processor_config(cfg).placement_group_config
        return {k: v for k, v in placement["bundle_per_worker"].items() if v}

    assert engine_placement(VllmConfig(device="cpu")) == {"bundle_per_worker": {"CPU": 1}}
    assert bundle(VllmConfig(device="cpu")) == {"CPU": 1}
    assert processor_config(VllmConfig(device="cpu")).accelerator_type is None
    assert bundle(VllmConfig(device="cpu", node_resource="csclip_vllm")) == {
        "CPU": 1, "csclip_vllm": 1}
    assert bundle(VllmConfig(node_resource="csclip_vllm")) == {"CPU": 1, "GPU": 1, "csclip_vllm": 1}


def test_cpu_engine_with_a_gpu_type_is_a_config_error():
    from csclip.config.extract import BackendConfig

    with pytest.raises(ConfigError, match="accelerator_type='L4' asks for a GPU type, but device=cpu"):
        load_config(BackendConfig, None, ["vllm.device=cpu", "vllm.accelerator_type=L4"])


def test_engine_kwargs_pass_through_and_guidance_is_the_default_backend():
    from csclip.config.extract import BackendConfig

    cfg = load_config(BackendConfig, None, ["vllm.engine_kwargs.dtype=float32",
                                            "vllm.engine_kwargs.enforce_eager=true"]).vllm
    kwargs = processor_config(cfg).engine_kwargs
    assert (kwargs["dtype"], kwargs["enforce_eager"]) == ("float32", True)
    assert kwargs["structured_outputs_config"] == {"backend": "guidance"}
    assert kwargs["enable_prefix_caching"] is True and kwargs["max_model_len"] == 4096
    xgrammar = processor_config(VllmConfig(structured_outputs_backend="xgrammar"))
    assert xgrammar.engine_kwargs["structured_outputs_config"] == {"backend": "xgrammar"}


def test_engine_kwargs_may_not_shadow_a_field():
    from csclip.config.extract import BackendConfig

    with pytest.raises(ConfigError, match="engine_kwargs sets max_model_len: use the field max_model_len"):
        load_config(BackendConfig, None, ["vllm.engine_kwargs.max_model_len=8192"])


def test_stage_cpus_are_set_on_every_cpu_stage():
    config = processor_config(VllmConfig(stage_num_cpus=0.25, tokenizer_stages=True))
    for stage in (config.chat_template_stage, config.tokenize_stage, config.detokenize_stage):
        assert stage["enabled"] is True and stage["num_cpus"] == 0.25
    assert config.chat_template_stage["chat_template_kwargs"] == {"enable_thinking": False}
    default = processor_config(VllmConfig())
    assert "num_cpus" not in default.chat_template_stage  # Ray's default: 1 per actor


def test_the_engine_tokenizes_unless_tokenizer_stages_are_asked_for():
    from csclip.extract.vllm import logical_cpus_needed

    default = processor_config(VllmConfig())
    assert default.chat_template_stage["enabled"] is True
    assert default.tokenize_stage["enabled"] is False and default.detokenize_stage["enabled"] is False
    # Per engine: its ranks plus one actor per CPU stage; plus one for Ray Data's tasks.
    assert logical_cpus_needed(VllmConfig(num_engines=2, tensor_parallel_size=2)) == 2 * (2 + 1) + 1
    assert logical_cpus_needed(VllmConfig(num_engines=2, tensor_parallel_size=2,
                                          tokenizer_stages=True, stage_num_cpus=0.5)) == 2 * (2 + 1.5) + 1


def test_logprob_columns_are_engine_columns():
    from csclip.extract.vllm import drop_engine_columns

    batch = pa.table({"sample_id": ["a"], "generated_text": ["{}"], "logprobs": [None],
                      "prompt_logprobs": [None], "num_input_tokens": [3]})
    assert drop_engine_columns(batch).column_names == ["sample_id", "generated_text",
                                                       "__inference_error__"]


def _screen(rows, cfg, attempt=0, prompt_length=None):
    from csclip.extract.prompt_sets.csclip import screen_llm_rows

    return screen_llm_rows(pa.Table.from_pylist(rows), cfg, attempt, prompt_length)


def test_empty_and_too_long_captions_are_rejected_before_the_engine():
    def words(messages):  # a stand-in tokenizer: one token per word
        return sum(len(m["content"].split()) for m in messages)

    base = words(prompts.extraction_messages("x"))
    cfg = VllmConfig(max_tokens=100, max_model_len=base + 100 + 5)
    rows = [ROW | {"sample_id": "ok", "caption": "a b c d e f"},        # base + 5 words
            ROW | {"sample_id": "long", "caption": "a b c d e f g"},    # one too many
            ROW | {"sample_id": "empty", "caption": "  "}]
    send, decided = _screen(rows, cfg, prompt_length=words)
    assert send.column("sample_id").to_pylist() == ["ok"]
    by_id = {r["sample_id"]: r for r in decided.to_pylist()}
    assert (by_id["empty"]["reason"], by_id["empty"]["stage"]) == ("empty_caption", "read")
    assert (by_id["long"]["reason"], by_id["long"]["stage"]) == ("prompt_too_long", "prompt")
    assert by_id["long"]["detail"] == (f"prompt of {base + 6} tokens + max_tokens 100 > "
                                       f"max_model_len {base + 105}")
    assert {r["status"] for r in by_id.values()} == {backends.Status.REJECTED}  # not repaired
    # Without a tokenizer (a server's model), only the empty caption is decided here.
    send, decided = _screen(rows, cfg)
    assert send.num_rows == 2 and decided.column("sample_id").to_pylist() == ["empty"]


def test_repair_prompts_are_measured_with_the_answer_they_carry():
    def chars(messages):
        return sum(len(m["content"]) for m in messages)

    row = ROW | {"raw_answer": "{" * 500, "detail": "not JSON"}
    limit = chars(prompts.extraction_messages(row["caption"])) + 200 + 16
    cfg = VllmConfig(max_tokens=16, max_model_len=max(512, limit))
    send, decided = _screen([row], cfg, attempt=0, prompt_length=chars)
    assert send.num_rows == (1 if limit >= 512 else 0)
    send, decided = _screen([row], cfg, attempt=1, prompt_length=chars)
    assert send.num_rows == 0
    assert decided.to_pylist()[0]["stage"] == "repair_prompt"
