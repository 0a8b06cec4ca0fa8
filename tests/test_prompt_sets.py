"""The LLM's prompt sets behind one interface: the registry's names import light, both
built-in sets implement PromptSet, and a third set, defined here, runs through the same
pipeline (a stand-in engine), stores its answers, replays them to the same tables and
dumps its requests, with nothing but its class and a registration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from csclip.config import load_config
from csclip.config.extract import ExtractConfig
from csclip.extract import answers, prompt_sets
from csclip.extract.pipeline import run_extraction
from csclip.extract.prompt_sets.base import PromptSet, StoredAnswers

CAPTIONS = ["A brown dog on a red sofa.", "A man riding a horse.", "", "A cat."]
# The toy's answers, keyed by caption: nouns of the caption, each with one object foil.
TOY_ANSWERS = {"A brown dog on a red sofa.": {"nouns": [["brown dog", "brown cat"],
                                                        ["red sofa", "red bed"]]},
               "A man riding a horse.": {"nouns": [["man", "woman"], ["horse", "cow"]]},
               "A cat.": {"nouns": []}}


def test_registry_names_import_without_pyarrow_ray_or_torch():
    code = ("import sys; from csclip.extract.prompt_sets import PROMPT_SET_NAMES; "
            "assert PROMPT_SET_NAMES == ('csclip', 'authors'), PROMPT_SET_NAMES; "
            "assert not {'pyarrow', 'ray', 'torch'} & set(sys.modules), 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", prompt_sets.PROMPT_SET_NAMES)
def test_each_registered_prompt_set_implements_the_interface(name):
    prompt_set = prompt_sets.get_prompt_set(name)
    assert isinstance(prompt_set, PromptSet)
    assert prompt_set.name == name
    assert set(prompt_set.schemas()) == set(prompt_set.call_kinds)
    assert all(schema["type"] == "object" for schema in prompt_set.schemas().values())


def toy_prompt_set():
    """A third prompt set: one call per caption asking for its nouns, each with one foil.
    Defined in a function so that Ray pickles it by value (the workers cannot import the
    tests); everything it calls is csclip's."""
    from dataclasses import replace

    import pyarrow as pa
    import ray.data

    from csclip.extract.backends import (
        RESULT_SCHEMA,
        Outcome,
        empty_caption_outcome,
        finish,
        outcome_row,
        shard_blocks,
    )
    from csclip.extract.vllm import ERROR_COLUMN
    from csclip.units import ChangeType, Foil, RejectReason, Unit, UnitsRecord

    class ToyPromptSet:
        name, source, call_kinds = "toy", "vllm_toy", ("nouns",)

        def schemas(self):
            return {"nouns": {"type": "object", "properties": {"nouns": {
                "type": "array", "items": {"type": "array", "items": {"type": "string"}}}}}}

        def messages(self, caption):
            return [{"role": "system", "content": "List the nouns, each with a foil."},
                    {"role": "user", "content": caption}]

        def decide(self, row, answer, error):
            call = {"kind": "nouns", "sample_id": row["sample_id"],
                    "caption_index": row["caption_index"], "entity": None, "occurrence": 0,
                    "answer": None if error else answer, "error": error or "", "prompts": "toy"}
            empty = empty_caption_outcome(row)
            if empty is not None:
                return empty
            if error or answer is None:
                return Outcome("inference", reason=RejectReason.INFERENCE_ERROR,
                               detail=error or "no answer", calls=[call])
            entities = [Unit.entity(noun, [Foil(foil, ChangeType.OBJECT_CHANGE)])
                        for noun, foil in json.loads(answer)["nouns"]]
            record = UnitsRecord(sample_id=row["sample_id"], image_id=row["image_id"],
                                 caption=row["caption"], split=row["split"],
                                 entities=tuple(entities), relations=(),
                                 image_path=row.get("image_path"), source=self.source)
            return replace(finish(record, raw_answer=answer), calls=[call])

        def run(self, rows, cfg, engine, attempt):
            def prompts(batch):
                messages = [json.dumps(self.messages(c)) for c in batch.column("caption").to_pylist()]
                params = json.dumps({"max_tokens": 64,
                                     "structured_outputs": {"json": self.schemas()["nouns"]}})
                batch = batch.append_column("prompt_json", pa.array(messages, pa.string()))
                return batch.append_column("sampling_json",
                                           pa.array([params] * batch.num_rows, pa.string()))

            def results(batch):
                return pa.Table.from_pylist(
                    [outcome_row(r, self.decide(r, r["generated_text"], r[ERROR_COLUMN]))
                     for r in batch.to_pylist()], schema=RESULT_SCHEMA)

            ds = ray.data.from_arrow(shard_blocks(rows, cfg.batch_size))
            ds = engine(ds.map_batches(prompts, batch_format="pyarrow", batch_size=None))
            yield from ds.map_batches(results, batch_format="pyarrow", batch_size=None) \
                .iter_batches(batch_format="pyarrow", batch_size=None)

        def outcome(self, row, answers, repair):
            record = answers.by_key.get(("nouns", None, 0))
            return self.decide(row, record and record["answer"], record and record["error"])

        def requests(self, row, answers, cfg):
            return [{"kind": "nouns", "sample_id": row["sample_id"],
                     "messages": self.messages(row["caption"]), "model": cfg.model_source}]

    return ToyPromptSet()


