"""The full Ray Data extraction pipeline on CPU with an injected engine stage that replays
recorded LLM answers for real SugarCrepe captions, malformed and semantically bad answers,
inference errors, and crashes followed by a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from csclip.config import load_config
from csclip.config.extract import ExtractConfig
from csclip.errors import ConfigError, DataError
from csclip.extract.pipeline import run_extraction
from csclip.units import read_units

REPO = Path(__file__).resolve().parents[1]


def _e(entity, *foils):
    return {"entity": entity, "foils": [{"foil": f, "change_type": t} for f, t in foils]}


def _r(s, p, o, *foils):
    return {"subject": s, "predicate": p, "object": o, "foils": [
        {"subject": fs, "predicate": fp, "object": fo, "change_type": t} for fs, fp, fo, t in foils]}


ATT, OBJ = "attribute_change", "object_change"
# Recorded answers for the first ten SugarCrepe captions (add_att 0-9), written by hand in
# the shape Qwen3 gives under structured decoding; some deliberately broken.
GOOD = {
    "A drawing of a young woman with many facial piercings.": {
        "entities": [_e("drawing", ("photograph", OBJ), ("painting", OBJ)),
                     _e("young woman", ("old woman", ATT), ("young man", OBJ)),
                     _e("many facial piercings", ("many facial tattoos", OBJ), ("one facial piercing", ATT))],
        "relations": [_r("young woman", "has", "many facial piercings",
                         ("young woman", "has no", "many facial piercings", "negation"))]},
    "The man is sitting on the park bench using his laptop.": {
        "entities": [_e("man", ("woman", OBJ), ("man", OBJ)),  # foil equals unit: dropped
                     _e("park bench", ("park swing", OBJ), ("stone bench", ATT)),
                     _e("laptop", ("tablet", OBJ), ("closed laptop", ATT))],
        "relations": [_r("man", "is sitting on", "park bench",
                         ("man", "is standing beside", "park bench", "antonym"),
                         ("man", "is not sitting on", "park bench", "negation")),
                      _r("he", "is using", "laptop")]},  # subject not an entity: dropped
    "A man and woman in ski gear standing in front of a mountain.": {
        "entities": [_e("man", ("boy", OBJ)), _e("woman", ("girl", OBJ)),
                     _e("ski gear", ("swim gear", OBJ)), _e("mountain", ("lake", OBJ))],
        "relations": [_r("man", "is standing in front of", "mountain",
                         ("man", "is standing behind", "mountain", "antonym"),
                         ("mountain", "is standing in front of", "man", "subject_object_swap"))]},
    "a man swinging a tennis racket and hitting a ball on a tennis court.": {
        "entities": [_e("man", ("woman", OBJ)), _e("tennis racket", ("baseball bat", OBJ)),
                     _e("ball", ("frisbee", OBJ)), _e("tennis court", ("basketball court", OBJ))],
        "relations": [_r("man", "is swinging", "tennis racket",
                         ("man", "is not swinging", "tennis racket", "negation")),
                      _r("man", "is hitting", "ball", ("man", "is missing", "ball", "antonym"))]},
}
REPAIRED = {
    "Two zebras are battling each other on hind legs.": {
        "entities": [_e("two zebras", ("two horses", OBJ), ("three zebras", ATT)),
                     _e("hind legs", ("front legs", ATT))], "relations": []},
    "A white umbrella that has been blown up the wrong way.": {
        "entities": [_e("white umbrella", ("black umbrella", ATT), ("white kite", OBJ))],
        "relations": []},
}
FIRST = {
    **{caption: json.dumps(answer) for caption, answer in GOOD.items()},
    # Cut off mid-answer (max_tokens), repaired on the second call.
    "Two zebras are battling each other on hind legs.": '{"entities": [{"entity": "two zebras", "foils": [{"foil": "two hor',
    # Schema-invalid change_type, repaired on the second call.
    "A white umbrella that has been blown up the wrong way.": json.dumps(
        {"entities": [_e("white umbrella", ("black umbrella", "color_change"))], "relations": []}),
    # Schema-valid but only placeholders, twice: rejected.
    "A man wearing a white shirt and tie standing in a room.": json.dumps(
        {"entities": [_e("entity_1"), _e("N/A")], "relations": []}),
    # Nothing extracted, twice: rejected.
    "A scenic view of a valley with mountains in the distance.": '{"entities": [], "relations": []}',
    # Fenced JSON, tolerated.
    "A man doing a trick upside down on his snow board.": "```json\n" + json.dumps(
        {"entities": [_e("man", ("woman", OBJ)), _e("snow board", ("skateboard", OBJ))],
         "relations": [_r("man", "is on", "snow board", ("man", "is off", "snow board", "antonym"))]}) + "\n```",
}
SECOND = {**{caption: json.dumps(answer) for caption, answer in REPAIRED.items()},
          "A man wearing a white shirt and tie standing in a room.": json.dumps(
              {"entities": [_e("<entity>")], "relations": []}),
          "A scenic view of a valley with mountains in the distance.": FIRST[
              "A scenic view of a valley with mountains in the distance."]}
FAILING = {"cars are stopped at a traffic light on a highway"}  # engine error every time


def recorded_engine(first=FIRST, second=SECOND, failing=FAILING, crash_flag=None, crash_shard=None,
                    call_log=None):
    """A stand-in for the vLLM processor: adds `generated_text` / `__inference_error__`
    from recorded answers keyed by caption. With crash_flag, the first batch holding
    `crash_shard` raises (once), like an engine actor dying mid-run. With call_log, each
    request appends "<first|repair> <sample_id>" to that file (workers share the disk)."""

    def answer(batch):
        import os

        import pyarrow as pa

        texts, errors = [], []
        for row in batch.to_pylist():
            if crash_flag and row["shard"] == crash_shard and not os.path.exists(crash_flag):
                open(crash_flag, "w").close()
                raise RuntimeError("engine actor died (injected)")
            messages = json.loads(row["prompt_json"])
            # The user message is `Caption: <JSON string>\nAnswer:` (csclip.extract.prompts);
            # parsed here, inside the Ray task, so that it imports nothing of the tests.
            user = next(m["content"] for m in messages if m["role"] == "user")
            caption = json.loads(user[len("Caption: "):user.rindex("\n")])
            caption = " ".join(caption.split())  # keys: single spaces
            answers = second if len(messages) > 2 else first
            if call_log:
                with open(call_log, "a") as log:
                    log.write(f"{'repair' if len(messages) > 2 else 'first'} {row['sample_id']}\n")
            texts.append("" if caption in failing else answers.get(caption, "{}"))
            errors.append("CUDA error: out of memory (injected)" if caption in failing else "")
        batch = batch.append_column("generated_text", pa.array(texts, pa.string()))
        return batch.append_column("__inference_error__", pa.array(errors, pa.string()))

    return lambda ds: ds.map_batches(answer, batch_format="pyarrow", batch_size=None)


def _config(sugarcrepe_dir, tmp_path, *overrides):
    return load_config(ExtractConfig, None, [
        "input.format=sugarcrepe", f"input.uri={sugarcrepe_dir}/add_att.json", "input.limit=10",
        "backend.name=vllm", "output.shard_size=4", f"output.uri={tmp_path / 'out'}",
        "tracking.enabled=false", *overrides])


def _outputs(tmp_path):
    units = read_units(str(tmp_path / "out" / "units"))
    rejects = pq.read_table(tmp_path / "out" / "rejects").to_pylist()
    return units, rejects


def _check_balanced(summary, units, rejects, read=10):
    ids = [u.sample_id for u in units]
    rejected = [r["sample_id"] for r in rejects if r["level"] == "record"]
    assert len(ids) == len(set(ids)), "duplicate units rows"
    assert len(rejected) == len(set(rejected)) and not set(ids) & set(rejected)
    assert summary.read == read == len(ids) + len(rejected)
    assert (summary.with_units, summary.rejected) == (len(ids), len(rejected))


def test_recorded_answers_end_to_end_with_repair_and_rejects(ray_session, sugarcrepe_dir, tmp_path):
    summary = run_extraction(_config(sugarcrepe_dir, tmp_path), engine=recorded_engine())
    units, rejects = _outputs(tmp_path)
    _check_balanced(summary, units, rejects)
    assert summary.with_units == 7 and summary.num_shards == 3
    assert summary.rejected_by_reason == {"inference_error": 1, "placeholder": 1,
                                          "empty_extraction": 1}
    by_caption = {u.caption.strip(): u for u in units}
    zebras = by_caption["Two zebras are battling each other on hind legs."]
    assert [e.text for e in zebras.entities] == ["two zebras", "hind legs"]  # from the repair
    assert zebras.source == "vllm" and zebras.split == "test"
    bench = by_caption["The man is sitting on the park bench using his laptop."]
    assert [f.text for f in bench.entities[0].foils] == ["woman"]
    assert [r.text for r in bench.relations] == ["man is sitting on park bench"]
    record_rejects = {r["reason"]: r for r in rejects if r["level"] == "record"}
    assert record_rejects["inference_error"]["stage"] == "inference"
    assert record_rejects["placeholder"]["stage"] == "repair_validation"
    assert record_rejects["placeholder"]["raw_answer"] == SECOND[
        "A man wearing a white shirt and tie standing in a room."]
    items = {(r["reason"], r["sample_id"]) for r in rejects if r["level"] == "item"}
    assert ("foil_equals_unit", "sugarcrepe-add_att-000003") in items
    assert ("relation_argument_not_entity", "sugarcrepe-add_att-000003") in items
    assert not list((tmp_path / "out").glob("_stage1/*.parquet"))  # parked shards finished


def test_without_repair_bad_answers_are_rejected_at_once(ray_session, sugarcrepe_dir, tmp_path):
    summary = run_extraction(_config(sugarcrepe_dir, tmp_path, "backend.vllm.repair=false"), engine=recorded_engine())
    _check_balanced(summary, *_outputs(tmp_path))
    assert summary.rejected_by_reason == {"inference_error": 1, "placeholder": 1,
                                          "empty_extraction": 1, "malformed_json": 1,
                                          "schema_violation": 1}


def test_crash_after_a_shard_then_resume_skips_it_and_loses_nothing(ray_session, sugarcrepe_dir, tmp_path):
    config = _config(sugarcrepe_dir, tmp_path)
    written = []

    def crash_after_first(shard):
        written.append(shard)
        raise KeyboardInterrupt("killed after one shard (injected)")

    with pytest.raises(KeyboardInterrupt):
        run_extraction(config, engine=recorded_engine(), on_shard_written=crash_after_first)
    (first,) = written
    marker = tmp_path / "out" / "_done" / f"part-{first:05d}.json"
    units_file = tmp_path / "out" / "units" / f"part-{first:05d}.parquet"
    stamp = (marker.stat().st_mtime_ns, units_file.stat().st_mtime_ns)

    again = []
    calls = tmp_path / "calls.txt"
    summary = run_extraction(config, engine=recorded_engine(call_log=str(calls)),
                             on_shard_written=again.append)
    assert first not in again and sorted(again + written) == [0, 1, 2]
    # Every shard had answers to repair, so the crash came in the repair phase: the rerun
    # repairs the parked shards' rows and asks nothing twice of the first pass.
    requests = calls.read_text().split("\n")[:-1]
    assert requests and all(r.startswith("repair ") for r in requests)
    assert len(requests) == len(set(requests))
    assert (summary.shards_written, summary.shards_skipped) == (2, 1)
    assert (marker.stat().st_mtime_ns, units_file.stat().st_mtime_ns) == stamp  # not redone
    _check_balanced(summary, *_outputs(tmp_path))
    assert summary.with_units == 7


def test_engine_failure_mid_run_then_resume_completes(ray_session, sugarcrepe_dir, tmp_path):
    config = _config(sugarcrepe_dir, tmp_path)
    flag = str(tmp_path / "crashed")
    with pytest.raises(Exception, match="engine actor died"):
        run_extraction(config, engine=recorded_engine(crash_flag=flag, crash_shard=1))
    summary = run_extraction(config, engine=recorded_engine())
    assert summary.shards_written + summary.shards_skipped == 3
    _check_balanced(summary, *_outputs(tmp_path))
    # A third run finds everything done and changes nothing.
    final = run_extraction(config, engine=recorded_engine())
    assert (final.shards_written, final.read, final.with_units) == (0, 10, 7)


def test_resume_into_output_of_another_config_is_refused(ray_session, sugarcrepe_dir, tmp_path):
    run_extraction(_config(sugarcrepe_dir, tmp_path), engine=recorded_engine())
    with pytest.raises(DataError, match="shard_size"):
        run_extraction(_config(sugarcrepe_dir, tmp_path, "output.shard_size=5"), engine=recorded_engine())


def test_gold_backend_passes_world_units_through_and_logs_to_mlflow(ray_session, tmp_path, mlflow_uri):
    import mlflow

    from csclip.config.world import WorldConfig
    from csclip.world import iter_world

    world = {"num_train": 6, "num_val": 3, "num_test": 0}
    config = load_config(ExtractConfig, None, [
        *(f"input.world.{k}={v}" for k, v in world.items()), "output.shard_size=4",
        f"output.uri={tmp_path / 'out'}", f"tracking.uri={mlflow_uri}", "tracking.experiment=t"])
    summary = run_extraction(config)
    units, rejects = _outputs(tmp_path)
    _check_balanced(summary, units, rejects, read=9)
    assert summary.rejected == 0 and not rejects
    expected = sorted(iter_world(WorldConfig(**world), splits=("train", "val")), key=lambda r: r.sample_id)
    assert [(u.sample_id, u.entities, u.relations, u.image_bytes, u.source) for u in units] == [
        (r.sample_id, r.entities, r.relations, r.image_bytes, "gold") for r in expected]

    client = mlflow.tracking.MlflowClient(mlflow_uri)
    run = client.get_run(summary.mlflow_run_id)
    assert run.data.metrics["read"] == 9 and run.data.metrics["with_units"] == 9
    assert run.data.params["backend.name"] == "gold"
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "extract")]
    assert sorted(artifacts) == ["extract/rejects.parquet", "extract/summary.txt"]


def test_gold_backend_needs_the_world():
    with pytest.raises(ConfigError, match="backend.name=gold needs input.format=world"):
        load_config(ExtractConfig, None, ["input.format=csv", "input.uri=x.csv"])


def _entry_point():
    import importlib.util

    spec = importlib.util.spec_from_file_location("extract_entry", REPO / "pipelines" / "extract_units.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_coco_extract_config_loads_with_paper_settings():
    config = load_config(ExtractConfig, REPO / "configs" / "extract_coco.yaml")
    assert (config.input.format, config.backend.name) == ("karpathy", "vllm")
    vllm = config.backend.vllm
    assert (vllm.model_source, vllm.batch_size, vllm.temperature, vllm.top_p) == (
        "Qwen/Qwen3-8B-AWQ", 256, 0.3, 0.95)


def test_entry_point_runs_and_reports_accounting(ray_session, tmp_path, capsys):
    main = _entry_point()
    code = main(["--set", "input.world.num_train=3", "--set", "input.world.num_val=1",
                 "--set", "input.world.num_test=1", "--set", f"output.uri={tmp_path / 'out'}",
                 "--set", "tracking.enabled=false"])
    assert code == 0
    assert "read 5 = with units 5 + rejected 0" in capsys.readouterr().out
    assert main(["--set", "backend.name=llama"]) == 2


def test_rules_backend_in_the_pipeline_matches_direct_extraction(ray_session, sugarcrepe_dir, tmp_path):
    from csclip.extract.backends import rules_outcome
    from csclip.extract.captions import caption_table

    config = _config(sugarcrepe_dir, tmp_path, "backend.name=rules")
    summary = run_extraction(config)
    units, rejects = _outputs(tmp_path)
    _check_balanced(summary, units, rejects)
    direct = {row["sample_id"]: rules_outcome(row) for row in caption_table(config.input).to_pylist()}
    assert {u.sample_id: u.units for u in units} == {
        sid: o.record.units for sid, o in direct.items() if o.record is not None}
    assert {u.source for u in units} == {"rules"}
    items = sum(len(o.item_rejections) for o in direct.values())
    assert len([r for r in rejects if r["level"] == "item"]) == items


@pytest.fixture
def chat_server():
    """A small OpenAI-compatible chat-completions stub on 127.0.0.1 that answers from the
    recorded answers (an error body for FAILING captions) and keeps every request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.test_vllm_config import caption_from_messages

    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            caption = " ".join(caption_from_messages(body["messages"]).split())
            answers = SECOND if len(body["messages"]) > 2 else FIRST
            reply = ({"error": {"message": "CUDA error: out of memory", "code": 500}}
                     if caption in FAILING else
                     {"choices": [{"index": 0, "message": {"role": "assistant",
                                                           "content": answers.get(caption, "{}")}}]})
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions", requests
    server.shutdown()


def test_ray_data_llm_http_processor_against_a_chat_server(ray_session, sugarcrepe_dir, tmp_path,
                                                           chat_server):
    # The real ray.data.llm processor (HTTP flavour) end to end, instead of a stand-in.
    url, requests = chat_server
    config = _config(sugarcrepe_dir, tmp_path, f"backend.vllm.server_url={url}",
                     "backend.vllm.model_source=Qwen/Qwen3-8B-AWQ", "backend.vllm.num_engines=2")
    summary = run_extraction(config)
    units, rejects = _outputs(tmp_path)
    _check_balanced(summary, units, rejects)
    assert summary.with_units == 7
    assert summary.rejected_by_reason == {"inference_error": 1, "placeholder": 1,
                                          "empty_extraction": 1}
    first = requests[0]
    assert first["model"] == "Qwen/Qwen3-8B-AWQ" and first["chat_template_kwargs"] == {
        "enable_thinking": False}
    assert first["response_format"]["json_schema"]["schema"]["required"] == ["entities", "relations"]
    assert (first["temperature"], first["top_p"]) == (0.3, 0.95)
    repairs = [r for r in requests if len(r["messages"]) > 2]
    assert len(requests) == 10 + len(repairs) and len(repairs) == 4  # 4 answers repaired once
