"""The authors' prompt set (`csclip extract --prompts authors`) against THEIR code's
output: tests/fixtures/authors_extraction holds the requests and the unit entries the
authors' unit_pipeline (kargibora/CS-CLIP @ cc17cf9) made from canned captions and raw
answers (its README says how). Our prompts must equal theirs exactly and our entries
theirs item for item; then the same captions go through the Ray Data stages with a
stand-in engine, and a replay of that run's stored answers gives its units table back.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from csclip.config import load_config
from csclip.config.extract import ExtractConfig
from csclip.extract import authors_prompts as ap
from csclip.extract.pipeline import run_extraction
from csclip.units import RejectReason, record_to_row

FIXTURES = Path(__file__).parent / "fixtures" / "authors_extraction"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line]


CAPTIONS = _jsonl("captions.jsonl")
ANSWERS = _jsonl("answers.jsonl")
THEIR_PROMPTS = _jsonl("prompts.jsonl")
THEIR_UNITS = json.loads((FIXTURES / "units.json").read_text())
BY_KEY = {(a["kind"], a["sample_id"], a["entity"], a["occurrence"]): a["answer"] for a in ANSWERS}


def _order(record: dict) -> tuple:
    return (record["caption_index"], ap.CALL_KINDS.index(record["kind"]), record["entity"] or "",
            record["occurrence"])


def _derive_all() -> list[ap.Derived]:
    return [ap.derive(row["sample_id"], index, row["caption"], row["image"],
                      lambda call: BY_KEY[call.key])
            for index, row in enumerate(CAPTIONS)]


def test_prompts_equal_the_authors_code():
    """Every request (system and user text, sampling, stop strings, schema, thinking off,
    model) equals what their code sent, and the same calls are made."""
    derived = _derive_all()
    ours = [call.request(ap.MODEL) for d in derived for call, _ in d.calls]
    assert len(ours) == len(THEIR_PROMPTS) == 49
    for mine, theirs in zip(sorted(ours, key=_order), sorted(THEIR_PROMPTS, key=_order),
                            strict=True):
        assert mine == theirs
    made = [{**call.head(), "answer": answer} for d in derived for call, answer in d.calls]
    assert sorted(made, key=_order) == sorted(ANSWERS, key=_order)


def test_units_equal_the_authors_code_item_for_item():
    """Their entries (main.build_structured_entries) from the same answers: malformed and
    prose-wrapped answers, bracket repair, each foil filter, the 8-relation cap, swaps
    with unlisted arguments, free-text change types."""
    entries = [d.entry for d in _derive_all() if d.entry is not None]
    assert [e["sample_id"] for e in entries] == [e["sample_id"] for e in THEIR_UNITS]
    for mine, theirs in zip(entries, THEIR_UNITS, strict=True):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert mine[key] == theirs[key], (theirs["sample_id"], key)


def test_every_drop_has_its_reason():
    """What their code drops silently is a counted rejection here, one reason per filter."""
    derived = {row["sample_id"]: d for row, d in zip(CAPTIONS, _derive_all(), strict=True)}
    reasons = Counter(r.reason for d in derived.values() for r in d.rejections)
    for reason in (RejectReason.FOIL_IN_CAPTION, RejectReason.DUPLICATE_UNIT,
                   RejectReason.FOIL_IS_SYNONYM, RejectReason.FOIL_ONLY_INFLECTION,
                   RejectReason.PLACEHOLDER, RejectReason.FOIL_GENERIC_WORD,
                   RejectReason.SWAP_ARGUMENT_NOT_ENTITY, RejectReason.TOO_MANY_UNITS,
                   RejectReason.UNMATCHED_NEGATIVE, RejectReason.UNKNOWN_CHANGE_TYPE,
                   RejectReason.MALFORMED_JSON, RejectReason.FOIL_EQUALS_UNIT,
                   RejectReason.EMPTY_FOIL):
        assert reasons[reason], reason
    assert {k: (d.reason, d.stage) for k, d in derived.items() if d.entry is None} == {
        "s02": (RejectReason.MALFORMED_JSON, "parse"), "s03": (RejectReason.MALFORMED_JSON, "parse"),
        "s04": (RejectReason.MALFORMED_JSON, "parse"),
        "s07": (RejectReason.EMPTY_EXTRACTION, "validation"),
        "s11": (RejectReason.EMPTY_EXTRACTION, "validation")}
    cut = [r.detail for r in derived["s05"].rejections if r.reason == RejectReason.TOO_MANY_UNITS]
    assert len(cut) == 2 and all("after the first 8" in d for d in cut)


def test_bracket_repair_appends_brackets_before_braces():
    assert ap.read_json('{"entities": ["a", "b"').value == {"entities": ["a", "b"]}
    assert ap.read_json('{"entities": ["a"], "relations": [{"subject": "a"').value is None
    assert ap.read_json('{"a": [1, 2]} trailing').value is None  # balanced: no repair
    assert ap.read_json('{"a": {"b": 1}').value is None  # ends with "}": no repair
    assert ap.read_json("").value is None


def test_config_and_flags():
    from csclip.entry.extract import build_parser, overrides_from_args

    args = build_parser().parse_args(["--backend", "replay", "--prompts", "authors", "--answers",
                                      "a/answers", "--out-format", "authors", "--dump-prompts",
                                      "p.jsonl", "--format", "jsonl", "--input", "c.jsonl"])
    config = load_config(ExtractConfig, None, overrides_from_args(args))
    assert (config.backend.prompts, config.backend.answers, config.output.format,
            config.output.dump_prompts) == ("authors", "a/answers", "authors", "p.jsonl")
    assert load_config(ExtractConfig, None, ["backend.name=vllm", "input.format=jsonl",
                                             "input.uri=c.jsonl"]).backend.prompts == "csclip"
    for bad in (["backend.name=replay"], ["backend.name=rules", "backend.prompts=authors"],
                ["backend.name=vllm", "output.format=authors"]):
        with pytest.raises(Exception, match="backend"):
            load_config(ExtractConfig, None, ["input.format=jsonl", "input.uri=c.jsonl", *bad])


def canned_engine(answers: dict):
    """A stand-in for the vLLM processor that answers each call from `answers`, keyed by
    (kind, sample_id, entity, occurrence), read from the row's own call."""

    def answer(batch):
        import pyarrow as pa

        texts = []
        for row in batch.to_pylist():
            call = json.loads(row["call_json"])
            texts.append(answers[(call["kind"], call["sample_id"], call["entity"],
                                  call["occurrence"])])
        batch = batch.append_column("generated_text", pa.array(texts, pa.string()))
        return batch.append_column("__inference_error__", pa.array([""] * len(texts), pa.string()))

    return lambda ds: ds.map_batches(answer, batch_format="pyarrow", batch_size=None)