def toy_engine():
    """A stand-in for the vLLM processor: the toy's answer to each row's caption."""
    answers_by_caption = {k: json.dumps(v) for k, v in TOY_ANSWERS.items()}

    def answer(batch):
        import pyarrow as pa

        captions = [json.loads(p)[-1]["content"] for p in batch.column("prompt_json").to_pylist()]
        batch = batch.append_column("generated_text", pa.array(
            [answers_by_caption.get(c, "{}") for c in captions], pa.string()))
        return batch.append_column("__inference_error__", pa.array([""] * len(captions)))

    return lambda ds: ds.map_batches(answer, batch_format="pyarrow", batch_size=None)


def _config(tmp_path: Path, name: str, *overrides: str) -> ExtractConfig:
    captions = tmp_path / "captions.jsonl"
    captions.write_text("".join(json.dumps({"image": f"{i}.jpg", "caption": c, "split": "val"})
                                + "\n" for i, c in enumerate(CAPTIONS)))
    config = load_config(ExtractConfig, None, [
        "input.format=jsonl", f"input.uri={captions}", "output.shard_size=3",
        f"output.uri={tmp_path / name}", "tracking.enabled=false",
        f"output.dump_prompts={tmp_path / name}.prompts.jsonl", *overrides])
    # The config knows the built-in names only; a registered set is picked by hand.
    return config.model_copy(update={"backend": config.backend.model_copy(
        update={"prompts": "toy"})})


def test_a_third_prompt_set_runs_stores_replays_and_dumps(ray_session, tmp_path, monkeypatch):
    toy = toy_prompt_set()
    # As if PROMPT_SETS had a line for it (the workers cannot import a test module).
    monkeypatch.setitem(prompt_sets._LOADED, "toy", toy)
    assert prompt_sets.get_prompt_set("toy") is toy

    live = run_extraction(_config(tmp_path, "live", "backend.name=vllm"), engine=toy_engine())
    assert (live.read, live.with_units, live.rejected) == (4, 2, 2)
    assert live.rejected_by_reason == {"empty_caption": 1, "empty_extraction": 1}
    units = pq.read_table(tmp_path / "live" / "units").to_pylist()
    assert {u["source"] for u in units} == {"vllm_toy"}
    stored = [json.loads(line) for part in sorted((tmp_path / "live" / "answers").glob("*.jsonl"))
              for line in part.read_text().splitlines()]
    assert sorted(r["kind"] + ":" + r["prompts"] for r in stored) == ["nouns:toy"] * 3

    replay = run_extraction(_config(tmp_path, "replay", "backend.name=replay",
                                    f"backend.answers={tmp_path / 'live' / 'answers'}"))
    assert (replay.read, replay.with_units, replay.rejected_by_reason) == (
        4, 2, live.rejected_by_reason)
    for table in ("units", "rejects"):
        assert pq.read_table(tmp_path / "replay" / table).equals(
            pq.read_table(tmp_path / "live" / table))
    dump = (tmp_path / "live.prompts.jsonl").read_text()
    assert dump == (tmp_path / "replay.prompts.jsonl").read_text()
    assert [json.loads(line)["messages"][1]["content"] for line in dump.splitlines()] == [
        c for c in CAPTIONS if c]


def test_a_registered_prompt_set_answers_replay_without_ray(monkeypatch):
    toy = toy_prompt_set()
    monkeypatch.setitem(prompt_sets._LOADED, "toy", toy)
    row = {"sample_id": "s", "image_id": "i", "caption": "A man riding a horse.",
           "split": "val", "image_path": None, "caption_index": 0,
           answers.ANSWERS_COLUMN: json.dumps({"prompts": "toy", "repair": False, "answers": [
               {"kind": "nouns", "sample_id": "s", "entity": None, "occurrence": 0,
                "answer": json.dumps(TOY_ANSWERS["A man riding a horse."]), "error": ""}]})}
    outcome = answers.replay_outcome(row)
    assert [u.text for u in outcome.record.entities] == ["man", "horse"]
    assert outcome.calls[0]["prompts"] == "toy"
    stored = StoredAnswers(json.loads(row[answers.ANSWERS_COLUMN])["answers"])
    assert toy.outcome(row, stored, False).record == outcome.record
