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
from csclip.errors import ConfigError
from csclip.extract import backends, prompts
from csclip.extract.vllm import VllmConfig, add_prompt_columns, processor_config, sampling_params
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
    from csclip.extract.backends import BackendConfig

    cfg = load_config(BackendConfig, None, ["vllm.model_source=s3://models/qwen3-14b-awq",
                                            "vllm.batch_size=64", "vllm.accelerator_type=L4"])
    config = processor_config(cfg.vllm)
    assert (config.model_source, config.batch_size, config.accelerator_type) == (
        "s3://models/qwen3-14b-awq", 64, "L4")


def test_bad_vllm_field_is_a_config_error_naming_it():
    from csclip.extract.backends import BackendConfig

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


def test_prompt_columns_carry_messages_and_sampling():
    batch = pa.Table.from_pylist([ROW | {"caption": 'A sign saying "stop" on a pole.'}])
    out = add_prompt_columns(batch, cfg_json=VllmConfig(max_tokens=99).model_dump_json())
    messages = json.loads(out.column("prompt_json")[0].as_py())
    assert [m["role"] for m in messages] == ["system", "user"]
    assert prompts.caption_from_messages(messages) == 'A sign saying "stop" on a pole.'
    assert json.loads(out.column("sampling_json")[0].as_py())["max_tokens"] == 99


def test_repair_prompt_shows_the_answer_and_the_error():
    batch = pa.Table.from_pylist([ROW | {"raw_answer": '{"entities": [', "detail": "not JSON: x"}])
    out = add_prompt_columns(batch, cfg_json=VllmConfig().model_dump_json(), repair=True)
    messages = json.loads(out.column("prompt_json")[0].as_py())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == '{"entities": ['
    assert "not JSON: x" in messages[3]["content"]
    assert prompts.caption_from_messages(messages) == ROW["caption"]


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