def _run(tmp_path: Path, name: str, *overrides: str, engine=None):
    captions = tmp_path / "captions.jsonl"
    captions.write_text((FIXTURES / "captions.jsonl").read_text() + json.dumps(
        {"image": "val2014/blank.jpg", "caption": "  ", "sample_id": "s99", "split": "val"}) + "\n")
    config = load_config(ExtractConfig, None, [
        "input.format=jsonl", f"input.uri={captions}", "output.shard_size=5",
        f"output.uri={tmp_path / name}", "tracking.enabled=false", "backend.prompts=authors",
        "output.format=authors", f"output.dump_prompts={tmp_path / name}.prompts.jsonl",
        *overrides])
    return run_extraction(config, engine=engine)


def test_three_stages_on_ray_then_replay(ray_session, tmp_path):
    """The chained stages of one Ray Data job (stand-in engine): the authors' format file
    equals their entries, the dump their requests; a replay of the run's own answers, no
    engine, gives the same units table, authors file and dump."""
    summary = _run(tmp_path, "live", "backend.name=vllm", engine=canned_engine(BY_KEY))
    # 13 captions: 7 with units, 5 their pipeline skips, 1 blank (never sent).
    assert (summary.read, summary.with_units, summary.rejected) == (13, 7, 6)
    assert summary.rejected_by_reason == {"malformed_json": 3, "empty_extraction": 2,
                                          "empty_caption": 1}
    live = tmp_path / "live"
    entries = [e for part in sorted((live / "authors").glob("*.json"))
               for e in json.loads(part.read_text())]
    assert entries == THEIR_UNITS
    dump = _jsonl_at(tmp_path / "live.prompts.jsonl")
    assert sorted(dump, key=_order) == sorted(THEIR_PROMPTS, key=_order)
    stored = [r for part in sorted((live / "answers").glob("*.jsonl")) for r in _jsonl_at(part)]
    assert sorted(({k: r[k] for k in ("kind", "sample_id", "caption_index", "entity",
                                       "occurrence", "answer")} for r in stored), key=_order) \
        == sorted(ANSWERS, key=_order)

    replay = _run(tmp_path, "replay", "backend.name=replay", f"backend.answers={live / 'answers'}")
    assert (replay.read, replay.with_units, replay.rejected_by_reason) == (
        13, 7, summary.rejected_by_reason)
    for table in ("units", "rejects"):
        assert pq.read_table(tmp_path / "replay" / table).equals(pq.read_table(live / table))
    for part in sorted((live / "authors").glob("*.json")):
        assert (tmp_path / "replay" / "authors" / part.name).read_text() == part.read_text()
    assert (tmp_path / "replay.prompts.jsonl").read_text() == (
        tmp_path / "live.prompts.jsonl").read_text()
    units = pq.read_table(live / "units").to_pylist()
    assert {u["source"] for u in units} == {"vllm_authors"}


def _jsonl_at(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_csclip_prompt_set_answers_replay_to_the_same_outcome():
    """Our own prompt set stores its answers too (kind extract, then repair), and replay
    re-derives each caption's outcome from them, repair included (no Ray: the answer
    stage's rows are the run's result rows)."""
    import pyarrow as pa

    from csclip.extract import answers
    from csclip.extract.backends import Status
    from csclip.extract.prompt_sets.csclip import answer_stage

    good = json.dumps({"entities": [{"entity": "dog", "foils": [
        {"foil": "cat", "change_type": "object_change"}]}], "relations": []})
    base = {"image_id": "i", "split": "train", "image_path": None, "image_bytes": None,
            "shard": 0, "__inference_error__": ""}
    rows = [{**base, "sample_id": "a", "caption_index": 0, "caption": "A dog.",
             "generated_text": good},
            {**base, "sample_id": "b", "caption_index": 1, "caption": "A dog.",
             "generated_text": "{not json"}]
    first = answer_stage(pa.Table.from_pylist(rows), attempt=0, repair=True).to_pylist()
    assert [r["status"] for r in first] == [Status.OK, Status.REPAIR]
    second = answer_stage(pa.Table.from_pylist([{**rows[1], "generated_text": good}]),
                          attempt=1, repair=True).to_pylist()[0]
    final = [first[0], answers.with_earlier_calls(second, first[1])]
    for result in final:
        calls = json.loads(result["calls_json"])
        row = {**base, **{k: result[k] for k in ("sample_id", "caption_index", "caption")},
               answers.ANSWERS_COLUMN: json.dumps({"prompts": "csclip", "repair": True,
                                                   "answers": calls})}
        replayed = answers.replay_outcome(row)
        assert replayed.stage == result["stage"]
        replayed_row = record_to_row(replayed.record)
        replayed_row.pop("image_bytes")
        assert json.loads(json.dumps(replayed_row)) == json.loads(result["record_json"])
    assert [c["kind"] for c in json.loads(final[1]["calls_json"])] == ["extract", "repair"]
